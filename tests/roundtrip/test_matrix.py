"""The layout × operation matrix (issue 7): every registry layout through every command, fast settings.

Each layout's adapter is trained by train-smoke and then inspected, remapped there and back, verified, merged
and round-tripped. n/a cells are declared in adapterdoc.matrix.NOT_APPLICABLE with their reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapterdoc.layouts import LAYOUTS
from adapterdoc.matrix import NOT_APPLICABLE, OPERATIONS, LayoutBench, cells_for

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def benches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LayoutBench]]:
    root: Path = tmp_path_factory.mktemp("matrix")
    out: dict[str, LayoutBench] = {}
    for layout in LAYOUTS:
        os.makedirs(root / layout)
        out[layout] = LayoutBench(layout, str(root / layout))
    yield out


HEAVY = ("omni", "moe")
"""Layouts whose cells are the heaviest (a tiny MoE or Omni model per operation): marked ``slow`` so the default
run stays within its time (CI runs ``-m slow``); the same operations run on every other layout by default."""


def _cells() -> list[object]:
    return [
        pytest.param(layout, op, marks=pytest.mark.slow) if any(h in layout for h in HEAVY) else (layout, op)
        for layout, op in cells_for()
    ]


@pytest.mark.parametrize(("layout", "operation"), _cells())
def test_cell(benches: dict[str, LayoutBench], layout: str, operation: str) -> None:
    cell = benches[layout].run(operation)
    if (layout, operation) in NOT_APPLICABLE:
        assert cell.status == "n/a" and cell.detail
        return
    assert cell.status == "pass", f"{layout} × {operation}: {cell.detail}"


def test_not_applicable_cells_are_exactly_the_layouts_without_a_tiny_model() -> None:
    from adapterdoc.ml.tiny import TINY_LAYOUTS

    whole = {layout for layout, op in NOT_APPLICABLE if op != "experts"}
    assert whole == set(LAYOUTS) - set(TINY_LAYOUTS)
    for layout in whole:
        assert all(NOT_APPLICABLE.get((layout, op)) for op in OPERATIONS), layout


def test_experts_cells_are_n_a_exactly_for_the_layouts_without_routed_experts() -> None:
    """The expert moves run for every MoE layout with a tiny model and are n/a, with a reason, elsewhere."""
    moe = {name for name, lay in LAYOUTS.items() if lay.experts is not None and lay.tiny is not None}
    assert moe == {"qwen3_5_moe_vl", "qwen3_5_moe_text", "qwen3_omni", "qwen3_omni_thinker", "qwen3_moe_text"}
    runs = {layout for layout in LAYOUTS if (layout, "experts") not in NOT_APPLICABLE}
    assert runs == moe
    assert "no routed experts" in NOT_APPLICABLE["qwen3_5_text", "experts"]
