"""Block FP8 (transformers FineGrainedFP8, DeepSeek-V3) and compressed-tensors ``float-quantized`` FP8, decoded and
encoded as their libraries do.

Decoding is the one multiplication every reference performs: the e4m3 code widened to float32 times its scale
widened to float32, the scale broadcast over its block (transformers ``Fp8Dequantize._dequantize_one``, DeepSeek-V3
``inference/kernel.py`` ``weight_dequant_kernel``, compressed-tensors ``_dequantize``). A code has at most 4
significant bits and a scale at most 24, so the float32 product is exact and casting it to bf16 gives what
compressed-tensors computes in bf16.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from adapterdoc.quant import schemes
from adapterdoc.quant.codec import Decoded, NotWritable
from adapterdoc.quant.schemes import QuantizedModule

E4M3_MAX = 448.0
"""The largest finite e4m3 value (``torch.finfo(torch.float8_e4m3fn).max``)."""
BLOCK_SCALE = ".weight_scale_inv"
CT_SCALE = ".weight_scale"
CT_ZERO = ".weight_zero_point"


def decode(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> Decoded:
    """``module``'s FP8 weight decoded: codes × scale in float32 (see the module docstring)."""
    weight, scale = _parts(module, tensors)
    block = _block(module, tuple(weight.shape), tuple(scale.shape))
    full = _broadcast(scale.to(torch.float32), block, tuple(weight.shape))
    codes = weight.view(torch.uint8).to(torch.int32)
    step = torch.index_select(e4m3_unit_steps(), 0, codes.reshape(-1)).reshape(codes.shape) * full
    return Decoded(values=values(module, tensors), codes=codes, step=step)


def values(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The decoded weight alone (what a merge needs): the same products, each code times its block's scale."""
    weight, scale = _parts(module, tensors)
    block = _block(module, tuple(weight.shape), tuple(scale.shape))
    x = _widened(weight)
    rows, cols = x.shape[-2:]
    if rows % block[0] or cols % block[1]:  # a partial last block: one scale per weight
        return x.mul_(_broadcast(scale.to(torch.float32), block, tuple(x.shape)))
    lead = x.shape[:-2]
    grid = scale.to(torch.float32).reshape(*lead, rows // block[0], 1, cols // block[1], 1)
    return x.view(*lead, rows // block[0], block[0], cols // block[1], block[1]).mul_(grid).view(x.shape)


def encode(
    module: QuantizedModule, weight: torch.Tensor, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``weight`` quantized with fresh scales as the library quantizes a weight.

    Block FP8 (``weight_scale_inv``): transformers ``Fp8Quantize._quantize_one`` per block: ``scales = 448 / amax``
    (1 for an all-zero block), ``q = clamp(W · scales, ±448)`` cast to e4m3, ``weight_scale_inv = 1 / scales``
    (float32). transformers leaves a weight whose shape the block does not divide unquantized; adapterdoc applies
    the same per-block rule on DeepSeek's ceil-divided grid (a partial last block is quantized over its own
    weights), which is what transformers computes on the weight zero-padded to whole blocks.

    compressed-tensors FP8: the library quantizes the model in its own dtype, the dtype it stores the scales in
    (bf16 for a bf16 model), so ``W`` is first cast to that dtype; then ``calculate_qparams`` on each block's /
    row's / the tensor's min and max in float32 (the min-max observer: ``scale = max(|min|, |max|) / 448``, float32
    eps for a zero scale), cast to the scale dtype, and ``quantize``: ``clamp(W / scale, ±448)`` (the division in
    that dtype) cast to e4m3.
    """
    stored, scale = _parts(module, tensors)
    if weight.shape != stored.shape:
        raise NotWritable(
            f"{module.path}: weight shape {tuple(weight.shape)} is not the stored {tuple(stored.shape)}"
        )
    block = _block(module, tuple(stored.shape), tuple(scale.shape))
    x = weight.to(torch.float32)
    if module.scheme == schemes.FP8_BLOCK:
        if scale.dtype != torch.float32:
            raise NotWritable(
                f"{module.path}: weight_scale_inv stored as {scale.dtype}, not float32 (ue8m0 scales)"
            )
        codes, inv = _quantize_transformers(x, block)
        return {".weight": codes, BLOCK_SCALE: inv.reshape(scale.shape)}
    model_weight = x.to(scale.dtype)
    new_scale = _ct_minmax_scale(model_weight.to(torch.float32), block).to(scale.dtype).reshape(scale.shape)
    full = _broadcast(new_scale, block, tuple(x.shape))
    codes = torch.clamp(model_weight / full, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return {".weight": codes, CT_SCALE: new_scale}


def _widened(weight: torch.Tensor) -> torch.Tensor:
    """The e4m3 codes as float32: the value of each code byte looked up in the 256-entry table (numpy's ``take``
    with byte indices: 2.4x torch's own fp8 conversion on this CPU, the same values)."""
    import numpy as np

    table = e4m3_values().numpy()
    return torch.from_numpy(np.take(table, weight.contiguous().view(torch.uint8).numpy()))


def e4m3_values() -> torch.Tensor:
    """The float32 value of each of the 256 e4m3 codes (torch's own conversion)."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def e4m3_unit_steps() -> torch.Tensor:
    """For each of the 256 e4m3 codes, the gap to its neighbouring values (the mean of the gaps below and above
    where they differ, the one gap at ±448; NaN for the NaN codes)."""
    values = e4m3_values().to(torch.float64)
    grid = torch.unique(values[torch.isfinite(values)])
    pos = torch.searchsorted(grid, values.nan_to_num(0.0))
    below = values - grid[(pos - 1).clamp(min=0)]
    above = grid[(pos + 1).clamp(max=grid.numel() - 1)] - values
    below = torch.where(pos == 0, above, below)
    above = torch.where(pos == grid.numel() - 1, below, above)
    steps = (below + above) / 2
    return torch.where(torch.isfinite(values), steps, torch.nan).to(torch.float32)


def _parts(module: QuantizedModule, tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The e4m3 codes and the scale tensor, checked."""
    scale_suffix = BLOCK_SCALE if module.scheme == schemes.FP8_BLOCK else CT_SCALE
    if module.scheme not in (schemes.FP8_BLOCK, schemes.CT_FP8):
        raise NotWritable(f"{module.path}: {module.scheme} is not an FP8 scheme")
    if CT_ZERO in tensors:
        raise NotWritable(f"{module.path}: asymmetric FP8 (a weight_zero_point) is not read")
    missing = [s for s in (".weight", scale_suffix) if s not in tensors]
    if missing:
        raise NotWritable(f"{module.path}: {', '.join(missing)} missing")
    weight, scale = tensors[".weight"], tensors[scale_suffix]
    if weight.dtype != torch.float8_e4m3fn:
        raise NotWritable(f"{module.path}: codes stored as {weight.dtype}, not float8_e4m3fn")
    if weight.ndim < 2:
        raise NotWritable(f"{module.path}: a {weight.ndim}-D weight is not a matrix")
    return weight, scale


def _block(module: QuantizedModule, shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> tuple[int, int]:
    """The (rows, columns) one scale covers, checked against the scale tensor's shape."""
    rows, cols = shape[-2:]
    geometry = module.geometry
    strategy = geometry.strategy if geometry else None
    if module.scheme == schemes.FP8_BLOCK or strategy == "block":
        block = (
            geometry.block_size if geometry and geometry.block_size else _block_from_grid(shape, scale_shape)
        )
    elif strategy == "channel":
        block = (1, cols)
    elif strategy == "tensor":
        block = (rows, cols)
    elif strategy == "group" and geometry and geometry.group_size:
        block = (1, geometry.group_size)
    else:
        raise NotWritable(f"{module.path}: FP8 scale strategy {strategy!r} is not read")
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    leading = shape[:-2]
    if strategy == "tensor":
        expected: tuple[int, ...] = (*leading, 1) if leading else (1,)
        if scale_shape not in (expected, (), (*leading, 1, 1)):
            raise NotWritable(f"{module.path}: tensor scale of shape {scale_shape}")
        return block
    if scale_shape != (*leading, *grid):
        raise NotWritable(
            f"{module.path}: scale shape {scale_shape} is not the {block} grid {(*leading, *grid)}"
        )
    return block


def _block_from_grid(shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> tuple[int, int]:
    """transformers' rule without a configured block: the weight divided evenly by the scale grid."""
    rows, cols = shape[-2:]
    grid_rows, grid_cols = scale_shape[-2:] if len(scale_shape) >= 2 else (1, 1)
    if rows % grid_rows or cols % grid_cols:
        raise NotWritable(
            f"weight shape {(rows, cols)} not divisible by the scale grid {(grid_rows, grid_cols)}"
        )
    return rows // grid_rows, cols // grid_cols


def _broadcast(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, ...]) -> torch.Tensor:
    """One scale per weight: each scale repeated over its block, a partial last block cut to the weight."""
    rows, cols = shape[-2:]
    grid = scale.reshape(*shape[:-2], -(-rows // block[0]), -(-cols // block[1]))
    full = grid.repeat_interleave(block[0], dim=-2).repeat_interleave(block[1], dim=-1)
    return full[..., :rows, :cols]


def _tiles(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``x`` zero-padded to whole blocks, as ``(..., grid_rows, block_rows, grid_cols, block_cols)``."""
    rows, cols = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (0, (-cols) % block[1], 0, (-rows) % block[0]))
    shape = (*x.shape[:-2], padded.shape[-2] // block[0], block[0], padded.shape[-1] // block[1], block[1])
    return padded.reshape(shape)


def _quantize_transformers(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers ``Fp8Quantize._quantize_one`` on the ceil grid: (e4m3 codes, float32 ``weight_scale_inv``)."""
    tiles = _tiles(x, block)
    max_abs = tiles.abs().amax(dim=(-3, -1))
    safe = torch.where(max_abs > 0, max_abs, torch.ones_like(max_abs))
    scales = E4M3_MAX / safe
    scales = torch.where(max_abs > 0, scales, torch.ones_like(scales))
    inv = (1.0 / scales).to(torch.float32)
    scaled = tiles * scales.unsqueeze(-1).unsqueeze(-3)
    codes = torch.clamp(scaled, min=-E4M3_MAX, max=E4M3_MAX).to(torch.float8_e4m3fn)
    padded = codes.reshape(*x.shape[:-2], tiles.shape[-4] * block[0], tiles.shape[-2] * block[1])
    return padded[..., : x.shape[-2], : x.shape[-1]].contiguous(), inv


def _ct_minmax_scale(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """compressed-tensors ``calculate_qparams`` (symmetric FP8) on each block's min and max, float32."""
    tiles = _tiles(x, block)
    lo = torch.clamp(tiles.amin(dim=(-3, -1)), max=0.0)
    hi = torch.clamp(tiles.amax(dim=(-3, -1)), min=0.0)
    scale = torch.max(lo.abs(), hi.abs()) / E4M3_MAX
    return torch.where(scale == 0, torch.finfo(torch.float32).eps, scale)
