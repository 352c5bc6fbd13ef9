"""The train-smoke, roundtrip and convert reports are built once (issue 28): every report and result type is
frozen, and no module of its builder's package assigns to, or appends to, a field of one after it is made. The
scan is of the source (any ``X.field = ...``, ``X.field += ...``, ``X.field.append/extend/update/insert(...)``
where ``field`` is a field of the package's report types), so a piecemeal fill that comes back is caught
whichever variable holds the report."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from source_scan import attribute_writes

from adapterdoc.report.base import FrozenReport
from adapterdoc.report.convert_report import ConvertReport
from adapterdoc.report.findings import make
from adapterdoc.report.roundtrip_report import Check, RoundtripReport
from adapterdoc.report.smoke_report import CheckResult, LayoutRun, SmokeReport

ROOT = Path(__file__).resolve().parents[2]


def _fields(*types: type) -> set[str]:
    return {f.name for t in types for f in dataclasses.fields(t)}


def _fills(paths: list[Path], fields: set[str]) -> list[str]:
    """Every write to an attribute named like a report field, ``self`` aside, whatever variable holds it."""
    return attribute_writes(
        paths,
        lambda a: a.attr in fields and not (isinstance(a.value, ast.Name) and a.value.id == "self"),
    )


def _frozen(cls: type) -> bool:
    return bool(cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]


def test_train_smoke_reports_are_frozen_and_built_once() -> None:
    assert issubclass(SmokeReport, FrozenReport) and all(map(_frozen, (SmokeReport, LayoutRun, CheckResult)))
    check = CheckResult("loss", True, "6.9 → 6.1", "adapterdoc.train")
    run = LayoutRun("qwen3_5_vl", checks=(check,), findings=(make("AD609", "x"),))
    report = SmokeReport(runs=(run,), steps=2, out=None, seconds=1.0, import_seconds=0.5)
    for obj, name in ((check, "seconds"), (run, "error"), (report, "steps")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, None)
    assert report.ok and report.to_dict()["layouts"][0]["checks"]["loss"]["ok"] is True
    paths = sorted((ROOT / "adapterdoc" / "smoke").glob("*.py"))
    assert _fills(paths, _fields(SmokeReport, LayoutRun, CheckResult)) == []


def test_roundtrip_report_is_frozen_and_built_once() -> None:
    assert issubclass(RoundtripReport, FrozenReport) and _frozen(RoundtripReport) and _frozen(Check)
    report = RoundtripReport(input="a", layout="x", base=None, checks=(Check("remap", "fail", "d"),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.checks = ()  # type: ignore[misc]
    assert not report.ok and report.to_dict()["checks"] == [
        {"name": "remap", "status": "fail", "detail": "d", "seconds": 0.0}
    ]
    paths = sorted((ROOT / "adapterdoc" / "roundtrip").glob("*.py"))
    assert _fills(paths, _fields(RoundtripReport, Check)) == []


def test_convert_report_is_frozen_and_built_once() -> None:
    assert issubclass(ConvertReport, FrozenReport) and _frozen(ConvertReport)
    report = ConvertReport(
        input="a", source_format="mlx", target_format="peft", out="b", route=("mlx", "peft")
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.notes = ("n",)  # type: ignore[misc]
    assert report.to_dict()["route"] == ["mlx", "peft"] and report.to_dict()["notes"] == []
    assert _fills([ROOT / "adapterdoc" / "formats" / "convert.py"], _fields(ConvertReport)) == []
