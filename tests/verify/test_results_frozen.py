"""Issue 28: verify's checks return frozen results and the report is built once; one expected-model type serves
the registry and the meta-device paths (and an engine's view of either)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest
from source_scan import attribute_writes

import adapterdoc
from adapterdoc import engines, verify

ROOT = Path(adapterdoc.__file__).parent
NOT_FROZEN: set[str] = set()


def _modules() -> list[str]:
    names = ["adapterdoc.ml.meta", "adapterdoc.report.verify_report"]
    for pkg in (verify, engines):
        names += [f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
    return names


@pytest.mark.parametrize("name", _modules())
def test_every_result_dataclass_is_frozen(name: str) -> None:
    module = importlib.import_module(name)
    own = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == name
    ]
    thawed = [
        f"{name}.{c.__name__}"
        for c in own
        if not c.__dataclass_params__.frozen and f"{name}.{c.__name__}" not in NOT_FROZEN  # type: ignore[attr-defined]
    ]
    assert thawed == []


def _attribute_writes(path: Path) -> list[str]:
    """Writes to a field of a variable named like a report (``report``, ``run``, ``rep``, ``r``)."""
    names = {"report", "run", "rep", "r"}
    return attribute_writes([path], lambda a: isinstance(a.value, ast.Name) and a.value.id in names)


def test_no_report_is_changed_after_it_is_made() -> None:
    files = sorted((ROOT / "verify").glob("*.py")) + sorted((ROOT / "engines").glob("*.py"))
    files.append(ROOT / "report" / "verify_report.py")
    assert [w for f in files for w in _attribute_writes(f)] == []


def test_the_registry_and_the_meta_device_give_one_type() -> None:
    """The registry's answer is the same class as the meta device's, and an engine's view of it too; each is
    frozen (a changed copy is ``dataclasses.replace``)."""
    from adapterdoc.adapter import AdapterConfig
    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.layouts.trees import build_tree
    from adapterdoc.ml.meta import ExpectedModel
    from adapterdoc.verify.base import keys_view
    from adapterdoc.verify.expected import registry_adapter

    lay = LAYOUTS["qwen3_5_vl"]
    assert lay.tiny is not None  # the registry's reference config, as config.json would hold it (no torch)
    tree = build_tree({**lay.tiny.kwargs(), "model_type": lay.model_type, "architectures": [lay.model_class]})
    acfg = AdapterConfig({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}, None)
    meta = registry_adapter(tree, acfg)
    view = keys_view(meta, "text", "adapterdoc remap A --for tgi --out DIR")
    assert type(meta) is ExpectedModel and type(view) is ExpectedModel and view is not meta
    assert meta.source == "registry" and view.fix and view.keys_against is not None
    assert all(".language_model." not in k for k in view.expected) and any(
        ".language_model." in k for k in meta.expected
    )
    km = view.match(dict(view.expected))
    assert (km.missing, km.unexpected, km.shape_mismatch) == ([], [], [])
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.layout = "x"  # type: ignore[misc]


def test_the_verify_reports_are_frozen() -> None:
    from adapterdoc.report.base import FrozenReport
    from adapterdoc.report.verify_report import VerifyReport, VerifyRun

    for cls in (VerifyReport, VerifyRun):
        assert issubclass(cls, FrozenReport) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    report = VerifyReport(adapter="a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.layout = "x"  # type: ignore[misc]
    assert dataclasses.replace(report, layout="x").layout == "x" and report.layout == "unknown"
