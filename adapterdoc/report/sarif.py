"""SARIF 2.1.0 (code-scanning dashboards): one run, a rule per finding code that occurs (from the catalogue), one
result per finding with the file it is about and, for a key, a logical location."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from adapterdoc import __version__
from adapterdoc.codes import catalogue
from adapterdoc.report.base import UNUSABLE
from adapterdoc.report.github import target
from adapterdoc.report.registry import view_of

if TYPE_CHECKING:
    from adapterdoc.report.base import Envelope
    from adapterdoc.report.findings import Finding

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def render_sarif(report: Envelope) -> str:
    """The SARIF log as indented JSON text (deterministic: no times, no absolute paths added)."""
    view = view_of(report)
    results: list[dict[str, Any]] = []
    for group in view.groups:
        if group.error:
            results.append(_result(UNUSABLE, "error", group.error, group.path or group.name, None, None))
            continue
        for f in group.findings:
            root = group.path or f.path or (group.name if view.named_by_input else None)
            file, line = target(f, root) if root else (None, None)
            results.append(_result(f.code, LEVEL[f.severity], _message(f), file, line, f.key))
    codes = sorted({r["ruleId"] for r in results})
    index = {c: i for i, c in enumerate(codes)}
    for r in results:
        r["ruleIndex"] = index[r["ruleId"]]
    run: dict[str, object] = {
        "tool": {
            "driver": {
                "name": "adapterdoc",
                "version": __version__,
                "rules": [_rule(c) for c in codes],
            }
        },
        "automationDetails": {"id": f"adapterdoc {view.command}"},
        "results": results,
    }
    props = {name: value for name, value in view.properties if value is not None}
    if props:
        run["properties"] = props
    log = {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(log, indent=2, ensure_ascii=False) + "\n"


def _message(f: Finding) -> str:
    return f"{f.message}\nfix: {f.hint}" if f.hint else f.message


def _result(
    code: str, level: str, text: str, file: str | None, line: int | None, key: str | None
) -> dict[str, object]:
    out: dict[str, object] = {"ruleId": code, "ruleIndex": 0, "level": level, "message": {"text": text}}
    location: dict[str, object] = {}
    if file:
        physical: dict[str, object] = {
            "artifactLocation": {"uri": quote(file.replace("\\", "/"), safe="/:@")}
        }
        if line is not None:
            physical["region"] = {"startLine": line}
        location["physicalLocation"] = physical
    if key:
        location["logicalLocations"] = [{"fullyQualifiedName": key}]
    if location:
        out["locations"] = [location]
    return out


def _rule(code: str) -> dict[str, object]:
    info = catalogue().get(code)
    if info is None:
        return {"id": code}
    return {
        "id": code,
        "name": info.name,
        "shortDescription": {"text": info.summary},
        "fullDescription": {"text": info.why},
        "help": {"text": f"{info.instead} (adapterdoc explain {code})"},
        "defaultConfiguration": {"level": LEVEL.get(info.severity, "warning")},
    }
