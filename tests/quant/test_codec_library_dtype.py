"""The public decode (adapterdoc.quant.codec.decode / values): the float32 products each family computes, rounded to
the dtype the format's library computes in where that is narrower (compressed-tensors: the scale's dtype; GPTQ/AWQ:
fp16; bitsandbytes 4-bit: its quant_state dtype), so a merge adds the update to the weight the library loads
(tests/quant/test_quant_merge_real.py checks that against the libraries). ``values`` is ``decode(...).values``."""

from __future__ import annotations

import pytest

from adapterdoc.quant import schemes
from tests.quant.test_codec_bnb import _4bit, _stored
from tests.quant.test_codec_fp8 import block_module, ct_module
from tests.quant.test_codec_packed_int import ct

torch = pytest.importorskip("torch")

from adapterdoc.quant.codec import bnb, decode, encode, fp8, library_dtype, packed_int, values  # noqa: E402


def _check(m: object, stored: dict[str, object], family: object, dtype: object) -> None:
    exact = family.decode(m, stored).values  # type: ignore[attr-defined]
    got = decode(m, stored)  # type: ignore[arg-type]
    assert library_dtype(m, stored) == dtype  # type: ignore[arg-type]
    assert got.values.dtype == torch.float32
    assert torch.equal(got.values, exact.to(dtype).to(torch.float32))
    assert torch.equal(values(m, stored), got.values)  # type: ignore[arg-type]
    if dtype != torch.float32:
        assert not torch.equal(got.values, exact)  # the rounding is real on these weights


@pytest.mark.parametrize("shape", [(200, 300), (256, 384), (3, 256, 128), (3, 130, 128)])
def test_block_fp8_stays_float32(shape: tuple[int, ...]) -> None:
    """Whole blocks (a block view), partial ones (one scale per weight), stacked experts: the same products."""
    torch.manual_seed(0)
    m = block_module(shape[-2:])  # type: ignore[arg-type]
    grid = (*shape[:-2], -(-shape[-2] // 128), -(-shape[-1] // 128))
    template = {
        ".weight": torch.zeros(shape, dtype=torch.float8_e4m3fn),
        ".weight_scale_inv": torch.zeros(grid),
    }
    _check(m, encode(m, torch.randn(shape), template), fp8, torch.float32)


def test_compressed_tensors_fp8_rounds_to_its_scale_dtype() -> None:
    torch.manual_seed(1)
    m = ct_module((64, 96), "channel")
    template = {
        ".weight": torch.zeros(64, 96, dtype=torch.float8_e4m3fn),
        ".weight_scale": torch.zeros(64, 1, dtype=torch.bfloat16),
    }
    _check(m, encode(m, torch.randn(64, 96), template), fp8, torch.bfloat16)


def test_compressed_tensors_w4a16_rounds_to_its_scale_dtype() -> None:
    torch.manual_seed(2)
    m, template = ct((32, 256), 128)
    _check(m, encode(m, torch.randn(32, 256), template), packed_int, torch.bfloat16)


def test_bitsandbytes_4bit_rounds_to_its_state_dtype() -> None:
    torch.manual_seed(3)
    w = torch.randn(16, 64) * 0.02
    m = _4bit("nf4", (16, 64))
    _check(m, _stored(w, "nf4"), bnb, torch.bfloat16)
    assert m.scheme == schemes.BNB_NF4
