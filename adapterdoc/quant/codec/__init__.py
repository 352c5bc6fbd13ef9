"""Decode and encode the weights of a quantized base, bit for bit as each format's own library does (torch).

One module per family of formats: :mod:`~adapterdoc.quant.codec.fp8` (block FP8 as transformers and DeepSeek write
it, compressed-tensors FP8), :mod:`~adapterdoc.quant.codec.packed_int` (compressed-tensors W4A16, GPTQ, AWQ),
:mod:`~adapterdoc.quant.codec.bnb` (bitsandbytes NF4/FP4/int8), :mod:`~adapterdoc.quant.codec.fp4` (compressed-tensors
NVFP4, MXFP4). Each exports ``decode(module, tensors) -> Decoded`` and ``encode(module, weight, tensors) -> dict``
(raising :class:`NotWritable` where adapterdoc cannot quantize as the library does).

``tensors`` maps each of the module's suffixes (:attr:`QuantizedModule.tensors`, e.g. ``.weight`` and
``.weight_scale_inv``) to the tensor as stored in the file (its on-disk dtype and shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from adapterdoc.quant import schemes

if TYPE_CHECKING:
    import torch

    from adapterdoc.quant.schemes import QuantizedModule


@dataclass(frozen=True)
class Decoded:
    """A quantized weight decoded."""

    values: torch.Tensor
    """float32, the logical weight as an unquantized checkpoint stores it (``(out, in)``; a stacked expert
    parameter as its bf16 checkpoint stores it), equal bit for bit to the library's dequantization computed in
    float32."""
    codes: torch.Tensor
    """One integer code per weight (unpacked), the same shape as ``values``."""
    step: torch.Tensor
    """float32, the local quantization step at each weight: the gap between the two representable values around
    it under its own scales (for a non-uniform grid, the mean of the gaps below and above). Same shape."""


class NotWritable(Exception):
    """adapterdoc cannot quantize this module as its library would; the message says why, in one sentence."""


def decode(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded:
    """``module``'s weight decoded from its stored ``tensors`` (suffix → tensor), its values as
    :func:`values` gives them."""
    decoded = _codec(module.scheme).decode(module, tensors)
    return replace(decoded, values=_as_library(module, tensors, decoded.values))


def values(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``module``'s weight alone, float32, equal to what its library's dequantization returns: computed in float32
    and rounded to the dtype the library computes in where that is narrower (:func:`library_dtype`)."""
    return _as_library(module, tensors, _codec(module.scheme).values(module, tensors))


def library_dtype(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The dtype the format's reference dequantization returns, whatever dtype the model is loaded in:
    compressed-tensors computes in the scale's dtype (NVFP4 in bf16, its unpacking dtype), GPTQ and AWQ in the
    scales' dtype (fp16), bitsandbytes 4-bit in its quant_state's dtype, transformers' MXFP4 in bf16; block FP8 and
    bitsandbytes int8 in float32."""
    import torch

    scheme = module.scheme
    if scheme in (schemes.CT_FP8, schemes.CT_W4A16) and ".weight_scale" in tensors:
        return tensors[".weight_scale"].dtype
    if scheme in (schemes.CT_NVFP4, schemes.MXFP4):
        return torch.bfloat16
    if scheme in (schemes.GPTQ, schemes.AWQ) and ".scales" in tensors:
        return tensors[".scales"].dtype
    if scheme in (schemes.BNB_NF4, schemes.BNB_FP4):
        from adapterdoc.quant.codec.bnb import quant_state

        name = quant_state(tensors)[1].get("dtype")
        found = getattr(torch, name, None) if isinstance(name, str) else None
        return found if isinstance(found, torch.dtype) else torch.float32
    return torch.float32


def _as_library(
    module: QuantizedModule, tensors: Mapping[str, torch.Tensor], v: torch.Tensor
) -> torch.Tensor:
    import torch

    dtype = library_dtype(module, tensors)
    return v if dtype == torch.float32 else v.to(dtype).to(torch.float32)


def encode(
    module: QuantizedModule, weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``weight`` (float32, the logical shape :func:`decode` returns) quantized in ``module``'s format and geometry as
    its library quantizes a weight (its rounding, its rule for fresh scales), one tensor per suffix of
    ``module.tensors`` (same dtypes and shapes as ``tensors``, the stored originals, which give what is kept:
    ``g_idx``, ``weight_shape``, a quant_state's JSON). Raises :class:`NotWritable`."""
    out = _codec(module.scheme).encode(module, weight, tensors)
    kept = {
        s: tensors[s].clone() for s in module.tensors if s in tensors and s not in out
    }  # e.g. MXFP4 `_bias`
    return {**kept, **out}


class _Codec(Protocol):
    """What each family module provides."""

    def decode(self, module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded: ...

    def values(self, module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor: ...

    def encode(
        self, module: QuantizedModule, weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]: ...


def _codec(scheme: str) -> _Codec:
    if scheme in (schemes.FP8_BLOCK, schemes.CT_FP8):
        from adapterdoc.quant.codec import fp8

        return fp8
    if scheme in (schemes.CT_W4A16, schemes.GPTQ, schemes.AWQ):
        from adapterdoc.quant.codec import packed_int

        return packed_int
    if scheme in (schemes.BNB_NF4, schemes.BNB_FP4, schemes.BNB_INT8):
        from adapterdoc.quant.codec import bnb

        return bnb
    if scheme in (schemes.CT_NVFP4, schemes.MXFP4):
        from adapterdoc.quant.codec import fp4

        return fp4
    raise NotWritable(f"adapterdoc cannot decode {scheme} weights")
