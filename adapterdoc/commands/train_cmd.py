"""`adapterdoc train --base BASE --data FILE.jsonl [--out DIR] [--steps N | --epochs N] [--json] [options]`."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import click

from adapterdoc.commands import options as opt


def _main_process() -> bool:
    """Under ``accelerate launch`` only rank 0 prints (the environment says which rank we are, torch-free)."""
    return os.environ.get("RANK", "0") in ("", "0")


@click.command("train")
@opt.base_option(opt.TRAIN_BASE_HELP, required=True)
@opt.data_option("JSONL rows: messages, prompt + completion, or text.")
@opt.out_option(
    "Run folder: new, empty, or an earlier run of train's [default: ./adapterdoc-train-BASE]. A file, "
    "symlink or read-only folder is refused."
)
@opt.steps_option("Optimizer steps.")
@click.option(
    "--epochs",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Passes over the rows [default: 1].",
)
@opt.batch_size_option(4, "Rows per process and micro-step.")
@click.option(
    "--grad-accum",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Micro-steps per optimizer step.",
)
@click.option(
    "--lr", type=click.FloatRange(min=0), default=2e-4, show_default=True, help="AdamW learning rate."
)
@click.option(
    "--warmup", type=click.IntRange(min=0), default=0, show_default=True, help="Linear warmup steps."
)
@click.option("--r", "rank", type=click.IntRange(min=1), default=8, show_default=True, help="LoRA rank.")
@click.option("--alpha", type=float, default=None, help="lora_alpha [default: 2 r].")
@click.option("--dropout", type=click.FloatRange(0, 1), default=0.0, show_default=True, help="lora_dropout.")
@click.option(
    "--targets",
    default=None,
    help="Comma-separated target_modules [default: the layout's language-model leaves].",
)
@opt.max_length_option()
@opt.dtype_option("The base's dtype.")
@click.option("--gradient-checkpointing", is_flag=True, help="Recompute activations in the backward pass.")
@opt.seed_option()
@click.option(
    "--val-split",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.0,
    show_default=True,
    help="Hold out this fraction.",
)
@click.option(
    "--val-data", type=click.Path(dir_okay=False), default=None, help="Validation rows from a second file."
)
@click.option(
    "--save-steps",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Checkpoint every N steps (0: never).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue from the last complete checkpoint in --out (without one, the run starts again from step 0).",
)
@opt.force_option(
    "Start afresh over an earlier run in --out (its run files are removed first); never another folder."
)
@click.option(
    "--no-canaries",
    is_flag=True,
    help="Write no OUT/canaries.json (for adapterdoc probe; made after the doctor by reloading the base).",
)
@opt.output_options()
@click.pass_context
@opt.handle_errors
def command(
    ctx: click.Context,
    base: str,
    data: str,
    out: str | None,
    steps: int | None,
    epochs: float | None,
    batch_size: int,
    grad_accum: int,
    lr: float,
    warmup: int,
    rank: int,
    alpha: float | None,
    dropout: float,
    targets: str | None,
    max_length: int | None,
    dtype: str,
    gradient_checkpointing: bool,
    seed: int,
    val_split: float,
    val_data: str | None,
    save_steps: int,
    resume: bool,
    force: bool,
    no_canaries: bool,
    output: opt.Output,
) -> None:
    """Train a LoRA adapter on your own model and data, then run the doctor on what was written.

    The layout comes from the base's config; LoRA goes on the language-model leaves (towers excluded, fused MoE
    experts through target_parameters). Rows follow TRL: `messages` (loss on assistant turns), `prompt` +
    `completion` (loss on the completion), `text` (loss on every token). Under `accelerate launch ... -m
    adapterdoc train ...` the run is data-parallel. Writes OUT/adapter, progress.jsonl, training_metadata.json,
    RUN_REPORT.md (with a loss curve when matplotlib is installed), checkpoints/step-N and, for a causal LM,
    canaries.json (what `adapterdoc probe` sends a deployed server; AD629 when none can be made). Exit 1 if the
    doctor finds an error in the output.
    """
    if steps is not None and epochs is not None:
        raise click.BadParameter("give --steps or --epochs, not both", param_hint="--steps/--epochs")
    if resume and force:
        raise click.BadParameter("give --resume or --force, not both", param_hint="--resume/--force")
    if val_split and val_data:
        raise click.BadParameter(
            "give --val-split or --val-data, not both", param_hint="--val-split/--val-data"
        )
    from adapterdoc.ml.meta import require_ml

    require_ml("train")
    from adapterdoc.fit.session import train_on_base
    from adapterdoc.train.settings import TrainSettings

    target_names = tuple(t.strip() for t in targets.split(",") if t.strip()) if targets else None
    settings = TrainSettings(
        steps=steps or 1,
        epochs=epochs if steps is None else None,
        batch_size=batch_size,
        grad_accum=grad_accum,
        lr=lr,
        warmup=warmup,
        r=rank,
        alpha=alpha,
        dropout=dropout,
        targets=target_names,
        max_length=max_length,
        dtype=dtype,
        gradient_checkpointing=gradient_checkpointing,
        seed=seed,
        save_steps=save_steps,
        resume=resume,
        cpu=False,
        threads=None,
    )
    if settings.epochs is None and steps is None:
        settings.epochs = 1.0
    main = _main_process()
    with _Bar(enabled=main and not opt.is_quiet() and sys.stderr.isatty()) as bar:
        report = train_on_base(
            base,
            data,
            out,
            settings,
            val_data=val_data,
            val_split=val_split,
            force=force,
            on_event=bar.on_event,
            canaries=not no_canaries,
        )
    if not main:  # accelerate's other processes: the main one reports
        ctx.exit(0 if report.ok else 1)
    opt.finish(report, output)


class _Bar(opt.LiveBar):
    """A rich progress bar on stderr over the optimizer steps (terminals only)."""

    def __init__(self, *, enabled: bool) -> None:
        columns = ("{task.description}", "bar", "{task.completed}/{task.total} steps", "elapsed", "remaining")
        super().__init__(columns, "loading", live=enabled)

    def on_event(self, event: Mapping[str, object]) -> None:
        if event.get("event") == "setup":
            self.update(total=event.get("steps"), description="training")
        elif event.get("event") == "step":
            self.update(
                completed=event["step"],
                description=f"loss {event['loss']:.4f}  {event['tokens_per_s']:.0f} tok/s",
            )
        elif event.get("event") == "eval":
            self.update(description=f"evaluating ({event.get('when')})")
