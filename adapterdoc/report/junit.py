"""JUnit XML for CI dashboards: one testsuite per run, one testcase per adapter, failures carrying the findings."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapterdoc.report.findings import Finding
    from adapterdoc.report.verify_report import VerifyRun

SUITE = "adapterdoc verify"
CLASSNAME = "adapterdoc.verify"


def render_junit(run: VerifyRun) -> str:
    """The XML document as text (UTF-8 declaration, two-space indent, deterministic: no times, no hostnames)."""
    failures = sum(1 for a in run.adapters if not a.error and not a.ok)
    errors = sum(1 for a in run.adapters if a.error)
    counts = {"tests": str(len(run.adapters)), "failures": str(failures), "errors": str(errors)}
    root = ET.Element("testsuites", {"name": "adapterdoc", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": SUITE, **counts, "skipped": "0"})
    props = ET.SubElement(suite, "properties")
    d = run.to_dict()
    for name, value in (
        ("base", run.base),
        ("profile", run.options.profile),
        ("max_lora_rank", d["max_lora_rank"]),
        ("vllm_version", d["vllm_version"]),
    ):
        if value is not None:
            ET.SubElement(props, "property", {"name": name, "value": str(value)})
    for report in run.adapters:
        case = ET.SubElement(suite, "testcase", {"classname": CLASSNAME, "name": report.adapter})
        if report.path:
            case.set("file", report.path)
        if report.error:
            ET.SubElement(
                case, "error", {"type": "unusable-input", "message": report.error}
            ).text = report.error
            continue
        errs = [f for f in report.findings if f.severity == "error"]
        if errs:
            codes = ", ".join(sorted({f.code for f in errs}))
            fail = ET.SubElement(
                case, "failure", {"type": errs[0].code, "message": f"{len(errs)} error finding(s): {codes}"}
            )
            fail.text = "\n".join(_line(f) for f in errs)
        rest = [f for f in report.findings if f.severity != "error"]
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
