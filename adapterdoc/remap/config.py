"""The new adapter_config.json of a remap: the rewritten module fields (:mod:`adapterdoc.remap.rewriter`), PEFT's
``auto_mapping`` pointed at the target layout's class, serialised the way the original file was written."""

from __future__ import annotations

import json
from dataclasses import dataclass

from adapterdoc.adapter import LoraKey, fused_expert_owner
from adapterdoc.checkpoint import Checkpoint
from adapterdoc.layouts import LAYOUTS, remap_path
from adapterdoc.remap.moves import RemapMove, detect
from adapterdoc.remap.rewriter import ConfigRewriter
from adapterdoc.report.remap_report import ConfigChange


@dataclass(frozen=True)
class ConfigPlan:
    """adapter_config.json after a remap: its path, its new bytes (``None``: unchanged), the changes and notes."""

    path: str | None = None
    data: bytes | None = None
    changes: tuple[ConfigChange, ...] = ()
    notes: tuple[str, ...] = ()


def plan_config(
    ckpt: Checkpoint,
    move: RemapMove,
    module_map: dict[str, str],
    parsed: list[LoraKey],
    *,
    keep_original: bool,
) -> ConfigPlan:
    """adapter_config.json's new bytes: ``None`` when nothing changes, unless ``keep_original`` (``--out``: the
    original bytes then)."""
    cfg = ckpt.adapter_config
    if cfg is None or cfg.path is None:
        return ConfigPlan()
    with open(cfg.path, "rb") as f:
        original = f.read()
    raw = json.loads(original.decode("utf-8"))
    if not isinstance(raw, dict):
        return ConfigPlan(cfg.path)
    lora_pairs, full_pairs = _pairs(parsed, module_map)
    changes = ConfigRewriter(move, module_map, lora_pairs, full_pairs).rewrite(raw)
    notes: tuple[str, ...] = ()
    if module_map:
        auto, notes = _auto_mapping_change(raw, move, lora_pairs)
        changes += auto
    if not changes:
        return ConfigPlan(cfg.path, original if keep_original else None, (), notes)
    return ConfigPlan(cfg.path, dump_like(raw, original), tuple(changes), notes)


def _auto_mapping_change(
    raw: dict[str, object], move: RemapMove, lora_pairs: list[tuple[str, str]]
) -> tuple[list[ConfigChange], tuple[str, ...]]:
    """PEFT's ``auto_mapping`` names the class the adapter was made for (``AutoPeftModel`` builds it from
    ``parent_library``): point it at the target layout's class when it names the source layout's, from the
    registry. A class the registry does not know is kept, with a note."""
    auto = raw.get("auto_mapping")
    if not isinstance(auto, dict) or not isinstance(auto.get("base_model_class"), str):
        return [], ()
    source, target = move.source, move.target
    if move.mode == "rule" or source is None:
        source, target = _rule_layouts(auto["base_model_class"], lora_pairs)
    if source not in LAYOUTS or target not in LAYOUTS:
        return [], ()
    src, dst = LAYOUTS[source], LAYOUTS[target]
    cls = auto["base_model_class"]
    if cls == dst.model_class:
        return [], ()
    if cls != src.model_class:
        note = (
            f"adapter_config.json auto_mapping names {cls}, which is not {source}'s class (kept): "
            f"AutoPeftModel.from_pretrained would build that class; load the {dst.model_class} base yourself "
            "and use PeftModel.from_pretrained"
        )
        return [], (note,)
    old = dict(auto)
    auto["base_model_class"] = dst.model_class
    if "parent_library" in auto:  # PEFT writes both; a hand-made mapping without it keeps its shape
        auto["parent_library"] = dst.model_module
    return [ConfigChange("auto_mapping", old, dict(auto), "class")], ()


def _rule_layouts(cls: str, lora_pairs: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    """For ``--rule`` (and an undetected ``--vl``): the source layout from the old module paths (the class
    breaks ties), the target from the new ones; a target must be reachable from the source in the registry
    (ties go to the source's family)."""
    before = detect([m for m, _ in lora_pairs], [cls])
    if before.name not in LAYOUTS:
        return None, None
    after = detect([n for _, n in lora_pairs], None)
    cands = [after.name] if after.name in LAYOUTS else list(after.candidates)
    if before.name in cands:  # the new names still fit the source layout: the class stays
        return before.name, None
    cands = [c for c in cands if remap_path(before.name, c) is not None]
    family = [c for c in cands if LAYOUTS[c].family == LAYOUTS[before.name].family]
    cands = family or cands
    if len({LAYOUTS[c].model_class for c in cands}) != 1:
        return before.name, None
    return before.name, cands[0]


def _pairs(
    parsed: list[LoraKey], module_map: dict[str, str]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(old, new) module pairs: LoRA targets (fused-expert wrappers collapsed) and whole-weight modules."""
    lora: dict[str, str] = {}
    full: dict[str, str] = {}
    for k in parsed:
        if k.role == "full":
            full.setdefault(k.module, module_map.get(k.module, k.module))
        elif k.is_lora and k.module not in lora:
            m = fused_expert_owner(k.module)
            lora.setdefault(m, module_map.get(m, m))
    return sorted(lora.items()), sorted(full.items())


def dump_like(raw: dict[str, object], original: bytes) -> bytes:
    """Serialise ``raw`` the way ``original`` was written (indent, ASCII escapes, final newline)."""
    text = original.decode("utf-8")
    lines = text.splitlines()
    indent: int | None = None
    if len(lines) > 1:
        second = lines[1]
        indent = len(second) - len(second.lstrip(" ")) or None
    ascii_only = text.isascii()
    out = json.dumps(raw, indent=indent, ensure_ascii=ascii_only)
    if text.endswith("\n"):
        out += "\n"
    return out.encode("utf-8")
