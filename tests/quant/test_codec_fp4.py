"""adapterdoc.quant.codec.fp4: compressed-tensors NVFP4 and gpt-oss MXFP4 decoded and encoded in plain torch.

Fast tests here (hand-computed cases, round trips, orientation, refusals); ``-m oracle`` runs
tests/quant/codec_oracle_fp4.py in the quant environment (compressed-tensors 0.20.1, transformers, the tiny bases
including ``mxfp4``) and tests/quant/codec_oracle_mlx.py in the mlx environment (MXFP4 encode against
``mx.quantize(mode="mxfp4")``), bit for bit."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from adapterdoc.quant import schemes
from adapterdoc.quant.codec import NotWritable, encode, fp4
from adapterdoc.quant.schemes import QuantizedModule

HERE = Path(__file__).parent
NV = {s: "m" + s for s in (".weight_packed", ".weight_scale", ".weight_global_scale")}


def _nv(shape: tuple[int, int]) -> QuantizedModule:
    return QuantizedModule("m", schemes.CT_NVFP4, dict(NV), "U8", shape)


def _mx(experts: int | None, rows: int, cols: int) -> QuantizedModule:
    tensors = {"_blocks": "X_blocks", "_scales": "X_scales", "_bias": "X_bias"}
    return QuantizedModule("X", schemes.MXFP4, tensors, "U8", (rows, cols), experts)


def test_nibbles_low_first() -> None:
    packed = torch.tensor([[0x21, 0xF8]], dtype=torch.uint8)
    assert fp4.unpack_low_first(packed).tolist() == [[1, 2, 8, 15]]
    assert torch.equal(fp4.pack_low_first(fp4.unpack_low_first(packed)), packed)
    values = fp4.fp4_values(torch.tensor([1, 2, 8, 15]))
    assert values.tolist() == [0.5, 1.0, 0.0, -6.0] and torch.signbit(values[2])


def test_nvfp4_by_hand() -> None:
    w = torch.zeros(1, 16)
    w[0, :8] = torch.tensor([6.0, -3.0, 1.25, 0.2, -0.2, 5.0, 7.0 / 3, 0.0])
    out = encode(_nv((1, 16)), w, {})
    # global scale 448·6/6 = 448; group scale 448·6/6 = 448 in E4M3 → the effective scale 1: the weights
    # themselves, rounded at the midpoints with ties to the even mantissa (1.25 → 1, 5 → 4); −0.2 → −0 (code 8)
    assert out[".weight_global_scale"].tolist() == [448.0]
    assert out[".weight_scale"].dtype == torch.float8_e4m3fn and out[".weight_scale"].float().tolist() == [
        [448.0]
    ]
    d = fp4.decode(_nv((1, 16)), out)
    assert d.codes[0, :8].tolist() == [7, 13, 2, 0, 8, 6, 4, 0]
    assert d.values[0, :8].tolist() == [6.0, -3.0, 1.0, 0.0, -0.0, 4.0, 2.0, 0.0]
    assert out[".weight_packed"][0, 0].item() == 0xD7  # low nibble first: code 7, then 13
    assert d.step[0, :3].tolist() == [2.0, 1.0, 0.5]


def _library_cast_and_pack(x: torch.Tensor) -> torch.Tensor:
    """compressed-tensors 0.20.1's CPU ``cast_to_fp4`` then ``pack_fp4_to_uint8``'s code, as written there."""
    x = torch.clamp(x, -6.0, 6.0)
    sign = torch.sign(x)
    x = torch.abs(x)
    x[(x >= 0.0) & (x <= 0.25)] = 0.0
    x[(x > 0.25) & (x < 0.75)] = 0.5
    x[(x >= 0.75) & (x <= 1.25)] = 1.0
    x[(x > 1.25) & (x < 1.75)] = 1.5
    x[(x >= 1.75) & (x <= 2.5)] = 2.0
    x[(x > 2.5) & (x < 3.5)] = 3.0
    x[(x >= 3.5) & (x <= 5.0)] = 4.0
    x[x > 5.0] = 6.0
    x = x * sign
    bit = torch.signbit(x).to(torch.uint8)
    doubled = (x * 2).to(torch.int8).abs_()
    codes = torch.zeros_like(doubled, dtype=torch.uint8)
    for code, twice in enumerate((1, 2, 3, 4, 6, 8), start=1):
        codes[doubled == twice] = code
    codes[doubled >= 12] = 7
    return codes | (bit << 3)


def test_nvfp4_codes_are_the_librarys_cast_and_pack() -> None:
    torch.manual_seed(4)
    ties = torch.tensor(
        [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.0, -0.0, 1e-9, 0.2500001, 0.7499999]
    )
    x = torch.cat([torch.randn(4096) * 3, ties, -ties])
    assert torch.equal(fp4.nvfp4_codes(x), _library_cast_and_pack(x))
    assert fp4.nvfp4_codes(torch.tensor([-0.0, -1e-9])).tolist() == [0, 8]


def test_nvfp4_zero_group_scale_is_the_e4m3_eps() -> None:
    w = torch.zeros(2, 32)
    w[1, 16:] = torch.linspace(-1, 1, 16)
    out = encode(_nv((2, 32)), w, {})
    assert out[".weight_scale"].float()[0].tolist() == [0.125, 0.125]  # compressed-tensors' eps for E4M3
    assert fp4.decode(_nv((2, 32)), out).values[0].abs().max().item() == 0.0


@pytest.mark.parametrize("shape", [(8, 64), (3, 16), (1, 48)])
def test_nvfp4_round_trip(shape: tuple[int, int]) -> None:
    torch.manual_seed(0)
    w = torch.randn(shape) * 0.02
    first = encode(_nv(shape), w, {})
    assert first[".weight_packed"].shape == (shape[0], shape[1] // 2)
    assert first[".weight_scale"].shape == (shape[0], shape[1] // 16)
    d = fp4.decode(_nv(shape), first)
    assert d.values.shape == d.codes.shape == d.step.shape == shape
    assert ((d.values - w).abs() <= d.step).all()
    again = encode(_nv(shape), d.values, first)
    assert torch.equal(again[".weight_global_scale"], first[".weight_global_scale"])
    assert torch.equal(fp4.decode(_nv(shape), again).values, d.values)


def test_nvfp4_refuses_a_width_not_in_groups() -> None:
    with pytest.raises(NotWritable, match="16"):
        encode(_nv((2, 24)), torch.zeros(2, 24), {})


def _blocks(experts: int, rows: int, cols: int) -> dict[str, torch.Tensor]:
    g = cols // 32
    torch.manual_seed(1)
    return {
        "_blocks": torch.randint(0, 256, (experts, rows, g, 16), dtype=torch.uint8),
        "_scales": torch.randint(100, 140, (experts, rows, g), dtype=torch.uint8),
        "_bias": torch.zeros(experts, rows, dtype=torch.bfloat16),
    }


def test_mxfp4_decode_orientation_and_scale() -> None:
    t = _blocks(2, 3, 64)
    t["_blocks"][1, 2, 1, 0] = 0x71  # [expert 1, out 2, group 1]: in 32 → code 1 (0.5), in 33 → code 7 (6.0)
    t["_scales"][1, 2, 1] = 127 + 3
    d = fp4.decode(_mx(2, 3, 64), t)
    assert d.values.shape == (2, 64, 3)  # [E, in, out], as the bf16 gpt-oss checkpoint stores experts
    assert d.values[1, 32, 2].item() == 0.5 * 8 and d.values[1, 33, 2].item() == 6.0 * 8
    assert d.codes[1, 33, 2].item() == 7 and d.step[1, 33, 2].item() == 2.0 * 8
    assert d.values.dtype == torch.float32 and d.codes.dtype == torch.int32


def test_mxfp4_quantize_by_hand() -> None:
    # absmax 7 → 7/6 → the smallest power of two above it: 2 (exponent 1, E8M0 128); then the nearest FP4 value of
    # w/2 = [3.5, 0.25, 1.75, 3.5, −0.25, 0.5], the lower code on a tie (mlx's argmin): 3.5 → 3 (code 5), 0.25 → 0,
    # 1.75 → 1.5 (code 3), −0.25 → +0 (code 0, before −0.5 and −0), 0.5 → code 1
    w = torch.zeros(1, 32)
    w[0, :6] = torch.tensor([7.0, 0.5, 3.5, 7.0, -0.5, 1.0])
    codes, scales = fp4.mxfp4_quantize(w)
    assert scales.tolist() == [[128]]
    assert codes[0, 0, :6].tolist() == [5, 0, 3, 5, 0, 1]
    zero_codes, zero_scales = fp4.mxfp4_quantize(torch.zeros(1, 32))
    assert zero_scales.tolist() == [[127]] and zero_codes.abs().sum() == 0


def test_mxfp4_codes_are_mlx_argmin_over_the_code_order() -> None:
    """mlx's own formulation, argmin |x − v| over the 16 values (first index on a tie), on random and tie values."""
    torch.manual_seed(3)
    w = torch.randn(64, 256) * 0.02
    ties = torch.tensor(
        [0.25, -0.25, 0.75, -0.75, 1.25, 1.75, 2.5, -2.5, 3.5, 5.0, -5.0, 6.0, -0.1, -0.0, 0.1, 4]
    )
    w[:4, :32] = torch.cat([ties, -ties]) * torch.tensor([[1.0], [0.5], [2.0**-20], [8.0]])
    codes, scales = fp4.mxfp4_quantize(w)
    exp = scales.to(torch.int32) - 127
    scaled = w.reshape(64, 8, 32) / torch.pow(torch.tensor(2.0), exp).unsqueeze(-1)
    reference = torch.abs(scaled.unsqueeze(-1) - torch.tensor(fp4.E2M1)).argmin(-1)
    assert torch.equal(codes.to(torch.int64), reference)


def test_mxfp4_round_trip_keeps_the_bias() -> None:
    t = _blocks(2, 4, 64)
    m = _mx(2, 4, 64)
    d = fp4.decode(m, t)
    out = encode(m, d.values, t)
    assert set(out) == {"_blocks", "_scales", "_bias"} and torch.equal(out["_bias"], t["_bias"])
    assert out["_blocks"].shape == t["_blocks"].shape and out["_scales"].dtype == torch.uint8
    assert torch.equal(fp4.decode(m, out).values, d.values)
    with pytest.raises(NotWritable, match="does not fit"):
        encode(m, d.values.transpose(1, 2), t)


def test_mxfp4_plain_linear_keeps_out_in() -> None:
    t = _blocks(1, 5, 64)
    t = {"_blocks": t["_blocks"][0], "_scales": t["_scales"][0]}  # 3-D: [out, in/32, 16], no expert axis
    m = _mx(None, 5, 64)
    d = fp4.decode(m, t)
    assert d.values.shape == (5, 64)
    assert torch.equal(encode(m, d.values, t)["_blocks"], fp4.pack_low_first(fp4.mxfp4_quantize(d.values)[0]))


def test_mxfp4_refuses_exponents_outside_e8m0() -> None:
    with pytest.raises(NotWritable, match="E8M0"):
        fp4.mxfp4_quantize(torch.full((1, 32), 1e-39))


def _run(python: Path, *args: str) -> None:
    r = subprocess.run([str(python), *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.oracle
def test_bit_for_bit_against_compressed_tensors_and_transformers(real_bases: tuple[Path, Path]) -> None:
    python, root = real_bases
    _run(python, str(HERE / "codec_oracle_fp4.py"), str(root))


@pytest.mark.oracle
def test_mxfp4_encode_bit_for_bit_against_mlx(oracle_env: Any, tmp_path: Path) -> None:
    python = oracle_env("mlx")
    torch.manual_seed(2)
    weights = {f"w{i}": torch.randn(shape) * 0.02 for i, shape in enumerate([(64, 256), (3, 2, 32), (7, 96)])}
    weights["w0"][0, :32] = 0.0  # a zero group
    weights["w0"][1, :32] *= 1e-30
    weights["w0"][2, :32] *= 1e30
    edges = torch.zeros(8, 32)  # absmax/6 at and just beside powers of two, and FP4 ties
    for i, k in enumerate((-9, -7, 0, 3)):
        base = torch.tensor(6.0 * 2.0**k)
        edges[2 * i, 0] = base
        edges[2 * i + 1, 0] = torch.nextafter(base, torch.tensor(float("inf")))
        edges[2 * i : 2 * i + 2, 1:12] = (
            base / 6 * torch.tensor([0.25, -0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -5, 0.5, 3])
        )
    weights["edges"] = edges
    np.savez(tmp_path / "in.npz", **{k: v.numpy() for k, v in weights.items()})
    _run(python, str(HERE / "codec_oracle_mlx.py"), str(tmp_path / "in.npz"), str(tmp_path / "out.npz"))
    mlx = np.load(tmp_path / "out.npz")
    # LIBRARY SURPRISE: mlx 0.32.4's CPU mxfp4 scale is the smallest power of two ≥ absmax/6 (as its Metal
    # kernel's mx_scale_round_up), not round(log2(absmax/6)) as mlx's ops.cpp fallback read in 2026-08: the
    # nearest-power rule gives other scales just above a power of two
    s = edges.abs().amax(-1) / 6.0
    nearest = (torch.round(torch.log2(s)).to(torch.int32) + 127).to(torch.uint8).numpy()
    assert not np.array_equal(nearest, mlx["edges.scales"][:, 0])
    for key, w in weights.items():
        codes, scales = fp4.mxfp4_quantize(w)
        assert np.array_equal(fp4.pack_low_first(codes).numpy(), mlx[key + ".blocks"]), key
        assert np.array_equal(scales.numpy(), mlx[key + ".scales"]), key
        # and what mlx dequantizes is what adapterdoc decodes (as transformers does) from those bytes
        if w.ndim == 2:
            t = {"_blocks": fp4.pack_low_first(codes).unsqueeze(0), "_scales": scales.unsqueeze(0)}
            values = fp4.decode(_mx(1, w.shape[0], w.shape[1]), t).values[0].t()
            assert np.array_equal(values.numpy(), mlx[key + ".dequant"]), key
