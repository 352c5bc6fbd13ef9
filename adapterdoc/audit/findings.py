"""The audit's findings: an adapter that changes nothing (AD310), many inert modules (AD311), a rank far above
what the deltas need (AD312), NaN/Inf factors (AD303), factors not read (AD304)."""

from __future__ import annotations

from adapterdoc.report.audit_report import ENERGY, INERT_RELATIVE, Audit, ModuleDelta
from adapterdoc.report.findings import Finding, make

INERT_WARN_SHARE = 0.25
"""AD311 (warning) when at least this share of the modules is inert (and not all of them: that is AD310)."""
RANK_WASTE_FACTOR = 4
"""AD312 (info) when every live module of a rank needs at most ``rank / RANK_WASTE_FACTOR`` for :data:`ENERGY`."""


def audit_findings(audit: Audit, spec: str) -> list[Finding]:
    out: list[Finding] = []
    measured = audit.measured
    n = len(measured)
    inert = audit.inert_count
    if n and inert == n:
        out.append(
            make(
                "AD310",
                f"all {n} LoRA module(s) have a zero delta ‖scaling·B A‖: the adapter changes nothing",
                path=spec,
            )
        )
    elif n and inert / n >= INERT_WARN_SHARE:
        first = next(m for m in measured if m.inert)
        out.append(
            make(
                "AD311",
                f"{inert} of {n} LoRA module(s) ({inert / n:.0%}) are inert "
                f"(delta ≤ {INERT_RELATIVE:g} × the RMS module delta)",
                path=spec,
                key=first.module if first.expert is None else f"{first.module} (expert {first.expert})",
            )
        )
    out += _rank_findings(measured, spec)
    for name, t in audit.tensors.items():
        if t.nonfinite:
            out.append(
                make(
                    "AD303",
                    f"{t.nonfinite} NaN/Inf value(s); its module's delta is not measured",
                    path=spec,
                    key=name,
                )
            )
    unread = [name for name, t in audit.tensors.items() if not t.scanned]
    if unread:
        out.append(
            make(
                "AD304",
                f"{len(unread)} LoRA tensor(s) not read by the weights audit",
                path=spec,
                key=unread[0],
            )
        )
    return out


def _rank_findings(measured: list[ModuleDelta], spec: str) -> list[Finding]:
    by_rank: dict[int, list[ModuleDelta]] = {}
    for m in measured:
        if not m.inert:
            by_rank.setdefault(m.rank, []).append(m)
    out = []
    for rank, mods in sorted(by_rank.items()):
        need = max(m.effective_rank or 0 for m in mods)
        if rank >= RANK_WASTE_FACTOR and need * RANK_WASTE_FACTOR <= rank:
            would = 1 << max(0, (need - 1).bit_length())
            out.append(
                make(
                    "AD312",
                    f"rank {rank}, but no module of that rank needs more than {need} for {ENERGY:.0%} of its "
                    f"delta ({len(mods)} module(s)): r={would} would do",
                    path=spec,
                    key=max(mods, key=lambda m: m.effective_rank or 0).module,
                )
            )
    return out
