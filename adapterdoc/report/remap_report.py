"""What ``adapterdoc remap`` returns: :class:`RemapReport`, the adapter_config changes it lists, and the one builder
that assembles it from the plan's and the write's results (:func:`build_remap_report`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adapterdoc.report.base import Report
from adapterdoc.report.findings import Finding

MAPPING_SAMPLE = 1000
"""The JSON form lists at most this many renames (``mapping_total`` says how many there are)."""

_FROZEN = Report.__dataclass_params__.frozen  # type: ignore[attr-defined]
"""A frozen dataclass cannot subclass a non-frozen one (and the other way round): :class:`RemapReport` is frozen
exactly when :class:`~adapterdoc.report.base.Report` is. Nothing assigns to a report's fields after
:func:`build_remap_report` made it either way (tests/remap/test_remap_report.py)."""


@dataclass(frozen=True)
class ConfigChange:
    """One adapter_config.json field the remap rewrites."""

    field: str
    old: object
    new: object
    how: str
    """``rules`` (the move's rules applied to the text), ``literal`` (the same textual rule on a regex),
    ``explicit`` (the exact module paths, because no textual rewrite selected the same modules),
    ``towers`` (exclusion of the target layout's towers added), ``class`` (``auto_mapping`` pointed at the target
    layout's class and module)."""

    def to_dict(self) -> dict[str, object]:
        return {"field": self.field, "old": self.old, "new": self.new, "how": self.how}


@dataclass(frozen=_FROZEN)
class RemapReport(Report):
    """What a remap did (or, with ``dry_run``, would do)."""

    input: str
    mode: str
    """``vl``, ``to``, ``rule``, ``experts`` or ``for``."""
    strategy: str
    """``in-place`` (header rewritten over the old one), ``copy`` (a new file written), ``none`` (nothing to rename)."""
    mapping: Mapping[str, str]
    """Every renamed key, old → new (``--experts``: every rewritten module, old → new)."""
    source_layout: str | None = None
    target_layout: str | None = None
    weights: str | None = None
    """The weights file read."""
    out: str | None = None
    dry_run: bool = False
    config_changes: Sequence[ConfigChange] = ()
    written: Sequence[str] = ()
    """Files written (or that would be, with ``dry_run``)."""
    notes: Sequence[str] = ()
    experts: Mapping[str, object] | None = None
    """``--experts`` only: the direction, the per-expert names, the blocks and tensors rewritten, the rank of each
    projection before and after, and what the conversion keeps exact."""
    engine: Mapping[str, object] | None = None
    """``--for`` only: the engine, the version its needs describe, the base layout and where it came from, and
    the needs themselves."""
    rewrites: Sequence[Mapping[str, object]] = ()
    """``--for`` only: each rewrite made (``keys``, ``experts``, ``rslora``, ``ranks``, ``scaling``, ``patterns``,
    ``target_modules``), with what it cost (``bytes_added`` by padding, ``max_rel_rounding`` of scaling)."""

    @property
    def renamed(self) -> int:
        """How many entries :attr:`mapping` has (keys; ``--experts``: modules)."""
        return len(self.mapping)

    def body(self) -> dict[str, object]:
        sample = dict(list(self.mapping.items())[:MAPPING_SAMPLE])
        return {
            "input": self.input,
            "mode": self.mode,
            "renamed": self.renamed,
            "strategy": self.strategy,
            "mapping": sample,
            "mapping_total": self.renamed,
            "mapping_truncated": len(sample) < self.renamed,
            "source_layout": self.source_layout,
            "target_layout": self.target_layout,
            "weights": self.weights,
            "out": self.out,
            "dry_run": self.dry_run,
            "config_changes": [c.to_dict() for c in self.config_changes],
            "written": list(self.written),
            "notes": list(self.notes),
            **({"experts": dict(self.experts)} if self.experts is not None else {}),
            **(
                {"engine": dict(self.engine), "rewrites": [dict(r) for r in self.rewrites]}
                if self.engine is not None
                else {}
            ),
        }


@dataclass(frozen=True)
class Planned:
    """What planning a remap found (:mod:`adapterdoc.remap.plan` and its ``--experts`` / ``--for`` siblings): every
    field of the report but what the write adds."""

    input: str
    mode: str
    strategy: str
    mapping: Mapping[str, str]
    source_layout: str | None = None
    target_layout: str | None = None
    weights: str | None = None
    out: str | None = None
    config_changes: tuple[ConfigChange, ...] = ()
    notes: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    experts: Mapping[str, object] | None = None
    engine: Mapping[str, object] | None = None
    rewrites: tuple[Mapping[str, object], ...] = ()


@dataclass(frozen=True)
class Written:
    """What the write did: the files written, in order, and what it noted (a link replaced, a backup kept)."""

    paths: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def __add__(self, other: Written) -> Written:
        return Written(self.paths + other.paths, self.notes + other.notes)


DRY_RUN_NOTE = "dry run: nothing was written"


def build_remap_report(planned: Planned, written: Written | None) -> RemapReport:
    """The report, once: the plan's findings, then the write's files and notes (``None``: a dry run)."""
    notes = planned.notes + (written.notes if written is not None else (DRY_RUN_NOTE,))
    return RemapReport(
        input=planned.input,
        mode=planned.mode,
        strategy=planned.strategy,
        mapping=planned.mapping,
        source_layout=planned.source_layout,
        target_layout=planned.target_layout,
        weights=planned.weights,
        out=planned.out,
        dry_run=written is None,
        config_changes=list(planned.config_changes),
        written=list(written.paths) if written is not None else [],
        notes=list(notes),
        experts=planned.experts,
        engine=planned.engine,
        rewrites=list(planned.rewrites),
        findings=list(planned.findings),
    )
