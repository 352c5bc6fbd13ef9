"""adapterdoc.quant.codec.packed_int: compressed-tensors W4A16, GPTQ v1 and AWQ GEMM, decoded and encoded.

Hand-packed words, the layouts' orders, GPTQ's v1 zero offset (and its carry), activation order, round trips and
refusals. test_codec_packed_int_oracle.py compares with compressed-tensors and the published GPTQ/AWQ code."""

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

from adapterdoc.quant.codec import encode, packed_int  # noqa: E402  (torch first)
from adapterdoc.quant.codec.packed_int import pack_fields, unpack_fields  # noqa: E402

ORACLE = Path(__file__).with_name("codec_oracle_packed_int.py")


def word(fields: list[int], bits: int = 4) -> int:
    """One int32 word (signed) from its fields, field j at bits ``bits·j``."""
    w = sum(f << (bits * j) for j, f in enumerate(fields))
    return w - (1 << 32) if w >= 1 << 31 else w


def module(scheme: str, suffixes: tuple[str, ...], shape: tuple[int, int], **geo: object) -> QuantizedModule:
    tensors = {s: "m" + s for s in suffixes}
    return QuantizedModule("m", scheme, tensors, "I32", shape, geometry=Geometry(**geo))  # type: ignore[arg-type]


GPTQ_SUFFIXES = (".qweight", ".qzeros", ".scales", ".g_idx")
AWQ_SUFFIXES = (".qweight", ".qzeros", ".scales")
CT_SUFFIXES = (".weight_packed", ".weight_scale", ".weight_shape")


def test_fields_hand_packed() -> None:
    w = torch.tensor([[word([0, 1, 2, 3, 4, 5, 6, 7]), word([15] * 8)]], dtype=torch.int32)
    assert unpack_fields(w, 4).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7] + [15] * 8]
    assert torch.equal(pack_fields(unpack_fields(w, 4), 4), w)
    assert unpack_fields(w, 4, dim=0).shape == (8, 2)
    assert unpack_fields(torch.tensor([[word([3, 0, 1, 2] * 4, 2)]], dtype=torch.int32), 2).tolist() == [
        [3, 0, 1, 2] * 4
    ]
    assert unpack_fields(torch.tensor([[-1]], dtype=torch.int32), 8).tolist() == [[255] * 4]
    assert pack_fields(torch.tensor([[1, 2, 3]]), 4).tolist() == [[word([1, 2, 3, 0, 0, 0, 0, 0])]]  # padded


def gptq_tensors() -> dict[str, object]:
    """8 inputs, 8 outputs, one group: code of (input i, output o) = (i + o) % 16, zero 8 (stored 7), scale o + 1."""
    qweight = [[word([(i + o) % 16 for i in range(8)]) for o in range(8)]]
    return {
        ".qweight": torch.tensor(qweight, dtype=torch.int32),
        ".qzeros": torch.tensor([[word([7] * 8)]], dtype=torch.int32),
        ".scales": torch.arange(1.0, 9.0, dtype=torch.float16).reshape(1, 8) / 64,
        ".g_idx": torch.zeros(8, dtype=torch.int32),
    }


def test_gptq_hand_computed() -> None:
    m = module(schemes.GPTQ, GPTQ_SUFFIXES, (8, 8), bits=4, group_size=8, symmetric=True)
    t = gptq_tensors()
    d = packed_int.decode(m, t)  # type: ignore[arg-type]
    for o in range(8):
        for i in range(8):
            assert d.codes[o, i].item() == (i + o) % 16
            assert d.values[o, i].item() == (o + 1) / 64 * ((i + o) % 16 - 8)
            assert d.step[o, i].item() == (o + 1) / 64
    again = encode(m, d.values, t)  # type: ignore[arg-type]
    assert all(torch.equal(again[s], t[s]) for s in GPTQ_SUFFIXES)  # type: ignore[arg-type]
    # values beyond the grid are clamped to its ends (0 and 15), not wrapped into the next field
    far = encode(m, torch.full((8, 8), 100.0), t)  # type: ignore[arg-type]
    assert packed_int.decode(m, {**t, ".qweight": far[".qweight"]}).codes.eq(15).all()  # type: ignore[dict-item]


def test_gptq_v1_zero_carry() -> None:
    # gptqmodel reads v1 qzeros by adding 0x11111111 to the int32 word: a stored field 15 (zero 0 written as -1)
    # carries into the next field instead of wrapping alone
    m = module(schemes.GPTQ, GPTQ_SUFFIXES, (8, 8), bits=4, group_size=8)
    t = {**gptq_tensors(), ".qzeros": torch.tensor([[word([15, 3, 7, 7, 7, 7, 7, 7])]], dtype=torch.int32)}
    d = packed_int.decode(m, t)  # type: ignore[arg-type]
    zeros = [(d.codes[o, 0] - d.values[o, 0] / d.step[o, 0]).item() for o in range(8)]
    assert zeros == [0, 5, 8, 8, 8, 8, 8, 8]  # field 1: 3 + 1 + the carry


def test_gptq_activation_order() -> None:
    torch.manual_seed(0)
    g_idx = torch.randperm(64) % 4  # desc_act: groups scattered over the inputs
    scales = torch.rand(4, 8).to(torch.float16) + 0.1
    codes = torch.randint(0, 16, (64, 8))
    t = {
        ".qweight": pack_fields(codes, 4, dim=0),
        ".qzeros": pack_fields(torch.full((4, 8), 7), 4),
        ".scales": scales,
        ".g_idx": g_idx.to(torch.int32),
    }
    m = module(schemes.GPTQ, GPTQ_SUFFIXES, (8, 64), bits=4, group_size=16, desc_act=True)
    d = packed_int.decode(m, t)
    expected = scales.float()[g_idx.long()] * (codes - 8).float()
    assert torch.equal(d.values, expected.t())
    # fp16, gptqmodel's dtype: the float32 product is exact, so its cast is the library's fp16 product
    assert torch.equal(d.values.to(torch.float16), (scales[g_idx.long()] * (codes - 8).to(torch.float16)).t())
    again = encode(m, d.values, t)
    assert torch.equal(again[".qweight"], t[".qweight"]) and again[".g_idx"] is t[".g_idx"]
    noisy = d.values + (torch.rand(8, 64) - 0.5) * 0.9 * d.step  # within half a step of each grid point
    assert torch.equal(encode(m, noisy, t)[".qweight"], t[".qweight"])


def test_awq_order_hand_computed() -> None:
    # field i of word k holds column 8k + (0, 2, 4, 6, 1, 3, 5, 7)[i]
    m = module(schemes.AWQ, AWQ_SUFFIXES, (8, 8), bits=4, group_size=8, symmetric=False)
    t = {
        ".qweight": torch.tensor([[word([0, 1, 2, 3, 4, 5, 6, 7])]] * 8, dtype=torch.int32),
        ".qzeros": torch.tensor([[word([1, 1, 2, 2, 3, 3, 4, 4])]], dtype=torch.int32),
        ".scales": torch.full((1, 8), 0.5, dtype=torch.float16),
    }
    d = packed_int.decode(m, t)
    assert d.codes[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # output column o, any input
    zeros = [1, 3, 1, 3, 2, 4, 2, 4]
    assert d.values[:, 3].tolist() == [
        (c - z) * 0.5 for c, z in zip([0, 4, 1, 5, 2, 6, 3, 7], zeros, strict=True)
    ]
    again = encode(m, d.values, t)
    assert all(torch.equal(again[s], t[s]) for s in AWQ_SUFFIXES)


def test_awq_round_trip_random() -> None:
    torch.manual_seed(1)
    codes = torch.randint(0, 16, (256, 64))
    zeros = torch.randint(0, 16, (2, 64))
    order = torch.arange(64).reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]].reshape(-1)
    t = {
        ".qweight": pack_fields(codes[:, order], 4),
        ".qzeros": pack_fields(zeros[:, order], 4),
        ".scales": (torch.rand(2, 64) * 0.01 + 0.001).to(torch.float16),
    }
    m = module(schemes.AWQ, AWQ_SUFFIXES, (64, 256), bits=4, group_size=128, symmetric=False)
    d = packed_int.decode(m, t)
    assert torch.equal(d.codes, codes.t().int())
    group = torch.arange(256) // 128
    assert torch.equal(d.values, ((codes - zeros[group]).float() * t[".scales"].float()[group]).t())
    assert torch.equal(encode(m, d.values, t)[".qweight"], t[".qweight"])


def ct(
    shape: tuple[int, int], group: int, asym: bool = False
) -> tuple[QuantizedModule, dict[str, torch.Tensor]]:
    rows, cols = shape
    suffixes = CT_SUFFIXES + ((".weight_zero_point",) if asym else ())
    m = module(
        schemes.CT_W4A16, suffixes, shape, bits=4, group_size=group, strategy="group", symmetric=not asym
    )
    t = {
        ".weight_packed": torch.zeros(rows, cols // 8, dtype=torch.int32),
        ".weight_scale": torch.ones(rows, cols // group, dtype=torch.bfloat16),
        ".weight_shape": torch.tensor([rows, cols]),
    }
    if asym:
        t[".weight_zero_point"] = torch.zeros(-(-rows // 8), cols // group, dtype=torch.int32)
    return m, t


def test_ct_hand_computed() -> None:
    # one group of 8, amax 7.5: scale 7.5 / 7.5 = 1, codes round(W) + 8 packed
    m, t = ct((1, 8), 8)
    w = torch.tensor([[0.0, 1.0, -1.0, 2.5, 3.5, -7.5, 7.0, 0.4]])
    out = encode(m, w, t)
    assert out[".weight_scale"].tolist() == [[1.0]] and out[".weight_scale"].dtype == torch.bfloat16
    assert out[".weight_packed"].tolist() == [
        [word([8, 9, 7, 10, 12, 0, 15, 8])]
    ]  # 2.5 → 2, 3.5 → 4, -7.5 → -8
    assert out[".weight_shape"] is t[".weight_shape"]
    d = packed_int.decode(m, out)
    assert d.codes.tolist() == [[8, 9, 7, 10, 12, 0, 15, 8]]
    assert d.values.tolist() == [[0.0, 1.0, -1.0, 2.0, 4.0, -8.0, 7.0, 0.0]]


def test_ct_asymmetric_zero_point_packed_by_rows() -> None:
    m, t = ct((16, 8), 8, asym=True)
    w = torch.linspace(0.0, 3.0, 8).repeat(16, 1) + torch.arange(16.0)[:, None]  # all positive: zero -8 + 0
    w = w.to(torch.bfloat16).float()  # the library quantizes the model in its dtype
    out = encode(m, w, t)
    zp = out[".weight_zero_point"]
    assert zp.shape == (2, 1) and zp.dtype == torch.int32
    assert unpack_fields(zp, 4, dim=0)[:16, 0].tolist() == [0] * 16  # -8 + 8: min clamped to 0, zero = q_min
    d = packed_int.decode(m, out)
    assert (d.values - w).abs().le(d.step * 0.55).all()  # the quotient and the zero added in bf16


@pytest.mark.parametrize("shape", [(64, 256), (24, 384)])
def test_ct_round_trip(shape: tuple[int, int]) -> None:
    torch.manual_seed(2)
    w = (torch.randn(shape) * 0.02).to(torch.bfloat16).float()
    m, t = ct(shape, 128)
    out = encode(m, w, t)
    d = packed_int.decode(m, out)
    assert d.values.shape == shape and d.codes.dtype == torch.int32
    assert (d.values - w).abs().le(d.step * 0.55).all()  # 7.5 steps clamped to 7, the scale rounded to bf16
    assert torch.equal(
        d.values.to(torch.bfloat16),
        ((d.codes - 8).to(torch.bfloat16) * out[".weight_scale"].repeat_interleave(128, 1)),
    )


def test_refusals() -> None:
    m = module(schemes.GPTQ, GPTQ_SUFFIXES, (8, 8), bits=3, group_size=8)
    with pytest.raises(NotWritable, match="3-bit"):
        packed_int.decode(m, gptq_tensors())  # type: ignore[arg-type]
    with pytest.raises(NotWritable, match="not 1-bit"):
        packed_int.decode(module(schemes.GPTQ, GPTQ_SUFFIXES, (8, 8), bits=1, group_size=8), gptq_tensors())  # type: ignore[arg-type]
    m4 = module(schemes.GPTQ, GPTQ_SUFFIXES, (8, 8), bits=4, group_size=8)
    with pytest.raises(NotWritable, match="missing"):
        packed_int.decode(m4, {k: v for k, v in gptq_tensors().items() if k != ".qzeros"})  # type: ignore[misc]
    with pytest.raises(NotWritable, match="g_idx"):
        packed_int.decode(m4, {**gptq_tensors(), ".g_idx": torch.full((8,), 3, dtype=torch.int32)})  # type: ignore[dict-item]
    with pytest.raises(NotWritable, match="weight shape"):
        encode(m4, torch.zeros(8, 16), gptq_tensors())  # type: ignore[arg-type]
    with pytest.raises(NotWritable, match="experts"):
        packed_int.decode(m4, {**gptq_tensors(), ".qweight": torch.zeros(2, 1, 8, dtype=torch.int32)})  # type: ignore[dict-item]
    awq = module(schemes.AWQ, AWQ_SUFFIXES, (8, 8), bits=8, group_size=8)
    with pytest.raises(NotWritable, match="4-bit"):
        packed_int.decode(awq, gptq_tensors())  # type: ignore[arg-type]
    mc, tc = ct((8, 256), 128)
    with pytest.raises(NotWritable, match="weight_g_idx"):
        packed_int.decode(mc, {**tc, ".weight_g_idx": torch.zeros(256, dtype=torch.int32)})
    with pytest.raises(NotWritable, match="does not hold"):
        packed_int.decode(mc, {**tc, ".weight_shape": torch.tensor([8, 512])})
    with pytest.raises(NotWritable, match="groups"):
        packed_int.decode(mc, {**tc, ".weight_scale": torch.ones(8, 3)})
    m300, t300 = ct(
        (8, 304), 128
    )  # 304 columns on 3 scales: a partial group, which compressed-tensors refuses
    with pytest.raises(NotWritable, match="groups"):
        packed_int.decode(
            m300,
            {
                **t300,
                ".weight_packed": torch.zeros(8, 38, dtype=torch.int32),
                ".weight_scale": torch.ones(8, 3),
            },
        )


@pytest.mark.oracle
def test_bit_equal_to_the_references(real_bases: tuple[Path, Path]) -> None:
    """Every module of the GPTQ, AWQ and compressed-tensors W4A16 bases (against their original bf16 weights too)
    and random weights (GPTQ act-order g_idx, a partial last group, asymmetric zeros with the v1 carry; AWQ;
    compressed-tensors asymmetric / channel / 8-bit / float32 and float16 models): decode and encode equal
    compressed-tensors' own compress / decompress and gptqmodel's and AutoAWQ's code transcribed with citations
    in tests/quant/codec_oracle_packed_int.py."""
    python, root = real_bases
    env = {**os.environ, "TQDM_DISABLE": "1"}
    r = subprocess.run(
        [str(python), str(ORACLE), str(root)], capture_output=True, text=True, timeout=600, env=env
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    assert counts == {
        "gptq": 14,
        "awq": 14,
        "random-gptq": 4,
        "random-awq": 3,
        "ct-w4a16": 14,
        "random-ct": 5,
    }
