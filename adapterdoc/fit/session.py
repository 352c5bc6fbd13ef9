"""`adapterdoc train` on a user's own base: open the base and its tokenizer (:mod:`~adapterdoc.train.base_model`),
encode the rows, run the shared loop (:func:`adapterdoc.train.loop.run`), then the doctor on what was written
(:mod:`~adapterdoc.fit.doctor`). `adapterdoc eval` is :mod:`~adapterdoc.fit.evaluation`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from adapterdoc.errors import ConfigError
from adapterdoc.fit.canaries import write_run_canaries
from adapterdoc.fit.doctor import examine, history_numbers
from adapterdoc.fit.outdir import RESTART, RESUME, plan_out
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.report.train_report import TrainReport
from adapterdoc.train import loop
from adapterdoc.train import rows as R
from adapterdoc.train.base_model import Base, load_model, open_base
from adapterdoc.train.objectives import objective_for
from adapterdoc.train.records import TrainResult
from adapterdoc.train.settings import OnEvent, Plan, TrainSettings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def default_out(base: str) -> str:
    stem = os.path.basename(os.path.normpath(base.replace("tiny:", "tiny-").replace("/", "--"))) or "base"
    return os.path.abspath(f"adapterdoc-train-{stem}")


def train_on_base(
    base_spec: str,
    data: str,
    out: str | None,
    settings: TrainSettings,
    *,
    val_data: str | None = None,
    val_split: float = 0.0,
    force: bool = False,
    on_event: OnEvent | None = None,
    canaries: bool = True,
) -> TrainReport:
    """Train a LoRA adapter on ``base_spec`` from ``data``; see the module docstring. Nothing is written before
    the base, the tokenizer and every row were found usable. ``--out`` follows :func:`~adapterdoc.fit.outdir.plan_out`:
    new, continued (``resume``), started again (no complete checkpoint) or replaced (``force``). ``canaries``: write
    ``OUT/canaries.json`` for `adapterdoc probe` (:mod:`~adapterdoc.fit.canaries`)."""
    t0 = time.time()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = R.read_rows(data)  # a malformed row fails here, before anything is loaded or written
    if val_data is not None:
        R.read_rows(val_data)
    where = plan_out(
        out or default_out(base_spec), resume=settings.resume, force=force
    )  # every process, read only
    base = open_base(base_spec, R.texts(rows))
    settings = replace(settings, resume=where.mode == RESUME, fresh=where.clears)
    plan = _plan(base, data, settings, val_data=val_data, val_split=val_split, out_mode=where.mode)
    target = where.path
    result = loop.run(plan, target, settings, on_event=on_event)
    if not result.is_main:
        return _report(result, base, target)
    _save_tokenizer(base.tokenizer, result.adapter_dir)
    verdict, findings = examine(result, base, target)
    if where.mode == RESTART:
        findings.append(make("AD628", f"{where.reason}; the run started from step 0", path=target))
    canaries_file, skipped = write_run_canaries(base, result, rows, target, wanted=canaries)
    if skipped:
        findings.append(skipped)
    return _report(
        result,
        base,
        target,
        verify=verdict.to_dict(),
        findings=sort_findings(findings),
        seconds=time.time() - t0,
        canaries=canaries_file,
    )


def _plan(
    base: Base, data: str, settings: TrainSettings, *, val_data: str | None, val_split: float, out_mode: str
) -> Plan:
    """What the loop trains: the base's layout and objective, the encoded rows, the metadata of the data; the
    doctor writes RUN_REPORT.md once, after its checks (the loop does not)."""
    objective = objective_for(base.layout)
    enc = R.encode_data(
        objective,
        base.tokenizer,
        data,
        val_data=val_data,
        val_split=val_split,
        max_length=settings.max_length,
        seed=settings.seed,
    )
    if settings.dropout and get_target_parameters(base.layout) and not settings.targets:
        raise ConfigError(
            "--dropout", "PEFT's fused-expert wrapper refuses lora_dropout != 0 for this layout; use 0"
        )
    return Plan(
        layout=base.layout,
        objective=objective,
        base_name=base.name,
        build_model=lambda: load_model(base, settings.dtype, settings.base_seed),
        train=enc.train,
        val=enc.val,
        classes=enc.classes,
        data=os.path.abspath(data),
        vocab_size=len(base.tokenizer),
        extra={
            "rows": enc.kind,
            "chat_mask": R.chat_mask_method(base.tokenizer) if enc.kind == R.MESSAGES else None,
            "val_data": os.path.abspath(val_data) if val_data else None,
            "val_split": val_split,
            "out_mode": out_mode,
        },
        writes_run_report=False,
    )


def _report(
    result: TrainResult,
    base: Base,
    target: str,
    *,
    verify: Mapping[str, object] | None = None,
    findings: Sequence[Finding] = (),
    seconds: float = 0.0,
    canaries: str | None = None,
) -> TrainReport:
    """The run's report, built once: the loop's result, then (main process) the doctor's verdict and findings."""
    speeds = [s for s in history_numbers(result.history, "tokens_per_s") if s]
    return TrainReport(
        base=base.name,
        layout=base.layout,
        out=target,
        adapter=result.adapter_dir,
        steps=result.settings.steps,
        train_loss={"before": result.train_before.loss, "after": result.train_after.loss},
        val_loss=(
            {"before": result.val_before.loss, "after": result.val_after.loss}
            if result.val_before and result.val_after
            else None
        ),
        num_processes=result.num_processes,
        is_main=result.is_main,
        tokens_per_s=round(sum(speeds) / len(speeds), 1) if speeds else None,
        verify=dict(verify or {}),
        findings=list(findings),
        seconds=seconds,
        canaries=canaries,
    )


def get_target_parameters(layout: str) -> tuple[str, ...]:
    from adapterdoc.layouts import get_layout

    return get_layout(layout).target_parameters if layout else ()


def _save_tokenizer(tok: PreTrainedTokenizerBase, folder: str) -> None:
    """The tokenizer beside the adapter (as TRL leaves it), each file written atomically."""
    from adapterdoc.st.atomic import atomic_write_bytes

    tmp = tempfile.mkdtemp(prefix=".adapterdoc-tok-", dir=folder)
    try:
        tok.save_pretrained(tmp)
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as f:
                atomic_write_bytes(os.path.join(folder, name), f.read())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
