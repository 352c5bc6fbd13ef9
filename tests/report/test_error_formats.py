"""Exit 3 in the CI formats: ``--format junit|sarif|github`` still writes a valid report holding the error (as
``--json`` writes its AD100 object), on stdout or in ``--output-file`` (issue 25)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest


def _missing(tmp_path: Path) -> str:
    return str(tmp_path / "no-such-adapter")


def _junit_error(text: str) -> ET.Element:
    root = ET.fromstring(text)
    assert root.tag == "testsuites" and root.get("errors") == "1" and root.get("tests") == "1"
    (err,) = root.iter("error")
    return err


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_junit_on_exit_3_is_a_report_with_the_error(tmp_path: Path, cli: Any, command: str) -> None:
    r = cli(command, _missing(tmp_path), "--format", "junit")
    assert r.exit_code == 3
    line = r.stderr.strip()
    assert line.startswith("adapterdoc: error: ") and line.count("\n") == 0
    err = _junit_error(r.stdout)
    assert err.get("message") == line.removeprefix("adapterdoc: error: ")


def test_sarif_on_exit_3_is_a_log_with_an_ad100_result(tmp_path: Path, cli: Any) -> None:
    r = cli("inspect", _missing(tmp_path), "--format", "sarif")
    assert r.exit_code == 3
    log = json.loads(r.stdout)
    assert log["version"] == "2.1.0"
    (run,) = log["runs"]
    (res,) = run["results"]
    assert res["ruleId"] == "AD100" and res["level"] == "error"
    assert res["message"]["text"] == r.stderr.strip().removeprefix("adapterdoc: error: ")
    assert [rule["id"] for rule in run["tool"]["driver"]["rules"]] == ["AD100"]


def test_github_on_exit_3_is_one_error_annotation(tmp_path: Path, cli: Any) -> None:
    r = cli("inspect", _missing(tmp_path), "--format", "github")
    assert r.exit_code == 3
    errors = [x for x in r.stdout.splitlines() if x.startswith("::error ")]
    assert len(errors) == 1 and "unusable input" in errors[0] and "no-such-adapter" in errors[0]


def test_the_report_goes_to_the_output_file_when_one_is_given(tmp_path: Path, cli: Any) -> None:
    out = tmp_path / "report.xml"
    r = cli("inspect", _missing(tmp_path), "--format", "junit", "--output-file", out)
    assert r.exit_code == 3 and r.stdout == ""
    _junit_error(out.read_text(encoding="utf-8"))
