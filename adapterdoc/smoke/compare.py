"""What the checks of a train-smoke run see (:class:`Ctx`), and how they compare modules: the outputs of a trained,
reloaded, remapped or merged model on the same validation batch, and their largest difference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adapterdoc.layouts import forward_module
from adapterdoc.train import models
from adapterdoc.train.objectives import CAUSAL, MASKED, POOLED
from adapterdoc.train.records import TrainResult

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel

    from adapterdoc.report.verify_report import VerifyReport
    from adapterdoc.train.data import Batch

    Outputs = dict[str, torch.Tensor]
    """Comparable outputs by name: ``logits``, ``hidden``."""

IDENTICAL = 1e-6
"""Max |Δ| for "identical" outputs (same weights, same ops: 0.0 is expected)."""
MERGE_TOLERANCE = 1e-4
"""Max |Δ| relative to max(1, max |output|) for merged vs unmerged (float rounding of W + s·B@A)."""


@dataclass
class Ctx:
    """What the checks see: the finished run, its in-memory model, a validation batch and its outputs."""

    layout: str
    result: TrainResult
    work: str
    saved_layout: str
    """The layout of the saved adapter's keys (a forward-routing wrapper saved in its inner module's naming:
    that module's layout, :func:`~adapterdoc.layouts.forward_layout`)."""
    reference: Outputs = field(default_factory=dict)
    verify_report: VerifyReport | None = None
    """``adapterdoc.verify``'s report on the saved adapter, once the verify check ran."""

    @property
    def objective(self) -> str:
        return self.result.objective

    @property
    def batch(self) -> Batch:
        assert self.result.val_batch is not None  # every run keeps its validation batch
        return self.result.val_batch

    @property
    def model(self) -> nn.Module:
        """The trained module (every run keeps it)."""
        assert self.result.model is not None
        return self.result.model


def outputs(module: nn.Module, batch: Batch, objective: str, head: nn.Module | None = None) -> Outputs:
    """Comparable outputs of a trained/reloaded/merged module: logits, and the encoder's hidden states."""
    import torch

    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        if objective == POOLED:
            encoder = module.get_submodule("encoder") if head is None else module
            head = module.get_submodule("head") if head is None else head
            hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            return {"hidden": hidden, "logits": head(models.mean_pool(hidden, mask))}
        out = {"logits": module(input_ids=ids, attention_mask=mask).logits}
        if objective == MASKED:
            encoder = models.peft_base(module).get_submodule("model")
            out["hidden"] = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        return out


def counterpart_outputs(module: nn.Module, batch: Batch, objective: str, head: nn.Module | None) -> Outputs:
    import torch

    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        out = module(input_ids=ids, attention_mask=mask)
        if objective == CAUSAL:
            return {"logits": out.logits}
        res = {"hidden": out.last_hidden_state}
        if objective == POOLED:
            assert head is not None  # the pooled objective's head comes with it
            res["logits"] = head(models.mean_pool(out.last_hidden_state, mask))
        return res


def max_diff(a: Outputs, b: Outputs, mask: torch.Tensor) -> tuple[float, float, list[str]]:
    """(max |Δ| over real tokens of the shared outputs, max |reference|, names compared)."""
    names = [k for k in a if k in b]
    worst, scale = 0.0, 0.0
    for k in names:
        x, y = a[k].float(), b[k].float()
        if x.shape != y.shape:
            return float("inf"), 0.0, names
        if x.dim() >= 2 and x.shape[:2] == mask.shape:
            keep = mask.bool()
            x, y = x[keep], y[keep]
        worst = max(worst, float((x - y).abs().max()))
        scale = max(scale, float(x.abs().max()))
    return worst, scale, names


def fresh_saved_base(ctx: Ctx) -> PreTrainedModel:
    """A fresh base of the saved adapter's layout, from the run's base seed."""
    seed = ctx.result.settings.base_seed
    if ctx.saved_layout == ctx.layout:
        return models.build_base(ctx.layout, seed)
    from transformers import PreTrainedModel

    # a wrapper saved in its inner module's naming
    inner = forward_module(models.build_base(ctx.layout, seed))
    assert isinstance(inner, PreTrainedModel)
    return inner
