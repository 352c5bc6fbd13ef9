"""merge into a quantized base: one AD520 refusal, nothing written (adapterdoc.merge.quantized)."""

from __future__ import annotations

from pathlib import Path

from adapterdoc.merge.run import merge
from tests.quant.quant_helpers import CT_W4A16_WEIGHTS, ct_qc, i64_pair, plain, write_base
from tests.small_adapters import write_small_adapter

Q = "model.layers.0.self_attn.q_proj"


def test_merge_into_a_quantized_base_is_one_clear_refusal(tmp_path: Path) -> None:
    base = write_base(
        tmp_path / "base",
        ct_qc("pack-quantized", CT_W4A16_WEIGHTS),
        {
            **plain(),
            f"{Q}.weight_shape": ("I64", (2,), i64_pair(256, 256)),
            f"{Q}.weight_packed": ("I32", (256, 32)),
            f"{Q}.weight_scale": ("BF16", (256, 2)),
        },
    )
    adapter = write_small_adapter(tmp_path / "adapter", hidden=256)
    out = tmp_path / "out"
    report = merge(adapter, base, out)
    assert [f.code for f in report.findings] == ["AD520"]
    assert report.findings[0].message == (
        "the base is quantized: ct-w4a16 (4-bit, group 128, symmetric), 1 quantized module(s); merging W + BA and "
        "quantizing again can erase the delta; adapterdoc does not merge into quantized bases yet: serve the "
        "adapter unmerged, or merge into the unquantized base"
    )
    assert report.out is None and report.tensors == 0
    assert not out.exists() or not any(out.iterdir())


def test_merge_into_a_plain_base_is_not_refused(tmp_path: Path) -> None:
    tensors = {**plain(), f"{Q}.weight": ("BF16", (256, 256))}
    base = write_base(tmp_path / "base", None, tensors)
    adapter = write_small_adapter(tmp_path / "adapter", hidden=256)
    report = merge(adapter, base, tmp_path / "out")
    assert "AD520" not in [f.code for f in report.findings]
