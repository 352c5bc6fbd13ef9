"""adapterdoc.quant.detect on hand-built headers: one realistic base per scheme (configs as the libraries write them,
tensor names, dtypes and shapes as their checkpoints hold them), then the odd and the invalid inputs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adapterdoc.errors import ConfigError, HeaderError
from adapterdoc.quant import Geometry, detect, detect_base, detect_folder, weight_files
from adapterdoc.quant.schemes import (
    AWQ,
    BNB_FP4,
    BNB_INT8,
    BNB_NF4,
    CT_FP8,
    CT_NVFP4,
    CT_W4A16,
    FP8_BLOCK,
    GPTQ,
    MIXED,
    MXFP4,
    NONE,
    UNKNOWN,
)
from adapterdoc.st.header import read_header
from tests.quant.quant_helpers import (
    BNB_INT8_QC,
    BNB_NF4_QC,
    CT_CHANNEL_FP8_WEIGHTS,
    CT_FP8_BLOCK_QC,
    CT_NVFP4_WEIGHTS,
    CT_W4A16_WEIGHTS,
    Spec,
    ct_qc,
    i64_pair,
    json_bytes,
    plain,
    write_base,
)

Q = "model.layers.0.self_attn.q_proj"
DOWN = "model.layers.0.mlp.down_proj"
DEEPSEEK_QC = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
"""DeepSeek-V3's quantization_config as published."""
PLAIN_PATHS = ("lm_head", "model.embed_tokens")


def _base(tmp_path: Path, qc: dict[str, object] | None, tensors: dict[str, Spec], name: str = "base") -> Path:
    return write_base(tmp_path / name, qc, {**plain(), **tensors})


# ------------------------------------------------------------------------------------------------- schemes


def test_block_fp8_as_deepseek_writes_it_with_a_ceil_divided_grid(tmp_path: Path) -> None:
    folder = _base(
        tmp_path,
        DEEPSEEK_QC,
        {
            f"{Q}.weight": ("F8_E4M3", (256, 256)),
            f"{Q}.weight_scale_inv": ("F32", (2, 2)),
            f"{DOWN}.weight": ("F8_E4M3", (256, 576)),
            f"{DOWN}.weight_scale_inv": ("F32", (2, 5)),  # ⌈576/128⌉ = 5
        },
    )
    q = detect_folder(folder)
    assert (q.scheme, q.method, q.format) == (FP8_BLOCK, "fp8", "e4m3")
    assert q.geometry == Geometry(bits=8, block_size=(128, 128), strategy="block", symmetric=True)
    assert [m.path for m in q.modules] == [DOWN, Q]  # by path
    down = q.module(DOWN)
    assert down is not None
    assert down.shape == (256, 576) and down.dtype == "F8_E4M3" and down.experts is None
    assert down.tensors == {".weight": f"{DOWN}.weight", ".weight_scale_inv": f"{DOWN}.weight_scale_inv"}
    assert q.unquantized == PLAIN_PATHS
    assert q.notes == (
        f"a weight not a whole number of blocks (partial last block, ceil-divided grid): {DOWN}",
    )


def test_block_fp8_scale_grid_that_is_floor_divided_is_a_note(tmp_path: Path) -> None:
    folder = _base(
        tmp_path,
        DEEPSEEK_QC,
        {f"{DOWN}.weight": ("F8_E4M3", (256, 576)), f"{DOWN}.weight_scale_inv": ("F32", (2, 4))},
    )
    assert detect_folder(folder).notes == (
        f"a block scale grid that is not ⌈shape/block⌉ (scale [2, 4]): {DOWN}",
    )


def test_block_fp8_stacked_expert_parameter(tmp_path: Path) -> None:
    # transformers' Fp8Quantize names the scale of a non-`.weight` parameter `X_scale_inv`
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    folder = _base(
        tmp_path,
        DEEPSEEK_QC,
        {experts: ("F8_E4M3", (4, 512, 256)), f"{experts}_scale_inv": ("F32", (4, 4, 2))},
    )
    (m,) = detect_folder(folder).modules
    assert (m.path, m.scheme, m.shape, m.experts) == (experts, FP8_BLOCK, (512, 256), 4)
    assert m.tensors == {"": experts, "_scale_inv": f"{experts}_scale_inv"}


def test_ct_fp8_block(tmp_path: Path) -> None:
    folder = _base(
        tmp_path,
        CT_FP8_BLOCK_QC,
        {
            f"{DOWN}.weight_scale": ("BF16", (2, 6)),  # compressed-tensors writes scales in the model's dtype
            f"{Q}.weight_scale": ("BF16", (2, 2)),
            f"{DOWN}.weight": ("F8_E4M3", (256, 768)),
            f"{Q}.weight": ("F8_E4M3", (256, 256)),
        },
    )
    q = detect_folder(folder)
    assert (q.scheme, q.method, q.format) == (CT_FP8, "compressed-tensors", "float-quantized")
    assert q.geometry == Geometry(bits=8, block_size=(128, 128), strategy="block", symmetric=True)
    assert [(m.path, m.shape) for m in q.modules] == [(DOWN, (256, 768)), (Q, (256, 256))]
    assert q.ignore == ("lm_head",) and q.unquantized == PLAIN_PATHS and q.notes == ()


def test_ct_fp8_dynamic_channel_scales(tmp_path: Path) -> None:
    folder = _base(
        tmp_path,
        ct_qc("float-quantized", CT_CHANNEL_FP8_WEIGHTS),
        {f"{DOWN}.weight_scale": ("BF16", (256, 1)), f"{DOWN}.weight": ("F8_E4M3", (256, 768))},
    )
    q = detect_folder(folder)
    assert q.scheme == CT_FP8 and q.geometry is not None and q.geometry.strategy == "channel"
    assert q.modules[0].shape == (256, 768) and q.notes == ()
    wrong = _base(
        tmp_path,
        ct_qc("float-quantized", CT_CHANNEL_FP8_WEIGHTS),
        {f"{DOWN}.weight_scale": ("BF16", (1, 256)), f"{DOWN}.weight": ("F8_E4M3", (256, 768))},
        "wrong",
    )
    assert detect_folder(wrong).notes == (f"a channel scale of shape [1, 256] (expected [out, 1]): {DOWN}",)


def test_ct_w4a16_reads_weight_shape(tmp_path: Path) -> None:
    folder = _base(
        tmp_path,
        ct_qc("pack-quantized", CT_W4A16_WEIGHTS),
        {
            f"{DOWN}.weight_shape": ("I64", (2,), i64_pair(256, 768)),
            f"{DOWN}.weight_packed": ("I32", (256, 96)),
            f"{DOWN}.weight_scale": ("BF16", (256, 6)),
        },
    )
    q = detect_folder(folder)
    assert q.scheme == CT_W4A16
    assert q.geometry == Geometry(bits=4, group_size=128, strategy="group", symmetric=True)
    (m,) = q.modules
    assert (m.shape, m.dtype) == ((256, 768), "I32")
    assert set(m.tensors) == {".weight_packed", ".weight_scale", ".weight_shape"}
    assert q.notes == ()


def test_ct_w4a16_without_weight_shape_has_no_logical_shape(tmp_path: Path) -> None:
    folder = _base(
        tmp_path,
        ct_qc("pack-quantized", CT_W4A16_WEIGHTS),
        {f"{DOWN}.weight_packed": ("I32", (256, 96)), f"{DOWN}.weight_scale": ("BF16", (256, 6))},
    )
    q = detect_folder(folder)
    assert q.modules[0].shape is None
    assert q.notes == (f"a packed weight without `weight_shape` (in_features not recorded): {DOWN}",)


def test_ct_w4a16_weight_shape_disagreeing_with_the_packing(tmp_path: Path) -> None:
    folder = _base(
        tmp_path,
        ct_qc("pack-quantized", CT_W4A16_WEIGHTS),
        {
            f"{DOWN}.weight_shape": ("I64", (2,), i64_pair(256, 1024)),
            f"{DOWN}.weight_packed": ("I32", (256, 96)),
            f"{DOWN}.weight_scale": ("BF16", (256, 8)),
        },
    )
    assert detect_folder(folder).notes == (f"4-bit codes packed as [256, 96] (expected [256, 128]): {DOWN}",)


def test_ct_nvfp4(tmp_path: Path) -> None:
    folder = _base(
        tmp_path,
        ct_qc("nvfp4-pack-quantized", CT_NVFP4_WEIGHTS),
        {
            f"{DOWN}.weight_global_scale": ("F32", (1,)),
            f"{DOWN}.weight_scale": ("F8_E4M3", (256, 48)),
            f"{DOWN}.weight_packed": ("U8", (256, 384)),
        },
    )
    q = detect_folder(folder)
    assert q.scheme == CT_NVFP4
    assert q.geometry == Geometry(bits=4, group_size=16, strategy="tensor_group", symmetric=True)
    (m,) = q.modules
    assert (m.shape, m.dtype) == ((256, 768), "U8")
    assert set(m.tensors) == {".weight_packed", ".weight_scale", ".weight_global_scale"}
    assert q.notes == ()


GPTQ_QC = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 128,
    "desc_act": False,
    "sym": True,
    "checkpoint_format": "gptq",
}


def _gptq_tensors(path: str, inn: int, out: int, g_idx: bool = True) -> dict[str, Spec]:
    t: dict[str, Spec] = {
        f"{path}.qweight": ("I32", (inn // 8, out)),
        f"{path}.qzeros": ("I32", (inn // 128, out // 8)),
        f"{path}.scales": ("F16", (inn // 128, out)),
    }
    if g_idx:
        t[f"{path}.g_idx"] = ("I32", (inn,))
    return t


def test_gptq(tmp_path: Path) -> None:
    folder = _base(tmp_path, GPTQ_QC, {**_gptq_tensors(DOWN, 768, 256), **_gptq_tensors(Q, 256, 256)})
    q = detect_folder(folder)
    assert (q.scheme, q.format) == (GPTQ, "gptq")
    assert q.geometry == Geometry(bits=4, group_size=128, strategy="group", symmetric=True, desc_act=False)
    assert [(m.path, m.shape) for m in q.modules] == [(DOWN, (256, 768)), (Q, (256, 256))]
    assert set(q.modules[0].tensors) == {".qweight", ".qzeros", ".scales", ".g_idx"}
    assert q.notes == ()


def test_gptq_without_g_idx_unpacks_with_the_configs_bits(tmp_path: Path) -> None:
    qc = {**GPTQ_QC, "bits": 8}
    folder = _base(
        tmp_path,
        qc,
        {
            f"{DOWN}.qweight": ("I32", (192, 256)),
            f"{DOWN}.qzeros": ("I32", (6, 64)),
            f"{DOWN}.scales": ("F16", (6, 256)),
        },
    )
    q = detect_folder(folder)
    assert q.modules[0].shape == (256, 768)
    assert q.notes == (f"GPTQ `qweight` without `g_idx` (in_features from 8-bit packing): {DOWN}",)


def test_awq_gemm(tmp_path: Path) -> None:
    qc = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    folder = _base(
        tmp_path,
        {**qc, "modules_to_not_convert": None},
        {
            f"{DOWN}.qweight": ("I32", (768, 32)),
            f"{DOWN}.qzeros": ("I32", (6, 32)),
            f"{DOWN}.scales": ("F16", (6, 256)),
        },
    )
    q = detect_folder(folder)
    assert (q.scheme, q.format) == (AWQ, "gemm")
    assert q.geometry == Geometry(bits=4, group_size=128, strategy="group", symmetric=False)
    assert q.modules[0].shape == (256, 768) and q.notes == ()


def test_awq_legacy_config_keys(tmp_path: Path) -> None:
    # AutoAWQ's own quant_config.json spelling: w_bit, q_group_size
    qc = {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"}
    folder = _base(tmp_path, qc, {f"{DOWN}.qweight": ("I32", (768, 32)), f"{DOWN}.scales": ("F16", (6, 256))})
    q = detect_folder(folder)
    assert q.geometry is not None and (q.geometry.bits, q.geometry.group_size) == (4, 128)
    assert q.notes == ("AWQ version 'GEMM': only the GEMM layout's shapes are read",)


def _nf4(path: str, out: int, inn: int, kind: str = "nf4", double: bool = True) -> dict[str, Spec]:
    n = out * inn
    state = {"quant_type": kind, "blocksize": 64, "dtype": "bfloat16", "shape": [out, inn]}
    t: dict[str, Spec] = {f"{path}.weight": ("U8", (n // 2, 1))}
    if double:
        state.update({"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.05})
        t[f"{path}.weight.absmax"] = ("U8", (n // 64,))
        t[f"{path}.weight.nested_absmax"] = ("F32", (n // 64 // 256,))
        t[f"{path}.weight.nested_quant_map"] = ("F32", (256,))
    else:
        t[f"{path}.weight.absmax"] = ("F32", (n // 64,))
    t[f"{path}.weight.quant_map"] = ("F32", (16,))
    t[f"{path}.weight.quant_state.bitsandbytes__{kind}"] = json_bytes(state)
    return t


def test_bnb_nf4_double_quant(tmp_path: Path) -> None:
    folder = _base(tmp_path, BNB_NF4_QC, {**_nf4(DOWN, 256, 768), **_nf4(Q, 256, 256)})
    q = detect_folder(folder)
    assert (q.scheme, q.method) == (BNB_NF4, "bitsandbytes")
    assert q.geometry == Geometry(bits=4, group_size=64, strategy="block", double_quant=True)
    assert [(m.path, m.shape, m.dtype) for m in q.modules] == [
        (DOWN, (256, 768), "U8"),
        (Q, (256, 256), "U8"),
    ]
    assert len(q.modules[0].tensors) == 6 and q.notes == ()


def test_bnb_fp4_without_double_quant(tmp_path: Path) -> None:
    qc = {**BNB_NF4_QC, "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False}
    folder = _base(tmp_path, qc, _nf4(DOWN, 256, 768, "fp4", double=False))
    q = detect_folder(folder)
    assert q.scheme == BNB_FP4 and q.geometry is not None and q.geometry.double_quant is False
    assert q.modules[0].shape == (256, 768) and len(q.modules[0].tensors) == 4


def test_bnb_quant_state_that_is_not_json_is_a_note(tmp_path: Path) -> None:
    t = _nf4(DOWN, 256, 768)
    t[f"{DOWN}.weight.quant_state.bitsandbytes__nf4"] = ("U8", (4,), b"\xff{[x")
    q = detect_folder(_base(tmp_path, BNB_NF4_QC, t))
    assert q.modules[0].shape is None
    assert q.notes == (f"a bitsandbytes quant_state whose JSON has no 2-D `shape`: {DOWN}",)


def test_bnb_int8_config_carries_the_4bit_default_fp4(tmp_path: Path) -> None:
    # transformers writes `bnb_4bit_quant_type: fp4` into an 8-bit config: it must not read as bnb-fp4
    assert BNB_INT8_QC["bnb_4bit_quant_type"] == "fp4"
    folder = _base(
        tmp_path,
        BNB_INT8_QC,
        {
            f"{DOWN}.SCB": ("F32", (256,)),
            f"{DOWN}.weight": ("I8", (256, 768)),
            f"{DOWN}.weight_format": ("U8", ()),
        },
    )
    q = detect_folder(folder)
    assert q.scheme == BNB_INT8
    (m,) = q.modules
    assert (m.shape, m.dtype) == ((256, 768), "I8")
    assert set(m.tensors) == {".weight", ".SCB", ".weight_format"}
    assert q.notes == ()


GPT_OSS_QC = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


def test_mxfp4_expert_parameters(tmp_path: Path) -> None:
    experts = "model.layers.0.mlp.experts"
    folder = _base(
        tmp_path,
        GPT_OSS_QC,
        {
            f"{experts}.gate_up_proj_blocks": ("U8", (4, 512, 8, 16)),
            f"{experts}.gate_up_proj_scales": ("U8", (4, 512, 8)),
            f"{experts}.gate_up_proj_bias": ("BF16", (4, 512)),
            f"{experts}.down_proj_blocks": ("U8", (4, 256, 8, 16)),
            f"{experts}.down_proj_scales": ("U8", (4, 256, 8)),
            f"{Q}.weight": ("BF16", (256, 256)),
            "model.layers.0.mlp.router.weight": ("BF16", (4, 256)),
        },
    )
    q = detect_folder(folder)
    assert q.scheme == MXFP4
    assert q.geometry == Geometry(bits=4, group_size=32, strategy="group", symmetric=True)
    assert [(m.path, m.shape, m.experts) for m in q.modules] == [
        (f"{experts}.down_proj", (256, 256), 4),
        (f"{experts}.gate_up_proj", (512, 256), 4),
    ]
    assert set(q.modules[1].tensors) == {"_blocks", "_scales", "_bias"}
    assert q.unquantized == ("lm_head", "model.embed_tokens", "model.layers.0.mlp.router", Q)
    assert q.notes == ()  # attention and router are excluded by modules_to_not_convert's patterns


def test_plain_base(tmp_path: Path) -> None:
    q = detect_folder(_base(tmp_path, None, {f"{Q}.weight": ("BF16", (256, 256))}))
    assert (q.scheme, q.method, q.geometry, q.modules, q.notes) == (NONE, None, None, (), ())
    assert not q.quantized and q.unquantized == ("lm_head", "model.embed_tokens", Q)


# ------------------------------------------------------------------------------------- odd but valid input


def test_config_says_gptq_but_no_qweight(tmp_path: Path) -> None:
    q = detect_folder(_base(tmp_path, GPTQ_QC, {f"{Q}.weight": ("BF16", (256, 256))}))
    assert q.scheme == GPTQ and q.modules == ()
    assert q.notes == ("config.json says gptq (gptq) but no tensor stores a quantized module",)


def test_quantized_tensors_without_a_config(tmp_path: Path) -> None:
    folder = _base(
        tmp_path, None, {f"{Q}.weight": ("F8_E4M3", (256, 256)), f"{Q}.weight_scale_inv": ("F32", (2, 2))}
    )
    q = detect_folder(folder)
    assert (q.scheme, q.method, q.geometry) == (FP8_BLOCK, None, None)
    assert q.modules[0].shape == (256, 256)
    assert q.notes == ("the tensors are quantized (fp8-block) but config.json has no quantization_config",)


def test_tensors_of_another_scheme_than_the_config(tmp_path: Path) -> None:
    folder = _base(
        tmp_path, GPTQ_QC, {f"{Q}.weight": ("F8_E4M3", (256, 256)), f"{Q}.weight_scale_inv": ("F32", (2, 2))}
    )
    q = detect_folder(folder)
    assert q.scheme == GPTQ and q.modules[0].scheme == FP8_BLOCK
    assert q.notes == (f"stored as fp8-block though the config says gptq: {Q}",)


def test_gptq_tensors_under_an_awq_config_are_told_apart_by_shape(tmp_path: Path) -> None:
    qc = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    q = detect_folder(_base(tmp_path, qc, _gptq_tensors(DOWN, 768, 256)))
    assert q.modules[0].scheme == GPTQ and q.modules[0].shape == (256, 768)
    assert q.notes == (f"stored as gptq though the config says awq: {DOWN}",)


def test_unquantized_module_inside_a_quantized_layer(tmp_path: Path) -> None:
    # transformers' Fp8Quantize leaves a weight that is not a whole number of blocks unquantized (make_quantized.py)
    gate = "model.layers.0.mlp.gate_proj"
    folder = _base(
        tmp_path,
        {**DEEPSEEK_QC, "modules_to_not_convert": ["model.layers.0.mlp.up_proj"]},
        {
            f"{Q}.weight": ("F8_E4M3", (256, 256)),
            f"{Q}.weight_scale_inv": ("F32", (2, 2)),
            f"{gate}.weight": ("BF16", (576, 256)),
            "model.layers.0.mlp.up_proj.weight": ("BF16", (576, 256)),
        },
    )
    q = detect_folder(folder)
    assert q.notes == (
        f"stored unquantized in a quantized layer, and the config does not exclude it: {gate}",
    )


def test_quantized_module_the_ignore_list_names(tmp_path: Path) -> None:
    qc = {**CT_FP8_BLOCK_QC, "ignore": ["lm_head", "re:.*self_attn.*"]}
    folder = _base(
        tmp_path, qc, {f"{Q}.weight": ("F8_E4M3", (256, 256)), f"{Q}.weight_scale": ("BF16", (2, 2))}
    )
    assert detect_folder(folder).notes == (f"stored quantized though the config's ignore list names it: {Q}",)


def test_ct_mixed_precision_groups(tmp_path: Path) -> None:
    qc = ct_qc(
        "mixed-precision",
        {},
        attn={
            "format": "float-quantized",
            "targets": ["re:.*self_attn.*"],
            "weights": CT_CHANNEL_FP8_WEIGHTS,
        },
        mlp={"format": "pack-quantized", "targets": ["re:.*mlp.*"], "weights": CT_W4A16_WEIGHTS},
    )
    folder = _base(
        tmp_path,
        qc,
        {
            f"{Q}.weight": ("F8_E4M3", (256, 256)),
            f"{Q}.weight_scale": ("BF16", (256, 1)),
            f"{DOWN}.weight_packed": ("I32", (256, 96)),
            f"{DOWN}.weight_scale": ("BF16", (256, 6)),
            f"{DOWN}.weight_shape": ("I64", (2,), i64_pair(256, 768)),
        },
    )
    q = detect_folder(folder)
    assert (q.scheme, q.format, q.geometry) == (MIXED, "mixed-precision", None)
    mlp, attn = q.modules
    assert (attn.scheme, attn.geometry and attn.geometry.strategy) == (CT_FP8, "channel")
    assert (mlp.scheme, mlp.geometry and mlp.geometry.group_size) == (CT_W4A16, 128)
    assert q.notes == ()


def test_unknown_method_and_unread_ct_format(tmp_path: Path) -> None:
    q = detect_folder(_base(tmp_path, {"quant_method": "hqq", "nbits": 4}, {}))
    assert (q.scheme, q.method) == (UNKNOWN, "hqq")
    assert q.notes[0] == "quantization_config `quant_method` 'hqq' is not one adapterdoc reads"
    int8 = {"dynamic": False, "num_bits": 8, "strategy": "channel", "symmetric": True, "type": "int"}
    q = detect_folder(
        _base(
            tmp_path,
            ct_qc("int-quantized", int8),
            {f"{Q}.weight": ("I8", (256, 256)), f"{Q}.weight_scale": ("BF16", (256, 1))},
            "int8",
        )
    )
    assert q.scheme == UNKNOWN and q.modules[0].scheme == UNKNOWN
    assert (
        q.notes[0]
        == "config group 'group_0': compressed-tensors format 'int-quantized' (int 8-bit) is not one adapterdoc reads"
    )


def test_config_only(tmp_path: Path) -> None:
    q = detect({"quantization_config": DEEPSEEK_QC}, [])
    assert q.scheme == FP8_BLOCK and q.geometry is not None and q.geometry.block_size == (128, 128)
    assert q.notes == ("no safetensors weights were read: the quantized modules are not known",)


def test_bnb_config_without_quant_method(tmp_path: Path) -> None:
    qc = {k: v for k, v in BNB_NF4_QC.items() if k != "quant_method"}
    assert detect({"quantization_config": qc}, []).scheme == BNB_NF4


# -------------------------------------------------------------------------------------------- invalid input


@pytest.mark.parametrize(
    ("qc", "message"),
    [
        ("fp8", "config.json `quantization_config` must be an object, not str"),
        ({"quant_method": 8}, "quantization_config `quant_method` must be a string, not int"),
        (
            {"quant_method": "fp8", "weight_block_size": [128]},
            "`weight_block_size` must be two positive integers",
        ),
        ({"quant_method": "gptq", "bits": "4"}, "quantization_config `bits` must be an integer, not str"),
        ({"quant_method": "gptq", "bits": 4, "sym": "yes"}, "`sym` must be true or false"),
        ({"quant_method": "compressed-tensors", "config_groups": []}, "`config_groups` must be an object"),
        ({**BNB_NF4_QC, "load_in_8bit": True}, "sets both `load_in_4bit` and `load_in_8bit`"),
        ({**BNB_NF4_QC, "bnb_4bit_quant_type": "int4"}, "is 'int4', not nf4 or fp4"),
        ({"quant_method": "mxfp4", "modules_to_not_convert": "lm_head"}, None),  # one string reads as a list
    ],
)
def test_malformed_quantization_config(qc: object, message: str | None) -> None:
    if message is None:
        assert detect({"quantization_config": qc}, []).ignore == ("lm_head",)
        return
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ) as e:
        detect({"quantization_config": qc}, [])
    assert e.value.exit_code == 3


def test_malformed_files(tmp_path: Path) -> None:
    folder = _base(tmp_path, DEEPSEEK_QC, {})
    (folder / "config.json").write_text("[1]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        detect_folder(folder)
    (folder / "config.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot read"):
        detect_folder(folder)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x00" * 4)
    with pytest.raises(HeaderError):
        detect_folder(folder)


# ------------------------------------------------------------------------------------ folders, shards, bases


def test_sharded_folder_follows_the_index(tmp_path: Path) -> None:
    from tests.quant.quant_helpers import write_st

    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "x", "quantization_config": GPTQ_QC}))
    write_st(folder / "a.safetensors", _gptq_tensors(Q, 256, 256))
    write_st(folder / "b.safetensors", _gptq_tensors(DOWN, 768, 256))
    write_st(folder / "stray.safetensors", _gptq_tensors("model.layers.9.mlp.down_proj", 768, 256))
    index = {
        "weight_map": {**dict.fromkeys(_gptq_tensors(Q, 256, 256), "a.safetensors"), "x": "b.safetensors"}
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [Path(p).name for p in weight_files(str(folder))] == ["a.safetensors", "b.safetensors"]
    assert [m.path for m in detect_folder(folder).modules] == [DOWN, Q]
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "../a.safetensors"}})
    )
    with pytest.raises(ConfigError, match="is not a file name in the model folder"):
        detect_folder(folder)


def test_detect_base_reads_a_resolved_base(tmp_path: Path) -> None:
    from adapterdoc.bases import resolve_base

    folder = _base(tmp_path, GPTQ_QC, _gptq_tensors(Q, 256, 256))
    assert detect_base(resolve_base(str(folder))).modules[0].shape == (256, 256)
    only_config = detect_base(resolve_base(str(folder / "config.json")))
    assert only_config.scheme == GPTQ and only_config.modules == ()


def test_detect_base_on_a_tiny_reference_base() -> None:
    from adapterdoc.bases import BaseSpec

    assert detect_base(BaseSpec("tiny:x", "tiny", tiny_layout="x", has_weights=True)).scheme == NONE


def test_detect_folder_reads_headers_only(tmp_path: Path) -> None:
    folder = _base(tmp_path, BNB_NF4_QC, _nf4(DOWN, 256, 768))
    header = read_header(folder / "model.safetensors")
    assert header.data_bytes > 0
    code = textwrap.dedent(
        f"""
        import sys
        from adapterdoc.quant import detect_folder
        q = detect_folder({str(folder)!r})
        assert q.modules[0].shape == (256, 768), q
        heavy = sorted(m for m in ("torch", "numpy", "safetensors.torch", "transformers") if m in sys.modules)
        print(heavy)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
