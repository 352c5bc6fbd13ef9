"""What the main process writes at the end of a run: the adapter (and the pooled head) from the gathered state
dict, ``training_metadata.json`` and ``RUN_REPORT.md``."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

from adapterdoc.train import lora as L
from adapterdoc.train.models import save_head
from adapterdoc.train.objectives import CAUSAL, POOLED
from adapterdoc.train.records import RunLog, TrainResult, run_report, write_json
from adapterdoc.train.settings import Plan, TrainSettings

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from torch import nn


def save_outputs(
    plan: Plan,
    s: TrainSettings,
    log: RunLog,
    unwrapped: nn.Module,
    full_state: dict[str, torch.Tensor],
    adapter_dir: str,
    head_dir: str | None,
) -> dict[str, torch.Tensor]:
    """The adapter (and the pooled head) from the gathered state dict; the saved tensors by name."""
    pooled = plan.objective == POOLED
    log("save_start", adapter_dir=adapter_dir)
    within = "encoder." if pooled else ""
    peft_part = {k[len(within) :]: v for k, v in _strip_all(full_state).items() if k.startswith(within)}
    state = L.adapter_state(peft_part, what=adapter_dir)
    # the PeftModel itself, or the pooled classifier's encoder (which is the PeftModel)
    target = cast("PeftModel", unwrapped.encoder if pooled else unwrapped)
    saved = L.save_adapter(
        target, state, adapter_dir, base_name=plan.base_name, unwrap_forward=s.unwrap_forward
    )
    if head_dir:
        import torch

        head = unwrapped.head
        assert isinstance(head, torch.nn.Linear)  # the pooled classifier's (train.models.pooled_module_class)
        save_head(
            head,
            head_dir,
            {
                "in_features": head.in_features,
                "classes": plan.classes,
                "pooling": "mean over attention_mask",
                "input": "last_hidden_state",
                "base": plan.base_name,
            },
        )
    return saved


def write_records(
    plan: Plan,
    out: str,
    log: RunLog,
    result: TrainResult,
    *,
    lora: dict[str, object],
    trainable: int,
    sums: list[float],
    resumed_from: str | None,
) -> None:
    """``training_metadata.json`` (the result, the data, the LoRA config, ...) and ``RUN_REPORT.md``; ``complete``."""
    objective = plan.objective
    meta = result.to_dict()
    meta.update(
        data=plan.data,
        classes=plan.classes if objective == POOLED else None,
        lora=lora,
        trainable_parameters=trainable,
        replica_checksums=sums,
        loss="answer-token cross-entropy" if objective == CAUSAL else objective,
        resumed_from=resumed_from,
        **plan.extra,
    )
    write_json(os.path.join(out, "training_metadata.json"), meta)
    if plan.writes_run_report:
        from adapterdoc.audit import report_section
        from adapterdoc.report.run_report import write_run_report

        write_run_report(out, run_report(result, [report_section(result.adapter_dir, out)]))
    log("complete", seconds=round(result.seconds, 3))


def _strip_all(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {L.strip_wrappers(k): v for k, v in state.items()}
