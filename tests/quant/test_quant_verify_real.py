"""`verify --base Q` and `inspect Q` on the tiny bases the real libraries wrote (``-m oracle``; fixtures/make_quantized.py
in the quant environment, as tests/quant/test_quant_detect_real.py): every quantized base is named with its scheme,
a matching adapter passes (exit 0, no missing, unexpected or shape key), and vLLM's profile says what it does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.quant import detect_folder
from tests.quant.quant_bases import DOWN, Q, V, lora_adapter

pytestmark = [pytest.mark.oracle]
pytest.importorskip("transformers")  # a Llama base: verify builds it on the meta device
QUANTIZED = [
    "awq",
    "bnb-fp4",
    "bnb-int8",
    "bnb-nf4",
    "ct-fp8-block",
    "ct-fp8-dynamic",
    "ct-nvfp4",
    "ct-w4a16",
    "fp8-deepseek",
    "fp8-transformers",
    "fp8-transformers-576",
    "gptq",
]
PLAIN = ["_bf16-576", "_bf16-768"]


@pytest.fixture(scope="module")
def bases(real_bases: tuple[Path, Path]) -> Path:
    return real_bases[1]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """An adapter on q_proj, v_proj and down_proj of both layers, per intermediate size the bases use."""
    root = tmp_path_factory.mktemp("adapters")
    return {size: lora_adapter(root / str(size), {DOWN: (256, size)}, layers=2) for size in (576, 768)}


def _adapter(bases: Path, name: str, adapters: dict[int, Path]) -> Path:
    size = json.loads((bases / name / "config.json").read_text())["intermediate_size"]
    return adapters[size]


@pytest.mark.parametrize("name", QUANTIZED)
def test_verify_names_the_quantization(name: str, bases: Path, adapters: dict[int, Path], cli: Any) -> None:
    q = detect_folder(bases / name)
    res = cli(
        "verify", _adapter(bases, name, adapters), "--base", bases / name, "--profile", "vllm", "--json"
    )
    assert res.exit_code == 0, res.stdout
    rep = json.loads(res.stdout)["adapters"][0]
    assert (rep["missing"], rep["unexpected"], rep["shape_mismatch"]) == ([], [], [])
    codes = [f["code"] for f in rep["findings"]]
    assert "AD281" not in codes and not [c for c in codes if c.startswith("AD5")]
    (summary,) = [f for f in rep["findings"] if f["code"] == "AD280"]
    assert summary["message"].startswith(f"the base is quantized: {q.scheme}")
    left = name == "fp8-transformers-576"  # transformers' Fp8Quantize leaves a 576-wide weight unquantized
    n = 4 if left else 6
    assert f"{n} of the adapter's 6 targeted modules are quantized (e.g. {Q}, {V}" in summary["message"]
    assert summary["message"].endswith(f"stored unquantized: {DOWN}, model.layers.1.mlp.down_proj") == left
    engine = [c for c in codes if c in ("AD480", "AD481")]
    assert engine == (["AD481"] if name.startswith("bnb-") else ["AD480"])


@pytest.mark.parametrize("name", PLAIN)
def test_verify_on_the_plain_bases_says_nothing(
    name: str, bases: Path, adapters: dict[int, Path], cli: Any
) -> None:
    res = cli(
        "verify", _adapter(bases, name, adapters), "--base", bases / name, "--profile", "vllm", "--json"
    )
    assert res.exit_code == 0
    codes = {f["code"] for f in json.loads(res.stdout)["adapters"][0]["findings"]}
    assert not codes & {"AD280", "AD281", "AD480", "AD481"}


@pytest.mark.parametrize("name", QUANTIZED + PLAIN)
def test_inspect_shows_the_quantization(name: str, bases: Path, cli: Any) -> None:
    q = detect_folder(bases / name)
    for spec in (bases / name, bases / name / "model.safetensors"):
        res = cli("inspect", spec, "--json")
        assert res.exit_code == 0
        shown = json.loads(res.stdout).get("quantization")
        if name in PLAIN:
            assert shown is None
            continue
        assert shown is not None
        assert (shown["scheme"], shown["method"], shown["modules"]) == (q.scheme, q.method, len(q.modules))
        assert shown["modules"] == (8 if name == "fp8-transformers-576" else 14)
