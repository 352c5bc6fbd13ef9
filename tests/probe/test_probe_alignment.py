"""How llama.cpp's echoed prompt logprobs line up with the canaries' positions is chosen by the fit's own measure
(the smallest worst-case deviation along the expected curve), not by a mean distance to the grid's points; two
alignments that fit about as well with different verdicts are exit 3; the chosen one is in the report."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.probe.canaries import Canaries, Canary, Position, save, scale_grid
from adapterdoc.probe.client import ProbeError
from adapterdoc.probe.conventions import Alignment
from adapterdoc.probe.fit import Observation
from adapterdoc.probe.run import choose_alignment
from tests.probe.stub_server import Reply, Stub, send, url

SCALES = scale_grid(4)
LLAMA_MODELS = {"data": [{"id": "a", "owned_by": "me"}]}


def _curve(start: float, slope: float) -> list[float]:
    return [start - slope * s for s in SCALES]


def test_the_alignment_is_chosen_by_the_fits_measure() -> None:
    """The right reading is the adapter at 0.6× exactly, between the grid's 0.5 and 0.75 (a mean distance of 0.05
    to the nearest point); the wrong one equals scale 1 at three positions and is 0.1 off at the fourth (a mean
    distance of 0.025, which the former choice preferred): the fit's measure keeps the right one."""
    curves = [_curve(-2.0 - i, 0.5) for i in range(4)]
    right = [Observation(c[0] - 0.5 * 0.6, c) for c in curves]
    wrong = [Observation(c[SCALES.index(1.0)] + (0.1 if i == 3 else 0.0), c) for i, c in enumerate(curves)]
    observed = {Alignment(0): right, Alignment(-1): wrong}
    chosen, result = choose_alignment(observed, SCALES, "float32", "here")
    assert chosen == Alignment(0) and result.verdict == "scale" and result.factor is not None
    assert abs(result.factor - 0.6) < 1e-6


def test_two_alignments_that_fit_alike_with_other_verdicts_are_refused() -> None:
    curve = _curve(-2.0, 0.5)
    observed = {
        Alignment(0): [Observation(curve[SCALES.index(1.0)], curve)],
        Alignment(1): [Observation(curve[SCALES.index(0.0)], curve)],
    }
    with pytest.raises(ProbeError, match="cannot tell how the answer lines up"):
        choose_alignment(observed, SCALES, "float32", "here")
    observed[Alignment(1)] = [Observation(curve[SCALES.index(1.0)] + 0.004, curve)]  # the same verdict
    assert choose_alignment(observed, SCALES, "float32", "here")[0] == Alignment(0)


@pytest.fixture
def stub(stubs: Callable[[Reply, Reply], Stub]) -> Callable[..., Stub]:
    def run(values: list[object]) -> Stub:
        answer = {"choices": [{"logprobs": {"token_logprobs": values}}]}
        return stubs(send(200, LLAMA_MODELS), send(200, answer))

    return run


def _canaries(tmp_path: Path, curves: list[list[float]]) -> Path:
    positions = [Position(i + 1, 6 + i, c) for i, c in enumerate(curves)]
    path = tmp_path / "c.json"
    save(Canaries("a", "b", 4, "float32", list(SCALES), [Canary("w", [5, 6, 7, 8], positions)]), path)
    return path


def test_an_ambiguous_answer_is_exit_3(cli: Any, stub: Any, tmp_path: Path) -> None:
    """Two positions whose curves overlap: read as it is, the adapter; read one position off, each value lies on
    the other position's curve (at 2× or ½×)."""
    canaries = _canaries(tmp_path, [_curve(-2.0, 0.5), _curve(-2.0, 1.0)])
    r = cli("probe", url(stub([None, -2.5, -3.0])), "--adapter", "a", "--canaries", canaries)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 3 and len(lines) == 1 and "cannot tell how the answer lines up" in lines[0], (
        r.output
    )
    assert "read at offset +0 it is applied, at offset " in lines[0]


def test_the_chosen_alignment_is_reported(cli: Any, stub: Any, tmp_path: Path) -> None:
    canaries = _canaries(tmp_path, [_curve(-2.0, 0.5), _curve(-6.0, 1.0), _curve(-9.0, 0.7)])
    server = stub([None, -2.5, -7.0, -9.7, -1.0])
    r = cli("probe", url(server), "--adapter", "a", "--canaries", canaries, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["alignment"] == "offset +0", r.output
    r = cli("probe", url(server), "--adapter", "a", "--canaries", canaries)
    assert "read at offset +0" in r.stdout, r.stdout
