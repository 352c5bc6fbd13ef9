"""What SGLang does with an adapter's tensor names, torch-free: where each tensor goes (``_process_weight``), the
renames it makes per decoder layer (``_normalize_weights``) and which server target each name then matches
(``get_target_module_name``), ported on names only from SGLang's ``python/sglang/srt/lora/lora.py`` and
``utils.py`` (the release in :data:`adapterdoc.engines.sglang.SGLANG_VERSION`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

LAYER_ID = re.compile(r"layers\.(\d+)\.")
"""``get_layer_id`` (srt/layers/utils/common.py)."""

NAME_MAP = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "out_proj": "out_proj",
    "embed_tokens": "embed_tokens",
    "vocab_emb": "embed_tokens",
    "embeddings": "embed_tokens",
    "word_embeddings": "embed_tokens",
    "lm_head": "lm_head",
    "output": "lm_head",
    "unembed_tokens": "lm_head",
    "q_a_proj": "fused_qkv_a_proj_with_mqa",
    "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa",
    "wq_b": "indexer.wq_b",
    "wk": "indexer.wk",
    "weights_proj": "indexer.weights_proj",
}
"""``params_mapping`` of ``get_normalized_target_modules`` (utils.py)."""

KNOWN_TARGETS = frozenset(
    {
        "qkv_proj",
        "qkvr",
        "o_proj",
        "wo_ud",
        "out_proj",
        "in_proj",
        "in_proj_qkvz",
        "up_proj",
        "gate_up_proj",
        "down_proj",
        "fc1_latent_proj",
        "fc2_latent_proj",
        "embed_tokens",
        "lm_head",
        "fused_qkv_a_proj_with_mqa",
        "q_b_proj",
        "kv_b_proj",
        "indexer.wq_b",
        "indexer.wk",
        "indexer.weights_proj",
    }
)
"""``_KNOWN_LORA_TARGET_MODULES`` (utils.py): the normalised modules the memory pool can size."""

SERVER_CHOICES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "q_a_proj",
    "kv_a_proj_with_mqa",
    "q_b_proj",
    "kv_b_proj",
    "wq_b",
    "wk",
    "weights_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
    "embed_tokens",
    "lm_head",
    "qkvr",
    "wo_ud",
)
"""``SUPPORTED_LORA_TARGET_MODULES`` (srt/utils/common.py): ``--lora-target-modules`` choices, besides ``all``."""

EMBEDDING_NAMES = ("embed_tokens", "lm_head")


class RegexTargets(ValueError):
    """``target_modules`` is a string other than ``all`` / ``all-linear``."""


def normalize_targets(target_modules: str | Iterable[str]) -> set[str]:
    """``get_normalized_target_modules``: leaf names through :data:`NAME_MAP`; ``{"all"}`` for the shorthands."""
    if isinstance(target_modules, str):
        if target_modules not in ("all", "all-linear"):
            raise RegexTargets(target_modules)
        return {"all"}
    return {NAME_MAP.get(name.split(".")[-1], name.split(".")[-1]) for name in target_modules}


def target_of(name: str, targets: Iterable[str]) -> str | None:
    """``get_target_module_name``: the longest target that is a substring of ``name`` (``None``: no match)."""
    best = None
    for t in targets:
        if t in name and (best is None or len(t) > len(best)):
            best = t
    return best


@dataclass(frozen=True)
class Loaded:
    """Where SGLang puts an adapter's tensors: ``layers`` maps each layer to its names after SGLang's renames
    (new name → the original keys it came from)."""

    layers: Mapping[int, Mapping[str, list[str]]]
    embedding: tuple[str, ...]
    untargeted_embedding: tuple[str, ...]
    """``embed_tokens`` / ``lm_head`` tensors outside the layers whose module the adapter does not target."""
    dropped: tuple[str, ...]
    """Tensors outside the layers that are neither: dropped without a log line."""
    qkv_key_error: tuple[str, ...]
    """q_proj keys whose v_proj (or k_proj, when some k_proj exists) is absent: ``normalize_qkv_proj`` KeyError."""


def load(keys: Iterable[str], adapter_targets: set[str]) -> Loaded:
    """``_process_weight`` then ``_normalize_weights`` on names only."""
    layers: dict[int, dict[str, list[str]]] = {}
    embedding: list[str] = []
    untargeted: list[str] = []
    dropped: list[str] = []
    for key in keys:
        name = key.replace("unembed_tokens", "lm_head") if "unembed_tokens" in key else key
        m = LAYER_ID.search(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[name] = [key]
        elif "embed_tokens" in name or "lm_head" in name:
            module = "embed_tokens" if "embed_tokens" in name else "lm_head"
            if "all" in adapter_targets or module in adapter_targets:
                embedding.append(key)
            else:
                untargeted.append(key)
        elif "input_embeddings" in name or "output_embeddings" in name:
            embedding.append(key)
        else:
            dropped.append(key)
    key_errors: list[str] = []
    for names in layers.values():
        _normalize(names, key_errors)
    return Loaded(layers, tuple(embedding), tuple(untargeted), tuple(dropped), tuple(key_errors))


def _move(names: dict[str, list[str]], new: str, *olds: str) -> None:
    origin = [k for old in olds for k in names.pop(old)]
    names[new] = names.get(new, []) + origin


def _normalize(names: dict[str, list[str]], key_errors: list[str]) -> None:
    _qkv(names, key_errors)
    for name in list(names):  # _rename_expert_w_to_proj
        for old, new in ((".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj.")):
            if old in name:
                _move(names, name.replace(old, new), name)
                break
    for name in list(names):  # _normalize_in_proj (Mamba: gate_proj + x_proj)
        x = name.replace("gate_proj", "x_proj")
        if "gate_proj" in name and x in names:
            _move(names, name.replace("gate_proj", "in_proj"), name, x)
    for name in list(names):  # _normalize_in_proj_qkvz (GDN)
        if "in_proj_q." in name and name in names:
            parts = [name.replace("in_proj_q", f"in_proj_{p}") for p in "kvz"]
            if all(p in names for p in parts):
                _move(names, name.replace("in_proj_q", "in_proj_qkvz"), name, *parts)
    for name in list(names):  # normalize_gate_up_proj
        if "gate_proj" in name:
            up = name.replace("gate_proj", "up_proj")
            _move(names, name.replace("gate_proj", "gate_up_proj"), name, *([up] if up in names else []))
    for name in list(names):  # normalize_fused_qkv_a_proj
        if "q_a_proj" in name and "fused_qkv_a_proj_with_mqa" not in name:
            kv = name.replace("q_a_proj", "kv_a_proj_with_mqa")
            fused = name.replace("q_a_proj", "fused_qkv_a_proj_with_mqa")
            _move(names, fused, name, *([kv] if kv in names else []))


def _qkv(names: dict[str, list[str]], key_errors: list[str]) -> None:
    """``normalize_qkv_proj``: every q_proj weight takes its k_proj (zeros shaped like v_proj when no k_proj is
    targeted in the layer) and its v_proj, which must exist."""
    present = {p for p in ("k_proj", "q_proj", "v_proj") if any(p in n for n in names)}
    for name in list(names):
        if "q_proj" not in name or name not in names:
            continue
        k, v = name.replace("q_proj", "k_proj"), name.replace("q_proj", "v_proj")
        if v not in names or ("k_proj" in present and k not in names):
            key_errors.extend(names[name])
            continue
        _move(names, name.replace("q_proj", "qkv_proj"), name, *([k] if "k_proj" in present else []), v)


def missing_partners(factors: Mapping[str, object]) -> dict[str, str]:
    """The partners ``normalize_qkv_proj`` / ``normalize_gate_up_proj`` need and an adapter's LoRA ``factors`` (module
    paths, no wrapper) lack, each with the module it copies dtype and key spelling from: a ``q_proj`` needs its
    ``v_proj`` (a KeyError otherwise) and its ``k_proj`` when the layer has any; a ``k_proj`` / ``v_proj`` without
    ``q_proj`` and an ``up_proj`` without ``gate_proj`` are never stacked (skipped). Decoder layers only (no
    experts, no towers)."""
    from adapterdoc.engines.zero_lora import LAYER
    from adapterdoc.layouts import tower_segment

    parents: dict[str, dict[str, str]] = {}
    k_in_layer: set[str] = set()
    for module in factors:
        parent, _, leaf = module.rpartition(".")
        m = LAYER.search(module)
        if m is None or ".experts." in module or tower_segment(module) is not None:
            continue
        if leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            parents.setdefault(parent, {})[leaf] = module
            if leaf == "k_proj":
                k_in_layer.add(m.group(1))
    missing: dict[str, str] = {}
    for parent, leaves in sorted(parents.items()):
        found = LAYER.search(parent + ".")
        like = next(iter(leaves.values()))
        if leaves.keys() & {"q_proj", "k_proj", "v_proj"}:
            need = {"q_proj", "v_proj"} | ({"k_proj"} if found and found.group(1) in k_in_layer else set())
            for leaf in sorted(need - leaves.keys()):
                missing[f"{parent}.{leaf}"] = leaves.get("q_proj", like)
        if "up_proj" in leaves and "gate_proj" not in leaves:
            missing[f"{parent}.gate_proj"] = leaves["up_proj"]
    return missing
