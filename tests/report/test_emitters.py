"""Every output format of the registry, rendered from ONE shared report, against golden files (as ruff tests its
emitters). The report has findings of every severity, with and without path, key and hint, unicode, characters
each format must escape, a multi-line message, and an input that could not be used at all.

Regenerate after an intended change: ``ADAPTERDOC_UPDATE_GOLDEN=1 python -m pytest tests/report/test_emitters.py``.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from adapterdoc import __version__
from adapterdoc.report.base import FrozenReport
from adapterdoc.report.findings import Finding, make
from adapterdoc.report.formats import FORMATS, render
from adapterdoc.report.registry import TEXT_MODULES, Group, View, register, view_of
from adapterdoc.report.render import Writer, write_findings

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
FIRST = "adapters/ünïcode-adapter"
SECOND = "adapters/second"
BROKEN = "adapters/missing"
GOLDEN_NAMES = {
    "text": "emitters.txt",
    "json": "emitters.json",
    "junit": "emitters.junit.xml",
    "github": "emitters.github.txt",
    "sarif": "emitters.sarif.json",
}


@dataclass(frozen=True)
class SampleReport(FrozenReport):
    """A report of two adapters and one unusable input, as a command would return it."""

    subjects: dict[str, list[Finding]] = field(default_factory=dict)
    unusable: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"inputs": list(self.subjects), "unusable": dict(self.unusable)}


def _view(report: SampleReport) -> View:
    groups = [Group(name, found, path=name) for name, found in report.subjects.items()]
    groups += [Group(name, [], error=why) for name, why in report.unusable.items()]
    return View(
        "sample", groups, unit="adapter", properties=[("base", "tiny:ministral3_text"), ("none", None)]
    )


@register("SampleReport", view=_view)
def _render_sample(report: SampleReport, *, width: int | None = None) -> str:
    w = Writer(width)
    for name, found in report.subjects.items():
        w.para((name, "bold"), hang=2)
        write_findings(w, found, indent=2, context=(name,))
    for name, why in report.unusable.items():
        w.para((name, "bold"), "unusable:", why, hang=2)
    return w.getvalue()


def sample_report() -> SampleReport:
    """The one shared fixture every emitter renders."""
    key = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"
    first = [
        make(
            "AD223",
            "VL adapter on a text-only base; the 56 mismatched key(s) all match after the move",
            path=FIRST,
            hint=f"adapterdoc remap {FIRST} --vl",
        ),
        make("AD221", "56 adapter key(s) match nothing, e.g. 'a,b:c' 100% dropped", path=FIRST, key=key),
        make(
            "AD302", "lora_B is all zero — ‖ΔW‖ = 0 (27 of 28 are not)", path=FIRST, key=key.replace("A", "B")
        ),
        make("AD111", "unknown field `lora_alpah`; did you mean `lora_alpha`?", path=FIRST, key="lora_alpah"),
        make("AD229", "scaling lora_alpha / r = 2 (r 64, lora_alpha 128)\nsecond line: 日本語", path=FIRST),
    ]
    second = [
        make("AD229", "scaling lora_alpha / r = 2 (r 2, lora_alpha 4)"),
        make("AD311", "3 of 12 LoRA module(s) (25%) are inert", severity="warning", key="model.layers.3.mlp"),
    ]
    return SampleReport(
        subjects={FIRST: first, SECOND: second},
        unusable={BROKEN: f"{BROKEN}: no such file or directory"},
        findings=[*first, *second],
    )


@pytest.fixture
def report() -> SampleReport:
    return sample_report()


def _normalise(fmt: str, text: str) -> str:
    """The version number changes every release; the goldens hold a placeholder."""
    if fmt == "sarif":
        return text.replace(f'"version": "{__version__}"', '"version": "VERSION"')
    return text


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ADAPTERDOC_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"missing golden file {path}; set ADAPTERDOC_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_matches_its_golden(
    report: SampleReport, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    text = render(report, fmt, width=80)
    assert text.endswith("\n") and "\x1b[" not in text
    check_golden(GOLDEN_NAMES[fmt], _normalise(fmt, text))


def test_every_format_has_a_golden_file() -> None:
    assert set(GOLDEN_NAMES) == set(FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_names_every_input_and_code(report: SampleReport, fmt: str) -> None:
    text = render(report, fmt, width=80)
    for name in (SECOND, BROKEN):
        assert name in text, (fmt, name)
    for f in report.findings:
        assert f.code in text, (fmt, f.code)


def test_json_is_the_envelope(report: SampleReport) -> None:
    d = json.loads(render(report, "json"))
    assert list(d)[:2] == ["ok", "findings"] and d["ok"] is False
    assert d["findings"] == [f.to_dict() for f in report.findings]
    assert d["inputs"] == [FIRST, SECOND]


def test_junit_parses_with_one_case_per_group(report: SampleReport) -> None:
    root = ET.fromstring(render(report, "junit"))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name") == "adapterdoc sample"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [FIRST, SECOND, BROKEN]
    assert cases[0].find("failure") is not None and cases[1].find("failure") is None
    assert cases[2].find("error") is not None
    assert [p.get("name") for p in suite.iter("property")] == ["base"]  # a None property is left out


def test_github_one_line_per_finding(report: SampleReport) -> None:
    lines = render(report, "github").splitlines()
    assert len(lines) == len(report.findings) + 2  # the unusable input and the summary
    assert lines[-1] == "adapterdoc sample: 1 of 3 adapter(s) passed"
    assert all("\n" not in line for line in lines)


def test_sarif_is_a_2_1_0_log(report: SampleReport) -> None:
    log = json.loads(render(report, "sarif"))
    assert log["version"] == "2.1.0" and len(log["runs"]) == 1
    run = log["runs"][0]
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert rules == sorted({f.code for f in report.findings} | {"AD100"})
    assert len(run["results"]) == len(report.findings) + 1
    for r in run["results"]:
        assert rules[r["ruleIndex"]] == r["ruleId"]
        assert r["level"] in ("error", "warning", "note")
    assert run["properties"] == {"base": "tiny:ministral3_text"}


def test_a_report_without_a_view_is_one_group() -> None:
    @dataclass(frozen=True)
    class PlainReport(FrozenReport):
        pass

    plain = PlainReport(findings=[make("AD229", "scaling 2", path="x.safetensors"), make("AD229", "no path")])
    view = view_of(plain)
    assert view.command == "plain" and [len(g.findings) for g in view.groups] == [2]
    lines = render(plain, "github").splitlines()
    assert lines[0].startswith("::notice file=x.safetensors,title=AD229")
    assert lines[1].startswith("::notice title=AD229")  # no path, no input name: no file
    with pytest.raises(LookupError):
        render(plain, "text")


def test_unknown_format_is_refused(report: SampleReport) -> None:
    with pytest.raises(ValueError, match="unknown output format"):
        render(report, "yaml")


def test_every_text_module_imports() -> None:
    import importlib

    for name in TEXT_MODULES:
        importlib.import_module(f"adapterdoc.report.{name}")
