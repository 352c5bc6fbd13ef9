"""The registry machinery: :class:`Layout` and :class:`Rule`, registration, lookup, detection and the routes
between layouts, forward routing and the tiny-model listings. The facts themselves live in one module per model
family (``adapterdoc.layouts.<family>``), whose ``ENTRIES`` the package registers in order."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

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

MODALITY_SEGMENTS = (
    "visual",
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "embed_vision",
    "embed_audio",
)
"""Tower segments that make a model multimodal (:attr:`Layout.is_vl`); MTP and the Omni talker do not."""


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
VL_INFIX = ".language_model."
"""The infix ``remap --vl`` strips (once) and refuses to leave behind: a VL class's text model."""


def strip_language_model(path: str) -> str:
    """The one "strip ``language_model``" (``remap --vl`` and the move verify suggests): remove the first
    ``language_model`` segment of a module path or full key, keeping the dots around it."""
    return STRIP_LANGUAGE_MODEL.apply(path)


ADD_LANGUAGE_MODEL = Rule(r"^model\.(?!language_model\.)", "model.language_model.")
"""``model.layers`` → ``model.language_model.layers`` (a text adapter onto a VL class)."""


@dataclass(frozen=True)
class Experts:
    """How one family names its mixture-of-experts parameters (data for :mod:`adapterdoc.adapter.expert_picture`)."""

    per_expert: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    """The leaf names of expert ``e``'s gate, up and down Linears (``...experts.{e}.<leaf>``) in the per-expert
    layout (transformers 4.x models, older PEFT, most engines)."""
    fused: tuple[str, str] = ("gate_up_proj", "down_proj")
    """The 3-D Parameters of transformers 5's fused experts module: ``[E, 2I, H]`` (gate rows, then up rows) and
    ``[E, H, I]``; PEFT reaches them through ``target_parameters``."""
    block: str = "mlp"
    """The MoE block's attribute under a decoder layer (its ``experts`` module sits below it)."""
    shared: tuple[str, ...] = ()
    """Shared-expert modules beside the routed experts (dense MLPs every token runs through)."""
    count_field: str = "num_experts"
    """The config field holding the routed-experts count."""
    served_fused: bool | None = None
    """Whether vLLM's class for this family reads expert LoRA in the fused form (its ``is_3d_moe_weight``):
    ``True`` fused, ``False`` per-expert, ``None`` not checked."""
    name_hints: tuple[str, ...] = ()
    """Words that, in a fused adapter's ``auto_mapping.base_model_class`` or ``base_model_name_or_path``
    (case-insensitive), choose this per-expert spelling when ``remap --experts per-expert`` writes it back."""


@dataclass(frozen=True)
class PeftMoeConversion:
    """PEFT's transformers-5 rewrite of a per-expert LoRA config and its keys to the fused experts
    (peft 0.21.2 ``utils/transformers_weight_conversion.py``: ``_MOE_TARGET_MODULE_MAPPING`` /
    ``_MOE_FUSED_TARGETS`` for the model type's conversion pattern, ``_convert_peft_config_moe`` at injection and
    ``build_peft_weight_mapping`` at load), as data."""

    renames: tuple[tuple[str, str], ...]
    """(old leaf, new target parameter) in PEFT's order: a ``target_modules`` entry equal to the old leaf or ending
    in ``.old`` leaves ``target_modules`` and adds the new name to ``target_parameters``."""
    fused: tuple[tuple[str, tuple[str, ...]], ...]
    """(fused parameter, its old leaves in order): all or none of them must be targeted; with all, the fused
    parameter's rank and alpha are the config's times their number (``rank_pattern`` / ``alpha_pattern``
    ``.*\\.<fused>``)."""


QWEN2_MOE_CONVERSION = PeftMoeConversion(
    renames=(
        ("gate", "gate.weight"),
        ("gate_proj", "gate_up_proj"),
        ("up_proj", "gate_up_proj"),
        ("down_proj", "down_proj"),
    ),
    fused=(("gate_up_proj", ("gate_proj", "up_proj")),),
)
"""PEFT's ``qwen2_moe`` entry, which transformers' ``_MODEL_TO_CONVERSION_PATTERN`` gives ``qwen3_moe`` and the
``qwen3_omni_moe*`` model types (transformers 5.24 ``conversion_mapping.py``: ``mlp.experts.*.gate_proj/up_proj``
→ ``mlp.experts.gate_up_proj`` by MergeModulelist(dim=0) + Concatenate(dim=1), ``mlp.experts.*.down_proj`` →
``mlp.experts.down_proj`` by MergeModulelist(dim=0))."""


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
    hint: str | None = None
    """A regex (``re.search``, any case) on a model name or path that names this layout's family; it breaks ties
    between layouts the keys fit equally."""
    forward_via: str | None = None
    """The attribute whose ``forward`` runs this model (the Omni wrapper has none of its own: ``thinker``); that
    submodule is a model of layout ``text_counterpart``."""
    counterpart_module: str | None = None
    """The attribute of this model that *is* its ``text_counterpart`` model (ModernBERT-MLM's ``model``): outputs
    of the two compare at that submodule."""
    move_words: dict[str, str] = field(default_factory=dict)
    """How a move from this layout to the named one reads in a finding (default: the VL/text wording)."""
    tiny: Tiny | None = None
    """The tiny reference config (``None``: no tiny model, e.g. a layout that exists only as adapter keys)."""
    no_tiny: str = ""
    """Why a layout without ``tiny`` has none (the layout × operation matrix prints it for its n/a cells)."""
    tree: Callable[[Mapping[str, object]], Any] | None = field(default=None, compare=False, repr=False)
    """The torch-free module-tree builder (``config.json`` dict → :class:`adapterdoc.layouts.trees.Tree`) for
    ``(model_type, model_class)``; ``None``: the meta device builds the model instead."""
    experts: Experts | None = None
    """How this layout's MoE blocks name their experts (``None``: not a mixture-of-experts model)."""
    load_conversion: bool = False
    """Whether transformers registers load-time renames for ``model_type`` (``transformers.conversion_mapping``),
    which PEFT's loader also applies to adapter keys."""
    peft_moe: PeftMoeConversion | None = None
    """PEFT's per-expert → fused config and key rewrite for ``model_type`` (``None``: PEFT has none for it)."""
    attention_layers: str = ""
    """Which decoder layers hold self-attention, as detection evidence from the layers an adapter's LoRA sits on:
    ``"hybrid"`` (some layers replace it, e.g. by linear attention: LoRA on layers with no ``self_attn`` LoRA while
    others have it, when no linear-attention LoRA already says so), ``"full"`` (every layer: ``self_attn`` LoRA on
    every layer that carries expert LoRA), ``""`` (no such evidence)."""

    @property
    def exclude_regex(self) -> str | None:
        return exclusion_regex(self.towers) if self.towers else None

    @property
    def is_vl(self) -> bool:
        """Whether the model carries a vision/audio tower or projector (served with its multimodal class)."""
        return any(t in MODALITY_SEGMENTS for t in self.towers)


@dataclass(frozen=True)
class Tiny:
    """A tiny reference config: the transformers config class and its keyword arguments, as plain data."""

    config_class: str
    kwargs: Callable[[], dict[str, object]]
    """Returns fresh keyword arguments for ``transformers.<config_class>(**kwargs)``."""


LAYOUTS: dict[str, Layout] = {}
"""Every layout by name, in the order the family modules register them (detection and listings follow it)."""
TREES: dict[tuple[str, str], Callable[[Mapping[str, object]], Any]] = {}
"""(``config.model_type``, model class) → module-tree builder, for every layout that has one."""
PEFT_MOE: dict[str, PeftMoeConversion] = {}
"""Model types among :data:`TREES` whose per-expert LoRA configs and keys PEFT rewrites to fused experts."""
LOAD_CONVERSIONS: set[str] = set()
"""Model types among :data:`TREES` with a ``transformers.conversion_mapping`` entry (transformers 5.24; pinned by
``tests/verify/test_expected_keys.py``)."""
_SMOKE: list[str] = []
EXPERT_SPELLINGS: list[Experts] = []
"""Every distinct expert naming: the registered layouts' and those known only from adapter keys
(:func:`register_experts`), in registration order."""


def register(*layouts: Layout, smoke: Sequence[str] = ()) -> None:
    """Add a family's layouts (in order) and its ``train-smoke --layout all`` entries (in run order)."""
    for layout in layouts:
        if layout.name in LAYOUTS:
            raise ValueError(f"layout {layout.name!r} is registered twice")
        if layout.tiny is None and not layout.no_tiny:
            raise ValueError(f"layout {layout.name!r} has no tiny config and no `no_tiny` reason")
        LAYOUTS[layout.name] = layout
        if layout.experts is not None:
            register_experts(layout.experts)
        if layout.tree is not None:
            TREES.setdefault((layout.model_type, layout.model_class), layout.tree)
            if layout.load_conversion:
                LOAD_CONVERSIONS.add(layout.model_type)
            if layout.peft_moe is not None:
                PEFT_MOE[layout.model_type] = layout.peft_moe
    for name in smoke:
        if name not in LAYOUTS or LAYOUTS[name].tiny is None:
            raise ValueError(f"smoke layout {name!r} is not a registered layout with a tiny config")
        _SMOKE.append(name)


def register_experts(*spellings: Experts) -> None:
    """Add expert namings (a family known only from its adapter keys registers its spelling here)."""
    for e in spellings:
        if e not in EXPERT_SPELLINGS:
            EXPERT_SPELLINGS.append(e)


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
    raw = set(module_paths)
    shapes = _shapes(raw)
    census = _layer_census(raw)
    if not shapes:
        return Detection("unknown", ("no LoRA modules",))
    scored: list[tuple[int, str, list[str]]] = []
    for layout in LAYOUTS.values():
        evidence: list[str] = []
        ok = True
        for rx in layout.requires:
            n = _count(rx, shapes)
            if not n:
                ok = False
                break
            evidence.append(f"{n} module(s) match /{rx}/")
        if not ok or any(_count(rx, shapes) for rx in layout.forbids):
            continue
        score = 10 * len(layout.requires)
        for rx, text in layout.signals:
            n = _count(rx, shapes)
            if n:
                score += 1
                evidence.append(f"{text}: {n} module(s)")
        pattern = census.get(layout.attention_layers)
        if pattern:
            score += 1
            evidence.append(pattern)
        scored.append((score, layout.name, evidence))
    if not scored:
        total = sum(shapes.values())
        return Detection(
            "unknown", (f"{total} module(s); no registry layout matches, e.g. {next(iter(shapes))}",)
        )
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


_LAYER = re.compile(r"^(?:thinker\.)?(?:model\.)?(?:language_model\.)?layers\.(\d+)\.(.+)$")


def _layer_census(module_paths: Iterable[str]) -> dict[str, str]:
    """The self-attention pattern the decoder layers' LoRA shows (tower modules left out), as evidence text by
    :attr:`Layout.attention_layers` value: ``hybrid`` when some layers carry LoRA but no ``self_attn`` LoRA while
    others carry ``self_attn`` LoRA (and no ``linear_attn`` LoRA is there to say so itself), ``full`` when
    every layer with expert LoRA also carries ``self_attn`` LoRA."""
    lora: set[int] = set()
    attn: set[int] = set()
    experts: set[int] = set()
    linear = False
    for path in module_paths:
        m = _LAYER.match(path)
        if m is None or tower_segment(path) is not None:
            continue
        digits, rest = m.groups()
        layer = int(digits)
        lora.add(layer)
        if rest.startswith("self_attn."):
            attn.add(layer)
        elif rest.startswith("linear_attn."):
            linear = True
        elif rest.startswith("mlp.experts"):
            experts.add(layer)
    out: dict[str, str] = {}
    if attn and lora - attn and not linear:
        out["hybrid"] = (
            f"{len(lora - attn)} of {len(lora)} decoder layers carry LoRA but no self-attention LoRA "
            "(hybrid attention: the others are linear-attention layers)"
        )
    if experts and experts <= attn:
        out["full"] = (
            f"self-attention LoRA on all {len(experts)} decoder layers with expert LoRA (full attention)"
        )
    return out


def _hint_matches(layout: Layout, hint: str) -> bool:
    if hint.startswith("tiny:"):  # adapters trained on adapterdoc's tiny reference models name their layout
        return hint[len("tiny:") :] == layout.name
    if re.fullmatch(r"[A-Za-z0-9_]+For[A-Za-z]+|[A-Za-z0-9_]+Model", hint):  # a class name (auto_mapping)
        return hint == layout.model_class
    return bool(layout.hint and re.search(layout.hint, hint, re.IGNORECASE))


_INDEX = re.compile(r"\.\d+(?=\.|$)")
"""A numeric segment with the dot before it (replaced by ``.0``)."""


def _shapes(module_paths: Iterable[str]) -> dict[str, int]:
    """Module paths with layer/expert indices replaced by ``0``, sorted, each with how many distinct paths it
    stands for: detection cost stays O(distinct shapes)."""
    counts: dict[str, int] = {}
    for p in set(module_paths):
        key = _INDEX.sub(".0", p)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def _count(rx: str, shapes: dict[str, int]) -> int:
    """How many module paths ``rx`` finds (each shape counts for the paths it stands for)."""
    pattern = re.compile(rx)
    return sum(n for shape, n in shapes.items() if pattern.search(shape))


_TOWERS: dict[int, frozenset[str]] = {}
""":func:`all_tower_segments` per registry size (a registration makes a new entry; lookups cost nothing)."""


def all_tower_segments() -> frozenset[str]:
    """Every segment that must never carry LoRA: :data:`TOWER_SEGMENTS` and every layout's towers."""
    n = len(LAYOUTS)
    towers = _TOWERS.get(n)
    if towers is None:
        towers = _TOWERS[n] = frozenset(
            (*TOWER_SEGMENTS, *(t for lay in LAYOUTS.values() for t in lay.towers))
        )
    return towers


def tower_segment(module_path: str) -> str | None:
    """The tower/projector/talker segment a module path runs through, if any."""
    towers = all_tower_segments()
    for seg in module_path.split("."):
        if seg in towers:
            return seg
    return None


def tower_probes(segment: str) -> tuple[str, ...]:
    """Module paths a tower ``segment`` sits at in the registry's layouts (bare, under ``model.``, under a
    forward-routing wrapper's ``<attr>.model.``): an ``exclude_modules`` regex that matches them all already
    excludes that tower."""
    prefixes = ["", "model."]
    for lay in LAYOUTS.values():
        if lay.forward_via and f"{lay.forward_via}.model." not in prefixes:
            prefixes.append(f"{lay.forward_via}.model.")
    return tuple(f"{p}{segment}.x" for p in prefixes)


# ------------------------------------------------------------------------------------------- forward routing


def forward_layout(name: str) -> str:
    """The layout of the module that runs ``name``'s forward (the Omni wrapper's: its thinker's), else ``name``."""
    lay = LAYOUTS[name]
    return lay.text_counterpart if lay.forward_via and lay.text_counterpart else name


def forward_module(model: nn.Module) -> nn.Module:
    """The module whose forward runs ``model`` (its ``thinker`` for the Omni wrapper), else ``model`` itself."""
    for attr in dict.fromkeys(lay.forward_via for lay in LAYOUTS.values() if lay.forward_via):
        inner: nn.Module | None = getattr(model, attr, None)
        if inner is not None:
            return inner
    return model


# ----------------------------------------------------------------------------------------------- tiny models


def tiny_layouts() -> tuple[str, ...]:
    """The layouts with a tiny reference config, in registry order."""
    return tuple(name for name, lay in LAYOUTS.items() if lay.tiny is not None)


def smoke_layouts() -> tuple[str, ...]:
    """The layouts ``train-smoke --layout all`` runs: every VL/wrapper layout and both encoders, in the order the
    family modules list them."""
    return tuple(_SMOKE)
