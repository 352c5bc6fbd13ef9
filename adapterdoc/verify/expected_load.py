"""PEFT's load-time renaming of adapter keys (``convert_peft_adapter_state_dict_for_transformers``), torch-free.

On a model type with a transformers load-time conversion, ``PeftModel.load_adapter`` puts every ``.lora_`` key
through transformers' renamings (PEFT's own prefix and adapter-name renamings first, then the model's: the
``PrefixChange`` that maps a VL adapter's ``model.language_model.`` onto a text model's ``model.``, the llava-style
moves, ...), undoes a renaming that only dropped a prefix, and serializes the result back to PEFT's saved naming.
The renamings are data (:data:`adapterdoc.layouts.load_conversions.LOAD_RENAMES`, generated from the installed
transformers and PEFT); this module applies them as ``WeightTransform.rename_source_key`` does. Keys a
``WeightConverter`` (per-expert → fused) would take are left to :func:`adapterdoc.verify.expected_moe.convert_keys`;
anything less regular (two keys renamed onto one, a key both renamed and converted) is :class:`KeysUnmodeled`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import TypeVar

from adapterdoc.layouts.load_conversions import LOAD_RENAMES
from adapterdoc.verify.expected_config import KeysUnmodeled

ADAPTER = "default"

S = TypeVar("S")
"""What a key maps to (a shape, a tensor): carried through unchanged."""
Row = tuple[str, re.Pattern[str], tuple[str, ...], Mapping[str, int], str | None, str | None]
"""One compiled row of :data:`~adapterdoc.layouts.load_conversions.LOAD_RENAMES`: (kind, the source pattern,
targets, groups, scope, base-model prefix)."""


@cache
def _compiled(model_type: str, model_class: str) -> tuple[str, tuple[Row, ...]] | None:
    entry = LOAD_RENAMES.get((model_type, model_class))
    if entry is None:
        return None
    prefix, rows = entry
    return prefix, tuple(
        (kind, re.compile(rx), targets, groups, scope, bmp) for kind, rx, targets, groups, scope, bmp in rows
    )


def has_renames(model_type: str, model_class: str) -> bool:
    return (model_type, model_class) in LOAD_RENAMES


def _rename(row: Row, key: str) -> tuple[str, bool]:
    """``WeightTransform.rename_source_key``: (the renamed key, whether the transform matched)."""
    _, rx, targets, groups, scope, bmp = row
    to_match, prefix = key, None
    if scope is not None:
        scope_dot = f"{scope}." if scope != "" else ""
        bmp_dot = f"{bmp}." if bmp != "" else ""
        if key.startswith(bmp_dot + scope_dot):
            prefix = bmp_dot + scope_dot
        elif key.startswith(scope_dot):
            prefix = scope_dot
        else:
            return key, False
        to_match = key.removeprefix(prefix)
    m = rx.search(to_match)
    if m is None:
        return key, False
    group = next(name for name, val in m.groupdict().items() if val is not None)
    replacement = targets[0]
    if r"\1" in replacement:
        replacement = replacement.replace(r"\1", m.group(groups[group] + 1))
    renamed = to_match.replace(m.group(0), replacement, 1)
    return (prefix + renamed if prefix is not None else renamed), True


def _serialized(key: str) -> str:
    """``_convert_to_peft_serialized_keys``: PEFT's saved naming of a model key."""
    if not key.startswith("base_model."):
        key = f"base_model.model.{key}"
    suffix = f".{ADAPTER}"
    if key.endswith(suffix):
        return key.removesuffix(suffix)
    head, dot, tail = key.rpartition(".")
    if dot and head.endswith(suffix):
        return f"{head.removesuffix(suffix)}.{tail}"
    return key


def load_rename(model_type: str, model_class: str, shapes: Mapping[str, S]) -> dict[str, S]:
    """``shapes`` with its keys as PEFT's loader names them before matching (unchanged where the model type has
    no conversion); keys a converter takes keep their renamed-only names for the expert conversion."""
    compiled = _compiled(model_type, model_class)
    if compiled is None:
        return dict(shapes)
    base_prefix, rows = compiled
    renamings = [r for r in rows if r[0] == "rename"]
    converters = [r for r in rows if r[0] == "convert"]
    out: dict[str, S] = {k: v for k, v in shapes.items() if ".lora_" not in k}
    taken: dict[str, str] = {}
    for original in sorted((k for k in shapes if ".lora_" in k), key=_natural):
        renamed = original
        for row in renamings:
            renamed = _rename(row, renamed)[0]
        converted = any(_rename(row, renamed)[1] for row in converters)
        if renamed not in shapes and original.endswith(_rreplace(renamed)):
            renamed = _prefix_fix(original, base_prefix, shapes)
            converted = False
        final = _serialized(renamed)
        if converted and final != original:
            raise KeysUnmodeled(f"`{original}` is renamed by PEFT's load-time conversion and then fused")
        if final in taken:
            raise KeysUnmodeled(f"`{original}` and `{taken[final]}` are both renamed to `{final}` at load")
        taken[final] = original
        out[final] = shapes[original]
    return out


def _rreplace(key: str) -> str:
    """``str_rreplace(key, ".default", "", count=1)``."""
    return "".join(key.rsplit(f".{ADAPTER}", 1))


def _prefix_fix(key: str, prefix: str, shapes: Mapping[str, object]) -> str:
    """``rename_source_key(key, [], [], prefix, adapter_state_dict)``: add or strip the base-model prefix."""
    if not prefix:
        return key
    stripped = re.sub(f"^{prefix}.", "", key, count=1)
    if key.startswith(prefix) and shapes.get(stripped) is not None:
        return stripped
    if shapes.get(f"{prefix}.{key}") is not None:
        return f"{prefix}.{key}"
    return key


def _natural(key: str) -> list[tuple[int, int | str]]:
    """transformers' ``dot_natural_key``: dotted parts, numbers as numbers."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in key.split(".")]


__all__ = ["has_renames", "load_rename"]
