"""JUnit XML for CI dashboards: one testsuite per run, one testcase per group of the report's view (verify: per
adapter), failures carrying the error findings."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from adapterdoc.report.registry import view_of

if TYPE_CHECKING:
    from adapterdoc.report.base import Envelope
    from adapterdoc.report.findings import Finding


def render_junit(report: Envelope) -> str:
    """The XML document as text (UTF-8 declaration, two-space indent, deterministic: no times, no hostnames)."""
    view = view_of(report)
    groups = view.groups
    failures = sum(1 for g in groups if not g.error and not g.ok)
    errors = sum(1 for g in groups if g.error)
    counts = {"tests": str(len(groups)), "failures": str(failures), "errors": str(errors)}
    root = ET.Element("testsuites", {"name": "adapterdoc", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": f"adapterdoc {view.command}", **counts, "skipped": "0"})
    props = ET.SubElement(suite, "properties")
    for name, value in view.properties:
        if value is not None:
            ET.SubElement(props, "property", {"name": name, "value": str(value)})
    for group in groups:
        case = ET.SubElement(
            suite, "testcase", {"classname": f"adapterdoc.{view.command}", "name": group.name}
        )
        if group.path:
            case.set("file", group.path)
        if group.error:
            ET.SubElement(
                case, "error", {"type": "unusable-input", "message": group.error}
            ).text = group.error
            continue
        errs = [f for f in group.findings if f.severity == "error"]
        if errs:
            codes = ", ".join(sorted({f.code for f in errs}))
            fail = ET.SubElement(
                case, "failure", {"type": errs[0].code, "message": f"{len(errs)} error finding(s): {codes}"}
            )
            fail.text = "\n".join(_line(f) for f in errs)
        rest = [f for f in group.findings if f.severity != "error"]
        if rest:
            ET.SubElement(case, "system-out").text = "\n".join(_line(f) for f in rest)
    ET.indent(root, space="  ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _line(f: Finding) -> str:
    s = f"{f.code} [{f.severity}] {f.message}"
    if f.key:
        s += f" (key: {f.key})"
    if f.hint:
        s += f" → {f.hint}"
    return s
