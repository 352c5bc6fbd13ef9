"""`adapterdoc remap ADAPTER (--vl | --to LAYOUT | --rule 'REGEX=>REPLACEMENT' ... | --experts per-expert|fused |
--for ENGINE [--base BASE]) [--out DIR] [--dry-run] [--json]`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import click

from adapterdoc.commands import options as opt
from adapterdoc.engines import SERVING
from adapterdoc.layouts import LAYOUTS

_LAYOUT = click.Choice(sorted(LAYOUTS), case_sensitive=True)


def _check_rules(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    from adapterdoc.remap import parse_rule

    for text in value:
        try:
            parse_rule(text)
        except ValueError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return value


@click.command("remap", epilog=opt.INPUT_FORMS)
@opt.adapter_argument()
@click.option(
    "--vl", is_flag=True, help="Strip the first `.language_model.` from every key (VL adapter → text class)."
)
@click.option(
    "--to",
    "to_layout",
    type=_LAYOUT,
    metavar="LAYOUT",
    help=f"Move to this registry layout: {', '.join(sorted(LAYOUTS))}.",
)
@click.option(
    "--from",
    "from_layout",
    type=_LAYOUT,
    metavar="LAYOUT",
    help="The adapter's layout, when detection from its keys is ambiguous (only with --to).",
)
@click.option(
    "--rule",
    "rules",
    multiple=True,
    callback=_check_rules,
    metavar="'REGEX=>REPLACEMENT'",
    help="re.sub on the full key, first match only; repeatable, applied in order.",
)
@click.option(
    "--experts",
    type=click.Choice(["per-expert", "fused"]),
    help="Rewrite a mixture-of-experts adapter into one LoRA per expert and projection, or PEFT's fused form "
    "(target_parameters); exact, a streamed copy.",
)
@click.option(
    "--for",
    "engine",
    type=click.Choice(SERVING),
    help="Make every exact rewrite this serving engine needs (keys, expert layout, rsLoRA folded, uniform ranks, "
    "explicit target_modules); DoRA and modules_to_save it cannot serve are refused.",
)
@opt.base_option(
    "With --for: the base the engine serves (model folder, config.json, cached repo id or tiny:LAYOUT), when "
    "the adapter's keys and base_model_name_or_path do not say it."
)
@opt.out_option(
    "Write a complete new adapter folder here (must not exist or be empty); the input is not touched."
)
@click.option("--dry-run", is_flag=True, help="Print the mapping and the strategy; write nothing.")
@opt.output_options()
@opt.handle_errors
def command(
    adapter: str,
    vl: bool,
    to_layout: str | None,
    from_layout: str | None,
    rules: tuple[str, ...],
    experts: str | None,
    engine: str | None,
    base: str | None,
    out: str | None,
    dry_run: bool,
    output: opt.Output,
) -> None:
    """Rename an adapter's keys to another model layout and keep adapter_config.json consistent.

    \b
    Exactly one of:
      --vl            strip `.language_model.` (Qwen3.5 / Qwen3.5-MoE / Mistral3
                      VL adapter onto the text class)
      --to LAYOUT     the registry's rules from the detected layout (or --from)
                      to LAYOUT
      --rule R=>S     your own renames on the full key, in order
      --experts FORM  a mixture-of-experts adapter into one LoRA per expert
                      (per-expert) or PEFT's fused target_parameters form
      --for ENGINE    every exact rewrite that serving engine needs (the
                      --for choices)

    --vl, --to and --rule are header-only: the tensor data bytes never change. The header is rewritten in place when the new one fits
    (always for --vl), else the file is copied to a temp file beside it and renamed over it. A weights file
    that is a symlink (the Hugging Face cache) is never written through: the link is replaced by a regular
    file and the shared blob stays as it was. A .bin adapter is written as adapter_model.safetensors and the
    .bin is kept as adapter_model.bin.bak. Refusals (collision, a key keeping `.language_model.`, no LoRA keys,
    read-only files) exit 3 and change nothing.
    """
    from adapterdoc.remap import remap

    modes = [
        m
        for m, on in (
            ("--vl", vl),
            ("--to", to_layout is not None),
            ("--rule", bool(rules)),
            ("--experts", experts is not None),
            ("--for", engine is not None),
        )
        if on
    ]
    if len(modes) != 1:
        got = " and ".join(modes) if modes else "none"
        raise click.UsageError(
            "choose exactly one of --vl, --to LAYOUT, --rule 'REGEX=>REPLACEMENT', --experts per-expert|fused, "
            "--for ENGINE "
            f"(got {got})"
        )
    if from_layout is not None and to_layout is None:
        raise click.UsageError("--from LAYOUT only goes with --to LAYOUT")
    if base is not None and engine is None:
        raise click.UsageError("--base BASE only goes with --for ENGINE")
    report = remap(
        adapter,
        vl=vl,
        to=to_layout,
        source=from_layout,
        rules=rules,
        experts=experts,
        engine=engine,
        base=base,
        out=out,
        dry_run=dry_run,
        progress=copy_bar if output.fmt == "text" and not opt.is_quiet() else None,
    )
    opt.finish(report, output)


PROGRESS_MIN_BYTES = 256 * 1024 * 1024
"""Streamed copies of at least this many data bytes show a progress bar (on a terminal)."""


@contextlib.contextmanager
def copy_bar(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr for a large copy on a terminal; a no-op callback otherwise."""
    if total < PROGRESS_MIN_BYTES:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(stderr=True)
    with Progress(
        TextColumn("copying {task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
