"""Small pieces the verify modules share: how many single-key findings are listed, findings moved under an adapter's
name, and duplicates dropped."""

from __future__ import annotations

from dataclasses import replace

from adapterdoc.report.findings import Finding

MAX_LISTED = 20
"""Per-kind cap on findings that name single keys (the JSON lists stay complete)."""


def at(f: Finding, spec: str) -> Finding:
    return replace(f, path=spec)  # the config field's line stays (Finding.line)


def dedupe(findings: list[Finding]) -> list[Finding]:
    """Drop repeats (same code, message and key), and a code's warning where the same code is also an error on the
    same key (the header's AD241 warning beside verify's AD241 error on a fused base)."""
    errors = {(f.code, f.key) for f in findings if f.severity == "error"}
    seen: set[tuple[str, str, str | None]] = set()
    out = []
    for f in findings:
        k = (f.code, f.message, f.key)
        if k in seen or (f.severity != "error" and (f.code, f.key) in errors):
            continue
        seen.add(k)
        out.append(f)
    return out
