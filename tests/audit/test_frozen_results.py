"""The header facts, the expert picture, the weights audit and the matrix's cells are frozen results: built once,
whole, and never changed afterwards (issue 28). Each is taken from a real run over a real adapter."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.adapter import parse_key
from adapterdoc.audit import audit_checkpoint
from adapterdoc.audit.read import factor_pairs
from adapterdoc.checkpoint import open_checkpoint
from adapterdoc.facts import _group_modules, header_facts
from adapterdoc.matrix import NOT_APPLICABLE, LayoutBench
from tests.small_adapters import write_small_adapter

QWEN_EXPERTS = (
    Path(__file__).resolve().parents[2] / "fixtures" / "old_stack" / "qwen3_moe" / "adapter_experts"
)


def _results(tmp_path: Path) -> dict[str, Any]:
    moe = open_checkpoint(QWEN_EXPERTS)
    facts = header_facts(moe)
    assert facts.experts is not None and facts.experts.blocks
    small = open_checkpoint(write_small_adapter(tmp_path / "small"))
    audit = audit_checkpoint(small)
    assert audit.modules
    (layout, op), _ = next(iter(NOT_APPLICABLE.items()))
    return {
        "HeaderFacts": facts,
        "ModuleLora": next(iter(_group_modules(moe.tensors, [parse_key(k) for k in moe.tensors]).values())),
        "ExpertPicture": facts.experts,
        "ExpertBlock": facts.experts.blocks[0],
        "Audit": audit,
        "ModuleDelta": audit.modules[0],
        "FactorPair": next(iter(factor_pairs(small).values())),
        "Cell": LayoutBench(layout, str(tmp_path)).run(op),
    }


def test_results_are_frozen(tmp_path: Path) -> None:
    results = _results(tmp_path)
    assert sorted(type(r).__name__ for r in results.values()) == sorted(results)
    for name, r in results.items():
        field = dataclasses.fields(r)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(r, field, getattr(r, field))
        copy = dataclasses.replace(r)  # copies are made with replace, and equal the original
        assert copy == r, name


def test_audit_entries_are_built_whole(tmp_path: Path) -> None:
    """The classified entry carries its share and inert flag from the start (nothing fills them later)."""
    audit = audit_checkpoint(open_checkpoint(write_small_adapter(tmp_path / "small")))
    (m,) = audit.modules
    assert (m.module, m.share, m.inert, m.layer, m.leaf, m.dtype) == (
        "model.layers.0.self_attn.q_proj",
        1.0,
        False,
        0,
        "self_attn.q_proj",
        "F32",
    )
    assert m.delta_norm == pytest.approx(2.0 * 2 * 64)  # scaling 4/2 · ‖B A‖_F, B A = 2 · ones(64, 64)
