"""A base model's quantization as ``inspect`` and ``verify`` show it: its JSON object and its one-line text."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapterdoc.quant import Geometry, Quantization


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
    """The scheme with its geometry, e.g. ``gptq (4-bit, group 32, symmetric)``."""
    geo = geometry_text(q.geometry)
    if not geo and q.modules and q.geometry is None:
        geo = "geometry differs between modules"
    return f"{q.scheme} ({geo})" if geo else q.scheme


def quantization_dict(q: Quantization) -> dict[str, object]:
    """The JSON object of a quantized base: scheme, method, format, geometry, module count, the tensor suffixes
    that store them, the modules stored unquantized, the config's ignore list and the notes."""
    geometry: dict[str, object] | None = None
    if q.geometry is not None:
        g = q.geometry
        geometry = {
            "bits": g.bits,
            "group_size": g.group_size,
            "block_size": None if g.block_size is None else list(g.block_size),
            "strategy": g.strategy,
            "symmetric": g.symmetric,
            "desc_act": g.desc_act,
            "double_quant": g.double_quant,
        }
    return {
        "scheme": q.scheme,
        "method": q.method,
        "format": q.format,
        "geometry": geometry,
        "modules": len(q.modules),
        "expert_modules": sum(1 for m in q.modules if m.experts is not None),
        "tensors": sorted({suffix for m in q.modules for suffix in m.tensors}),
        "unquantized": list(q.unquantized),
        "ignore": list(q.ignore),
        "notes": list(q.notes),
    }
