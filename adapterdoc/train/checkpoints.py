"""Checkpoints of a run, ``OUT/checkpoints/step-N/``: the trainable tensors, the optimizer and the trainer state,
each file atomic and the state last, so that a folder with its state is complete."""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING, TypedDict

from adapterdoc.errors import AdapterdocError
from adapterdoc.train.records import write_json

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from torch import nn


class CheckpointState(TypedDict):
    """``trainer_state.json``: where a run stood at a checkpoint (written by the loop, read back by ``--resume``)."""

    step: int
    history: list[dict[str, object]]
    train_before: dict[str, float]
    """The first evaluation (:class:`~adapterdoc.train.objectives.Metrics` as a dict)."""
    val_before: dict[str, float] | None
    settings: dict[str, object]
    base: str


CHECKPOINTS = "checkpoints"
_STATE = "trainer_state.json"
MARKER = "progress.jsonl"
"""A folder holding this file was written by a training run."""
FINISHED = "training_metadata.json"
"""Written last by a run that finished."""
CANARIES = "canaries.json"
"""What `adapterdoc train` writes for `adapterdoc probe` after the doctor (:mod:`adapterdoc.fit.canaries`)."""
RUN_FILES = (
    MARKER,
    FINISHED,
    CANARIES,
    "RUN_REPORT.md",
    "loss_curve.png",
    "delta_heatmap.png",
    "adapter",
    "head",
    CHECKPOINTS,
)
"""What a run writes in its folder: all that a fresh start removes (anything else in the folder stays)."""


def clear_run(out: str) -> None:
    """Remove an earlier run's files from ``out`` (only :data:`RUN_FILES` and adapterdoc's temp leftovers)."""
    from adapterdoc.st.paths import TEMP_PREFIX, writing

    if not os.path.isdir(out):
        return
    with writing(out):
        for name in sorted(os.listdir(out)):
            if name in RUN_FILES or name.startswith(TEMP_PREFIX):
                full = os.path.join(out, name)
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)
                else:
                    os.unlink(full)


def last_checkpoint(out: str) -> str | None:
    """The newest complete ``OUT/checkpoints/step-N/`` (its ``trainer_state.json`` is written last)."""
    root = os.path.join(out, CHECKPOINTS)
    try:
        names = os.listdir(root)
    except OSError:
        return None
    done = [
        (int(n[5:]), os.path.join(root, n))
        for n in names
        if n.startswith("step-") and n[5:].isdigit() and os.path.isfile(os.path.join(root, n, _STATE))
    ]
    return max(done)[1] if done else None


def save_checkpoint(
    acc: Accelerator,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    out: str,
    state: CheckpointState,
    *,
    sharded: bool = False,
) -> str:
    """The trainable tensors, the optimizer and the trainer state, each file atomic, the state last (main only).
    ``sharded`` (FSDP): every process gathers the tensors and the optimizer state whole, keyed by name."""
    import io

    import torch
    from safetensors.torch import save as st_save

    from adapterdoc.st.atomic import atomic_write_bytes

    folder = os.path.join(out, CHECKPOINTS, f"step-{state['step']:06d}")
    from adapterdoc.train import sharding as SH

    unwrapped = acc.unwrap_model(model)
    tensors = SH.full_trainable_state(unwrapped)
    opt_state = SH.optimizer_state(unwrapped, optimizer) if sharded else optimizer.state_dict()
    if acc.is_main_process:
        os.makedirs(folder, exist_ok=True)
        atomic_write_bytes(os.path.join(folder, "trainable.safetensors"), st_save(tensors))
        buf = io.BytesIO()
        torch.save({"optimizer": opt_state, "torch_rng": torch.get_rng_state()}, buf)
        atomic_write_bytes(os.path.join(folder, "optimizer.pt"), buf.getvalue())
        write_json(os.path.join(folder, _STATE), state)
    acc.wait_for_everyone()
    return folder


def read_checkpoint_state(folder: str) -> CheckpointState:
    """The trainer state :func:`save_checkpoint` wrote (our own JSON: ``step``, ``history``, the evaluations)."""
    with open(os.path.join(folder, _STATE), encoding="utf-8") as f:
        state: CheckpointState = json.load(f)
    return state


def load_checkpoint(
    folder: str, model: nn.Module, optimizer: torch.optim.Optimizer, *, sharded: bool = False
) -> None:
    """The checkpoint's trainable tensors and optimizer state into ``model`` (unwrapped) and ``optimizer``."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, "trainable.safetensors"))
    own = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(own) != set(tensors):
        raise AdapterdocError(
            folder, "the checkpoint's trainable tensors do not match this run's LoRA settings"
        )
    blob = torch.load(os.path.join(folder, "optimizer.pt"), weights_only=True)
    if sharded:
        from adapterdoc.train import sharding as SH

        SH.load_state(model, optimizer, tensors, blob["optimizer"])
    else:
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(tensors[n])
        optimizer.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["torch_rng"])
