"""THE registry of model layouts: detection evidence, remap rules, exclusions and LoRA leaves, as data.

Every naming rule adapterdoc knows lives here. Module paths below are PEFT module paths *without* the
``base_model.model.`` wrapper (``model.language_model.layers.0.self_attn.q_proj``). Nothing in this module
imports torch; the tiny reference configs are built by :mod:`adapterdoc.ml.tiny` from the names here, and each
layout's module tree (from ``config.json``, torch-free) lives in :mod:`adapterdoc.layouts.trees`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

TOWER_SEGMENTS = (
    "visual",
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "talker",
    "code2wav",
    "mtp",
)
"""Module-path segments that must never carry LoRA when a multimodal model is trained or served as text."""


def exclusion_regex(segments: Iterable[str] = TOWER_SEGMENTS) -> str:
    """A PEFT ``exclude_modules`` regex (fullmatch semantics) excluding every module under ``segments``."""
    return r"(^|.*\.)(" + "|".join(segments) + r")(\..*|$)"


@dataclass(frozen=True)
class Rule:
    """One rename on a module path: ``re.sub(pattern, replacement, path, count=1)``."""

    pattern: str
    replacement: str

    def apply(self, path: str) -> str:
        return re.sub(self.pattern, self.replacement, path, count=1)


STRIP_LANGUAGE_MODEL = Rule(r"^((?:[^.]+\.)*?)language_model\.", r"\1")
"""Remove the first ``language_model`` segment: ``model.language_model.layers`` → ``model.layers``."""


def strip_language_model(path: str) -> str:
    """The one "strip ``language_model``" (``remap --vl`` and the move verify suggests): remove the first
    ``language_model`` segment of a module path or full key, keeping the dots around it."""
    return STRIP_LANGUAGE_MODEL.apply(path)


ADD_LANGUAGE_MODEL = Rule(r"^model\.(?!language_model\.)", "model.language_model.")
"""``model.layers`` → ``model.language_model.layers`` (a text adapter onto a VL class)."""


@dataclass(frozen=True)
class Layout:
    """One model layout: how its adapters' module paths look and how to move them to neighbours."""

    name: str
    family: str
    model_class: str
    """The transformers class whose module tree this layout describes."""
    model_type: str
    """``config.model_type`` of the config this class is built from."""
    description: str
    requires: tuple[str, ...]
    """Regexes (``re.search`` on module paths); each must match at least one module for a detection."""
    forbids: tuple[str, ...] = ()
    """Regexes that must match no module."""
    signals: tuple[tuple[str, str], ...] = ()
    """Extra (regex, evidence text) pairs that raise confidence when they match a module."""
    lora_leaves: tuple[str, ...] = ()
    """Leaf module names LoRA targets by default (attention and MLP linears)."""
    target_parameters: tuple[str, ...] = ()
    """Fused-expert parameters targeted through PEFT's ``target_parameters``."""
    towers: tuple[str, ...] = ()
    """Module-path segments of towers/projectors/talker in this layout (never LoRA targets)."""
    remaps: dict[str, tuple[Rule, ...]] = field(default_factory=dict)
    """Direct moves to neighbouring layouts: target layout name → rules applied in order."""
    text_counterpart: str | None = None
    """The layout a text-only trainer or server uses for this one (``remap --vl`` / train-smoke)."""
    is_encoder: bool = False
    model_module: str = ""
    """The transformers module that defines ``model_class``: what PEFT writes as ``auto_mapping.parent_library``."""
    counterpart_config: str | None = None
    """The attribute of this layout's config that holds the config ``text_counterpart`` is built from (``None``: the
    same config), so that a base of this layout can also be loaded as its counterpart's class."""

    @property
    def exclude_regex(self) -> str | None:
        return exclusion_regex(self.towers) if self.towers else None


_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_DELTANET = ("in_proj_qkv", "in_proj_z", "out_proj")
_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
_LINEAR_ATTN = r"\.linear_attn\."
_FUSED_EXPERTS = r"\.mlp\.experts(\.base_layer)?$"
_MOE = r"\.mlp\.(experts|shared_expert)(\.|$)"
_VL_LM = r"^model\.language_model\.layers\.\d+\."
_TEXT_LM = r"^model\.layers\.\d+\."
_QWEN35_MARK = r"\.(linear_attn|mlp\.shared_expert)\."
"""Gated DeltaNet or a shared expert: what tells Qwen3.5-MoE from the Omni thinker / Qwen3-MoE."""
_VL_DECODER = r"^model\.language_model\.layers\.\d+\.(self_attn|mlp)\.[^.]+$"
_TEXT_DECODER = r"^model\.layers\.\d+\.(self_attn|mlp)\.[^.]+$"
_BERT_LEAF = r"\.(Wqkv|Wi|Wo)$"
_VL_DECODER_OR_DELTANET = r"^model\.language_model\.layers\.\d+\.(self_attn|mlp|linear_attn)\.[^.]+$"
_TEXT_DECODER_OR_DELTANET = r"^model\.layers\.\d+\.(self_attn|mlp|linear_attn)\.[^.]+$"
"""Qwen3.5 adapters that skip the Gated-DeltaNet projections look like any decoder's: then only a hint tells."""

LAYOUTS: dict[str, Layout] = {}


def _register(*layouts: Layout) -> None:
    for layout in layouts:
        LAYOUTS[layout.name] = layout


_register(
    Layout(
        name="qwen3_5_vl",
        family="qwen3_5",
        model_class="Qwen3_5ForConditionalGeneration",
        model_module="transformers.models.qwen3_5.modeling_qwen3_5",
        counterpart_config="text_config",
        model_type="qwen3_5",
        description="Qwen3.5 / Qwen3.6 dense vision-language (model.language_model.*, model.visual)",
        requires=(_VL_DECODER_OR_DELTANET,),
        forbids=(_MOE, r"^thinker\."),
        signals=((r"\.linear_attn\.in_proj_qkv$", "Gated-DeltaNet in_proj_qkv (Qwen3.5 linear attention)"),),
        lora_leaves=_ATTN + _MLP + _DELTANET,
        towers=("visual", "mtp"),
        remaps={"qwen3_5_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="qwen3_5_text",
    ),
    Layout(
        name="qwen3_5_text",
        family="qwen3_5",
        model_class="Qwen3_5ForCausalLM",
        model_module="transformers.models.qwen3_5.modeling_qwen3_5",
        model_type="qwen3_5_text",
        description="Qwen3.5 dense, text-only class (model.layers.*)",
        requires=(_TEXT_DECODER_OR_DELTANET,),
        forbids=(_MOE, _BERT_LEAF),
        signals=((_LINEAR_ATTN, "Gated-DeltaNet linear-attention modules (Qwen3.5)"),),
        lora_leaves=_ATTN + _MLP + _DELTANET,
        towers=("mtp",),
        remaps={"qwen3_5_vl": (ADD_LANGUAGE_MODEL,)},
    ),
    Layout(
        name="qwen3_5_moe_vl",
        family="qwen3_5_moe",
        model_class="Qwen3_5MoeForConditionalGeneration",
        model_module="transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
        counterpart_config="text_config",
        model_type="qwen3_5_moe",
        description="Qwen3.5 / Qwen3.6 MoE vision-language, fused experts (model.language_model.*)",
        requires=(_VL_LM, _MOE, _QWEN35_MARK),
        forbids=(r"^thinker\.",),
        signals=(
            (_LINEAR_ATTN, "Gated-DeltaNet linear-attention modules"),
            (r"\.mlp\.shared_expert\.", "shared-expert MLP (Qwen3.5-MoE)"),
            (_FUSED_EXPERTS, "fused-expert LoRA (target_parameters)"),
        ),
        lora_leaves=_ATTN + _MLP + _DELTANET,
        target_parameters=_EXPERTS,
        towers=("visual", "mtp"),
        remaps={"qwen3_5_moe_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="qwen3_5_moe_text",
    ),
    Layout(
        name="qwen3_5_moe_text",
        family="qwen3_5_moe",
        model_class="Qwen3_5MoeForCausalLM",
        model_module="transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
        model_type="qwen3_5_moe_text",
        description="Qwen3.5 MoE, text-only class (model.layers.*)",
        requires=(_TEXT_LM, _MOE, _QWEN35_MARK),
        signals=(
            (_LINEAR_ATTN, "Gated-DeltaNet linear-attention modules"),
            (r"\.mlp\.shared_expert\.", "shared-expert MLP (Qwen3.5-MoE)"),
        ),
        lora_leaves=_ATTN + _MLP + _DELTANET,
        target_parameters=_EXPERTS,
        towers=("mtp",),
        remaps={"qwen3_5_moe_vl": (ADD_LANGUAGE_MODEL,)},
    ),
    Layout(
        name="qwen3_omni",
        family="qwen3_omni",
        model_class="Qwen3OmniMoeForConditionalGeneration",
        model_module="transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe",
        counterpart_config="thinker_config",
        model_type="qwen3_omni_moe",
        description="Qwen3-Omni full wrapper (thinker.model.language_model.*; talker must never get LoRA)",
        requires=(r"^thinker\.model\.language_model\.layers\.\d+\.",),
        signals=((_FUSED_EXPERTS, "fused-expert LoRA (target_parameters)"),),
        lora_leaves=_ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
        towers=("audio_tower", "visual", "talker", "code2wav"),
        remaps={"qwen3_omni_thinker": (Rule(r"^thinker\.", ""),)},
        text_counterpart="qwen3_omni_thinker",
    ),
    Layout(
        name="qwen3_omni_thinker",
        family="qwen3_omni",
        model_class="Qwen3OmniMoeThinkerForConditionalGeneration",
        model_module="transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe",
        counterpart_config="text_config",
        model_type="qwen3_omni_moe_thinker",
        description="Qwen3-Omni thinker alone (model.language_model.*, audio and vision towers)",
        requires=(_VL_LM, _FUSED_EXPERTS),
        forbids=(_LINEAR_ATTN, r"\.shared_expert\."),
        signals=(
            (r"^model\.language_model\.layers\.\d+\.self_attn\.", "full attention only (no Gated DeltaNet)"),
        ),
        lora_leaves=_ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
        towers=("audio_tower", "visual"),
        remaps={
            "qwen3_omni": (Rule(r"^(?!thinker\.)", "thinker."),),
            "qwen3_moe_text": (STRIP_LANGUAGE_MODEL,),
        },
        text_counterpart="qwen3_moe_text",
    ),
    Layout(
        name="qwen3_moe_text",
        family="qwen3_omni",
        model_class="Qwen3MoeForCausalLM",
        model_module="transformers.models.qwen3_moe.modeling_qwen3_moe",
        model_type="qwen3_moe",
        description="Qwen3-MoE text class, the text stand-in for the Omni thinker (model.layers.*)",
        requires=(_TEXT_LM, _FUSED_EXPERTS),
        forbids=(_LINEAR_ATTN, r"\.shared_expert\."),
        lora_leaves=_ATTN,
        target_parameters=("gate_up_proj", "down_proj"),
        remaps={"qwen3_omni_thinker": (ADD_LANGUAGE_MODEL,)},
    ),
    Layout(
        name="mistral3_vl",
        family="mistral3",
        model_class="Mistral3ForConditionalGeneration",
        model_module="transformers.models.mistral3.modeling_mistral3",
        counterpart_config="text_config",
        model_type="mistral3",
        description="Ministral 3 vision-language (Mistral3 + Pixtral tower, model.language_model.*)",
        requires=(_VL_DECODER,),
        forbids=(_LINEAR_ATTN, _MOE, r"^thinker\."),
        signals=(
            (r"^model\.vision_tower\.", "Pixtral vision_tower modules"),
            (r"^model\.multi_modal_projector\.", "multi_modal_projector modules"),
        ),
        lora_leaves=_ATTN + _MLP,
        towers=("vision_tower", "multi_modal_projector"),
        remaps={"ministral3_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="ministral3_text",
    ),
    Layout(
        name="ministral3_text",
        family="mistral3",
        model_class="Ministral3ForCausalLM",
        model_module="transformers.models.ministral3.modeling_ministral3",
        model_type="ministral3",
        description="Ministral 3 text-only class (model.layers.*); a generic decoder layout",
        requires=(_TEXT_DECODER,),
        forbids=(_LINEAR_ATTN, _MOE, r"^visual\.", _BERT_LEAF),
        lora_leaves=_ATTN + _MLP,
        remaps={"mistral3_vl": (ADD_LANGUAGE_MODEL,)},
    ),
    Layout(
        name="qwen_vl_legacy",
        family="qwen_vl",
        model_class="Qwen2_5_VLForConditionalGeneration",
        model_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        model_type="qwen2_5_vl",
        description="Qwen2.5-VL / Qwen3-VL adapters from transformers < 4.52 (model.layers.*, top-level visual)",
        requires=(_TEXT_LM, r"^visual\."),
        lora_leaves=_ATTN + _MLP,
        towers=("visual",),
        remaps={
            "qwen_vl": (
                Rule(r"^model\.(?!language_model\.)", "model.language_model."),
                Rule(r"^visual\.", "model.visual."),
            )
        },
    ),
    Layout(
        name="qwen_vl",
        family="qwen_vl",
        model_class="Qwen2_5_VLForConditionalGeneration",
        model_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        model_type="qwen2_5_vl",
        description="Qwen2.5-VL / Qwen3-VL adapters from transformers >= 4.52 (model.language_model.*, model.visual)",
        requires=(_VL_DECODER,),
        forbids=(_LINEAR_ATTN, _MOE, r"^thinker\.", r"^model\.(vision_tower|multi_modal_projector)\."),
        signals=((r"^model\.visual\.", "Qwen-VL vision tower `model.visual` modules"),),
        lora_leaves=_ATTN + _MLP,
        towers=("visual",),
        remaps={
            "qwen_vl_legacy": (
                Rule(r"^model\.language_model\.", "model."),
                Rule(r"^model\.visual\.", "visual."),
            )
        },
    ),
    Layout(
        name="modernbert_mlm",
        family="modernbert",
        model_class="ModernBertForMaskedLM",
        model_module="transformers.models.modernbert.modeling_modernbert",
        model_type="modernbert",
        description="ModernBERT with the masked-LM head (model.layers.*.attn.Wqkv)",
        requires=(r"^model\.layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        signals=((r"^(head\.dense|decoder)$", "masked-LM head modules"),),
        lora_leaves=("Wqkv", "Wo", "Wi"),
        remaps={"modernbert": (Rule(r"^model\.", ""),)},
        text_counterpart="modernbert",
        is_encoder=True,
    ),
    Layout(
        name="modernbert",
        family="modernbert",
        model_class="ModernBertModel",
        model_module="transformers.models.modernbert.modeling_modernbert",
        model_type="modernbert",
        description="ModernBERT encoder without a head (layers.*.attn.Wqkv)",
        requires=(r"^layers\.\d+\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        lora_leaves=("Wqkv", "Wo", "Wi"),
        remaps={"modernbert_mlm": (Rule(r"^(?=(?:layers|embeddings|final_norm)\.)", "model."),)},
        is_encoder=True,
    ),
    Layout(
        name="embeddinggemma2",
        family="embeddinggemma2",
        model_class="EmbeddingGemma2Model",
        model_module="transformers.models.embedding_gemma2.modeling_embedding_gemma2",
        counterpart_config="text_config",
        model_type="embedding_gemma2",
        description="EmbeddingGemma 2 multimodal embedding model (language_model.layers.*, no model. prefix)",
        requires=(r"^language_model\.layers\.\d+\.",),
        signals=((r"\.ple_block\.", "per-layer-embedding blocks"),),
        lora_leaves=_ATTN + _MLP,
        towers=("vision_tower", "audio_tower", "embed_vision", "embed_audio"),
        remaps={"embeddinggemma2_text": (STRIP_LANGUAGE_MODEL,)},
        text_counterpart="embeddinggemma2_text",
        is_encoder=True,
    ),
    Layout(
        name="embeddinggemma2_text",
        family="embeddinggemma2",
        model_class="EmbeddingGemma2TextModel",
        model_module="transformers.models.embedding_gemma2.modeling_embedding_gemma2",
        model_type="embedding_gemma2_text",
        description="EmbeddingGemma 2 text tower alone (layers.*)",
        requires=(r"^layers\.\d+\.(self_attn|mlp)\.",),
        forbids=(r"\.(attn\.(Wqkv|Wo)|mlp\.(Wi|Wo))$",),
        signals=((r"\.ple_block\.", "per-layer-embedding blocks"),),
        lora_leaves=_ATTN + _MLP,
        remaps={"embeddinggemma2": (Rule(r"^(?!language_model\.)", "language_model."),)},
        is_encoder=True,
    ),
)


def get_layout(name: str) -> Layout:
    """The layout called ``name``; raises ``KeyError`` with the known names."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise KeyError(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}") from None


def loadable_as(name: str) -> list[tuple[str, tuple[str, ...]]]:
    """The layouts whose class a base of layout ``name`` can be built as, itself first, each with the chain of
    config attributes that leads from the base's config to the config that class is built from (the
    ``text_counterpart`` chain: ``qwen3_omni`` → ``qwen3_omni_thinker`` via ``thinker_config`` → ...)."""
    out: list[tuple[str, tuple[str, ...]]] = []
    here: str | None = name
    attrs: tuple[str, ...] = ()
    while here in LAYOUTS and all(here != n for n, _ in out):
        out.append((here, attrs))
        lay = LAYOUTS[here]
        if lay.counterpart_config:
            attrs = (*attrs, lay.counterpart_config)
        here = lay.text_counterpart
    return out


def remap_path(source: str, target: str) -> list[tuple[str, tuple[Rule, ...]]] | None:
    """The shortest chain of registry moves from ``source`` to ``target`` as (layout reached, rules) steps."""
    if source == target:
        return []
    queue: deque[tuple[str, list[tuple[str, tuple[Rule, ...]]]]] = deque([(source, [])])
    seen = {source}
    while queue:
        here, steps = queue.popleft()
        for nxt, rules in LAYOUTS[here].remaps.items():
            if nxt in seen:
                continue
            path = [*steps, (nxt, rules)]
            if nxt == target:
                return path
            seen.add(nxt)
            queue.append((nxt, path))
    return None


@dataclass(frozen=True)
class Detection:
    """Which layout an adapter's module paths belong to, and why."""

    name: str
    """A layout name, or ``"unknown"``; ``"ambiguous"`` when several match equally well."""
    evidence: tuple[str, ...]
    candidates: tuple[str, ...] = ()


def detect_layout(module_paths: Iterable[str], hint: str | Iterable[str] | None = None) -> Detection:
    """Detect the layout from module paths (``base_model.model.`` already removed).

    ``hint`` is corroborating text, or several, most precise first (PEFT's ``auto_mapping.base_model_class``,
    ``base_model_name_or_path``); it only breaks ties between layouts that match the keys equally well.
    """
    paths = _shapes(module_paths)
    if not paths:
        return Detection("unknown", ("no LoRA modules",))
    scored: list[tuple[int, str, list[str]]] = []
    for layout in LAYOUTS.values():
        evidence: list[str] = []
        ok = True
        for rx in layout.requires:
            n = _count(rx, paths)
            if not n:
                ok = False
                break
            evidence.append(f"{n} module(s) match /{rx}/")
        if not ok or any(_count(rx, paths) for rx in layout.forbids):
            continue
        score = 10 * len(layout.requires)
        for rx, text in layout.signals:
            n = _count(rx, paths)
            if n:
                score += 1
                evidence.append(f"{text}: {n} module(s)")
        scored.append((score, layout.name, evidence))
    if not scored:
        total = sum(p.count for p in paths)
        return Detection("unknown", (f"{total} module(s); no registry layout matches, e.g. {paths[0]}",))
    scored.sort(key=lambda s: -s[0])
    best = [s for s in scored if s[0] == scored[0][0]]
    hints = [hint] if isinstance(hint, str) else list(hint or [])
    for h in hints if len(best) > 1 else []:
        by_hint = [s for s in best if _hint_matches(LAYOUTS[s[1]], h)]
        if len(by_hint) == 1:
            s = by_hint[0]
            why = f"the adapter config names {h!r}, which breaks the tie with {', '.join(b[1] for b in best if b is not s)}"
            return Detection(s[1], (*s[2], why), tuple(b[1] for b in best if b is not s))
    if len(best) > 1:
        names = tuple(s[1] for s in best)
        return Detection("ambiguous", tuple(best[0][2]), names)
    return Detection(best[0][1], tuple(best[0][2]), tuple(s[1] for s in scored[1:]))


_FAMILY_HINTS = {
    "qwen3_5": r"qwen3[._-]?[56]",
    "qwen3_5_moe": r"qwen3[._-]?[56].*(a\d+b|moe)",
    "qwen3_omni": r"omni",
    "mistral3": r"(mi|mini)stral",
    "qwen_vl": r"qwen[23](\.5)?-?vl",
    "modernbert": r"modernbert",
    "embeddinggemma2": r"embedding-?gemma",
}


def _hint_matches(layout: Layout, hint: str) -> bool:
    if hint.startswith("tiny:"):  # adapters trained on adapterdoc's tiny reference models name their layout
        return hint[len("tiny:") :] == layout.name
    if re.fullmatch(r"[A-Za-z0-9_]+For[A-Za-z]+|[A-Za-z0-9_]+Model", hint):  # a class name (auto_mapping)
        return hint == layout.model_class
    rx = _FAMILY_HINTS.get(layout.family)
    return bool(rx and re.search(rx, hint, re.IGNORECASE))


class _Shape(str):
    """A module path with layer/expert indices replaced by ``0``, standing for ``count`` real paths."""

    count: int


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _shapes(module_paths: Iterable[str]) -> list[_Shape]:
    """Collapse module paths that differ only in numeric indices: detection cost stays O(distinct shapes)."""
    counts: dict[str, int] = {}
    for p in set(module_paths):
        key = _INDEX.sub("0", p)
        counts[key] = counts.get(key, 0) + 1
    out = []
    for key in sorted(counts):
        shape = _Shape(key)
        shape.count = counts[key]
        out.append(shape)
    return out


def _count(rx: str, paths: list[_Shape]) -> int:
    pattern = re.compile(rx)
    return sum(p.count for p in paths if pattern.search(p))


def tower_segment(module_path: str) -> str | None:
    """The tower/projector/talker segment a module path runs through, if any."""
    for seg in module_path.split("."):
        if seg in TOWER_SEGMENTS or seg in ("embed_vision", "embed_audio"):
            return seg
    return None
