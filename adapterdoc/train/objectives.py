"""The objectives a run can train with, which one a layout gets, their losses (each a weighted sum over the
supervised positions only: the answer tail goes through the output head, the prompt never does) and the
evaluation that sums them over a split and across processes (:class:`Metrics`)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.layouts import get_layout
from adapterdoc.train import data as D

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from tokenizers import Tokenizer
    from torch import nn

    from adapterdoc.train.data import Batch

    LossFn = Callable[[nn.Module, Batch, nn.Module | None], "Tally"]
    """A loss: (model, batch, output head) -> :class:`Tally`."""

CAUSAL, MASKED, POOLED = "answer-token", "masked-token", "pooled-class"
"""Objectives: next-token CE on the answer (decoders), CE on masked answer tokens (masked-LM encoders),
CE of a small head on mean-pooled hidden states (embedding models)."""


def objective_for(layout: str) -> str:
    """The loss of a layout's runs; a base outside the registry (``layout`` empty) is a causal LM."""
    if not layout:
        return CAUSAL
    lay = get_layout(layout)
    if not lay.is_encoder:
        return CAUSAL
    return MASKED if lay.model_class.endswith("ForMaskedLM") else POOLED


@contextlib.contextmanager
def supervised_projection(head: nn.Module, select: torch.Tensor) -> Iterator[dict[str, bool]]:
    """While active, ``head`` sees only the hidden states at ``select`` (a bool ``[batch, seq]`` mask), gathered
    into one ``[1, N, hidden]`` row: only the supervised positions become vocabulary logits.

    The yielded dict's ``hit`` tells whether the head was called on a ``[batch, seq, hidden]`` input (otherwise
    the model projected differently and the caller selects from its full logits).
    """
    state = {"hit": False}

    def gather(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...] | None:
        h = args[0]
        if state["hit"] or h.dim() != 3 or tuple(h.shape[:2]) != tuple(select.shape):
            return None
        state["hit"] = True
        return (h[select].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield state
    finally:
        handle.remove()


@dataclass
class Tally:
    """Weighted sums over supervised positions: ``loss_sum`` keeps its graph; ``loss`` is the mean."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    count: torch.Tensor

    @property
    def loss(self) -> torch.Tensor:
        return self.loss_sum / self.count.clamp(min=1e-12)


def _token_tally(picked: torch.Tensor, target: torch.Tensor, w: torch.Tensor) -> Tally:
    """Weighted CE and accuracy of ``[N, vocab]`` logits against ``[N]`` targets."""
    import torch
    import torch.nn.functional as F

    picked = picked.float()
    ce = F.cross_entropy(picked, target, reduction="none") if target.numel() else picked.sum(-1)
    correct = (picked.argmax(-1) == target).float() if target.numel() else torch.zeros(0)
    return Tally((ce * w).sum(), (correct * w).sum().detach(), w.sum().detach())


def _selected_loss(
    model: nn.Module,
    batch: Batch,
    head: nn.Module | None,
    select: torch.Tensor,
    target: torch.Tensor,
    tail_only: bool,
) -> Tally:
    """Run the model; project ``select`` positions (only those, with ``tail_only``) and score them."""
    w = batch["weights"][:, None].expand_as(select)[select]
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if tail_only:
        assert head is not None  # a token objective's model has an output head (models.output_head)
        with supervised_projection(head, select) as state:
            logits = model(input_ids=ids, attention_mask=mask).logits
        picked = logits[0] if state["hit"] else logits[select]
    else:
        picked = model(input_ids=ids, attention_mask=mask).logits[select]
    return _token_tally(picked, target, w)


def answer_token_loss(
    model: nn.Module, batch: Batch, head: nn.Module | None, *, tail_only: bool = True
) -> Tally:
    """Next-token cross-entropy over the supervised (answer) tokens only.

    With ``tail_only`` the hidden states are computed for the whole sequence, the positions that predict a
    supervised token are selected, and only those go through the output head: the prompt never becomes
    vocabulary logits, and the loss is the full projection's.
    """
    import torch

    labels = batch["labels"]
    nxt = labels[:, 1:]
    supervised = nxt != D.IGNORE
    select = torch.zeros_like(labels, dtype=torch.bool)
    select[:, :-1] = supervised
    return _selected_loss(model, batch, head, select, nxt[supervised], tail_only)


def masked_token_loss(
    model: nn.Module, batch: Batch, head: nn.Module | None, *, tail_only: bool = True
) -> Tally:
    """Cross-entropy on the masked answer tokens; the decoder projects only the masked positions."""
    labels = batch["labels"]
    select = labels != D.IGNORE
    return _selected_loss(model, batch, head, select, labels[select], tail_only)


def pooled_loss(
    model: nn.Module, batch: Batch, head: nn.Module | None = None, *, tail_only: bool = True
) -> Tally:
    import torch.nn.functional as F

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    w = batch["weights"]
    ce = F.cross_entropy(logits.float(), batch["targets"], reduction="none")
    correct = (logits.argmax(-1) == batch["targets"]).float()
    return Tally((ce * w).sum(), (correct * w).sum().detach(), w.sum().detach())


LOSSES = {CAUSAL: answer_token_loss, MASKED: masked_token_loss, POOLED: pooled_loss}


def encode_rows(
    objective: str, tok: Tokenizer, rows: list[D.Row], classes: list[str], seed: int
) -> list[D.Example]:
    if objective == CAUSAL:
        return [D.encode_chat(tok, r) for r in rows]
    if objective == MASKED:
        return [D.encode_masked(tok, r, seed) for r in rows]
    return [D.encode_pooled(tok, r, classes) for r in rows]


def batches(examples: list[D.Example], size: int) -> Iterator[Batch]:
    for i in range(0, len(examples), size):
        yield D.collate(examples[i : i + size])


def to_device(batch: Batch, device: torch.device | str) -> Batch:
    return {k: v.to(device) for k, v in batch.items()}


@dataclass(frozen=True)
class Metrics:
    """A token-weighted evaluation over a split, summed across processes."""

    loss: float
    accuracy: float
    count: float
    """Supervised tokens (or rows, for the pooled head) counted."""


def evaluate(
    accelerator: Accelerator,
    model: nn.Module,
    examples: list[D.Example],
    loss_fn: LossFn,
    head: nn.Module | None,
    size: int,
) -> Metrics:
    """Token-weighted loss and accuracy over ``examples`` on this process, summed over all processes."""
    import torch

    was_training = model.training
    model.eval()
    total = torch.zeros(3, dtype=torch.float64)
    device = accelerator.device
    with torch.no_grad():
        for batch in batches(examples, size):
            t = loss_fn(model, to_device(batch, device), head)
            total += torch.stack([t.loss_sum.double(), t.correct.double(), t.count.double()]).cpu()
    total = accelerator.reduce(total.to(device), reduction="sum").cpu()
    model.train(was_training)
    n = float(total[2])
    return Metrics(float(total[0] / n) if n else math.nan, float(total[1] / n) if n else math.nan, n)
