"""Integer codes packed into int32 words: compressed-tensors ``pack-quantized`` (W4A16), GPTQ (v1 checkpoint
format) and AWQ GEMM, decoded and encoded as their libraries do.

Decoding follows each reference's arithmetic: compressed-tensors ``_dequantize`` (``(q − zero) · scale``, q the
signed code), gptqmodel ``PackableQuantLinear.dequantize_weight`` after ``convert_gptq_v1_to_v2_format_module``
(``scales[g_idx] · (q − zeros[g_idx])``), AutoAWQ ``packing_utils.dequantize_gemm`` (``(q − zeros) · scales``).
The libraries compute in the scales' dtype (bf16 / fp16); a code difference has at most 9 significant bits and a
scale at most 24, so the float32 product is exact and its cast to that dtype is the library's result.
``Decoded.codes`` are the unsigned fields as packed (compressed-tensors stores ``q + 2^(bits−1)``);
``Decoded.step`` is the scale (the grid is uniform).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from adapterdoc.quant import schemes
from adapterdoc.quant.codec import Decoded, NotWritable
from adapterdoc.quant.schemes import QuantizedModule

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ GEMM: field ``i`` of a word holds column ``8k + AWQ_ORDER[i]``."""
GPTQ_V1_OFFSET = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}
"""gptqmodel ``convert_gptq_v1_to_v2_format_module``: added to each int32 qzeros word (carries included)."""
PACKABLE_BITS = (1, 2, 4, 8)
"""Bit widths whose fields never straddle a word (compressed-tensors' dense packing and the old layout agree)."""


def decode(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded:
    """``module``'s packed integer weight decoded (see the module docstring)."""
    if module.scheme == schemes.CT_W4A16:
        return _ct_decode(module, tensors)
    if module.scheme == schemes.GPTQ:
        return _gptq_decode(module, tensors)
    if module.scheme == schemes.AWQ:
        return _awq_decode(module, tensors)
    raise NotWritable(f"{module.path}: {module.scheme} is not a packed integer scheme")


def encode(
    module: QuantizedModule, weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``weight`` quantized as the library quantizes it.

    compressed-tensors W4A16 (4 bits shown; ``2^(bits−1)`` in general): fresh scales, as it quantizes a model (in the model's dtype, the dtype it stores the
    scales in): ``calculate_qparams`` on each group's min and max in float32 (symmetric ``scale = max(|min|,
    |max|) / 7.5``; asymmetric ``scale = (max − min) / 15``, ``zero = round(clamp(−8 − min / scale))``; float32
    eps for a zero scale), cast to the scale dtype; then ``quantize``: ``round(clamp(W / scale + zero, −8, 7))``,
    packed by ``pack_to_int32`` (``q + 8``, field ``j`` of a word at bits ``4j``); ``weight_shape`` kept.

    GPTQ and AWQ: their scales come from calibration (GPTQ's Hessian updates, AWQ's activation search) that cannot
    run here, so the stored ``scales``, zeros and ``g_idx`` are kept and the new weight is rounded onto that grid as
    the libraries' ``pack`` does given those qparams: ``round((W + zero · scale) / scale)`` clamped to
    ``[0, 2^bits − 1]`` (gptqmodel ``pack_block``; AutoAWQ ``WQLinear_GEMM.from_linear``, which does not clamp:
    adapterdoc clamps, where AutoAWQ would corrupt the neighbouring fields), ``zero · scale`` computed in the
    scales' dtype as both do, the rest in float32.
    """
    if module.scheme == schemes.CT_W4A16:
        return _ct_encode(module, weight, tensors)
    if module.scheme in (schemes.GPTQ, schemes.AWQ):
        return _kept_grid_encode(module, weight, tensors)
    raise NotWritable(f"{module.path}: {module.scheme} is not a packed integer scheme")


# ------------------------------------------------------------------------------------------- bit fields


def unpack_fields(words: torch.Tensor, bits: int, dim: int = -1) -> torch.Tensor:
    """The unsigned ``bits``-wide fields of int32 ``words`` along ``dim`` (the last or the one before), field ``j``
    of a word at bits ``bits·j`` (int32, ``32 / bits`` times longer along ``dim``)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    mask = (1 << bits) - 1
    if _last(dim, words):
        return ((words.unsqueeze(-1) >> shifts) & mask).flatten(-2)
    fields = (words.unsqueeze(-2) >> shifts.unsqueeze(-1)) & mask  # [..., words, per_word, columns]
    return fields.flatten(-3, -2)


def pack_fields(fields: torch.Tensor, bits: int, dim: int = -1) -> torch.Tensor:
    """:func:`unpack_fields` reversed: unsigned fields along ``dim`` (zero-padded to whole words) into int32."""
    per_word = 32 // bits
    f = fields.to(torch.int32)
    if _last(dim, f):
        f = torch.nn.functional.pad(f, (0, (-f.shape[-1]) % per_word))
        f = f.reshape(*f.shape[:-1], -1, per_word)
        parts = [f[..., j] for j in range(per_word)]
    else:
        f = torch.nn.functional.pad(f, (0, 0, 0, (-f.shape[-2]) % per_word))
        f = f.reshape(*f.shape[:-2], -1, per_word, f.shape[-1])
        parts = [f[..., j, :] for j in range(per_word)]
    words = torch.zeros_like(parts[0])
    for j, part in enumerate(parts):
        words |= part << (bits * j)  # int32: the top field wraps into the sign bit
    return words


def _last(dim: int, t: torch.Tensor) -> bool:
    """Whether ``dim`` is the last dimension (else it must be the one before)."""
    if dim % t.ndim == t.ndim - 1:
        return True
    if dim % t.ndim != t.ndim - 2:
        raise ValueError(f"fields run along the last two dimensions, not {dim}")
    return False


def _bits(module: QuantizedModule, default: int = 4) -> int:
    bits = module.geometry.bits if module.geometry and module.geometry.bits else default
    if bits not in PACKABLE_BITS:
        raise NotWritable(
            f"{module.path}: {bits}-bit fields straddle int32 words; adapterdoc reads 1, 2, 4, 8 bits"
        )
    return bits


def _need(module: QuantizedModule, tensors: Mapping[str, torch.Tensor], *suffixes: str) -> list[torch.Tensor]:
    missing = [s for s in suffixes if s not in tensors]
    if missing:
        raise NotWritable(f"{module.path}: {', '.join(missing)} missing")
    return [tensors[s] for s in suffixes]


# ---------------------------------------------------------------------------------- compressed-tensors


def _ct_layout(
    module: QuantizedModule, tensors: Mapping[str, torch.Tensor]
) -> tuple[tuple[int, ...], int, int]:
    """(the weight's shape, columns per scale, bits), checked."""
    packed, scale = _need(module, tensors, ".weight_packed", ".weight_scale")
    if ".weight_g_idx" in tensors:
        raise NotWritable(f"{module.path}: activation-ordered groups (weight_g_idx) are not read")
    bits = _bits(module)
    if ".weight_shape" in tensors:
        shape = tuple(int(v) for v in tensors[".weight_shape"].tolist())
    elif module.shape is not None:
        shape = (*packed.shape[:-1], module.shape[1])
    else:
        raise NotWritable(f"{module.path}: the weight's shape is unknown")
    cols = shape[-1]
    if packed.dtype != torch.int32 or tuple(packed.shape) != (*shape[:-1], -(-cols * bits // 32)):
        raise NotWritable(
            f"{module.path}: weight_packed {tuple(packed.shape)} does not hold {shape} at {bits} bits"
        )
    groups = scale.shape[-1] if scale.ndim >= 2 else 1
    configured = (
        module.geometry.group_size if module.geometry and module.geometry.strategy == "group" else None
    )
    group = configured or cols // groups
    rows_ok = scale.numel() == 1 or tuple(scale.shape[:-1]) == shape[:-1]
    if not rows_ok or group * groups != cols:  # compressed-tensors refuses a partial group
        raise NotWritable(
            f"{module.path}: scale {tuple(scale.shape)} does not divide the weight {shape} in groups"
        )
    return shape, group, bits


def _ct_zero(
    module: QuantizedModule, tensors: Mapping[str, torch.Tensor], shape: tuple[int, ...], bits: int
) -> torch.Tensor | None:
    """The signed zero point per scale (unpacked along the rows for group / channel scales), or None."""
    if ".weight_zero_point" not in tensors:
        return None
    zero = tensors[".weight_zero_point"]
    scale = tensors[".weight_scale"]
    if zero.dtype == torch.int32 and scale.ndim >= 2:  # packed along dim 0 (PACK_ZP_STRATS: group, channel)
        fields = unpack_fields(zero, bits, dim=-2)[..., : shape[-2], :]
        return fields - (1 << (bits - 1))
    return zero.to(torch.int32)


def _ct_decode(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded:
    shape, group, bits = _ct_layout(module, tensors)
    fields = unpack_fields(tensors[".weight_packed"], bits)[..., : shape[-1]]
    signed = fields - (1 << (bits - 1))
    scale = _per_weight(tensors[".weight_scale"].to(torch.float32), group, shape)
    zero = _ct_zero(module, tensors, shape, bits)
    diff = signed if zero is None else signed - _per_weight(zero, group, shape)
    return Decoded(values=diff.to(torch.float32) * scale, codes=fields, step=scale)


def _per_weight(per_group: torch.Tensor, group: int, shape: tuple[int, ...]) -> torch.Tensor:
    """One value per weight: each group's value repeated over its ``group`` columns."""
    if per_group.numel() == 1:
        return per_group.reshape(()).expand(shape)
    return per_group.reshape(*shape[:-1], -1).repeat_interleave(group, dim=-1)


def _ct_encode(
    module: QuantizedModule, weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    shape, group, bits = _ct_layout(module, tensors)
    if tuple(weight.shape) != shape:
        raise NotWritable(f"{module.path}: weight shape {tuple(weight.shape)} is not the stored {shape}")
    scale_stored = tensors[".weight_scale"]
    model_weight = weight.to(scale_stored.dtype)
    groups = model_weight.to(torch.float32).reshape(*shape[:-1], -1, group)
    if scale_stored.numel() == 1:
        groups = model_weight.to(torch.float32).reshape(1, -1)
    lo = torch.clamp(groups.amin(dim=-1), max=0.0)
    hi = torch.clamp(groups.amax(dim=-1), min=0.0)
    q_min, q_max = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    asymmetric = ".weight_zero_point" in tensors
    if asymmetric:
        scale = (hi - lo) / float(q_max - q_min)
        zero = torch.clamp(q_min - lo / scale, q_min, q_max)
        zero = torch.round(torch.clamp(zero, -128, 127)).to(torch.int8).to(torch.int32)
    else:
        scale = torch.max(lo.abs(), hi.abs()) / (float(q_max - q_min) / 2)
    scale = torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
    new_scale = scale.to(scale_stored.dtype).reshape(scale_stored.shape)
    scaled = model_weight / _per_weight(new_scale, group, shape)
    out = {".weight_shape": tensors[".weight_shape"]} if ".weight_shape" in tensors else {}
    if asymmetric:
        scaled = scaled + _per_weight(zero.to(scaled.dtype), group, shape)
        out[".weight_zero_point"] = _ct_pack_zero(zero, tensors[".weight_zero_point"], bits)
    q = torch.round(torch.clamp(scaled, q_min, q_max)).to(torch.int32)
    out[".weight_packed"] = pack_fields(q + (1 << (bits - 1)), bits)
    out[".weight_scale"] = new_scale
    return out


def _ct_pack_zero(zero: torch.Tensor, stored: torch.Tensor, bits: int) -> torch.Tensor:
    """The zero point as stored: packed along the rows (``pack_to_int32(..., packed_dim=0)``) or as it was."""
    if stored.dtype == torch.int32 and stored.ndim >= 2:
        return pack_fields(zero + (1 << (bits - 1)), bits, dim=-2).reshape(stored.shape)
    return zero.to(stored.dtype).reshape(stored.shape)


# ------------------------------------------------------------------------------------------- GPTQ, AWQ


def _gptq_parts(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(codes ``[out, in]``, zeros ``[out, groups]``, scales ``[out, groups]``, group of each input), the zeros as
    gptqmodel reads a v1 checkpoint."""
    qweight, qzeros, scales = _need(module, tensors, ".qweight", ".qzeros", ".scales")
    bits = _bits(module)
    if bits not in GPTQ_V1_OFFSET:
        raise NotWritable(f"{module.path}: gptqmodel reads 2-, 3-, 4- and 8-bit GPTQ, not {bits}-bit")
    _check_2d(module, qweight, qzeros, scales)
    codes = unpack_fields(qweight.t(), bits)
    words = (qzeros.to(torch.int64) + GPTQ_V1_OFFSET[bits]) & 0xFFFFFFFF  # the library's int32 addition wraps
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    zeros = unpack_fields(words, bits)
    if codes.shape[0] != scales.shape[1] or zeros.shape != scales.shape:
        raise NotWritable(
            f"{module.path}: qweight {tuple(qweight.shape)}, qzeros, scales {tuple(scales.shape)} disagree"
        )
    inputs = codes.shape[1]
    g_idx = tensors.get(".g_idx")
    if g_idx is None:
        g_idx = torch.arange(inputs) // _group(module, inputs, scales.shape[0])
    g_idx = g_idx.long()
    if g_idx.shape != (inputs,) or int(g_idx.min()) < 0 or int(g_idx.max()) >= scales.shape[0]:
        raise NotWritable(
            f"{module.path}: g_idx does not map the {inputs} inputs onto {scales.shape[0]} groups"
        )
    return codes, zeros.t().contiguous(), scales.t().contiguous(), g_idx


def _awq_parts(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """(codes ``[out, in]``, zeros ``[out, groups]``, scales ``[out, groups]``, group of each input)."""
    qweight, qzeros, scales = _need(module, tensors, ".qweight", ".qzeros", ".scales")
    bits = _bits(module)
    if bits != 4:
        raise NotWritable(f"{module.path}: AWQ GEMM packs 4-bit codes only, not {bits}")
    _check_2d(module, qweight, qzeros, scales)
    codes = unpack_fields(qweight.t(), bits, dim=-2)
    codes = codes.index_select(0, _awq_index(codes.shape[0], inverse=True))
    zeros = unpack_fields(qzeros, bits)
    zeros = zeros.index_select(1, _awq_index(zeros.shape[1], inverse=True))
    if codes.shape[0] != scales.shape[1] or zeros.shape != scales.shape:
        raise NotWritable(
            f"{module.path}: qweight {tuple(qweight.shape)}, qzeros, scales {tuple(scales.shape)} disagree"
        )
    group_of = torch.arange(codes.shape[1]) // _group(module, codes.shape[1], scales.shape[0])
    return codes, zeros.t().contiguous(), scales.t().contiguous(), group_of


def _check_2d(module: QuantizedModule, *parts: torch.Tensor) -> None:
    if any(p.ndim != 2 for p in parts) or any(p.dtype != torch.int32 for p in parts[:2]):
        raise NotWritable(f"{module.path}: qweight / qzeros are not 2-D int32 (stacked experts are not read)")


def _group(module: QuantizedModule, inputs: int, groups: int) -> int:
    """Inputs per group: the configured group size (all inputs for per-channel scales), checked (whole groups:
    AutoAWQ's dequantization repeats each scale ``group_size`` times)."""
    configured = module.geometry.group_size if module.geometry else None
    size = configured or inputs // groups
    if size * groups != inputs:
        raise NotWritable(f"{module.path}: {inputs} inputs in groups of {size} are not {groups} groups")
    return size


def _awq_index(n: int, inverse: bool = False) -> torch.Tensor:
    """AutoAWQ's packing order over ``n`` columns: packed position ``p`` holds column ``index[p]``; ``inverse``:
    column ``c`` sits at packed position ``index[c]`` (``reverse_awq_order``)."""
    index = torch.arange(n).reshape(-1, 8)[:, list(AWQ_ORDER)].reshape(-1)
    return torch.argsort(index) if inverse else index


def _gptq_decode(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded:
    codes, zeros, scales, g_idx = _gptq_parts(module, tensors)
    scale = scales.to(torch.float32).index_select(1, g_idx)
    values = scale * (codes - zeros.index_select(1, g_idx)).to(torch.float32)
    return Decoded(values=values, codes=codes, step=scale)


def _awq_decode(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded:
    codes, zeros, scales, group_of = _awq_parts(module, tensors)
    scale = scales.to(torch.float32).index_select(1, group_of)
    values = (codes - zeros.index_select(1, group_of)).to(torch.float32) * scale
    return Decoded(values=values, codes=codes, step=scale)


def _kept_grid_encode(
    module: QuantizedModule, weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    gptq = module.scheme == schemes.GPTQ
    codes, zeros, scales, group_of = (_gptq_parts if gptq else _awq_parts)(module, tensors)
    if weight.shape != codes.shape:
        raise NotWritable(f"{module.path}: weight shape {tuple(weight.shape)} is not {tuple(codes.shape)}")
    bits = _bits(module)
    scale_zeros = (zeros.to(scales.dtype) * scales).to(torch.float32).index_select(1, group_of)
    s = scales.to(torch.float32).index_select(1, group_of)
    q = torch.round((weight.to(torch.float32) + scale_zeros) / s)
    q = torch.clamp(q, 0, (1 << bits) - 1).to(torch.int32)  # [out, in]
    out = {suffix: tensors[suffix] for suffix in module.tensors if suffix in tensors}
    if gptq:
        out[".qweight"] = pack_fields(q, bits).t().contiguous()
    else:
        ordered = q.index_select(0, _awq_index(q.shape[0]))
        out[".qweight"] = pack_fields(ordered, bits, dim=-2).t().contiguous()
    return out


def values(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The decoded weight alone (what a merge needs)."""
    return decode(module, tensors).values
