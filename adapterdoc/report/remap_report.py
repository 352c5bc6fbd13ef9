"""What ``adapterdoc remap`` returns: :class:`RemapReport`, the adapter_config changes it lists, and the one builder
that completes the plan's report with the write's results (:func:`build_remap_report`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from adapterdoc.report.base import FrozenReport

MAPPING_SAMPLE = 1000
"""The JSON form lists at most this many renames (``mapping_total`` says how many there are)."""


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


@dataclass(frozen=True)
class RemapReport(FrozenReport):
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
    config_changes: Sequence[ConfigChange] = field(default_factory=list)
    written: Sequence[str] = field(default_factory=list)
    """Files written (or that would be, with ``dry_run``)."""
    notes: Sequence[str] = field(default_factory=list)
    experts: Mapping[str, object] | None = None
    """``--experts`` only: the direction, the per-expert names, the blocks and tensors rewritten, the rank of each
    projection before and after, and what the conversion keeps exact."""
    engine: Mapping[str, object] | None = None
    """``--for`` only: the engine, the version its needs describe, the base layout and where it came from, and
    the needs themselves."""
    rewrites: Sequence[Mapping[str, object]] = field(default_factory=list)
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
class Written:
    """What the write did: the files written, in order, and what it noted (a link replaced, a backup kept)."""

    paths: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def __add__(self, other: Written) -> Written:
        return Written(self.paths + other.paths, self.notes + other.notes)


DRY_RUN_NOTE = "dry run: nothing was written"


def build_remap_report(planned: RemapReport, written: Written | None) -> RemapReport:
    """The final report, from the plan's (:attr:`adapterdoc.remap.plan.Plan.planned`, which the write never
    touches) and the write's results (``None``: a dry run, nothing written)."""
    if written is None:
        return replace(planned, dry_run=True, notes=[*planned.notes, DRY_RUN_NOTE])
    return replace(planned, written=list(written.paths), notes=[*planned.notes, *written.notes])
