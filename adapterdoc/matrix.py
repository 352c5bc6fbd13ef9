"""The layout × operation matrix: every registry layout through every command, on adapters the training core makes.

For each layout with a tiny reference model, ``train-smoke`` trains a real adapter (non-zero ``lora_B``), and that
adapter then goes through ``inspect``, ``remap`` (every registry move, there and back), ``verify``, ``merge`` and
``roundtrip``; a mixture-of-experts layout's adapter also goes to the other expert layout and back (``experts``:
``remap --experts``, names and exact tensors, then outputs through PEFT on the tiny base, from ``roundtrip``'s
expert checks). A cell the registry lists but cannot run is an explicit "n/a" with its reason, never a gap.
``python -m adapterdoc.matrix`` prints the Markdown table that the README keeps.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.layouts import LAYOUTS

if TYPE_CHECKING:
    from adapterdoc.report.roundtrip_report import RoundtripReport

OPERATIONS = ("train-smoke", "inspect", "remap", "verify", "merge", "roundtrip", "experts")
SMOKE_STEPS = 4
"""Fast settings: enough steps for the loss to fall and lora_B to be non-zero."""

NOT_APPLICABLE: dict[tuple[str, str], str] = {
    (name, op): lay.no_tiny for name, lay in LAYOUTS.items() if lay.tiny is None for op in OPERATIONS
}
NOT_APPLICABLE.update(
    {
        (name, "experts"): "no routed experts in this layout (dense MLP): nothing for remap --experts to move"
        for name, lay in LAYOUTS.items()
        if lay.tiny is not None and lay.experts is None
    }
)
"""Cells the registry lists but cannot run: every operation of a layout without a tiny model, and the expert
moves of a layout without routed experts, with their reasons."""


@dataclass(frozen=True)
class Cell:
    """One cell of the layout × operation matrix: its status and what it found."""

    layout: str
    operation: str
    status: str
    """``pass``, ``fail`` or ``n/a``."""
    detail: str = ""
    seconds: float = 0.0


def cells_for(layouts: Iterable[str] | None = None) -> list[tuple[str, str]]:
    names = list(layouts) if layouts is not None else list(LAYOUTS)
    return [(layout, op) for layout in names for op in OPERATIONS]


class LayoutBench:
    """Runs one layout's row: train-smoke first (its adapter feeds the other operations)."""

    def __init__(self, layout: str, work: str) -> None:
        self.layout = layout
        self.work = work
        self.adapter: str | None = None
        self.smoke_error: str | None = None
        self._rt: RoundtripReport | None = None

    def run(self, operation: str) -> Cell:
        reason = NOT_APPLICABLE.get((self.layout, operation))
        if reason:
            return Cell(self.layout, operation, "n/a", reason)
        t = time.perf_counter()
        fn: Callable[[], tuple[bool, str]] = getattr(self, "_" + operation.replace("-", "_"))
        if operation != "train-smoke" and self.adapter is None:
            self._train_smoke()
        if operation != "train-smoke" and self.adapter is None:
            return Cell(self.layout, operation, "fail", f"no adapter: train-smoke failed: {self.smoke_error}")
        try:
            ok, detail = fn()
        except Exception as e:  # a crash in a cell is that cell's failure, with its reason
            ok, detail = False, f"{type(e).__name__}: {e}"
        return Cell(
            self.layout, operation, "pass" if ok else "fail", detail, round(time.perf_counter() - t, 2)
        )

    def _train_smoke(self) -> tuple[bool, str]:
        from adapterdoc.smoke import run_smoke

        out = os.path.join(self.work, "smoke")
        report = run_smoke([self.layout], steps=SMOKE_STEPS, out=out)
        run = report.runs[0]
        if run.adapter_dir:
            self.adapter = run.adapter_dir
        failed = [c.name for c in run.checks if c.ok is False]
        if not run.ok:
            self.smoke_error = run.error or f"checks failed: {', '.join(failed)}"
            return False, self.smoke_error
        return (
            True,
            f"loss {run.train_loss_before:.3f} → {run.train_loss_after:.3f}; {len(run.checks)} checks",
        )

    def _inspect(self) -> tuple[bool, str]:
        from adapterdoc.inspection import inspect

        assert self.adapter
        report = inspect(self.adapter)
        errors = [f.code for f in report.findings if f.severity == "error"]
        ok = report.layout.name == self.layout and not errors
        return ok, f"detected {report.layout.name}" + (f"; errors {errors}" if errors else "")

    def _remap(self) -> tuple[bool, str]:
        from adapterdoc.checkpoint import open_checkpoint
        from adapterdoc.roundtrip import byte_roundtrips, copy_adapter, reachable_layouts

        assert self.adapter
        if not reachable_layouts(self.layout):
            return True, "no registry moves from this layout"
        work = tempfile.mkdtemp(dir=self.work)
        original = copy_adapter(open_checkpoint(self.adapter), os.path.join(work, "original"))
        checks = byte_roundtrips(original, self.layout, work)
        bad = [c.name for c in checks if c.status != "pass"]
        return (
            not bad,
            f"{len(checks)} moves there and back byte-identical" if not bad else f"failed: {bad}",
        )

    def _verify(self) -> tuple[bool, str]:
        from adapterdoc.verify import verify

        assert self.adapter
        run = verify([self.adapter], f"tiny:{self.layout}")
        rep = run.adapters[0]
        ok = run.ok and not rep.missing and not rep.unexpected and not rep.shape_mismatch
        return ok, f"missing {len(rep.missing)}, unexpected {len(rep.unexpected)}, lora_B non-zero " + (
            f"{rep.lora_b.get('nonzero')}/{rep.lora_b.get('total')}" if isinstance(rep.lora_b, dict) else "?"
        )

    def _merge(self) -> tuple[bool, str]:
        from adapterdoc.merge import merge
        from adapterdoc.ml.tiny import build_tiny

        assert self.adapter
        base = os.path.join(self.work, "base")
        if not os.path.exists(base):
            build_tiny(self.layout).save_pretrained(base)
        out = tempfile.mkdtemp(dir=self.work, prefix="merged-")
        os.rmdir(out)
        result = merge(self.adapter, base=base, out=out)
        return (
            result.ok and not result.unused
        ), f"{len(result.applied)} modules applied, {len(result.unused)} unused"

    def _roundtrip_report(self) -> RoundtripReport:
        """``roundtrip`` on the adapter with ``tiny:LAYOUT``, run once for the roundtrip and experts cells."""
        from adapterdoc.roundtrip import roundtrip

        assert self.adapter
        if self._rt is None:
            self._rt = roundtrip(self.adapter, f"tiny:{self.layout}")
        return self._rt

    def _experts(self) -> tuple[bool, str]:
        checks = [c for c in self._roundtrip_report().checks if c.name.split(":")[0] == "experts"]
        bad = [f"{c.name} {c.status}: {c.detail}" for c in checks if c.status != "pass"]
        if bad or len(checks) != 2:
            return False, "; ".join(bad) or f"{len(checks)} expert checks ran, want 2"
        path = checks[0].name.partition(":")[2]
        return True, f"{path}: names and exact tensors identical; {checks[1].detail}"

    def _roundtrip(self) -> tuple[bool, str]:
        report = self._roundtrip_report()
        counts = {s: sum(c.status == s for c in report.checks) for s in ("pass", "fail", "skipped")}
        failed = [c.name for c in report.checks if c.status == "fail"]
        detail = f"{counts['pass']} passed, {counts['skipped']} skipped" + (
            f"; failed {failed}" if failed else ""
        )
        return report.ok, detail


def run_matrix(layouts: Iterable[str] | None = None, operations: Iterable[str] = OPERATIONS) -> list[Cell]:
    ops = list(operations)
    out: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="adapterdoc-matrix-") as work:
        for layout in layouts if layouts is not None else LAYOUTS:
            bench = LayoutBench(layout, os.path.join(work, layout))
            os.makedirs(bench.work)
            out.extend(bench.run(op) for op in ops)
    return out


_MARK = {"pass": "✅ pass", "fail": "❌ fail", "n/a": "n/a¹"}


def render_markdown(cells: list[Cell]) -> str:
    """The matrix as a Markdown table, with the n/a reasons as footnotes."""
    ops = [op for op in OPERATIONS if any(c.operation == op for c in cells)]
    rows: dict[str, dict[str, Cell]] = {}
    for c in cells:
        rows.setdefault(c.layout, {})[c.operation] = c
    lines = ["| layout | " + " | ".join(ops) + " |", "| --- | " + " | ".join("---" for _ in ops) + " |"]
    reasons: dict[str, int] = {}
    for layout, row in rows.items():
        marks = []
        for op in ops:
            cell = row.get(op)
            if cell is None:
                marks.append("")
            elif cell.status == "n/a":
                n = reasons.setdefault(cell.detail, len(reasons) + 1)
                marks.append(f"n/a [{n}]")
            else:
                marks.append(_MARK[cell.status])
        lines.append(f"| `{layout}` | " + " | ".join(marks) + " |")
    if reasons:
        lines.append("")
        lines.extend(f"[{n}] {reason}  " for reason, n in reasons.items())
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m adapterdoc.matrix", description=__doc__)
    parser.add_argument("--layout", action="append", help="only these layouts (repeatable)")
    args = parser.parse_args(argv)
    t = time.perf_counter()
    cells = run_matrix(args.layout)
    print(render_markdown(cells))
    failed = [c for c in cells if c.status == "fail"]
    for c in failed:
        print(f"FAIL {c.layout} × {c.operation}: {c.detail}")
    print(f"{len(cells)} cells, {len(failed)} failed, {time.perf_counter() - t:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__: list[str] = ["OPERATIONS", "Cell", "cells_for", "render_markdown", "run_matrix"]
