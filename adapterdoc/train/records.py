"""What a run records: its result (:class:`TrainResult`, the body of ``training_metadata.json``),
``progress.jsonl`` (:class:`RunLog`), JSON files written atomically, and ``RUN_REPORT.md``."""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING

from adapterdoc.train import lora as L
from adapterdoc.train.objectives import POOLED, Metrics
from adapterdoc.train.settings import OnEvent, TrainSettings

if TYPE_CHECKING:
    from torch import nn

    from adapterdoc.train.data import Batch


@dataclass(frozen=True)
class TrainResult:
    """One finished run: its settings, metrics before and after, history and output folders."""

    layout: str
    objective: str
    settings: TrainSettings
    num_processes: int
    train_before: Metrics
    train_after: Metrics
    val_before: Metrics | None
    val_after: Metrics | None
    history: list[dict[str, object]]
    out_dir: str
    adapter_dir: str
    head_dir: str | None
    seconds: float
    saved_keys: list[str] = field(default_factory=list)
    model: nn.Module | None = None
    """The trained module (main process; not serialised)."""
    val_batch: Batch | None = None
    """A collated batch of validation rows for output comparisons (not serialised)."""
    base_name: str = ""
    is_main: bool = True

    def to_dict(self) -> dict[str, object]:
        """The serialisable fields; the model is never copied (``asdict`` would deep-copy it, and a sharded model
        refuses a deep copy)."""
        d: dict[str, object] = {}
        for f in fields(self):
            if f.name not in ("model", "val_batch", "is_main"):
                v = getattr(self, f.name)
                d[f.name] = asdict(v) if is_dataclass(v) and not isinstance(v, type) else copy.deepcopy(v)
        return d


class RunLog:
    """``progress.jsonl`` (main process only) plus an optional callback for live progress."""

    def __init__(
        self, path: str | None, on_event: OnEvent | None, layout: str, *, append: bool = False
    ) -> None:
        self.path, self.on_event, self.layout, self.t0 = path, on_event, layout, time.time()
        if path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a" if append else "w", encoding="utf-8"):
                pass
            if append:
                drop_partial_line(path)

    def __call__(self, event: str, **fields: object) -> None:
        row = {"event": event, "layout": self.layout, **fields, "elapsed_s": round(time.time() - self.t0, 4)}
        row["timestamp"] = time.time()
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        if self.on_event:
            self.on_event(row)


def drop_partial_line(path: str) -> None:
    """Cut a last line without its newline (a run killed or out of disk while logging), so that the next event
    starts a line of its own and every line of the log stays JSON."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def write_json(path: str, obj: object) -> None:
    from adapterdoc.st.atomic import atomic_write_bytes

    text = json.dumps(obj, indent=2, ensure_ascii=False, default=L.jsonable)
    atomic_write_bytes(path, (text + "\n").encode())


def run_report(result: TrainResult, sections: list[str] | None = None) -> str:
    """RUN_REPORT.md: the run's settings and losses, then ``sections`` (the doctor's verdict, pictures); the
    markdown is :func:`adapterdoc.report.run_report.render_run_report`'s."""
    from adapterdoc.report.run_report import render_run_report

    def m(x: Metrics | None) -> str:
        return "n/a" if x is None else f"{x.loss:.4f} (accuracy {x.accuracy:.3f}, n={x.count:g})"

    s = result.settings
    facts = [
        f"Objective: {result.objective}"
        + (
            " (output head projects only the supervised tail: the selected answer positions)"
            if s.tail_only and result.objective != POOLED
            else ""
        ),
        f"Base: {result.base_name} (layout {result.layout or 'outside the registry'}"
        + (f", seed {s.base_seed}" if result.base_name.startswith("tiny:") else "")
        + f"); LoRA r={s.r}, alpha={s.alpha or 2 * s.r}, dropout {s.dropout}, seed {s.seed}",
        f"Steps: {s.steps} x batch {s.batch_size} x accumulation {s.grad_accum} x {result.num_processes} "
        f"process(es); AdamW lr {s.lr}, clip {s.max_grad_norm}",
        f"Train loss: {m(result.train_before)} -> {m(result.train_after)}",
        f"Validation loss: {m(result.val_before)} -> {m(result.val_after)}",
        f"Adapter: `{result.adapter_dir}` ({len(result.saved_keys)} tensors)",
    ]
    if result.head_dir:
        facts.append(f"Pooled head: `{result.head_dir}`")
    note = "Only LoRA (and the pooled head) were trained; the base weights stayed frozen."
    return render_run_report(
        f"Training run: {result.base_name or result.layout}", facts, note, sections or []
    )
