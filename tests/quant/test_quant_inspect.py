"""`inspect Q` on hand-built quantized bases: the quantization (scheme, geometry, module count) in text and in
``--json``'s ``quantization`` object, for the folder and for its safetensors file, torch-free (the same where torch
is not installed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.quant.quant_bases import lora_adapter, quantized_base
from tests.test_no_torch import run_child

EXPECTED = {
    "gptq": {
        "scheme": "gptq",
        "method": "gptq",
        "format": None,
        "geometry": {
            "bits": 4,
            "group_size": 128,
            "block_size": None,
            "strategy": "group",
            "symmetric": True,
            "desc_act": False,
            "double_quant": None,
        },
        "modules": 7,
        "expert_modules": 0,
        "tensors": [".g_idx", ".qweight", ".qzeros", ".scales"],
        "unquantized": ["lm_head", "model.embed_tokens"],
        "ignore": [],
        "notes": [],
    },
}
TEXT = {
    "gptq": "quantization gptq (4-bit, group 128, symmetric) (gptq) 7 quantized modules: .g_idx, .qweight, "
    ".qzeros, .scales stored unquantized: lm_head, model.embed_tokens",
    "fp8-block": "quantization fp8-block (8-bit, block 128×128, symmetric) (fp8, e4m3) 7 quantized modules: "
    ".weight, .weight_scale_inv stored unquantized: lm_head, model.embed_tokens",
    "ct-w4a16": "quantization ct-w4a16 (4-bit, group 128, symmetric) (compressed-tensors, pack-quantized) 7 "
    "quantized modules: .weight_packed, .weight_scale, .weight_shape stored unquantized",
    "bnb-nf4": "quantization bnb-nf4 (4-bit, group 64, double quant) (bitsandbytes) 7 quantized modules: .weight, "
    ".weight.absmax, .weight.nested_absmax, .weight.nested_quant_map, .weight.quant_map, "
    ".weight.quant_state.bitsandbytes__nf4 stored unquantized",
}
"""The text's quantization lines, whitespace collapsed (the text wraps at the terminal's width)."""


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("scheme", list(TEXT))
def test_inspect_text_shows_the_quantization(scheme: str, tmp_path: Path, cli: Any) -> None:
    base = quantized_base(tmp_path / scheme, scheme)
    res = cli("inspect", base)
    assert res.exit_code == 0
    assert TEXT[scheme] in _words(res.stdout)


@pytest.mark.parametrize("which", ["folder", "file"])
def test_inspect_json_quantization_of_the_folder_and_its_file(which: str, tmp_path: Path, cli: Any) -> None:
    base = quantized_base(tmp_path / "gptq", "gptq")
    res = cli("inspect", base if which == "folder" else base / "model.safetensors", "--json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)["quantization"] == EXPECTED["gptq"]


def test_a_file_without_a_config_beside_it_still_shows_its_tensors(tmp_path: Path, cli: Any) -> None:
    base = quantized_base(tmp_path / "fp8", "fp8-block")
    (base / "config.json").unlink()
    q = json.loads(cli("inspect", base / "model.safetensors", "--json").stdout)["quantization"]
    assert (q["scheme"], q["method"], q["modules"]) == ("fp8-block", None, 7)
    assert q["notes"] == ["the tensors are quantized (fp8-block) but config.json has no quantization_config"]


def test_no_quantization_for_a_plain_base_or_an_adapter(tmp_path: Path, cli: Any) -> None:
    for spec in (quantized_base(tmp_path / "plain", "none"), lora_adapter(tmp_path / "adapter")):
        res = cli("inspect", spec, "--json")
        assert res.exit_code == 0 and "quantization" not in json.loads(res.stdout)
        assert "\nquantization " not in cli("inspect", spec).stdout


def test_the_light_install_shows_the_same(tmp_path: Path, cli: Any) -> None:
    base = quantized_base(tmp_path / "w4a16", "ct-w4a16")
    rep, proc = run_child(tmp_path, ["inspect", "--json", str(base)], block=True)
    assert rep["code"] == 0 and rep["heavy"] == [] and rep["mmap"] == 0
    assert json.loads(proc.stdout) == json.loads(cli("inspect", base, "--json").stdout)
    rep, proc = run_child(tmp_path, ["inspect", str(base)], block=True)
    assert rep["code"] == 0 and TEXT["ct-w4a16"] in _words(proc.stdout)
