"""A base model's quantization as ``inspect --json`` shows it (its words: :mod:`adapterdoc.quant.text`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapterdoc.quant import Quantization


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
