"""The served dtype: a server that computes in bfloat16 against float32 canaries is judged by the fitted factor
(applied, base), with a note of how far off its values are, never as "another scale" at 1.0× or 0.007×; vLLM and
SGLang are judged at bfloat16's tolerance unless --served-dtype says otherwise. Loopback stubs, no engine."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.fit.canaries import coarse_warning
from adapterdoc.probe.canaries import Canaries, Canary, Position, load, save, scale_grid
from adapterdoc.probe.fit import Observation, fit
from adapterdoc.probe.run import served_dtype
from tests.probe.stub_server import Reply, Stub, send, url

SCALES = scale_grid(4)
POSITIONS = [(1, 6), (2, 7), (3, 8)]
ROUNDING = 0.02
"""What bfloat16 does to a logprob near -3 (2⁻⁸ relative, and a kernel's order): ~9 tolerances of float32."""


def _expected(i: int, s: float) -> float:
    return -2.0 - 0.5 * (i + 1) * s


def _served(i: int, s: float) -> float:
    """The value at scale ``s`` as a bfloat16 server gives it: off by the rounding, up or down."""
    return _expected(i, s) + (ROUNDING if i % 2 else -ROUNDING)


CANARY = Canary(
    "w1 w2 w3 w4",
    [5, 6, 7, 8],
    [Position(pos, token, [_expected(i, s) for s in SCALES]) for i, (pos, token) in enumerate(POSITIONS)],
)
MODELS = {"data": [{"id": "a", "owned_by": "vllm"}]}


def _answer(scale: float) -> dict[str, object]:
    rows: list[object] = [None] * 4
    for i, (pos, token) in enumerate(POSITIONS):
        rows[pos] = {str(token): {"logprob": _served(i, scale)}}
    return {"choices": [{"prompt_logprobs": rows}]}


@pytest.fixture
def stub(stubs: Callable[[Reply, Reply], Stub]) -> Callable[..., Stub]:
    def run(scale: float, models: object = MODELS) -> Stub:
        return stubs(send(200, models), send(200, _answer(scale)))

    return run


@pytest.fixture
def canaries(tmp_path: Path) -> Path:
    path = tmp_path / "c.json"
    save(Canaries("a", "b", 4, "float32", list(SCALES), [CANARY]), path)
    return path


@pytest.mark.parametrize(("scale", "verdict"), [(1.0, "applied"), (0.0, "base")])
def test_bfloat16_values_at_float32_tolerance_are_judged_by_the_factor(scale: float, verdict: str) -> None:
    """Was: "scale" at 1.0× (exit 1) for the adapter applied, "scale" at ~0.01× (AD902) for the base."""
    observations = [Observation(_served(i, scale), CANARY.positions[i].logprobs) for i in range(3)]
    result = fit(observations, SCALES, "float32")
    assert result.verdict == verdict and result.factor == scale and result.off, result
    assert not fit(observations, SCALES, "bfloat16").off


def test_values_off_everywhere_still_differ() -> None:
    """The factor decides only where the curve explains the values: a served vector off in shape is "differs"."""
    observations = [Observation(_expected(i, 1.0) + (0.5 if i == 0 else 0.0), CANARY.positions[i].logprobs)
                    for i in range(3)]  # fmt: skip
    assert fit(observations, SCALES, "float32").verdict == "differs"


def test_a_factor_well_away_from_0_and_1_is_still_a_scale() -> None:
    observations = [Observation(_served(i, 0.5), CANARY.positions[i].logprobs) for i in range(3)]
    result = fit(observations, SCALES, "float32")
    assert result.verdict == "scale" and result.factor is not None and abs(result.factor - 0.5) < 0.05


@pytest.mark.parametrize(("scale", "code", "exit_code"), [(1.0, "AD900", 0), (0.0, "AD901", 1)])
def test_vllm_is_judged_at_bfloat16_by_default(
    cli: Any, stub: Any, canaries: Path, scale: float, code: str, exit_code: int
) -> None:
    """Was: float32 (the canaries' dtype) for every engine: exit 1 "scale factor 1.0" for the applied adapter."""
    r = cli("probe", url(stub(scale)), "--adapter", "a", "--canaries", canaries, "--json")
    report = json.loads(r.stdout)
    assert r.exit_code == exit_code and report["dtype"] == "bfloat16", r.output
    assert [f["code"] for f in report["findings"]] == [code] and "differ from PEFT" not in r.stdout


def test_a_served_dtype_given_says_how_far_off_the_values_are(cli: Any, stub: Any, canaries: Path) -> None:
    r = cli("probe", url(stub(1.0)), "--adapter", "a", "--canaries", canaries, "--served-dtype", "float32")
    assert r.exit_code == 0, r.output
    assert "differ from PEFT's by" in r.output and "tolerances of float32" in r.output
    assert "--served-dtype" in r.output


def test_the_default_served_dtype_per_engine() -> None:
    assert served_dtype("vllm", "float32") == served_dtype("sglang", "float16") == "bfloat16"
    assert served_dtype("llama.cpp", "float32") == served_dtype("mlx-lm", "float32") == "float32"


@pytest.mark.parametrize(("dtype", "ok"), [("float64", True), ("int8", False), ("float8_e4m3fn", False)])
def test_an_unknown_dtype_is_refused_at_load(tmp_path: Path, dtype: str, ok: bool) -> None:
    path = tmp_path / "c.json"
    save(Canaries("a", "b", 4, dtype, list(SCALES), [CANARY]), path)
    if ok:
        assert load(path).dtype == dtype
    else:
        with pytest.raises(Exception, match=f"dtype '{dtype}' is none of"):
            load(path)


def test_canaries_too_weak_for_bfloat16_are_said_so(tmp_path: Path) -> None:
    """A move of 0.05 is ~20 tolerances of float32 and ~1 of bfloat16: train writes the file and warns (AD630)."""
    weak = Canary("w", [5, 6], [Position(1, 6, [-2.0 - 0.05 * s for s in SCALES])])
    finding = coarse_warning(Canaries("a", "b", 4, "float32", list(SCALES), [weak]), "c.json")
    assert finding is not None and finding.code == "AD630" and "bfloat16" in finding.message
    assert coarse_warning(Canaries("a", "b", 4, "float32", list(SCALES), [CANARY]), "c.json") is None


# ------------------------------------------------------------------------- --base-model where no request sends it


@pytest.mark.parametrize(
    ("owner", "adapter", "words"),
    [
        ("vllm", "a", "a vllm request has no place for it (its model field is --adapter)"),
        ("me", "a", "a llama.cpp request has no place for it"),
        ("sglang", "base:a", "model=BASE:ADAPTER names the base already"),
    ],
)
def test_a_base_model_no_request_sends_is_refused(
    cli: Any, stub: Any, canaries: Path, owner: str, adapter: str, words: str
) -> None:
    """Was: silently not sent (the report named a request the server never saw)."""
    server = stub(1.0, {"data": [{"id": "a", "owned_by": owner}]})
    r = cli("probe", url(server), "--adapter", adapter, "--base-model", "b", "--canaries", canaries)
    assert r.exit_code == 3 and "--base-model" in r.stderr and words in r.stderr, r.output
    assert server.bodies == []
