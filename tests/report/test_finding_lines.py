"""Findings about a config field carry its line in adapter_config.json from when they are made
(:func:`adapterdoc.report.findings.make` through :func:`adapterdoc.adapter.lines.config_field_line`); the github
and sarif emitters only format it and never read the config themselves."""

from __future__ import annotations

import json
from pathlib import Path

from adapterdoc.adapter.lines import config_field_line
from adapterdoc.report.findings import make
from adapterdoc.report.github import render_github
from adapterdoc.report.registry import Group, View, register
from adapterdoc.report.sarif import render_sarif

CONFIG = {"peft_type": "LORA", "r": 8, "lora_alpah": 16, "target_modules": ["q_proj"]}


def _adapter(tmp_path: Path) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(CONFIG, indent=2))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


def test_a_config_field_finding_carries_its_line(tmp_path: Path) -> None:
    folder = _adapter(tmp_path)
    typo = make("AD111", "unknown field `lora_alpah`", path=str(folder), key="lora_alpah")
    assert typo.line == 4 and typo.to_dict()["line"] == 4
    via_file = make("AD111", "unknown field", path=str(folder / "adapter_config.json"), key="lora_alpah")
    assert via_file.line == 4
    tensor = make("AD302", "lora_B is all zero", path=str(folder), key="model.layers.0.q_proj.lora_B.weight")
    whole = make("AD229", "scaling", path=str(folder))
    absent = make("AD111", "unknown field", path=str(folder), key="no_such_field")
    for f in (tensor, whole, absent):  # no line: the JSON stays as it was (to_dict drops None)
        assert f.line is None and "line" not in f.to_dict()
    assert config_field_line(str(tmp_path / "nowhere"), "r") is None


def test_the_line_follows_a_rewritten_config(tmp_path: Path) -> None:
    folder = _adapter(tmp_path)
    assert config_field_line(str(folder), "r") == 3
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "x": 1, "y": 2, "r": 8}, indent=2)
    )
    assert config_field_line(str(folder), "r") == 5


class LinesReport:
    def __init__(self, folder: str, findings: list) -> None:  # type: ignore[type-arg]
        self.folder, self.findings = folder, findings


register("LinesReport", view=lambda r: View("lines", [Group(r.folder, r.findings, path=r.folder)]))(
    lambda report, **_: ""
)


def test_emitters_format_the_line_without_reading_the_config(tmp_path: Path) -> None:
    folder = _adapter(tmp_path)
    typo = make("AD111", "unknown field `lora_alpah`", path=str(folder), key="lora_alpah")
    moved = {"a": 1, "b": 2, "c": 3, **CONFIG}  # an emitter that read the config now would say line 7
    (folder / "adapter_config.json").write_text(json.dumps(moved, indent=2))
    assert config_field_line(str(folder), "lora_alpah") == 7
    report = LinesReport(str(folder), [typo])
    github = render_github(report).splitlines()[0]
    assert github.startswith(f"::warning file={folder}/adapter_config.json,line=4,title=AD111 ")
    (result,) = json.loads(render_sarif(report))["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 4}
