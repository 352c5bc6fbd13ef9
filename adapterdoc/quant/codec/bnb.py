"""bitsandbytes NF4 / FP4 (4-bit blocks, optionally double-quantized absmax) and int8 (row-wise) weights, decoded and
encoded bit for bit as bitsandbytes 0.50 does on the CPU (plain torch; bitsandbytes is not imported).

4-bit: ``.weight`` U8 ``[numel/2, 1]`` (two codes per byte, high nibble first, over the flattened weight), blocks of
``blocksize`` consecutive weights scaled by ``absmax``; with double quant ``.weight.absmax`` holds 8-bit codes of
``absmax − nested_offset`` in blocks of 256 (``.weight.nested_absmax``, ``.weight.nested_quant_map``), and the JSON
tensor ``.weight.quant_state.bitsandbytes__<type>`` carries shape, dtype, blocksize and ``nested_offset``.
int8: ``.weight`` I8, ``.SCB`` (row absmax of the float16 weight), ``W = int8 · SCB · (1/127)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from adapterdoc.quant import schemes
from adapterdoc.quant.codec import Decoded, NotWritable
from adapterdoc.quant.schemes import QuantizedModule

NF4_LEVELS = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)
"""bitsandbytes ``get_4bit_type("nf4")``, in code order."""
FP4_RAW = (0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0.0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0)
"""bitsandbytes ``get_4bit_type("fp4")`` before its division by 12, in code order (code 8 is +0.0: the source
writes the integer ``-0``, so its quant_map holds +0.0)."""
STATE = ".weight.quant_state.bitsandbytes__"
NESTED_BLOCK = 256
LUT_SIZE = 65536
"""bitsandbytes' CPU 8-bit quantizer looks codes up in a table of 65536 evenly spaced values in [-1, 1]."""
INV_127 = 7.874015718698502e-3
"""bitsandbytes' ``int8_vectorwise_dequant`` multiplies by this (1/127) after the row scale."""


def decode(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded:
    """The weight as bitsandbytes' CPU ``dequantize_4bit`` / ``int8_vectorwise_dequant`` computes it in float32."""
    if module.scheme == schemes.BNB_INT8:
        return _decode_int8(tensors)
    if module.scheme in (schemes.BNB_NF4, schemes.BNB_FP4):
        return _decode_4bit(tensors)
    raise NotWritable(f"the bitsandbytes codec does not read {module.scheme}")


def encode(
    module: QuantizedModule, weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``weight`` quantized as bitsandbytes quantizes a weight (``Params4bit`` / ``Int8Params`` on the CPU), in the
    stored blocksize, quant type and double quant; the quant_state JSON rewritten as bitsandbytes serializes it."""
    if module.scheme == schemes.BNB_INT8:
        out = _encode_int8(weight)
    elif module.scheme in (schemes.BNB_NF4, schemes.BNB_FP4):
        out = _encode_4bit(weight, tensors)
    else:
        raise NotWritable(f"the bitsandbytes codec does not write {module.scheme}")
    return out


# ------------------------------------------------------------------------------------------------------ 4-bit


def code_table(quant_type: str) -> torch.Tensor:
    """The 16 levels of ``quant_type`` in code order, float32, as ``get_4bit_type`` builds them."""
    if quant_type == "nf4":
        return torch.tensor(NF4_LEVELS, dtype=torch.float32)
    if quant_type == "fp4":
        data = torch.tensor(FP4_RAW, dtype=torch.float32)
        return data.div_(data.abs().max())
    raise NotWritable(f"bitsandbytes 4-bit quant type {quant_type!r} is not nf4 or fp4")


def quant_state(tensors: Mapping[str, torch.Tensor]) -> tuple[str, dict[str, Any]]:
    """(the quant_state suffix, its JSON) from the stored tensors."""
    keys = [k for k in tensors if k.startswith(STATE)]
    if len(keys) != 1:
        raise NotWritable(f"expected one `{STATE}*` tensor, found {len(keys)}")
    raw = bytes(tensors[keys[0]].to(torch.uint8).reshape(-1).tolist())
    state = json.loads(raw.decode("utf-8"))
    if not isinstance(state, dict):
        raise NotWritable("the bitsandbytes quant_state is not a JSON object")
    return keys[0], state


def unpack_nibbles(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` 4-bit codes of ``packed`` (high nibble first), int64."""
    flat = packed.reshape(-1).view(torch.uint8).to(torch.int64)
    return torch.stack([flat >> 4, flat & 0xF], dim=1).reshape(-1)[:n]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Codes (any int dtype) packed two per byte, high nibble first, as ``[ceil(n/2), 1]`` uint8."""
    q = codes.reshape(-1).to(torch.uint8)
    if q.numel() % 2:
        q = torch.nn.functional.pad(q, (0, 1))
    return ((q[::2] << 4) | q[1::2]).unsqueeze(1)


def _per_weight(scales: torch.Tensor, block: int, n: int) -> torch.Tensor:
    return scales.repeat_interleave(block)[:n]


def absmax_of(tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> torch.Tensor:
    """The float32 absmax per block, undoing double quant as ``dequantize_blockwise`` + offset does."""
    absmax = tensors[".weight.absmax"]
    if ".weight.nested_absmax" not in tensors:
        return absmax.float()
    code = tensors[".weight.nested_quant_map"].float()
    block = int(state.get("nested_blocksize", NESTED_BLOCK))
    nested = tensors[".weight.nested_absmax"].float()
    n = absmax.numel()
    out = code[absmax.reshape(-1).to(torch.int64)] * _per_weight(nested, block, n)
    return out + torch.tensor(float(state["nested_offset"]), dtype=torch.float32)


def _shape(state: Mapping[str, Any]) -> tuple[int, ...]:
    return tuple(int(d) for d in state["shape"])


def _decode_4bit(tensors: Mapping[str, torch.Tensor]) -> Decoded:
    _, state = quant_state(tensors)
    shape = _shape(state)
    n = 1
    for d in shape:
        n *= d
    block = int(state["blocksize"])
    code = code_table(str(state["quant_type"]))
    idx = unpack_nibbles(tensors[".weight"], n)
    scale = _per_weight(absmax_of(tensors, state), block, n)
    values = (code[idx] * scale).reshape(shape)
    step = (level_steps(code)[idx] * scale).reshape(shape)
    return Decoded(values, idx.to(torch.int32).reshape(shape), step)


def level_steps(code: torch.Tensor) -> torch.Tensor:
    """Per code, the mean of the gaps to the neighbouring distinct levels (the one gap at either end)."""
    levels = torch.unique(code.double())
    steps = []
    for value in code.double().tolist():
        i = int(torch.searchsorted(levels, torch.tensor(value, dtype=torch.float64)))
        gaps = [levels[j + 1] - levels[j] for j in (i - 1, i) if 0 <= j < levels.numel() - 1]
        steps.append(float(sum(gaps) / len(gaps)))
    return torch.tensor(steps, dtype=torch.float32)


def quantize_4bit(flat: torch.Tensor, block: int, quant_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, absmax) as bitsandbytes' default ``quantize_4bit`` kernel: scale by 1/absmax per block (the last,
    partial block divided by its absmax), nearest level by ``bucketize`` on the sorted midpoints; an odd count of
    codes gets one more, of 0.0."""
    code = code_table(quant_type)
    order = torch.argsort(code)
    bounds = (code[order[:-1]] + code[order[1:]]) / 2
    n = flat.numel()
    rem = n % block
    full = n - rem
    com = flat[:full].reshape(full // block, block)
    absmax = com.abs().max(dim=-1)[0]
    scaled = torch.clamp(com * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if rem:
        am = flat[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(flat[full:] / am, -1, 1)])
    if scaled.numel() % 2:  # the kernel pads an odd count with 0.0, quantized like any weight
        scaled = torch.nn.functional.pad(scaled, (0, 1))
    q = torch.bucketize(scaled, bounds, out_int32=True)
    if quant_type != "nf4":
        q = order[q]
    return q.to(torch.int64), absmax


def quantize_blockwise_cpu(
    a: torch.Tensor, code: torch.Tensor, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes, absmax) as bitsandbytes' native CPU ``quantize_blockwise`` (float32): ``x · (1/absmax)`` looked up
    in a 65536-entry table of evenly spaced values, each holding the code whose midpoints bracket it."""
    code = code.float()
    mids = 0.5 * (code[:-1] + code[1:])
    grid = -1.0 + (2.0 * torch.arange(LUT_SIZE, dtype=torch.float32)) / float(LUT_SIZE - 1)
    lut = torch.searchsorted(mids, grid)
    n = a.numel()
    flat = a.reshape(-1).float()
    pad = (-n) % block
    blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, block)
    absmax = blocks.abs().max(dim=-1)[0]
    inv = 1.0 / absmax
    normed = torch.clamp(blocks * inv.view(-1, 1), -1.0, 1.0)
    normed[absmax == 0] = 0.0  # an all-zero block: codes 0 (the kernel skips the lookup)
    index = ((normed + 1.0) * 0.5 * float(LUT_SIZE - 1) + 0.5).to(torch.int64)
    q = lut[index].to(torch.uint8)
    q[absmax == 0] = 0
    return q.reshape(-1)[:n], absmax


def _encode_4bit(weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    key, state = quant_state(tensors)
    shape = _shape(state)
    if tuple(weight.shape) != shape:
        raise NotWritable(f"weight of shape {list(weight.shape)}, the quant_state says {list(shape)}")
    quant_type = str(state["quant_type"])
    codes, absmax = quantize_4bit(weight.reshape(-1).float(), int(state["blocksize"]), quant_type)
    packed = pack_nibbles(codes)
    storage = tensors[".weight"].dtype if ".weight" in tensors else torch.uint8
    if storage != torch.uint8:  # bnb_4bit_quant_storage: the same bytes viewed as that dtype, [n, 1]
        packed = packed.reshape(-1).view(storage).unsqueeze(1)
    out = {".weight": packed, ".weight.quant_map": code_table(quant_type)}
    if ".weight.nested_absmax" in tensors:
        nested_code = tensors[".weight.nested_quant_map"].float()
        offset = absmax.mean()
        qabsmax, nested = quantize_blockwise_cpu(
            absmax - offset, nested_code, int(state.get("nested_blocksize", NESTED_BLOCK))
        )
        out[".weight.absmax"] = qabsmax
        out[".weight.nested_absmax"] = nested
        out[".weight.nested_quant_map"] = nested_code.clone()
        state = {**state, "nested_offset": offset.item()}
    else:
        out[".weight.absmax"] = absmax
    out[key] = torch.tensor(list(json.dumps(state).encode("utf-8")), dtype=torch.uint8)
    return out


# ------------------------------------------------------------------------------------------------------- int8


def _decode_int8(tensors: Mapping[str, torch.Tensor]) -> Decoded:
    q = tensors[".weight"]
    scb = tensors[".SCB"].float()
    values = q * scb.view(-1, 1) * INV_127
    step = (scb / 127.0).view(-1, 1).expand(q.shape).contiguous()
    return Decoded(values, q.to(torch.int32), step)


def _encode_int8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """``Int8Params`` on the CPU: the weight in float16, row absmax, ``round(W · (127/absmax))``."""
    half = weight.contiguous().to(torch.float16)
    row_stats = torch.max(half.abs(), dim=1).values.float()
    q = torch.round(half * (127.0 / row_stats.unsqueeze(-1))).to(torch.int8)
    return {".weight": q, ".SCB": row_stats}


def values(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The decoded weight alone (what a merge needs)."""
    return decode(module, tensors).values
