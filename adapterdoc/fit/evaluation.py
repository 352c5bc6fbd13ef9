"""`adapterdoc eval`: loss and token accuracy of a base and of base + adapter on the same rows, encoded with
training's label rules."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.report.train_report import EvalReport
from adapterdoc.train import models as M
from adapterdoc.train import rows as R
from adapterdoc.train.base_model import has_tokenizer, load_model, open_base
from adapterdoc.train.objectives import LOSSES, POOLED, Metrics, evaluate, objective_for
from adapterdoc.train.runtime import accelerator_for, quiet_libraries, torch_threads
from adapterdoc.train.settings import TrainSettings

if TYPE_CHECKING:
    import torch


def _metrics_dict(m: Metrics) -> dict[str, float]:
    return {"loss": m.loss, "accuracy": m.accuracy, "tokens": m.count}


def eval_on_base(
    adapter: str,
    base_spec: str,
    data: str,
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    seed: int = 0,
    dtype: str = "float32",
    min_improvement: float | None = None,
) -> EvalReport:
    """Loss and token accuracy of the base and of base + adapter on every row of ``data`` (training's label rules)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = R.read_rows(data)
    if not os.path.isdir(adapter) or not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
        raise UnsupportedInputError(
            adapter, "eval needs a PEFT adapter folder (adapter_config.json + weights)"
        )
    tok_dir = adapter if has_tokenizer(adapter) else None
    base = open_base(base_spec, R.texts(rows), tokenizer_dir=tok_dir)
    objective = objective_for(base.layout)
    head_dir = os.path.join(os.path.dirname(os.path.abspath(adapter)), "head")
    classes = None
    head = None
    if objective == POOLED:
        if not os.path.isfile(os.path.join(head_dir, M.HEAD_CONFIG)):
            raise UnsupportedInputError(adapter, "a pooled-head adapter needs its head/ folder beside it")
        head = M.load_head(head_dir)
        import json

        with open(os.path.join(head_dir, M.HEAD_CONFIG), encoding="utf-8") as f:
            classes = list(json.load(f)["classes"])
    enc = R.encode_data(
        objective,
        base.tokenizer,
        data,
        val_data=None,
        val_split=0.0,
        max_length=max_length,
        seed=seed,
        classes=classes,
    )
    findings: list[Finding] = []
    with torch_threads(1), quiet_libraries():
        acc = accelerator_for(TrainSettings(cpu=True))
        model: torch.nn.Module = load_model(base, dtype)
        model.eval()
        loss_fn = LOSSES[objective]

        def score(m: torch.nn.Module) -> Metrics:
            module = m
            if head is not None:  # the pooled objective's head
                module = M.pooled_module_class()(m, head.in_features, len(classes or []))
                module.get_submodule("head").load_state_dict(head.state_dict())
            out_head = None if objective == POOLED else M.output_head(m)
            return evaluate(acc, module, enc.train, lambda a, b, h: loss_fn(a, b, h), out_head, batch_size)

        on_base = _metrics_dict(score(model))
        from adapterdoc.train.lora import load_peft

        peft_model, missing = load_peft(model, adapter)
        if missing:
            findings.append(make("AD624", missing[0][:300], path=adapter))
        adapted = _metrics_dict(score(peft_model))
    improvement = on_base["loss"] - adapted["loss"]
    if min_improvement is not None and not improvement >= min_improvement:
        findings.append(
            make(
                "AD625",
                f"loss {on_base['loss']:.4f} -> {adapted['loss']:.4f}: improvement "
                f"{improvement:.4f} < --min-improvement {min_improvement}",
                path=adapter,
            )
        )
    return EvalReport(
        adapter,
        base_spec,
        base=on_base,
        adapted=adapted,
        rows=len(rows),
        improvement=improvement,
        min_improvement=min_improvement,
        findings=sort_findings(findings),
    )
