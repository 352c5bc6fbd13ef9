"""A base's quantization in words, the one spelling ``inspect``, ``verify``, ``verify --load`` and ``merge`` use:
``gptq (4-bit, group 128, symmetric)``; a method adapterdoc does not read is named as the config writes it."""

from __future__ import annotations

from adapterdoc.quant.schemes import UNKNOWN, Geometry, Quantization


def geometry_text(g: Geometry | None) -> str:
    """The geometry in words, e.g. ``4-bit, group 128, symmetric`` (empty when unknown)."""
    if g is None:
        return ""
    parts: list[str] = []
    if g.bits is not None:
        parts.append(f"{g.bits}-bit")
    if g.block_size is not None:
        parts.append(f"block {g.block_size[0]}×{g.block_size[1]}")
    if g.group_size is not None:
        parts.append(f"group {g.group_size}")
    if g.strategy is not None and g.strategy not in ("block", "group"):
        parts.append(f"per {g.strategy}")
    if g.symmetric is not None:
        parts.append("symmetric" if g.symmetric else "asymmetric")
    if g.desc_act:
        parts.append("act-order")
    if g.double_quant:
        parts.append("double quant")
    return ", ".join(parts)


def scheme_text(q: Quantization) -> str:
    """The scheme with its geometry, e.g. ``gptq (4-bit, group 32, symmetric)``; ``quant_method 'hqq'`` for a method
    adapterdoc does not read."""
    if q.scheme == UNKNOWN and q.method:
        return f"quant_method {q.method!r}"
    geo = geometry_text(q.geometry)
    if not geo and q.modules and q.geometry is None:
        geo = "geometry differs between modules"
    return f"{q.scheme} ({geo})" if geo else q.scheme
