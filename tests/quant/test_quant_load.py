"""verify --load on a quantized base without its library: one exit-3 line naming the scheme and the pip install,
decided torch-free before anything loads (adapterdoc.ml.quant_load)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from adapterdoc.bases import resolve_base
from adapterdoc.errors import UnsupportedInputError
from adapterdoc.ml.quant_load import quantized_base, require_libraries
from adapterdoc.quant import detect_folder
from adapterdoc.quant.text import scheme_text
from tests.quant.quant_helpers import CT_W4A16_WEIGHTS, ct_qc, i64_pair, plain, write_base

DOWN = "model.layers.0.mlp.down_proj"
GPTQ_QC: dict[str, object] = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 128,
    "desc_act": False,
    "sym": True,
}


def _w4a16(tmp_path: Path) -> Path:
    return write_base(
        tmp_path / "w4a16",
        ct_qc("pack-quantized", CT_W4A16_WEIGHTS),
        {
            **plain(),
            f"{DOWN}.weight_shape": ("I64", (2,), i64_pair(256, 768)),
            f"{DOWN}.weight_packed": ("I32", (256, 96)),
            f"{DOWN}.weight_scale": ("BF16", (256, 6)),
        },
    )


def _gptq(tmp_path: Path) -> Path:
    return write_base(
        tmp_path / "gptq",
        GPTQ_QC,
        {
            **plain(),
            f"{DOWN}.qweight": ("I32", (96, 256)),
            f"{DOWN}.qzeros": ("I32", (6, 32)),
            f"{DOWN}.scales": ("F16", (6, 256)),
            f"{DOWN}.g_idx": ("I32", (768,)),
        },
    )


def test_describe_names_scheme_and_geometry(tmp_path: Path) -> None:
    assert scheme_text(detect_folder(_w4a16(tmp_path))) == "ct-w4a16 (4-bit, group 128, symmetric)"


def test_a_method_adapterdoc_does_not_read_is_named(tmp_path: Path) -> None:
    folder = write_base(tmp_path / "hqq", {"quant_method": "hqq"}, plain())
    qb = quantized_base(resolve_base(str(folder)))
    assert qb is not None and qb.described == "quant_method 'hqq'" and qb.route.modules == ()


def test_a_plain_or_tiny_base_takes_the_usual_route(tmp_path: Path) -> None:
    assert quantized_base(resolve_base("tiny:ministral3_text")) is None
    plain_base = write_base(tmp_path / "plain", None, plain())
    assert quantized_base(resolve_base(str(plain_base))) is None


@pytest.mark.skipif(
    importlib.util.find_spec("compressed_tensors") is not None, reason="compressed-tensors installed"
)
def test_compressed_tensors_missing_is_one_line_with_the_install(tmp_path: Path) -> None:
    from adapterdoc.ml.load import load_check

    base = resolve_base(str(_w4a16(tmp_path)))
    ckpt = SimpleNamespace(root=str(tmp_path), adapter_config=object())
    with pytest.raises(UnsupportedInputError) as e:
        load_check(base, ckpt)  # type: ignore[arg-type]
    assert e.value.exit_code == 3
    assert str(e.value).endswith(
        "the base is quantized: ct-w4a16 (4-bit, group 128, symmetric); loading it needs `compressed_tensors` "
        "(not installed): pip install 'compressed-tensors>=0.15.0'"
    )


@pytest.mark.skipif(importlib.util.find_spec("gptqmodel") is not None, reason="gptqmodel installed")
def test_gptq_needs_gptqmodel(tmp_path: Path) -> None:
    qb = quantized_base(resolve_base(str(_gptq(tmp_path))))
    assert qb is not None and qb.quantization.scheme == "gptq"
    with pytest.raises(
        UnsupportedInputError,
        match=r"quantized: gptq \(4-bit, group 128, symmetric\); .*pip install optimum gptqmodel",
    ):
        require_libraries(qb)
