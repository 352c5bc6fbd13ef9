"""The model side of a run: the tiny base (forward routed), the LoRA config of a plan, the pooled classifier head
(built, saved, loaded) and the output projection the answer-token losses restrict."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from adapterdoc.errors import AdapterdocError
from adapterdoc.layouts import forward_module, get_layout
from adapterdoc.train import data as D
from adapterdoc.train import lora as L
from adapterdoc.train.records import write_json
from adapterdoc.train.settings import Plan, TrainSettings

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig
    from torch import nn
    from transformers import PreTrainedModel

HEAD_WEIGHTS = "pooled_head.safetensors"
HEAD_CONFIG = "pooled_head_config.json"


def route_forward(model: PreTrainedModel, layout: str) -> PreTrainedModel:
    """Route ``model``'s forward to the submodule that runs it where the layout names one (``forward_via``: a
    wrapper without a forward of its own is trained and evaluated through it); ``model``, routed. A base outside
    the registry (``layout`` empty) runs its own forward."""
    via = get_layout(layout).forward_via if layout else None
    if via:
        model.forward = getattr(model, via).forward
    return model


def build_base(layout: str, seed: int = 0) -> PreTrainedModel:
    """The tiny base of ``layout``, forward routed (:func:`route_forward`)."""
    from adapterdoc.ml.tiny import build_tiny

    return route_forward(build_tiny(layout, seed), layout)


def pooled_module_class() -> type[nn.Module]:
    import torch

    class PooledClassifier(torch.nn.Module):
        """An encoder (the PEFT model) and a linear head on its mask-averaged last hidden state."""

        def __init__(self, encoder: nn.Module, in_features: int, classes: int) -> None:
            super().__init__()
            self.encoder = encoder
            self.head = torch.nn.Linear(in_features, classes)

        def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return mean_pool(hidden, attention_mask)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = self.head(self.pooled(input_ids, attention_mask))
            return logits

    return PooledClassifier


def pooled_classifier(encoder: nn.Module, in_features: int, classes: int, seed: int = 0) -> nn.Module:
    import torch

    state = torch.random.get_rng_state()
    torch.manual_seed(seed + 1)
    try:
        return pooled_module_class()(encoder, in_features, classes)
    finally:
        torch.random.set_rng_state(state)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


def encoder_width(model: nn.Module) -> int:
    """The width of the encoder's ``last_hidden_state`` (an encoder may project after its final norm)."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([[D.BOS, D.EOS]])
        return int(model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.shape[-1])


def peft_base(model: nn.Module) -> nn.Module:
    """The model inside a PEFT wrapper (``get_base_model``), else ``model`` itself."""
    get_base: Callable[[], nn.Module] | None = getattr(model, "get_base_model", None)
    return get_base() if get_base is not None else model


def output_head(model: nn.Module) -> nn.Module:
    """The module that projects hidden states to vocabulary logits (``lm_head``, the MLM ``decoder``)."""
    # a transformers model, whose get_output_embeddings is unannotated
    inner: Any = forward_module(peft_base(model))
    head: nn.Module | None = inner.get_output_embeddings()
    if head is None:
        raise AdapterdocError(type(inner).__name__, "has no output projection to restrict to the answer tail")
    return head


def plan_lora_config(plan: Plan, s: TrainSettings) -> LoraConfig:
    """The registry's LoRA config for the plan's layout, with the run's rank, alpha, dropout and targets; for a base
    outside the registry, ``--targets`` or PEFT's own ``all-linear`` rule (:func:`~adapterdoc.train.lora.generic_lora_config`)."""
    if not plan.layout:
        return L.generic_lora_config(r=s.r, alpha=s.alpha, dropout=s.dropout, targets=s.targets)
    lay = get_layout(plan.layout)
    if not s.targets:
        return L.lora_config(lay, r=s.r, alpha=s.alpha, dropout=s.dropout)
    params = [t for t in s.targets if t in lay.target_parameters]
    modules = [t for t in s.targets if t not in params] or None
    if not modules and not params:
        raise AdapterdocError("--targets", "no target given")
    return L.lora_config(
        lay,
        r=s.r,
        alpha=s.alpha,
        dropout=s.dropout,
        target_modules=modules,
        target_parameters=params or None,
    )


def save_head(head: nn.Module, folder: str, config: dict[str, object]) -> None:
    """The pooled head as safetensors, and its config as JSON, both written atomically."""
    from safetensors.torch import save as st_save

    from adapterdoc.st.atomic import atomic_write_bytes

    os.makedirs(folder, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    atomic_write_bytes(os.path.join(folder, HEAD_WEIGHTS), st_save(tensors, metadata={"format": "pt"}))
    write_json(os.path.join(folder, HEAD_CONFIG), config)


def load_head(folder: str) -> nn.Linear:
    import torch
    from safetensors.torch import load_file

    with open(os.path.join(folder, HEAD_CONFIG), encoding="utf-8") as f:
        cfg = json.load(f)
    head = torch.nn.Linear(cfg["in_features"], len(cfg["classes"]))
    head.load_state_dict(load_file(os.path.join(folder, HEAD_WEIGHTS)), strict=True)
    return head.eval()
