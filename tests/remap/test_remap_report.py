"""The remap report (issue 28): made once by the plan, completed once with the write's frozen result
(:func:`~adapterdoc.report.remap_report.build_remap_report`), never filled field by field; and (issue 25) count
lines that say what they count, with the numbers ``--json`` gives: an expert remap rewrites modules and tensors,
not "keys"."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from source_scan import attribute_writes

from adapterdoc.engines.zero_lora import BaseModules
from adapterdoc.remap.config import ConfigPlan
from adapterdoc.remap.expert_rewrite import Block, ExpertPlan
from adapterdoc.remap.for_engine.fill import Filled, FillStep
from adapterdoc.remap.for_engine.plan import ExpertsStep
from adapterdoc.remap.moves import RemapMove
from adapterdoc.remap.plan import HeaderPlan, KeyMoves, Plan
from adapterdoc.report.base import FrozenReport
from adapterdoc.report.remap_report import ConfigChange, RemapReport, Written
from adapterdoc.report.remap_text import render_remap

ROOT = Path(__file__).resolve().parents[2]
PER_EXPERT = ROOT / "fixtures" / "old_stack" / "qwen3_moe" / "adapter_experts"
"""Qwen3-MoE (old stack), per-expert LoRA: 2 layers × 4 experts × gate/up/down = 24 modules, 48 tensors."""
REPORT_FIELDS = {f.name for f in dataclasses.fields(RemapReport)}


def _is_report(node: ast.expr) -> bool:
    """``report`` or ``*.report``."""
    return (isinstance(node, ast.Name) and node.id == "report") or (
        isinstance(node, ast.Attribute) and node.attr == "report"
    )


def test_nothing_in_remap_fills_a_report_after_it_is_made() -> None:
    paths = sorted((ROOT / "adapterdoc" / "remap").glob("*.py"))
    assert attribute_writes(paths, lambda a: _is_report(a.value)) == []


RESULTS = [ConfigChange, Written, Plan, HeaderPlan, KeyMoves, ConfigPlan, RemapMove, ExpertPlan, Block,
           Filled, FillStep, ExpertsStep, BaseModules]  # fmt: skip


@pytest.mark.parametrize("cls", RESULTS, ids=[c.__name__ for c in RESULTS])
def test_every_remap_result_is_frozen(cls: type) -> None:
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_report_is_frozen() -> None:
    """RemapReport is built once (issue 28): frozen, on the frozen base."""
    assert issubclass(RemapReport, FrozenReport) and RemapReport.__dataclass_params__.frozen  # type: ignore[attr-defined]
    report = RemapReport(input="a", mode="vl", strategy="none", mapping={"x": "y"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.mode = "to"  # type: ignore[misc]
    assert report.renamed == 1 and report.to_dict()["mapping_total"] == 1


# ------------------------------------------------------------------------------------------ counts (issue 25)


def test_remap_experts_counts_modules_and_tensors_not_keys(cli: Callable[..., Any]) -> None:
    """Before: "would rename 4 keys (copy)" and "2 keys:" for the 48 tensors of 24 per-expert modules made into 4
    fused modules (8 tensors). The line now counts what ``--json`` counts: ``renamed`` (mapping entries: fused
    modules), ``experts.tensors_read`` / ``tensors_written``."""
    js = json.loads(cli("remap", PER_EXPERT, "--experts", "fused", "--dry-run", "--json").stdout)
    ex = js["experts"]
    assert (js["renamed"], ex["blocks"], ex["tensors_read"], ex["tensors_written"]) == (4, 4, 48, 8)
    lines = cli("remap", PER_EXPERT, "--experts", "fused", "--dry-run").stdout.splitlines()
    assert "  would rewrite 48 tensors → 8, 24 per-expert modules as 4 fused modules (copy)" in lines
    assert "    2 fused modules: model.layers.*.mlp.experts.{0..3}.down_proj" in lines  # was "2 keys:"
    assert not any("keys" in line for line in lines[:6])


def test_remap_for_experts_counts_the_modules_each_side(cli: Callable[..., Any], tmp_path: Path) -> None:
    """Before: "fused → per-expert, 8 tensors → 48 in 4 modules" (the 48 tensors are 24 modules); now both sides
    are named, with the numbers of the ``rewrites`` entry in ``--json``."""
    fused = tmp_path / "fused"
    assert cli("remap", PER_EXPERT, "--experts", "fused", "--out", fused).exit_code == 0
    js = json.loads(cli("remap", fused, "--for", "vllm", "--dry-run", "--json").stdout)
    (rw,) = [r for r in js["rewrites"] if r["rewrite"] == "experts"]
    assert (rw["blocks"], rw["tensors_read"], rw["tensors_written"]) == (4, 8, 48)
    text = " ".join(cli("remap", fused, "--for", "vllm", "--dry-run").stdout.split())  # the line wraps at 80
    assert (
        "would rewrite experts: fused → per-expert, 8 tensors → 48, 4 fused modules as 24 per-expert modules"
        in text
    )


def test_more_rewritten_modules_are_counted_as_modules() -> None:
    """Before: "and 2 more (--json lists them)" under a rewrite's module list."""
    tensors = {
        f"model.layers.{i}.mlp.experts": f"model.layers.{i}.mlp.experts.{{0..3}}.down_proj" for i in range(8)
    }
    rewrite = {"rewrite": "experts", "from": "fused", "to": "per-expert", "blocks": 8, "exact": True,
               "tensors_read": 16, "tensors_written": 64, "tensors": tensors}  # fmt: skip
    report = RemapReport(
        input="a", mode="for", strategy="copy", mapping={}, engine={"name": "vllm"}, rewrites=[rewrite]
    )
    lines = render_remap(report, width=120).splitlines()
    assert (
        "  rewrote experts: fused → per-expert, 16 tensors → 64, 8 fused modules as 32 per-expert modules"
        in lines
    )
    assert "    and 2 more modules (--json lists them)" in lines


def test_a_fill_rewrite_says_what_it_added() -> None:
    """Before: a bare "rewrote fill" line; now the modules, tensors and bytes of the ``rewrites`` entry."""
    fill = {"rewrite": "fill", "fill": "layer-types", "modules": 3, "added": {"v_proj": [1, 2, 3]}, "tensors": 6,
            "bytes_added": 1536, "exact": True}  # fmt: skip
    report = RemapReport(
        input="a", mode="for", strategy="copy", mapping={}, engine={"name": "tgi"}, rewrites=[fill]
    )
    lines = render_remap(report, width=120).splitlines()
    assert "  rewrote fill: layer-types, 3 module(s) (6 tensors), 1536 bytes added" in lines
