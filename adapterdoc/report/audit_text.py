"""Human rendering of the weights audit (:class:`~adapterdoc.report.audit_report.Audit`): the totals, then per
layer stack a table per module leaf and per layer, then the inert modules."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from adapterdoc.report.render import KEEP, Span, Writer, columns, human_bytes, plural

if TYPE_CHECKING:
    from adapterdoc.report.audit_report import Audit, ModuleDelta

MAX_INERT_LISTED = 8
_HEAD = ["modules", "inert", "share", "median", "max"]


def write_audit(w: Writer, audit: Audit) -> None:
    """The audit's lines, into an inspect report's writer."""
    n, inert = len(audit.measured), audit.inert_count
    modules = len({m.module for m in audit.measured})  # inspect's count: a fused-expert module is one module
    entries = f" as {n:,} entries (fused experts: one per expert)" if n != modules else ""
    w.para(
        ("weights", "bold"),
        f"{plural(modules, 'LoRA module')} measured{entries}, {inert:,} inert ({audit.inert_share:.0%}),",
        f"total ‖ΔW‖_F {audit.total_norm:.4g}, {human_bytes(audit.bytes_read)} read",
        hang=2,
    )
    for note in audit.notes:
        w.para("note:", note, indent=2)
    groups: dict[str, list[ModuleDelta]] = {}
    for m in audit.modules:
        groups.setdefault(m.group, []).append(m)
    for group, mods in groups.items():
        _group(w, group, mods)
    dead = [m for m in audit.modules if m.inert]
    if dead and inert < n:
        names = [m.module if m.expert is None else f"{m.module}[expert {m.expert}]" for m in dead]
        shown: list[Span] = [(x + ",", KEEP) for x in names[:MAX_INERT_LISTED]]
        more = len(names) - MAX_INERT_LISTED
        if more > 0:
            shown.append(f"and {more:,} more")
        else:
            shown[-1] = (names[min(len(names), MAX_INERT_LISTED) - 1], KEEP)
        w.para("inert:", *shown, indent=2)


def _group(w: Writer, group: str, mods: list[ModuleDelta]) -> None:
    """Per leaf (with the effective rank against the rank), then per layer (or per expert), for one stack."""
    by_leaf: dict[str, list[ModuleDelta]] = {}
    for m in mods:
        by_leaf.setdefault(m.leaf, []).append(m)
    title = f"{group}.N" if group else "outside the layer stacks"
    rows: list[list[Span]] = [[f"{title}: per leaf", *_HEAD, "eff. rank / r"]]
    rows += [[leaf, *_stats(ms), _ranks(ms)] for leaf, ms in by_leaf.items()]
    for row in columns(rows, right=range(1, 7)):
        w.line(*row, indent=2)
    by_layer: dict[int, list[ModuleDelta]] = {}
    for m in mods:
        if m.layer is not None:
            by_layer.setdefault(m.layer, []).append(m)
    if len(by_layer) > 1:
        rows = [[f"{title}: per layer", *_HEAD]]
        rows += [[str(layer), *_stats(ms)] for layer, ms in sorted(by_layer.items())]
        for row in columns(rows, right=range(1, 6)):
            w.line(*row, indent=2)


def _stats(mods: list[ModuleDelta]) -> list[Span]:
    norms = [m.delta_norm for m in mods if m.delta_norm is not None]
    inert = str(sum(m.inert for m in mods))
    if not norms:
        return [str(len(mods)), inert, "n/a", "n/a", "n/a"]
    share = sum(m.share or 0.0 for m in mods)
    return [str(len(mods)), inert, f"{share:.1%}", f"{statistics.median(norms):.3g}", f"{max(norms):.3g}"]


def _ranks(mods: list[ModuleDelta]) -> str:
    eff = max((m.effective_rank or 0) for m in mods)
    ranks = sorted({m.rank for m in mods})
    return f"{eff} / {','.join(map(str, ranks))}"
