"""The doctor on what the algebra wrote: ``verify`` against the base when one is given, else the weights audit of
``inspect --weights``; and finding AD959 when a module was truncated."""

from __future__ import annotations

from dataclasses import replace

from adapterdoc.report.algebra_report import AlgebraReport
from adapterdoc.report.findings import Finding, make, sort_findings

EXACT = 1e-12
"""A relative error at or below this is rounding, not truncation (no AD959)."""


def finish(report: AlgebraReport, findings: list[Finding], base: str | None) -> AlgebraReport:
    """The report with the doctor's findings on the written adapter (``verify`` against ``base``, else the weights
    audit) and AD959 when a module was truncated."""
    checked = doctor(report.out, base)
    cut = [m for m in report.modules if m.rel_error > EXACT]
    if cut:
        worst = max(cut, key=lambda m: m.rel_error)
        findings = [
            *findings,
            make(
                "AD959",
                f"{len(cut)} of {len(report.modules)} modules truncated; largest relative error "
                f"{worst.rel_error:.3g} ({worst.rank_in} → {worst.rank_out}, kept energy {worst.kept_energy:.6f})",
                key=worst.module,
            ),
        ]
    return replace(report, findings=sort_findings([*findings, *checked]))


def doctor(out: str, base: str | None) -> list[Finding]:
    """``verify OUT --base BASE``'s findings, or without a base the weights audit's."""
    if base is None:
        from adapterdoc.audit import audit_adapter

        return list(audit_adapter(out).findings)
    from adapterdoc.verify import verify

    run = verify([out], base)
    return [f for r in run.adapters for f in r.findings]


__all__ = ["EXACT", "doctor", "finish"]
