"""E2M1 (FP4) weights: compressed-tensors NVFP4 and MXFP4 expert parameters, decoded and encoded in plain torch, bit for
bit as their libraries do (none is imported).

NVFP4 (compressed-tensors ``nvfp4-pack-quantized``): ``.weight_packed`` U8 ``[out, in/2]`` (low nibble first),
``.weight_scale`` F8_E4M3 ``[out, in/16]``, ``.weight_global_scale`` F32 ``[1]``; ``W = fp4 · (scale / global)``.
MXFP4 (gpt-oss): ``X_blocks`` U8 ``[(E,) out, in/32, 16]`` (low nibble first), ``X_scales`` U8 ``[(E,) out, in/32]``
(E8M0: ``2^(s − 127)``); decoded as transformers' ``convert_moe_packed_tensors`` does, in the bf16 checkpoint's
``[E, in, out]`` orientation; encoded as mlx's ``quantize(mode="mxfp4")``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from adapterdoc.quant import schemes
from adapterdoc.quant.codec import Decoded, NotWritable
from adapterdoc.quant.schemes import QuantizedModule

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The 16 FP4 values in code order (bit 3 the sign)."""
E2M1_STEP = (0.5, 0.5, 0.5, 0.5, 0.75, 1.0, 1.5, 2.0)
"""Per magnitude code, the mean gap to its neighbours on the signed grid (at 6, the one gap below)."""
MX_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
"""Between neighbouring FP4 magnitudes; a magnitude on one rounds down (bucketize counts the midpoints below)."""
NV_GROUP = 16
MX_GROUP = 32
FP4_MAX = 6.0
E4M3_MAX = 448.0


def decode(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded:
    """The weight as compressed-tensors' NVFP4 decompression / transformers' MXFP4 dequantization computes it in
    float32."""
    if module.scheme == schemes.CT_NVFP4:
        return _decode_nvfp4(tensors)
    if module.scheme == schemes.MXFP4:
        return _decode_mxfp4(tensors)
    raise NotWritable(f"the FP4 codec does not read {module.scheme}")


def encode(
    module: QuantizedModule, weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """NVFP4: fresh global and group scales (min-max, compressed-tensors' ``generate_gparam`` + ``calculate_qparams``)
    and its compression, on the weight rounded to bf16 first (compressed-tensors quantizes the model's own bf16
    weights, the dtype its NVFP4 decompression returns); MXFP4: mlx's quantizer."""
    if module.scheme == schemes.CT_NVFP4:
        out = _encode_nvfp4(weight)
    elif module.scheme == schemes.MXFP4:
        out = _encode_mxfp4(weight, tensors)
    else:
        raise NotWritable(f"the FP4 codec does not write {module.scheme}")
    return out


def unpack_low_first(packed: torch.Tensor) -> torch.Tensor:
    """4-bit codes of ``packed`` (uint8, low nibble first) along a doubled last axis, int64."""
    p = packed.to(torch.int64)
    return torch.stack([p & 0x0F, p >> 4], dim=-1).flatten(-2)


def pack_low_first(codes: torch.Tensor) -> torch.Tensor:
    """Codes (last axis even) packed two per byte, low nibble first, uint8."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def fp4_values(codes: torch.Tensor) -> torch.Tensor:
    """The float32 FP4 value of each code (−0.0 for code 8)."""
    return torch.tensor(E2M1, dtype=torch.float32)[codes]


def fp4_steps(codes: torch.Tensor) -> torch.Tensor:
    return torch.tensor(E2M1_STEP, dtype=torch.float32)[codes & 7]


# ------------------------------------------------------------------------------------------------------ NVFP4


def nvfp4_scale(scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Each group's float32 scale, ``weight_scale / weight_global_scale`` as compressed-tensors divides it."""
    return scale.to(torch.float32) / global_scale.to(torch.float32)


def _decode_nvfp4(tensors: Mapping[str, torch.Tensor]) -> Decoded:
    codes = unpack_low_first(tensors[".weight_packed"])
    scale = nvfp4_scale(tensors[".weight_scale"], tensors[".weight_global_scale"])
    per = scale.repeat_interleave(NV_GROUP, dim=-1)
    if per.shape != codes.shape:
        raise NotWritable(f"NVFP4 scales {list(scale.shape)} do not cover codes {list(codes.shape)}")
    return Decoded(fp4_values(codes) * per, codes.to(torch.int32), fp4_steps(codes) * per)


def nvfp4_global_scale(weight: torch.Tensor) -> torch.Tensor:
    """compressed-tensors ``generate_gparam(w.amin(), w.amax())``: 448 · 6 / absmax, float32 ``[1]``."""
    lo, hi = weight.amin(), weight.amax()
    min_vals = torch.min(lo, torch.zeros_like(lo))
    max_vals = torch.max(hi, torch.zeros_like(hi))
    max_val_pos = torch.max(torch.abs(min_vals), torch.abs(max_vals))
    max_val_pos = torch.clamp(max_val_pos, min=torch.finfo(max_val_pos.dtype).tiny)
    global_scale = E4M3_MAX * FP4_MAX / max_val_pos
    global_scale = torch.nan_to_num(global_scale, nan=1.0, posinf=1.0, neginf=1.0)
    return global_scale.to(torch.float32).reshape([1])


def nvfp4_group_scales(weight: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors ``calculate_qparams`` on each group's min and max: ``global · absmax / 6`` in E4M3 (a zero
    scale becomes 0.125), float32."""
    groups = weight.reshape(*weight.shape[:-1], weight.shape[-1] // NV_GROUP, NV_GROUP)
    lo, hi = groups.amin(-1), groups.amax(-1)
    min_vals = torch.min(lo, torch.zeros_like(lo))
    max_vals = torch.max(hi, torch.zeros_like(hi))
    bit_range = torch.tensor(FP4_MAX) - torch.tensor(-FP4_MAX)
    max_val_pos = torch.max(torch.abs(min_vals), torch.abs(max_vals))
    scales = max_val_pos / (bit_range.to(max_val_pos.dtype) / 2)
    scales = global_scale * scales
    finfo = torch.finfo(torch.float8_e4m3fn)
    scales = torch.clamp(scales, finfo.min, finfo.max).to(torch.float8_e4m3fn).to(scales.dtype)
    return torch.where(scales == 0, torch.tensor(0.125, dtype=scales.dtype), scales)


def nvfp4_codes(x: torch.Tensor) -> torch.Tensor:
    """The FP4 code compressed-tensors writes for each scaled weight (its CPU ``cast_to_fp4`` then
    ``pack_fp4_to_uint8``): clamped to ±6, rounded at the midpoints with ties to the even mantissa (0.25 → 0,
    0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4), the sign bit on every negative (one that rounds to
    zero gives −0, code 8; −0.0 itself gives code 0, as ``torch.sign(−0.0)`` is +0)."""
    x = torch.clamp(x, torch.tensor(-FP4_MAX), torch.tensor(FP4_MAX))
    mag = torch.abs(x)
    code = (mag > 0.25).to(torch.uint8)
    for bound, up in ((0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False)):
        code += (mag >= bound) if up else (mag > bound)
    return code | ((x < 0).to(torch.uint8) << 3)


def _encode_nvfp4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    w = weight.to(torch.bfloat16).float()
    if w.ndim != 2 or w.shape[-1] % NV_GROUP:
        raise NotWritable(f"NVFP4 needs a 2-D weight with in divisible by 16, got {list(w.shape)}")
    global_scale = nvfp4_global_scale(w)
    scale = nvfp4_group_scales(w, global_scale)
    groups = w.reshape(*w.shape[:-1], w.shape[-1] // NV_GROUP, NV_GROUP)
    codes = nvfp4_codes(groups / (scale / global_scale).unsqueeze(-1)).flatten(-2)
    return {
        ".weight_packed": pack_low_first(codes),
        ".weight_scale": scale.to(torch.float8_e4m3fn),
        ".weight_global_scale": global_scale,
    }


# ------------------------------------------------------------------------------------------------------ MXFP4


def _decode_mxfp4(tensors: Mapping[str, torch.Tensor]) -> Decoded:
    blocks, scales = tensors["_blocks"].to(torch.uint8), tensors["_scales"]
    if blocks.ndim not in (3, 4) or blocks.shape[:-1] != scales.shape:
        raise NotWritable(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not match")
    # convert_moe_packed_tensors: the FP4 values times ldexp's factor pow(2, scale − 127), in float32
    factor = torch.pow(2.0, scales.to(torch.int32) - 127)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).flatten(-2)  # uint8 [..., G, 32]
    *lead, groups, width = codes.shape
    if blocks.ndim == 4:  # stacked experts: [E, out, in] → the checkpoint's [E, in, out], transposed as bytes
        experts, rows = lead
        codes = codes.reshape(experts, rows, groups * width).transpose(1, 2).contiguous()
        codes = codes.reshape(experts, groups, width, rows)
        factor = factor.transpose(1, 2).unsqueeze(2)  # [E, G, 1, out]
        shape: tuple[int, ...] = (experts, groups * width, rows)
    else:
        factor = factor.unsqueeze(-1)  # [out, G, 1]
        shape = (lead[0], groups * width)
    idx = codes.to(torch.int64)
    values = torch.tensor(E2M1, dtype=torch.float32)[idx] * factor
    step = torch.tensor(E2M1_STEP * 2, dtype=torch.float32)[idx] * factor
    return Decoded(values.reshape(shape), codes.to(torch.int32).reshape(shape), step.reshape(shape))


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes ``[..., G, 32]``, E8M0 scales ``[..., G]``) of ``w`` (float32, groups of 32 along the last axis) as
    mlx 0.32's ``quantize(mode="mxfp4")`` on the CPU: the smallest power of two ≥ ``absmax / 6`` (0 for a zero
    group), then ``argmin |w/2^e − v|`` over the 16 FP4 values in code order. Those distances are exact (|w/2^e| ≤ 6,
    neighbouring levels within a factor of two), so that is the nearest magnitude, the lower on a tie, and the sign
    bit only where a negative weight lands off zero (+0 comes before −0). Raises :class:`NotWritable` where the
    exponent leaves E8M0's range."""
    groups = w.reshape(*w.shape[:-1], w.shape[-1] // MX_GROUP, MX_GROUP)
    scales = groups.abs().amax(-1, keepdim=True) / torch.tensor(FP4_MAX, dtype=w.dtype)
    near = torch.round(torch.log2(scales)).to(torch.int32)
    near = torch.where(torch.pow(torch.tensor(2.0, dtype=w.dtype), near) < scales, near + 1, near)
    exp = torch.where(scales == 0, 0, near)
    if bool(((exp > 127) | (exp < -127)).any()):
        raise NotWritable("a group's MXFP4 exponent falls outside E8M0's range (mlx would wrap it)")
    scaled = groups / torch.pow(torch.tensor(2.0, dtype=w.dtype), exp)
    mids = torch.tensor(MX_MIDPOINTS, dtype=w.dtype)
    magnitude = torch.bucketize(scaled.abs(), mids, out_int32=True).to(torch.uint8)
    negative = ((scaled < 0) & (magnitude > 0)).to(torch.uint8)
    return magnitude | (negative << 3), (exp.squeeze(-1) + 127).to(torch.uint8)


def _encode_mxfp4(weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    blocks = tensors["_blocks"]
    w = weight.float()
    if blocks.ndim == 4:  # the checkpoint's [E, in, out] → [E, out, in], groups along in
        w = w.transpose(1, 2)
    if tuple(w.shape) != (*blocks.shape[:-2], blocks.shape[-2] * MX_GROUP):
        raise NotWritable(
            f"weight of shape {list(weight.shape)} does not fit MXFP4 blocks {list(blocks.shape)}"
        )
    codes, scales = mxfp4_quantize(w.contiguous())
    return {"_blocks": pack_low_first(codes), "_scales": scales}


def values(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The decoded weight alone (what a merge needs)."""
    return decode(module, tensors).values
