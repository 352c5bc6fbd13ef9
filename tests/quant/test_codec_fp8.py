"""adapterdoc.quant.codec.fp8: block FP8 (transformers / DeepSeek) and compressed-tensors FP8, decoded and encoded.

Hand-computed cases, the ceil-divided grid, round trips and refusals. test_codec_fp8_oracle.py compares bit for bit
with transformers' and compressed-tensors' own code."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from adapterdoc.quant import schemes
from adapterdoc.quant.codec import NotWritable
from adapterdoc.quant.schemes import Geometry, QuantizedModule

pytestmark = pytest.mark.ml
torch = pytest.importorskip("torch")

from adapterdoc.quant.codec import encode, fp8  # noqa: E402  (torch first)

F8 = torch.float8_e4m3fn
ORACLE = Path(__file__).with_name("codec_oracle_fp8.py")


def block_module(shape: tuple[int, int], block: tuple[int, int] = (128, 128)) -> QuantizedModule:
    tensors = {".weight": "m.weight", ".weight_scale_inv": "m.weight_scale_inv"}
    geometry = Geometry(bits=8, block_size=block, strategy="block", symmetric=True)
    return QuantizedModule("m", schemes.FP8_BLOCK, tensors, "F8_E4M3", shape, geometry=geometry)


def ct_module(shape: tuple[int, int], strategy: str, block: tuple[int, int] | None = None) -> QuantizedModule:
    tensors = {".weight": "m.weight", ".weight_scale": "m.weight_scale"}
    geometry = Geometry(bits=8, block_size=block, strategy=strategy, symmetric=True)
    return QuantizedModule("m", schemes.CT_FP8, tensors, "F8_E4M3", shape, geometry=geometry)


def block_tensors(rows: int, cols: int, block: tuple[int, int] = (128, 128)) -> dict[str, object]:
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    return {".weight": torch.zeros(rows, cols, dtype=F8), ".weight_scale_inv": torch.ones(grid)}


def test_hand_computed_block() -> None:
    # one 2x2 block, amax 4: transformers' scales = 448 / 4 = 112, codes W * 112, weight_scale_inv = 1 / 112
    w = torch.tensor([[1.0, -2.0], [0.5, 4.0]])
    module = block_module((2, 2), (2, 2))
    out = encode(module, w, block_tensors(2, 2, (2, 2)))  # type: ignore[arg-type]
    assert out[".weight"].view(torch.uint8).tolist() == [[0x6E, 0xF6], [0x66, 0x7E]]  # 112, -224, 56, 448
    assert out[".weight_scale_inv"].tolist() == [[torch.tensor(1.0 / 112.0, dtype=torch.float32).item()]]
    d = fp8.decode(module, out)
    assert d.codes.tolist() == [[0x6E, 0xF6], [0x66, 0x7E]]
    assert d.values.dtype == torch.float32
    inv = out[".weight_scale_inv"][0, 0]
    assert torch.equal(d.values, torch.tensor([[112.0, -224.0], [56.0, 448.0]]) * inv)
    # e4m3 gaps: 112 and 56 sit inside their binades (gap 8 and 4), 224 too (16), 448 at the top (gap below 32)
    assert torch.equal(d.step, torch.tensor([[8.0, 16.0], [4.0, 32.0]]) * inv)


def test_unit_steps() -> None:
    steps = fp8.e4m3_unit_steps()
    assert steps[0x00].item() == steps[0x80].item() == 2.0**-9  # ±0: the subnormal gap on both sides
    assert steps[0x01].item() == 2.0**-9  # subnormal
    assert steps[0x08].item() == 2.0**-9  # 2^-6, first normal: subnormal gap below, 2^-9 above
    assert steps[0x38].item() == (2.0**-4 + 2.0**-3) / 2  # 1.0: a binade edge, mean of the two gaps
    assert steps[0x39].item() == 2.0**-3  # 1.125
    assert steps[0x7E].item() == steps[0xFE].item() == 32.0  # ±448: only the gap below
    assert torch.isnan(steps[0x7F]) and torch.isnan(steps[0xFF])


def test_ceil_grid_partial_blocks() -> None:
    torch.manual_seed(1)
    w = torch.randn(5, 7)
    module = block_module((5, 7), (2, 3))
    out = encode(module, w, block_tensors(5, 7, (2, 3)))  # type: ignore[arg-type]
    inv = out[".weight_scale_inv"]
    assert inv.shape == (3, 3) and inv.dtype == torch.float32
    for i in range(3):
        for j in range(3):
            tile = w[2 * i : 2 * i + 2, 3 * j : 3 * j + 3]  # the last row / column blocks are partial
            scales = 448.0 / tile.abs().amax()
            assert inv[i, j].item() == (1.0 / scales).item()
            codes = torch.clamp(tile * scales, -448.0, 448.0).to(F8)
            assert torch.equal(
                out[".weight"][2 * i : 2 * i + 2, 3 * j : 3 * j + 3].view(torch.uint8),
                codes.view(torch.uint8),
            )
    d = fp8.decode(module, out)
    assert d.values.shape == (5, 7)
    assert torch.equal(d.values[4, 6], out[".weight"][4, 6].float() * inv[2, 2])
    assert (d.values - w).abs().le(d.step).all()


def test_zero_block_keeps_scale_one() -> None:
    w = torch.zeros(4, 4)
    w[:2, :2] = 1.0
    out = encode(block_module((4, 4), (2, 2)), w, block_tensors(4, 4, (2, 2)))  # type: ignore[arg-type]
    assert out[".weight_scale_inv"][1, 1].item() == 1.0
    assert out[".weight"].float()[2:, 2:].eq(0).all()


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (130, 129)])
def test_block_round_trip(shape: tuple[int, int]) -> None:
    torch.manual_seed(0)
    w = torch.randn(shape) * 0.02
    module = block_module(shape)
    out = encode(module, w, block_tensors(*shape))  # type: ignore[arg-type]
    d = fp8.decode(module, out)
    assert d.codes.dtype == torch.int32 and d.codes.shape == shape
    assert (d.values - w).abs().le(d.step).all()
    assert torch.equal(d.codes, out[".weight"].view(torch.uint8).int())
    again = encode(module, d.values, out)
    changed = (again[".weight"].view(torch.uint8) != out[".weight"].view(torch.uint8)).float().mean().item()
    assert changed < 0.01


def test_stacked_experts() -> None:
    torch.manual_seed(2)
    w = torch.randn(3, 130, 260)
    module = block_module((130, 260))
    stored = {".weight": torch.zeros(3, 130, 260, dtype=F8), ".weight_scale_inv": torch.ones(3, 2, 3)}
    out = encode(module, w, stored)  # type: ignore[arg-type]
    for e in range(3):
        one = encode(module, w[e], block_tensors(130, 260))  # type: ignore[arg-type]
        assert torch.equal(out[".weight"][e].view(torch.uint8), one[".weight"].view(torch.uint8))
        assert torch.equal(out[".weight_scale_inv"][e], one[".weight_scale_inv"])
    assert fp8.decode(module, out).values.shape == (3, 130, 260)


def test_ct_channel_hand_computed() -> None:
    w = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
    module = ct_module((2, 3), "channel")
    stored = {".weight": torch.zeros(2, 3, dtype=F8), ".weight_scale": torch.ones(2, 1, dtype=torch.bfloat16)}
    out = encode(module, w, stored)
    scale = out[".weight_scale"]
    assert scale.dtype == torch.bfloat16
    assert scale[0, 0].item() == torch.tensor(2.0 / 448.0).to(torch.bfloat16).item()
    assert scale[1, 0].item() == torch.tensor(torch.finfo(torch.float32).eps).to(torch.bfloat16).item()
    expected = torch.clamp(w.to(torch.bfloat16) / scale, -448, 448).to(
        F8
    )  # the division in bf16, the model's dtype
    assert torch.equal(out[".weight"].view(torch.uint8), expected.view(torch.uint8))
    d = fp8.decode(module, out)
    assert torch.equal(d.values, out[".weight"].float() * scale.float())


@pytest.mark.parametrize(
    ("strategy", "block", "scale_shape"),
    [("block", (128, 128), (2, 5)), ("channel", None, (200, 1)), ("tensor", None, (1,))],
)
def test_ct_round_trip_and_bf16_exactness(
    strategy: str, block: tuple[int, int] | None, scale_shape: tuple[int, ...]
) -> None:
    torch.manual_seed(3)
    w = (torch.randn(200, 576) * 0.05).to(torch.bfloat16).float()
    module = ct_module((200, 576), strategy, block)
    stored = {
        ".weight": torch.zeros(200, 576, dtype=F8),
        ".weight_scale": torch.ones(scale_shape, dtype=torch.bfloat16),
    }
    out = encode(module, w, stored)
    assert out[".weight_scale"].shape == scale_shape and out[".weight_scale"].dtype == torch.bfloat16
    d = fp8.decode(module, out)
    assert (d.values - w).abs().le(d.step * 1.01).all()
    # the float32 product is exact, so its bf16 cast is compressed-tensors' bf16 arithmetic
    full = fp8._broadcast(
        out[".weight_scale"], block or ((1, 576) if strategy == "channel" else (200, 576)), (200, 576)
    )
    assert torch.equal(d.values.to(torch.bfloat16), out[".weight"].to(torch.bfloat16) * full)


def test_refusals() -> None:
    module = block_module((256, 256))
    good = block_tensors(256, 256)
    with pytest.raises(NotWritable, match="scale shape"):
        fp8.decode(module, {".weight": good[".weight"], ".weight_scale_inv": torch.ones(2, 3)})  # type: ignore[dict-item]
    with pytest.raises(NotWritable, match="ue8m0"):
        encode(
            module,
            torch.zeros(256, 256),
            {**good, ".weight_scale_inv": torch.ones(2, 2, dtype=torch.bfloat16)},
        )  # type: ignore[dict-item]
    with pytest.raises(NotWritable, match="not float8_e4m3fn"):
        fp8.decode(module, {**good, ".weight": torch.zeros(256, 256, dtype=torch.float8_e5m2)})  # type: ignore[dict-item]
    with pytest.raises(NotWritable, match="missing"):
        fp8.decode(module, {".weight": good[".weight"]})  # type: ignore[dict-item]
    with pytest.raises(NotWritable, match="weight shape"):
        encode(module, torch.zeros(256, 128), good)  # type: ignore[arg-type]
    ct = ct_module((4, 4), "channel")
    with pytest.raises(NotWritable, match="asymmetric"):
        fp8.decode(
            ct,
            {
                ".weight": torch.zeros(4, 4, dtype=F8),
                ".weight_scale": torch.ones(4, 1),
                ".weight_zero_point": torch.zeros(4, 1),
            },
        )
    with pytest.raises(NotWritable, match="strategy"):
        fp8.decode(
            ct_module((4, 4), "token"),
            {".weight": torch.zeros(4, 4, dtype=F8), ".weight_scale": torch.ones(4, 1)},
        )


def test_block_without_configured_size_follows_the_grid() -> None:
    tensors = {".weight": "m.weight", ".weight_scale_inv": "m.weight_scale_inv"}
    module = QuantizedModule("m", schemes.FP8_BLOCK, tensors, "F8_E4M3", (256, 384))
    stored = {".weight": torch.ones(256, 384, dtype=F8), ".weight_scale_inv": torch.arange(6.0).reshape(2, 3)}
    d = fp8.decode(module, stored)
    assert d.values[127, 127].item() == 0.0 and d.values[128, 383].item() == 5.0
    odd = QuantizedModule("m", schemes.FP8_BLOCK, tensors, "F8_E4M3", (250, 384))
    with pytest.raises(NotWritable, match="not divisible"):
        fp8.decode(odd, {".weight": torch.ones(250, 384, dtype=F8), ".weight_scale_inv": torch.ones(3, 3)})


@pytest.mark.oracle
def test_bit_equal_to_the_libraries(real_bases: tuple[Path, Path]) -> None:
    """Every quantized module of the block-FP8 and compressed-tensors FP8 bases, and random weights of awkward
    shapes (partial blocks, every compressed-tensors strategy, bf16 and float32 models): decode equals transformers'
    Fp8Dequantize / compressed-tensors' decompression (float32 and the library's dtype), encode equals
    transformers' Fp8Quantize / compressed-tensors' calibrate + compress (tests/quant/codec_oracle_fp8.py)."""
    python, root = real_bases
    env = {**os.environ, "TQDM_DISABLE": "1"}
    r = subprocess.run(
        [str(python), str(ORACLE), str(root)], capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in counts.items() if k != "deepseek-codes-differ"} == {
        "fp8-transformers": 14,
        "fp8-transformers-576": 8,  # the 576-wide MLP stays unquantized in transformers' own output
        "fp8-deepseek": 14,
        "ct-fp8-block": 14,
        "ct-fp8-dynamic": 14,
        "random-block": 5,
        "random-ct-block": 2,
        "random-ct-channel": 2,
        "random-ct-tensor": 1,
    }
    assert 0 < counts["deepseek-codes-differ"] < 0.01 * 14 * 256 * 576
