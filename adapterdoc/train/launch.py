"""The training loop (accelerate): answer-token cross-entropy with a tail-only output projection, AdamW, gradient
accumulation and clipping, sharded data and gathered evaluation, and the run's records.

One process (``train(...)`` from Python or the CLI) or several: ``accelerate launch --multi_gpu --num_processes 2
--num_machines 1 --mixed_precision no -m adapterdoc.train.loop --layout NAME --out DIR --processes 2`` runs two CPU
processes (torchrun; the loop pins the CPU and gloo itself, no GPU is needed). ``accelerate launch --cpu
--num_processes 2`` is NOT that: accelerate 1.x's ``--cpu`` takes its simple launcher, which starts one process
unless ``--mpirun_hostfile`` is given (``--processes 2`` makes the loop refuse such a launch instead of training
alone; tests/train/test_train_loop.py pins both). Only the main process writes files.
"""

from __future__ import annotations

import json
import sys

from adapterdoc.errors import AdapterdocError
from adapterdoc.train import data as D
from adapterdoc.train.loop import train
from adapterdoc.train.settings import TrainSettings


def main(argv: list[str] | None = None) -> int:
    """``python -m adapterdoc.train.loop`` (or ``.launch``; under ``accelerate launch`` for several processes)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m adapterdoc.train.loop", description=__doc__)
    p.add_argument("--layout", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=str(D.DEFAULT_DATA))
    d = TrainSettings()
    for name in ("steps", "batch_size", "grad_accum", "seed", "r"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name))
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--full-projection", action="store_true", help="project every position (no tail cut)")
    p.add_argument("--unwrap-forward", action="store_true")
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="fail unless the launcher started exactly this many processes",
    )
    a = p.parse_args(argv)
    if a.processes is not None:
        started = _world_size()
        if started != a.processes:
            print(
                f"adapterdoc: error: {a.processes} processes asked, {started} started: `accelerate launch --cpu` "
                "starts one process unless --mpirun_hostfile is given; on CPU use `accelerate launch --multi_gpu "
                "--num_processes N` (torchrun; the loop itself pins the CPU and gloo)",
                file=sys.stderr,
                flush=True,
            )
            return 3
    settings = TrainSettings(
        steps=a.steps,
        batch_size=a.batch_size,
        grad_accum=a.grad_accum,
        seed=a.seed,
        r=a.r,
        lr=a.lr,
        tail_only=not a.full_projection,
        unwrap_forward=a.unwrap_forward,
    )
    try:
        result = train(a.layout, a.out, settings, data=a.data)
    except AdapterdocError as e:
        print(f"adapterdoc: error: {e}", file=sys.stderr, flush=True)
        return 3
    if _is_main():
        print(
            json.dumps(
                {
                    "layout": result.layout,
                    "num_processes": result.num_processes,
                    "train_before": result.train_before.loss,
                    "train_after": result.train_after.loss,
                    "out": result.out_dir,
                }
            )
        )
    return 0


def _world_size() -> int:
    from accelerate import PartialState

    processes: int = PartialState(cpu=True).num_processes
    return processes


def _is_main() -> bool:
    from accelerate import PartialState

    main: bool = PartialState().is_main_process
    return main


if __name__ == "__main__":
    raise SystemExit(main())
