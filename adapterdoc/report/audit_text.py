"""Human rendering of the weights audit (:class:`adapterdoc.audit.Audit`): totals, per leaf, per layer, inert."""

from __future__ import annotations

import statistics
from typing import Any

from rich.table import Table

from adapterdoc.report.render import capture_console, human_bytes

MAX_INERT_LISTED = 10


def render_audit(audit: Any) -> str:
    console, buf = capture_console()
    n, inert = len(audit.measured), audit.inert_count
    console.print(
        f"[bold]weights[/]: {n} LoRA module(s) measured, {inert} inert ({audit.inert_share:.0%}), "
        f"total ‖ΔW‖_F = {audit.total_norm:.4g}, {human_bytes(audit.bytes_read)} read"
    )
    for note in audit.notes:
        console.print(f"  note: {note}")
    if not audit.modules:
        return buf.getvalue()
    leaves = Table(title="delta ‖scaling·B A‖_F per module leaf")
    for col in ("leaf", "modules", "inert", "share", "min", "median", "max", "eff. rank / rank"):
        leaves.add_column(col, justify="left" if col == "leaf" else "right", overflow="fold")
    by_leaf: dict[str, list[Any]] = {}
    for m in audit.modules:
        by_leaf.setdefault(f"{m.group}.*.{m.leaf}" if m.group else m.leaf, []).append(m)
    for leaf, mods in by_leaf.items():
        leaves.add_row(leaf, *_stats(mods), _ranks(mods))
    console.print(leaves)
    layers = Table(title="delta per layer")
    for col in ("layer", "modules", "inert", "share", "min", "median", "max"):
        layers.add_column(col, justify="left" if col == "layer" else "right")
    by_layer: dict[str, list[Any]] = {}
    for m in audit.modules:
        if m.layer is not None:
            by_layer.setdefault(f"{m.group}.{m.layer}", []).append(m)
    for layer, mods in by_layer.items():
        layers.add_row(layer, *_stats(mods))
    if by_layer:
        console.print(layers)
    dead = [m for m in audit.modules if m.inert]
    if dead and inert < n:
        names = [m.module if m.expert is None else f"{m.module} (expert {m.expert})" for m in dead]
        more = f" ... and {len(names) - MAX_INERT_LISTED} more" if len(names) > MAX_INERT_LISTED else ""
        console.print("inert: " + ", ".join(names[:MAX_INERT_LISTED]) + more)
    return buf.getvalue()


def _stats(mods: list[Any]) -> list[str]:
    norms = [m.delta_norm for m in mods if m.delta_norm is not None]
    share = sum(m.share or 0.0 for m in mods)
    if not norms:
        return [str(len(mods)), str(sum(m.inert for m in mods)), "n/a", "n/a", "n/a", "n/a"]
    return [
        str(len(mods)),
        str(sum(m.inert for m in mods)),
        f"{share:.1%}",
        f"{min(norms):.3g}",
        f"{statistics.median(norms):.3g}",
        f"{max(norms):.3g}",
    ]


def _ranks(mods: list[Any]) -> str:
    eff = max((m.effective_rank or 0) for m in mods)
    ranks = sorted({m.rank for m in mods})
    return f"≤{eff} / {','.join(map(str, ranks))}"
