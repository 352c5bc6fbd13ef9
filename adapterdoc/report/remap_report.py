"""What ``adapterdoc remap`` returns: :class:`RemapReport` and the adapter_config changes it lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapterdoc.report.base import Report

MAPPING_SAMPLE = 1000
"""The JSON form lists at most this many renames (``mapping_total`` says how many there are)."""


@dataclass
class ConfigChange:
    """One adapter_config.json field the remap rewrites."""

    field: str
    old: Any
    new: Any
    how: str
    """``rules`` (the move's rules applied to the text), ``literal`` (the same textual rule on a regex),
    ``explicit`` (the exact module paths, because no textual rewrite selected the same modules),
    ``towers`` (exclusion of the target layout's towers added), ``class`` (``auto_mapping`` pointed at the target
    layout's class and module)."""

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "old": self.old, "new": self.new, "how": self.how}


@dataclass
class RemapReport(Report):
    """What a remap did (or, with ``dry_run``, would do)."""

    input: str
    mode: str
    """``vl``, ``to``, ``rule``, ``experts`` or ``for``."""
    strategy: str
    """``in-place`` (header rewritten over the old one), ``copy`` (a new file written), ``none`` (nothing to rename)."""
    mapping: dict[str, str]
    """Every renamed key, old → new."""
    source_layout: str | None = None
    target_layout: str | None = None
    weights: str | None = None
    """The weights file read."""
    out: str | None = None
    dry_run: bool = False
    config_changes: list[ConfigChange] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    """Files written (or that would be, with ``dry_run``)."""
    notes: list[str] = field(default_factory=list)
    experts: dict[str, Any] | None = None
    """``--experts`` only: the direction, the per-expert names, the blocks and tensors rewritten, the rank of each
    projection before and after, and what the conversion keeps exact."""
    engine: dict[str, Any] | None = None
    """``--for`` only: the engine, the version its needs describe, the base layout and where it came from, and
    the needs themselves."""
    rewrites: list[dict[str, Any]] = field(default_factory=list)
    """``--for`` only: each rewrite made (``keys``, ``experts``, ``rslora``, ``ranks``, ``scaling``, ``patterns``,
    ``target_modules``), with what it cost (``bytes_added`` by padding, ``max_rel_rounding`` of scaling)."""
    renamed: int = field(init=False)

    def __post_init__(self) -> None:
        self.renamed = len(self.mapping)

    def body(self) -> dict[str, Any]:
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
            "written": self.written,
            "notes": self.notes,
            **({"experts": self.experts} if self.experts is not None else {}),
            **({"engine": self.engine, "rewrites": self.rewrites} if self.engine is not None else {}),
        }
