"""The process around a run: torch's thread count, the known library noise silenced, and the accelerator (its
device and its process group, closed when the process ends)."""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from adapterdoc.errors import AdapterdocError
from adapterdoc.ml.quiet import quiet_libraries
from adapterdoc.train.settings import TrainSettings

if TYPE_CHECKING:
    from accelerate import Accelerator


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


def accelerator_for(settings: TrainSettings) -> Accelerator:
    """The run's accelerator; the tiny reference runs pin the CPU (gloo between processes) so that they never
    depend on a GPU being present. FSDP/DeepSpeed come from ``accelerate launch``'s own config."""
    import torch
    from accelerate import Accelerator

    # without an accelerator, cpu=False under torchrun gives N independent single-process runs: pin the CPU
    cpu = settings.cpu or not (torch.cuda.is_available() or torch.backends.mps.is_available())
    acc = Accelerator(cpu=cpu, gradient_accumulation_steps=settings.grad_accum)
    close_process_group_at_exit()
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if acc.num_processes != launched:
        raise AdapterdocError(
            "accelerate",
            f"the launcher started {launched} processes but they joined a group of {acc.num_processes}",
        )
    return acc


_CLOSING: list[bool] = []


def close_process_group_at_exit() -> None:
    """Destroy torch's default process group when the interpreter exits, while it is still fully alive.

    A gloo group keeps three threads per process (two workers and the TCP loop) until
    ``destroy_process_group`` joins them. Left to the interpreter's own teardown, one of them can release the
    last reference to a collective's tensor after finalization began, take the GIL there and die inside C++:
    ``terminate called without an active exception``, SIGABRT, and torchrun's ``ChildFailedError`` at the very
    end of a run that trained and saved (issue 29; more likely the later the thread runs, so under load). An
    ``atexit`` handler runs before that teardown. The group is closed at exit rather than after each run
    because one group serves every run of a launched process: torchrun's rendezvous does not let a
    destroyed default group be created again (a second ``init_process_group`` waits forever). Destroying a
    gloo group is local (no collective), so a rank that leaves first never waits for the others."""
    if not _CLOSING:
        _CLOSING.append(True)
        atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


__all__ = ["accelerator_for", "close_process_group_at_exit", "quiet_libraries", "torch_threads"]
