"""`verify --base Q` on hand-built quantized bases: the adapter's modules match the quantized modules by path (no
missing or unexpected keys from the renamed tensors), AD280 names the scheme, AD281 compares the logical shapes,
and each engine profile says what it does with LoRA there (AD480-AD483). Exit 0 for a good adapter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.adapter import parse_key
from adapterdoc.engines import sglang as sglang_profile
from adapterdoc.engines import vllm as vllm_profile
from adapterdoc.engines.peft import PROFILE as PEFT
from adapterdoc.engines.quantized import VLLM_QUANTIZATION_METHODS
from adapterdoc.quant import detect_folder
from adapterdoc.verify.quant import check_quantization, match_modules
from tests.quant.quant_bases import DOWN, SCHEMES, Q, V, lora_adapter, quantized_base

pytest.importorskip(
    "transformers"
)  # a Llama base is outside the registry: verify builds it on the meta device

GEOMETRY = {
    "gptq": "gptq (4-bit, group 128, symmetric)",
    "fp8-block": "fp8-block (8-bit, block 128×128, symmetric)",
    "ct-w4a16": "ct-w4a16 (4-bit, group 128, symmetric)",
    "bnb-nf4": "bnb-nf4 (4-bit, group 64, double quant)",
}


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lora_adapter(tmp_path_factory.mktemp("lora") / "adapter")


def _verify(cli: Any, adapter: Path, base: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    res = cli("verify", adapter, "--base", base, "--json", *extra)
    return res.exit_code, json.loads(res.stdout)["adapters"][0]


def _codes(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in report["findings"]:
        out.setdefault(f["code"], []).append(f)
    return out


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_good_adapter_on_a_quantized_base(scheme: str, tmp_path: Path, adapter: Path, cli: Any) -> None:
    base = quantized_base(tmp_path / scheme, scheme)
    code, rep = _verify(cli, adapter, base)
    assert code == 0, rep["findings"]
    assert (rep["missing"], rep["unexpected"], rep["shape_mismatch"]) == ([], [], [])
    found = _codes(rep)
    assert not {c for c in found if c.startswith("AD5")} and "AD281" not in found
    (summary,) = found["AD280"]
    assert summary["severity"] == "info"
    assert summary["message"].startswith(f"the base is quantized: {GEOMETRY[scheme]}, 7 modules; ")
    assert (
        f"3 of the adapter's 3 targeted modules are quantized (e.g. {Q}, {V}, {DOWN})" in summary["message"]
    )
    # the default profile (peft) says what PEFT does on bitsandbytes only
    assert ("AD483" in found) == (scheme == "bnb-nf4")


def test_a_plain_base_gets_no_quantization_finding(tmp_path: Path, adapter: Path, cli: Any) -> None:
    code, rep = _verify(cli, adapter, quantized_base(tmp_path / "plain", "none"), "--profile", "vllm")
    assert code == 0
    assert not {c for c in _codes(rep) if c in ("AD280", "AD281") or c.startswith("AD48")}


def test_the_logical_shape_disagreeing_with_the_factors(tmp_path: Path, adapter: Path, cli: Any) -> None:
    # the config says intermediate 768 (so PEFT builds down_proj [256, 768]); the tensors store (256, 512)
    base = quantized_base(tmp_path / "gptq", "gptq", {DOWN: (256, 512)})
    code, rep = _verify(cli, adapter, base)
    assert rep["shape_mismatch"] == []
    (mismatch,) = _codes(rep)["AD281"]
    assert mismatch["severity"] == "warning"
    assert mismatch["key"] == f"base_model.model.{DOWN}.lora_A.weight"
    assert mismatch["message"] == (
        f"{DOWN} is stored gptq with logical shape (out, in) (256, 512), but lora_A [4, 768] has in 768"
    )
    assert code == 0  # a warning


def test_an_adapter_mismatching_its_config_is_reported_once(tmp_path: Path, cli: Any) -> None:
    adapter = lora_adapter(tmp_path / "wide", {DOWN: (256, 1024)})
    code, rep = _verify(cli, adapter, quantized_base(tmp_path / "gptq", "gptq"))
    assert code == 1
    found = _codes(rep)
    assert "AD222" in found and "AD281" not in found  # verify's own shape error, not twice


@pytest.mark.parametrize(
    ("profile", "scheme", "code", "severity"),
    [
        ("vllm", "gptq", "AD480", "info"),
        ("vllm", "fp8-block", "AD480", "info"),
        ("vllm", "ct-w4a16", "AD480", "info"),
        ("vllm", "bnb-nf4", "AD481", "warning"),
        ("sglang", "gptq", "AD482", "info"),
        ("sglang", "bnb-nf4", "AD482", "info"),
        ("peft", "bnb-nf4", "AD483", "info"),
    ],
)
def test_what_each_engine_does_with_lora_on_it(
    profile: str, scheme: str, code: str, severity: str, tmp_path: Path, adapter: Path, cli: Any
) -> None:
    exit_code, rep = _verify(cli, adapter, quantized_base(tmp_path / scheme, scheme), "--profile", profile)
    assert exit_code == 0
    engine = [f for f in rep["findings"] if f["code"] in ("AD480", "AD481", "AD482", "AD483")]
    assert [(f["code"], f["severity"]) for f in engine] == [(code, severity)]


def test_profiles_without_source_read_add_nothing(tmp_path: Path, adapter: Path, cli: Any) -> None:
    for profile in ("tgi", "lorax"):
        _, rep = _verify(cli, adapter, quantized_base(tmp_path / profile, "bnb-nf4"), "--profile", profile)
        assert not {c for c in _codes(rep) if c.startswith("AD48")}, profile


def test_modules_match_by_path_with_or_without_a_wrapper(tmp_path: Path) -> None:
    q = detect_folder(quantized_base(tmp_path / "gptq", "gptq"))
    keys = [
        parse_key(f"base_model.model.{Q}.lora_A.weight"),
        parse_key("base_model.model.lm_head.lora_A.weight"),
    ]
    m = match_modules(q, keys)
    assert m.targeted == (Q, "lm_head") and [x.path for x in m.modules()] == [Q]
    # a key under one more wrapper (an older VL class's language_model) still finds its module by the path's tail
    vl = parse_key(f"base_model.model.language_model.{Q}.lora_A.weight")
    assert [x.path for x in match_modules(q, [vl]).modules()] == [Q]


def test_no_findings_on_a_plain_base_or_none(tmp_path: Path) -> None:
    keys = [parse_key(f"base_model.model.{Q}.lora_A.weight")]
    assert check_quantization("a", None, keys, {}, PEFT) == []
    plain = detect_folder(quantized_base(tmp_path / "plain", "none"))
    assert check_quantization("a", plain, keys, {}, PEFT) == []


def test_the_vllm_quantization_methods_are_its_release(tmp_path: Path) -> None:
    assert vllm_profile.VLLM_VERSION == "0.33.0" and sglang_profile.SGLANG_VERSION == "0.5.23"
    assert "bitsandbytes" not in VLLM_QUANTIZATION_METHODS
    assert {"fp8", "gptq", "awq", "compressed-tensors", "mxfp4"} <= set(VLLM_QUANTIZATION_METHODS)
