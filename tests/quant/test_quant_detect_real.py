"""adapterdoc.quant.detect on tiny bases the real libraries wrote (``-m oracle``; environment: .ci/oracles/quant.sh).

fixtures/make_quantized.py runs in the quant environment (compressed-tensors 0.20.1, bitsandbytes 0.50.2, transformers'
own Fp8Quantize; GPTQ, AWQ and DeepSeek's block FP8 by their published layouts) and detect() reads each base here,
torch-free. The facts the libraries' output showed are pinned beside the checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.quant import Geometry, Quantization, detect_folder
from adapterdoc.st.header import read_header

pytestmark = [pytest.mark.oracle]
LAYER0 = "model.layers.0"
DOWN = f"{LAYER0}.mlp.down_proj"
Q = f"{LAYER0}.self_attn.q_proj"
PROJECTIONS = 14
"""2 layers × (q, k, v, o, gate, up, down)."""
SHAPES_768 = {(256, 256), (128, 256), (768, 256), (256, 768)}
"""(out, in) of q/o, k/v, gate/up, down at hidden 256, 2 of 4 heads for k/v, intermediate 768."""
SHAPES_576 = {(256, 256), (128, 256), (576, 256), (256, 576)}
PLAIN = ("lm_head", "model.embed_tokens")


@pytest.fixture(scope="module")
def bases(real_bases: tuple[Path, Path]) -> Path:
    return real_bases[1]


def _detect(bases: Path, name: str) -> Quantization:
    return detect_folder(bases / name)


def _tensor(bases: Path, name: str, tensor: str) -> tuple[str, tuple[int, ...]]:
    info = read_header(bases / name / "model.safetensors").tensors[tensor]
    return info.dtype, info.shape


def _qc(bases: Path, name: str) -> dict[str, Any]:
    qc: dict[str, Any] = json.loads((bases / name / "config.json").read_text())["quantization_config"]
    return qc


def _common(q: Quantization, scheme: str, shapes: set[tuple[int, int]]) -> None:
    assert q.scheme == scheme
    assert len(q.modules) == PROJECTIONS
    assert {m.scheme for m in q.modules} == {scheme}
    assert {m.shape for m in q.modules} == shapes
    assert q.unquantized == PLAIN


def test_the_libraries_that_made_them(bases: Path) -> None:
    manifest = json.loads((bases / "manifest.json").read_text())
    assert manifest["versions"]["compressed-tensors"] == "0.20.1"
    assert manifest["versions"]["bitsandbytes"] == "0.50.2"
    assert manifest["fixtures"]["ct-nvfp4"] == "compressed-tensors"
    assert manifest["fixtures"]["bnb-nf4"] == "bitsandbytes"
    assert manifest["fixtures"]["fp8-transformers"] == "transformers"
    assert manifest["fixtures"]["gptq"] == "published layout"


# ----------------------------------------------------------------------------------------- compressed-tensors


def test_ct_fp8_block_writes_a_ceil_divided_grid(bases: Path) -> None:
    q = _detect(bases, "ct-fp8-block")
    _common(q, "ct-fp8", SHAPES_576)
    assert (q.method, q.format, q.ignore) == ("compressed-tensors", "float-quantized", ("lm_head",))
    assert q.geometry == Geometry(bits=8, block_size=(128, 128), strategy="block", symmetric=True)
    # compressed-tensors only warns on 576 = 4.5 blocks and writes the ceil grid, scales in the model's dtype (bf16)
    assert _tensor(bases, "ct-fp8-block", f"{DOWN}.weight_scale") == ("BF16", (2, 5))
    assert _tensor(bases, "ct-fp8-block", f"{DOWN}.weight") == ("F8_E4M3", (256, 576))
    assert q.notes == (
        "a weight not a whole number of blocks (partial last block, ceil-divided grid): 6 modules, e.g. "
        f"{DOWN}",
    )
    assert _qc(bases, "ct-fp8-block")["quantization_status"] == "compressed"
    assert _qc(bases, "ct-fp8-block")["version"] == "0.20.1"  # the library's version, not a format version


def test_ct_fp8_dynamic(bases: Path) -> None:
    q = _detect(bases, "ct-fp8-dynamic")
    _common(q, "ct-fp8", SHAPES_768)
    assert q.geometry == Geometry(bits=8, strategy="channel", symmetric=True)
    assert _tensor(bases, "ct-fp8-dynamic", f"{DOWN}.weight_scale") == ("BF16", (256, 1))
    assert q.notes == ()


def test_ct_w4a16(bases: Path) -> None:
    q = _detect(bases, "ct-w4a16")
    _common(q, "ct-w4a16", SHAPES_768)
    assert (q.format, q.geometry) == (
        "pack-quantized",
        Geometry(bits=4, group_size=128, strategy="group", symmetric=True),
    )
    down = q.module(DOWN)
    assert down is not None and down.shape == (256, 768)
    # symmetric: no weight_zero_point is written; weight_shape is I64 [2]; codes packed along in
    assert set(down.tensors) == {".weight_packed", ".weight_scale", ".weight_shape"}
    assert _tensor(bases, "ct-w4a16", f"{DOWN}.weight_shape") == ("I64", (2,))
    assert _tensor(bases, "ct-w4a16", f"{DOWN}.weight_packed") == ("I32", (256, 96))
    assert q.notes == ()


def test_ct_nvfp4(bases: Path) -> None:
    q = _detect(bases, "ct-nvfp4")
    _common(q, "ct-nvfp4", SHAPES_768)
    assert q.geometry == Geometry(bits=4, group_size=16, strategy="tensor_group", symmetric=True)
    assert _tensor(bases, "ct-nvfp4", f"{DOWN}.weight_packed") == ("U8", (256, 384))
    assert _tensor(bases, "ct-nvfp4", f"{DOWN}.weight_scale") == ("F8_E4M3", (256, 48))
    assert _tensor(bases, "ct-nvfp4", f"{DOWN}.weight_global_scale") == ("F32", (1,))
    assert (
        _qc(bases, "ct-nvfp4")["config_groups"]["group_0"]["weights"]["scale_dtype"] == "torch.float8_e4m3fn"
    )
    assert q.notes == ()


# ------------------------------------------------------------------------------------------------ block FP8


def test_fp8_transformers(bases: Path) -> None:
    q = _detect(bases, "fp8-transformers")
    _common(q, "fp8-block", SHAPES_768)
    assert (q.method, q.format) == ("fp8", None)  # FineGrainedFP8Config writes no `fmt`
    assert q.geometry == Geometry(bits=8, block_size=(128, 128), strategy="block", symmetric=True)
    qc = _qc(bases, "fp8-transformers")
    assert (qc["scale_fmt"], qc["dequantize"], qc["modules_to_not_convert"]) == ("float", False, None)
    assert _tensor(bases, "fp8-transformers", f"{DOWN}.weight_scale_inv") == ("F32", (2, 6))
    assert q.notes == ()


def test_fp8_transformers_leaves_partial_block_weights_unquantized(bases: Path) -> None:
    # transformers' Fp8Quantize returns a weight that is not a whole number of 128-blocks as it was (bf16), while
    # the config quantizes every Linear and excludes nothing: the MLP of each layer stays bf16
    q = _detect(bases, "fp8-transformers-576")
    assert q.scheme == "fp8-block" and len(q.modules) == 8
    assert {m.path.rsplit(".", 1)[1] for m in q.modules} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert _tensor(bases, "fp8-transformers-576", f"{DOWN}.weight") == ("BF16", (256, 576))
    assert set(q.unquantized) == {
        *PLAIN,
        *(f"model.layers.{i}.mlp.{p}" for i in (0, 1) for p in ("gate_proj", "up_proj", "down_proj")),
    }
    assert q.notes == (
        f"stored unquantized in a quantized layer, and the config does not exclude it: 6 modules, e.g. {DOWN}",
    )


def test_fp8_deepseek_rule(bases: Path) -> None:
    q = _detect(bases, "fp8-deepseek")
    _common(q, "fp8-block", SHAPES_576)
    assert q.format == "e4m3"
    assert _tensor(bases, "fp8-deepseek", f"{DOWN}.weight_scale_inv") == ("F32", (2, 5))
    assert len(q.notes) == 1 and q.notes[0].startswith("a weight not a whole number of blocks")


# ------------------------------------------------------------------------------------------------ bitsandbytes


def test_bnb_nf4(bases: Path) -> None:
    q = _detect(bases, "bnb-nf4")
    _common(q, "bnb-nf4", SHAPES_768)
    assert q.geometry == Geometry(bits=4, group_size=64, strategy="block", double_quant=True)
    # the packed codes are a 2-D [numel/2, 1] U8 column; with double quant absmax itself is U8
    assert _tensor(bases, "bnb-nf4", f"{DOWN}.weight") == ("U8", (256 * 768 // 2, 1))
    assert _tensor(bases, "bnb-nf4", f"{DOWN}.weight.absmax") == ("U8", (256 * 768 // 64,))
    down = q.module(DOWN)
    assert down is not None and len(down.tensors) == 6
    assert q.notes == ()


def test_bnb_fp4(bases: Path) -> None:
    q = _detect(bases, "bnb-fp4")
    _common(q, "bnb-fp4", SHAPES_768)
    assert q.geometry is not None and q.geometry.double_quant is False
    assert _tensor(bases, "bnb-fp4", f"{DOWN}.weight.absmax") == ("F32", (256 * 768 // 64,))
    assert q.notes == ()


def test_bnb_int8(bases: Path) -> None:
    q = _detect(bases, "bnb-int8")
    _common(q, "bnb-int8", SHAPES_768)
    # an 8-bit config still carries the 4-bit default quant type; a scalar weight_format tensor sits beside SCB
    assert _qc(bases, "bnb-int8")["bnb_4bit_quant_type"] == "fp4"
    assert _tensor(bases, "bnb-int8", f"{DOWN}.weight_format") == ("U8", ())
    assert _tensor(bases, "bnb-int8", f"{DOWN}.SCB") == ("F32", (256,))
    assert q.notes == ()


# -------------------------------------------------------------------------------------- GPTQ and AWQ layouts


def test_gptq(bases: Path) -> None:
    q = _detect(bases, "gptq")
    _common(q, "gptq", SHAPES_768)
    assert q.geometry == Geometry(bits=4, group_size=128, strategy="group", symmetric=True, desc_act=False)
    assert _tensor(bases, "gptq", f"{DOWN}.qweight") == ("I32", (96, 256))
    assert q.notes == ()


def test_awq(bases: Path) -> None:
    q = _detect(bases, "awq")
    _common(q, "awq", SHAPES_768)
    assert q.geometry == Geometry(bits=4, group_size=128, strategy="group", symmetric=False)
    assert _tensor(bases, "awq", f"{DOWN}.qweight") == ("I32", (768, 32))
    assert q.notes == ()
