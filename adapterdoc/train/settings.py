"""The knobs of one training run (:class:`TrainSettings`), what it trains (:class:`Plan`), and the schedule derived
from them (steps from epochs, the learning rate at a step)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapterdoc.train import data as D
from adapterdoc.train import lora as L

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Event = dict[str, Any]
OnEvent = Callable[[Event], None]


@dataclass
class TrainSettings:
    """Knobs of one run. The defaults are the reference smoke settings (seconds on two CPU cores)."""

    steps: int = 24
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 5e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    """Seeds LoRA initialisation, the head and the sample order (identical on every process)."""
    base_seed: int = 0
    """The tiny base's seed: ``verify --base tiny:LAYOUT`` rebuilds the same weights from it."""
    r: int = L.DEFAULT_RANK
    alpha: float | None = None
    """``None``: 2 r."""
    tail_only: bool = True
    """Project only the supervised tail through the output head (the loss is the same as with the full projection)."""
    eval_batch_size: int = 8
    unwrap_forward: bool = False
    """Save a forward-routing wrapper's adapter in the naming of the module that runs it (the layout's
    ``forward_via`` level dropped)."""
    threads: int | None = 1
    """torch intra-op threads while training (``None``: leave as is). Tiny models gain nothing from more, and on a
    busy machine two spinning threads per op were 10-20x slower than one."""
    epochs: float | None = None
    """When set, ``steps`` is derived: epochs x optimizer steps per pass over the training rows."""
    warmup: int = 0
    """Linear warmup over this many optimizer steps, then the constant ``lr``."""
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None
    """LoRA ``target_modules`` instead of the layout's language-model leaves (towers stay excluded)."""
    max_length: int | None = None
    dtype: str = "float32"
    """The base's dtype: ``auto`` (the checkpoint's), ``bfloat16``, ``float16`` or ``float32``."""
    gradient_checkpointing: bool = False
    save_steps: int = 0
    """A checkpoint every this many steps (0: none) in ``OUT/checkpoints/step-N/``."""
    resume: bool = False
    """Continue from the last complete checkpoint in ``OUT``."""
    fresh: bool = False
    """Remove an earlier run's files from ``OUT`` first (the main process, once every process has joined)."""
    cpu: bool = True
    """Train on the CPU even where an accelerator is present (the tiny reference runs)."""


@dataclass
class Plan:
    """What one run trains: built by train-smoke for a tiny base, and by ``adapterdoc train`` for a user's base."""

    layout: str
    objective: str
    base_name: str
    """``base_model_name_or_path`` in the saved adapter config (and the base the doctor verifies against)."""
    build_model: Callable[[], PreTrainedModel]
    """Returns the base model, forward routed (through the layout's ``forward_via``), gradients off."""
    train: list[D.Example]
    val: list[D.Example]
    classes: list[str] = field(default_factory=list)
    data: str | None = None
    vocab_size: int = 0
    extra: dict[str, object] = field(default_factory=dict)
    """More for training_metadata.json (the chat-mask method, the tokenizer, ...)."""
    writes_run_report: bool = True
    """False: the caller writes RUN_REPORT.md once, after its own checks (``adapterdoc train``'s doctor), so the
    loop neither writes it nor runs the weights audit for it."""


def steps_for(s: TrainSettings, rows: int, world: int) -> int:
    """``s.steps``, or with ``s.epochs`` the optimizer steps that pass over ``rows`` that many times."""
    if s.epochs is None:
        return s.steps
    per_step = s.batch_size * s.grad_accum * world
    return max(1, math.ceil(s.epochs * rows / per_step))


def lr_at(s: TrainSettings, step: int) -> float:
    """Linear warmup over ``s.warmup`` steps, then constant."""
    if s.warmup and step <= s.warmup:
        return s.lr * step / (s.warmup + 1)
    return s.lr
