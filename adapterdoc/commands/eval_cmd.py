"""`adapterdoc eval ADAPTER --base BASE --data FILE.jsonl [--min-improvement X] [--json]`."""

from __future__ import annotations

import click

from adapterdoc.commands import options as opt


@click.command("eval")
@opt.adapter_argument()
@opt.base_option(opt.TRAIN_BASE_HELP, required=True)
@opt.data_option("JSONL rows, as for train.")
@opt.batch_size_option(8)
@opt.max_length_option()
@opt.dtype_option()
@opt.seed_option("Seeds the masked-LM masks (as in train).")
@click.option(
    "--min-improvement",
    type=float,
    default=None,
    help="Exit 1 unless the adapter lowers the loss by at least this much (base loss - adapter loss).",
)
@opt.output_options()
@opt.handle_errors
def command(
    adapter: str,
    base: str,
    data: str,
    batch_size: int,
    max_length: int | None,
    dtype: str,
    seed: int,
    min_improvement: float | None,
    output: opt.Output,
) -> None:
    """Loss and token accuracy of the base and of base + adapter on the same rows.

    The rows are encoded with train's label rules (assistant turns, completions, all tokens), with the tokenizer
    saved beside the adapter if there is one, else the base's. Exit 1 when PEFT reports adapter keys missing on
    this base, or when --min-improvement is not met.
    """
    from adapterdoc.ml.meta import require_ml

    require_ml("eval")
    from adapterdoc.fit.evaluation import eval_on_base

    report = eval_on_base(
        adapter,
        base,
        data,
        batch_size=batch_size,
        max_length=max_length,
        seed=seed,
        dtype=dtype,
        min_improvement=min_improvement,
    )
    opt.finish(report, output)
