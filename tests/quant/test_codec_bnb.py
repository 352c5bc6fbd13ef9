"""adapterdoc.quant.codec.bnb: bitsandbytes NF4 / FP4 / int8 decoded and encoded in plain torch.

Fast tests here (hand-computed cases, round trips, shapes); ``-m oracle`` runs tests/quant/codec_oracle_bnb.py in the
quant environment, bit for bit against bitsandbytes 0.50.2 on random weights of awkward shapes and on the tiny bases
bitsandbytes + transformers wrote."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from adapterdoc.quant import schemes
from adapterdoc.quant.codec import NotWritable, bnb, encode
from adapterdoc.quant.schemes import QuantizedModule

ORACLE = Path(__file__).with_name("codec_oracle_bnb.py")
NF4 = torch.tensor(bnb.NF4_LEVELS)


def _state(quant_type: str, shape: tuple[int, ...], block: int = 64, nested: bool = False) -> torch.Tensor:
    state: dict[str, object] = {
        "quant_type": quant_type,
        "blocksize": block,
        "dtype": "bfloat16",
        "shape": list(shape),
    }
    if nested:
        state |= {"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0}
    return torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)


def _dynamic_map() -> torch.Tensor:
    """A sorted 256-entry map in [-1, 1] standing in for bitsandbytes' dynamic map (the oracle uses the real one)."""
    return torch.linspace(-1.0, 1.0, 256)


def _4bit(quant_type: str, shape: tuple[int, ...], block: int = 64, nested: bool = False) -> QuantizedModule:
    scheme = schemes.BNB_NF4 if quant_type == "nf4" else schemes.BNB_FP4
    suffixes = [".weight", ".weight.absmax", ".weight.quant_map", bnb.STATE + quant_type]
    if nested:
        suffixes += [".weight.nested_absmax", ".weight.nested_quant_map"]
    rows, cols = shape if len(shape) == 2 else (1, shape[0])
    return QuantizedModule("m", scheme, {s: "m" + s for s in suffixes}, "U8", (rows, cols))


def _stored(
    w: torch.Tensor, quant_type: str, block: int = 64, nested: bool = False
) -> dict[str, torch.Tensor]:
    """What encode writes for ``w`` from a template state (the shape and kind are all it reads)."""
    template = {bnb.STATE + quant_type: _state(quant_type, tuple(w.shape), block, nested)}
    if nested:
        template[".weight.nested_absmax"] = torch.zeros(1)
        template[".weight.nested_quant_map"] = _dynamic_map()
    return encode(_4bit(quant_type, tuple(w.shape), block, nested), w, template)


def test_nf4_by_hand() -> None:
    w = torch.tensor([[1.0, -1.0, 0.0, 0.5], [0.25, -0.6, 0.1, -0.09]])
    out = _stored(w, "nf4")
    # one partial block of 8, absmax 1: 1 → 15, −1 → 0, 0 → 7, 0.5 → 12 (0.4407 is nearer than 0.5626), 0.25 → 10,
    # −0.6 → 2 (−0.5251 is nearer than −0.6962), 0.1 → 8 (0.0796), −0.09 → 6 (−0.0911)
    assert out[".weight"].flatten().tolist() == [0xF0, 0x7C, 0xA2, 0x86]
    assert out[".weight"].shape == (4, 1) and out[".weight"].dtype == torch.uint8
    assert out[".weight.absmax"].tolist() == [1.0]
    assert torch.equal(out[".weight.quant_map"], NF4)
    d = bnb.decode(_4bit("nf4", (2, 4)), out)
    assert d.codes.tolist() == [[15, 0, 7, 12], [10, 2, 8, 6]]
    assert torch.equal(d.values, NF4[d.codes.long()])
    # step: the mean gap to the neighbours (the one gap at the ends), times absmax 1
    assert d.step[0, 0].item() == pytest.approx(1.0 - 0.7229568362236023)
    assert d.step[0, 2].item() == pytest.approx((0.07958029955625534 + 0.09105003625154495) / 2)
    assert d.values.dtype == d.step.dtype == torch.float32 and d.codes.shape == (2, 4)


def test_fp4_levels_and_signed_zero() -> None:
    code = bnb.code_table("fp4")
    assert code[:8].tolist() == pytest.approx([0, 1 / 192, 2 / 3, 1, 1 / 3, 0.5, 1 / 6, 0.25])
    assert torch.equal(code[8:], -code[:8])
    w = torch.tensor([[12.0, -6.0, 0.0, -0.0001, 0.0001, 3.0]])
    out = _stored(w, "fp4")
    d = bnb.decode(_4bit("fp4", (1, 6)), out)
    assert d.values[0, :2].tolist() == [12.0, -6.0]
    assert d.values[0, 5].item() == 3.0
    assert d.values[0, 2:5].abs().max().item() < 0.07  # the tiny weights land on ±0 or ±1/192


def test_odd_count_packs_a_padding_code_as_the_kernel_does() -> None:
    w = torch.tensor([[0.5, -1.0, 0.25]])
    out = _stored(w, "nf4")
    assert out[".weight"].shape == (2, 1)
    # the kernel pads the odd count with 0.0 before bucketize: NF4 code 7 in the last low nibble
    assert out[".weight"][1, 0].item() & 0xF == 7
    assert bnb.decode(_4bit("nf4", (1, 3)), out).values.shape == (1, 3)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("shape", [(64, 128), (3, 100), (5, 7)])
def test_requantizing_a_decoded_weight_keeps_its_codes(
    quant_type: str, nested: bool, shape: tuple[int, int]
) -> None:
    torch.manual_seed(0)
    w = torch.randn(shape) * 0.02
    m = _4bit(quant_type, shape, 64, nested)
    first = _stored(w, quant_type, 64, nested)
    d = bnb.decode(m, first)
    assert d.values.shape == d.codes.shape == d.step.shape == shape
    assert (d.values - w).abs().max() <= d.step.max()
    again = encode(m, d.values, first)
    assert set(again) == set(first)
    redone = bnb.decode(m, again)
    if nested:  # the decoded absmax is itself requantized (a new offset): close, not equal
        assert ((redone.values - d.values).abs() <= d.step).all()
        return
    assert torch.equal(redone.values, d.values)  # (FP4's ±0 codes may swap: −0.0 == 0.0)
    assert torch.equal(again[".weight.absmax"], first[".weight.absmax"])
    if quant_type == "nf4":
        assert torch.equal(redone.codes, d.codes)


def test_double_quant_rewrites_the_offset_in_the_json() -> None:
    torch.manual_seed(1)
    w = torch.randn(16, 64) * 0.05
    out = _stored(w, "nf4", 64, nested=True)
    state = json.loads(bytes(out[bnb.STATE + "nf4"].tolist()))
    absmax = w.reshape(-1, 64).abs().amax(1)
    assert state["nested_offset"] == pytest.approx(absmax.mean().item(), rel=1e-6)
    assert list(state) == [
        "quant_type",
        "blocksize",
        "dtype",
        "shape",
        "nested_blocksize",
        "nested_dtype",
        "nested_offset",
    ]
    assert out[".weight.absmax"].dtype == torch.uint8 and out[".weight.absmax"].shape == (16,)
    assert out[".weight.nested_absmax"].shape == (1,)
    decoded_absmax = bnb.absmax_of(out, state)
    assert (decoded_absmax - absmax).abs().max() < 2 * out[".weight.nested_absmax"].item() / 127


def test_blockwise_lut_quantizer_by_hand() -> None:
    code = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0] + [1.0] * 251)
    q, absmax = bnb.quantize_blockwise_cpu(torch.tensor([2.0, -1.0, 0.4, 0.6, 0.0, 0.0]), code, 4)
    assert absmax.tolist() == [2.0, 0.0]
    assert q.tolist() == [4, 1, 2, 3, 0, 0]  # 0.2 → 0.0, 0.3 → 0.5; an all-zero block → code 0
    # the table has 65536 entries 2/65535 apart: 0.000025 is nearer 0.00004 than 0, but its table entry
    # (1.526e-5) lies below the midpoint 0.00002, so bitsandbytes' CPU kernel (and adapterdoc) give code 1 (0.0)
    fine = torch.tensor([-1.0, 0.0, 0.00004] + [1.0] * 253)
    q, _ = bnb.quantize_blockwise_cpu(torch.tensor([1.0, 0.000025]), fine, 2)
    assert q.tolist() == [3, 1]


def test_4bit_storage_dtype_is_kept() -> None:
    w = torch.tensor([[1.0, -1.0, 0.0, 0.5]])
    template = {bnb.STATE + "nf4": _state("nf4", (1, 4)), ".weight": torch.zeros(1, 1, dtype=torch.bfloat16)}
    out = encode(_4bit("nf4", (1, 4)), w, template)
    assert out[".weight"].dtype == torch.bfloat16 and out[".weight"].shape == (1, 1)
    assert out[".weight"].view(torch.uint8).flatten().tolist() == [0xF0, 0x7C]
    assert torch.equal(bnb.decode(_4bit("nf4", (1, 4)), out).values, NF4[torch.tensor([[15, 0, 7, 12]])])


def test_int8_by_hand() -> None:
    m = QuantizedModule("m", schemes.BNB_INT8, {".weight": "m.weight", ".SCB": "m.SCB"}, "I8", (2, 3))
    w = torch.tensor([[1.0, -0.5, 0.25], [0.0, 0.1, -0.2]])
    out = encode(m, w, {})
    # row 0: absmax 1, round(127·w): 127, −63.5 → −64 (half to even), 31.75 → 32
    assert out[".weight"][0].tolist() == [127, -64, 32]
    assert out[".weight"].dtype == torch.int8
    assert out[".SCB"].tolist() == pytest.approx([1.0, 0.2], rel=1e-3)  # row absmax of the float16 weight
    d = bnb.decode(m, out)
    assert d.codes[0].tolist() == [127, -64, 32]
    assert d.values[0, 0].item() == pytest.approx(1.0)
    assert torch.equal(d.values, out[".weight"] * out[".SCB"].view(-1, 1) * bnb.INV_127)
    assert d.step[1, 2].item() == pytest.approx(out[".SCB"][1].item() / 127)


def test_int8_op_order_and_float16_cast() -> None:
    m = QuantizedModule("m", schemes.BNB_INT8, {".weight": "m.weight", ".SCB": "m.SCB"}, "I8", (1, 2))
    scb = torch.tensor([0.01852310262620449])
    d = bnb.decode(m, {".weight": torch.tensor([[127, 0]], dtype=torch.int8), ".SCB": scb})
    # int8 · SCB first, then · 0.007874015718698502 (bitsandbytes' 1/127): one float32 ulp below SCB itself here
    assert d.values[0, 0].item() == 0.01852310076355934 != scb.item()
    # Int8Params quantizes the weight cast to float16: 0.492125 → 0.4921875, 127 · that = 62.51 → 63 (62 in float32)
    assert encode(m, torch.tensor([[1.0, 0.492125]]), {})[".weight"].tolist() == [[127, 63]]


def test_int8_keeps_weight_format() -> None:
    suffixes = {".weight": "m.weight", ".SCB": "m.SCB", ".weight_format": "m.weight_format"}
    m = QuantizedModule("m", schemes.BNB_INT8, suffixes, "I8", (1, 2))
    out = encode(m, torch.tensor([[0.5, 1.0]]), {".weight_format": torch.tensor(0, dtype=torch.uint8)})
    assert set(out) == set(suffixes) and out[".weight_format"].item() == 0


def test_refusals() -> None:
    template = {bnb.STATE + "nf4": _state("nf4", (2, 4))}
    with pytest.raises(NotWritable, match="shape"):
        encode(_4bit("nf4", (2, 4)), torch.zeros(4, 2), template)
    with pytest.raises(NotWritable, match="quant_state"):
        bnb.decode(_4bit("nf4", (2, 4)), {".weight": torch.zeros(4, 1, dtype=torch.uint8)})
    with pytest.raises(NotWritable, match="af4"):
        bnb.code_table("af4")


@pytest.mark.oracle
def test_bit_for_bit_against_bitsandbytes(real_bases: tuple[Path, Path]) -> None:
    python, root = real_bases
    r = subprocess.run([str(python), str(ORACLE), str(root)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert r.stdout.strip().splitlines()[-1].startswith("ok ")
