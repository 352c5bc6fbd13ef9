"""The process around a run: torch's thread count, the known library noise silenced, and the accelerator (its
device and its process group)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from adapterdoc.errors import AdapterdocError
from adapterdoc.ml.quiet import quiet_libraries
from adapterdoc.train.settings import TrainSettings


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch intra-op threads, then restore the previous count."""
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def accelerator_for(settings: TrainSettings) -> Any:
    """The run's accelerator; the tiny reference runs pin the CPU (gloo between processes) so that they never
    depend on a GPU being present. FSDP/DeepSpeed come from ``accelerate launch``'s own config."""
    import torch
    from accelerate import Accelerator

    # without an accelerator, cpu=False under torchrun gives N independent single-process runs: pin the CPU
    cpu = settings.cpu or not (torch.cuda.is_available() or torch.backends.mps.is_available())
    acc = Accelerator(cpu=cpu, gradient_accumulation_steps=settings.grad_accum)
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if acc.num_processes != launched:
        raise AdapterdocError(
            "accelerate",
            f"the launcher started {launched} processes but they joined a group of {acc.num_processes}",
        )
    return acc


__all__ = ["accelerator_for", "quiet_libraries", "torch_threads"]
