"""The audit's entries are built once, after the adapter's total is known (:func:`adapterdoc.audit.measure.classify`):
each must equal, field for field and in field order, the entry the two-step route builds (``ModuleDelta(...)``, then the share and inert flag by ``dataclasses.replace``, as
the audit did before), on real measured modules (dense, fused experts, NaN factors) and on the edge cases of the
inert test (zero, tiny and unmeasured entries, an all-zero adapter)."""

from __future__ import annotations

import dataclasses
import importlib
import math
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")

import adapterdoc.audit as audit_mod  # noqa: E402
from adapterdoc.audit.read import factor_pairs  # noqa: E402
from adapterdoc.checkpoint import open_checkpoint  # noqa: E402
from adapterdoc.report.audit_report import INERT_RELATIVE, ModuleDelta  # noqa: E402
from tests.audit.test_stacked import _write_adapter, _write_fused_adapter  # noqa: E402

measure_mod = importlib.import_module("adapterdoc.audit.measure")  # the package's `measure` is the function
Measured = measure_mod.Measured

QWEN_EXPERTS = (  # one LoRA module per expert (the expert index from the path)
    Path(__file__).resolve().parents[2] / "fixtures" / "old_stack" / "qwen3_moe" / "adapter_experts"
)


def _plain(results: list[Any]) -> list[ModuleDelta]:
    """The entries as the audit built them before: whole through ``__init__``, then share and inert by replace."""
    entries = []
    for res in results:
        fields = res.common
        for n, eff, num, e in zip(res.norms, res.effective, res.numerical, res.experts):
            entries.append(
                ModuleDelta(delta_norm=n, effective_rank=eff, numerical_rank=num, expert=e, **fields)
            )
    measured = [m for m in entries if m.delta_norm is not None]
    sq = sum(m.delta_norm**2 for m in measured)  # type: ignore[operator]
    rms = math.sqrt(sq / len(measured)) if measured else 0.0
    return [
        dataclasses.replace(
            m,
            share=m.delta_norm**2 / sq if sq else 0.0,
            inert=m.delta_norm == 0 or m.delta_norm <= INERT_RELATIVE * rms,
        )
        if m.delta_norm is not None
        else m
        for m in entries
    ]


def _same(fast: list[ModuleDelta], plain: list[ModuleDelta]) -> None:
    names = [f.name for f in dataclasses.fields(ModuleDelta)]
    assert len(fast) == len(plain)
    for f, p in zip(fast, plain):
        assert type(f) is ModuleDelta and f == p and hash(f) == hash(p)
        assert list(vars(f)) == names and vars(f) == vars(p)  # every field, in field order, nothing else
        assert repr(f) == repr(p) and f.to_dict() == p.to_dict()
    for f in fast[:1]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            f.share = 0.5  # type: ignore[misc]


@pytest.mark.parametrize("ranks", [True, False])
def test_entries_of_real_modules_equal_the_plain_route(tmp_path: Path, ranks: bool) -> None:
    rng = np.random.default_rng(2)
    modules = {}
    for i in range(4):
        for leaf in ("q_proj", "v_proj"):
            a, b = rng.standard_normal((8, 40)) * 0.02, rng.standard_normal((24, 8)) * 0.01
            if (i, leaf) == (1, "v_proj"):
                b[0, 0] = np.nan  # not measured: delta_norm None
            if (i, leaf) == (2, "q_proj"):
                b[:] = 0  # inert
            modules[f"model.layers.{i}.self_attn.{leaf}"] = (a, b)
    _write_adapter(tmp_path / "ad", modules, 8)
    _write_fused_adapter(tmp_path / "fused", "BF16")
    for spec in (tmp_path / "ad", tmp_path / "fused", QWEN_EXPERTS):
        ckpt = open_checkpoint(str(spec))
        groups = list(factor_pairs(ckpt).values())
        results, _ = audit_mod._measure_all(ckpt, groups, ckpt.adapter_config, np, ranks)
        fast = measure_mod.classify(results)
        _same(fast, _plain(results))
        if ranks:
            assert fast == audit_mod.audit_checkpoint(ckpt).modules
        if spec == tmp_path / "ad":
            assert any(m.inert for m in fast) and any(m.delta_norm is None for m in fast)
        elif spec == tmp_path / "fused":  # one entry per expert, numbered; expert 1 is zero (inert)
            assert [m.expert for m in fast] == list(range(6)) * 3 and fast[1].inert and fast[1].share == 0.0
        else:
            assert {0, 1, None} <= {m.expert for m in fast} and {m.kind for m in fast} == {"linear"}


def _result(norms: tuple[float | None, ...], module: str = "m") -> Any:
    n = len(norms)
    per_entry = ("delta_norm", "effective_rank", "numerical_rank", "share", "inert", "expert")
    common: dict[str, object] = {
        f.name: None for f in dataclasses.fields(ModuleDelta) if f.name not in per_entry
    }
    common.update(module=module, kind="linear", rank=4, scaling=2.0, group="", leaf=module)
    common.update(dtype="BF16", nonfinite=0)
    return Measured((), norms, (None,) * n, (None,) * n, tuple(range(n)) if n > 1 else (None,), 4, common)


@pytest.mark.parametrize(
    "norms",
    [
        [(1.0, 2.0), (0.0,), (1e-9,), (None,)],  # zero, tiny (inert) and unmeasured entries
        [(0.0, 0.0), (0.0,)],  # an adapter that changes nothing: every share 0.0, every entry inert
        [(None,), (None, None)],  # nothing measured
        [(3.0,), (4.0,)],
        [],
    ],
)
def test_inert_and_share_edge_cases_equal_the_plain_route(norms: list[tuple[float | None, ...]]) -> None:
    results = [_result(n, f"model.layers.{i}.mlp") for i, n in enumerate(norms)]
    fast = measure_mod.classify(results)
    _same(fast, _plain(results))
    assert len(fast) == sum(map(len, norms))
