"""`adapterdoc eval ADAPTER --base BASE --data FILE.jsonl [--min-improvement X] [--json]`."""

from __future__ import annotations

from typing import Any

import click

from adapterdoc.commands._common import emit, handle_errors, is_quiet
from adapterdoc.commands._train_options import base_and_data, length_and_dtype


@click.command("eval")
@click.argument("adapter", type=click.Path())
@base_and_data("JSONL rows, as for train.")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@length_and_dtype()
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seeds the masked-LM masks (as in train)."
)
@click.option(
    "--min-improvement",
    type=float,
    default=None,
    help="Exit 1 unless the adapter lowers the loss by at least this much (base loss - adapter loss).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@click.pass_context
@handle_errors
def command(ctx: click.Context, adapter: str, base: str, data: str, as_json: bool, **o: Any) -> None:
    """Loss and token accuracy of the base and of base + adapter on the same rows.

    The rows are encoded with train's label rules (assistant turns, completions, all tokens), with the tokenizer
    saved beside the adapter if there is one, else the base's. Exit 1 when PEFT reports adapter keys missing on
    this base, or when --min-improvement is not met.
    """
    from adapterdoc.ml.meta import require_ml

    require_ml("eval")
    from adapterdoc.train.evaluation import eval_on_base

    report = eval_on_base(
        adapter,
        base,
        data,
        batch_size=o["batch_size"],
        max_length=o["max_length"],
        seed=o["seed"],
        dtype=o["dtype"],
        min_improvement=o["min_improvement"],
    )
    if as_json:
        from adapterdoc.report import render

        emit(render.to_json(report.to_dict()))
    elif not is_quiet():
        from adapterdoc.report.train_text import render_eval

        emit(render_eval(report))
    ctx.exit(0 if report.ok else 1)
