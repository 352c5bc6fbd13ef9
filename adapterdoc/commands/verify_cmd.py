"""`adapterdoc verify ADAPTER... --base BASE`: the pre-deploy gate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import click

from adapterdoc.commands import options as opt
from adapterdoc.engines import PROFILES as _REGISTRY
from adapterdoc.engines.options import OPTIONS, EngineOption
from adapterdoc.errors import AdapterdocError

F = TypeVar("F", bound=Callable[..., Any])

PROFILES = tuple(_REGISTRY)
"""The profile registry's names (read when the command line starts)."""
SCANS = ("all", "lora-b", "nonzero")


def _profile_help() -> str:
    """``Rules to apply: A, B or C.``, from each registered profile's summary."""
    summaries = [p.summary for p in _REGISTRY.values()]
    listed = ", ".join(summaries[:-1]) + " or " + summaries[-1] if len(summaries) > 1 else summaries[0]
    return f"Rules to apply: {listed}."


def _engine_option(o: EngineOption[Any]) -> Callable[[F], F]:
    """One engine option's click option, from its declaration (:mod:`adapterdoc.engines.options`)."""
    help_text = o.help_text(_REGISTRY.values())
    if o.kind == "rank":
        return click.option(o.flag, type=click.IntRange(min=1), metavar=o.metavar, help=help_text)
    if o.kind == "names":
        return click.option(o.flag, multiple=True, metavar=o.metavar, help=help_text)
    return click.option(o.flag, type=click.Choice(o.choices), metavar=o.metavar, help=help_text)


def engine_options(f: F) -> F:
    """Every engine option the engines declare (:data:`~adapterdoc.engines.options.OPTIONS`), in their order; the
    command receives them by name."""
    for o in reversed(OPTIONS):
        f = _engine_option(o)(f)
    return f


@click.command("verify", epilog=opt.INPUT_FORMS)
@opt.adapter_argument("adapters", many=True)
@opt.base_option(
    "Model directory, config.json, cached repo id, or tiny:LAYOUT. Default: [tool.adapterdoc] base, else "
    "each adapter's own base_model_name_or_path (when it resolves locally)."
)
@click.option("--profile", type=click.Choice(PROFILES), help=_profile_help())
@engine_options
@click.option(
    "--load", is_flag=True, help="Also load base weights + adapter with PEFT and check the outputs change."
)
@click.option(
    "--scan",
    type=click.Choice(SCANS),
    default="all",
    show_default=True,
    help="Weight scan: NaN/Inf in every tensor and zeros in lora_B; lora_B only; or lora_B zeros only.",
)
@click.option(
    "--max-inert-share",
    type=click.FloatRange(0, 1),
    help="Fail when more than this share of LoRA modules is inert (weights audit; e.g. 0.25).",
)
@opt.output_options(output_file=True)
@opt.junit_file_option()
@click.option(
    "--exit-zero", is_flag=True, help="Exit 0 even when findings are errors (unusable inputs still exit 3)."
)
@opt.handle_errors
def command(
    adapters: tuple[str, ...],
    base: str | None,
    profile: str | None,
    load: bool,
    scan: str,
    max_inert_share: float | None,
    output: opt.Output,
    junit_file: str | None,
    exit_zero: bool,
    **engine: object,
) -> None:
    """Check adapters against a base before they are deployed: keys, shapes, weights, serving rules.

    Defaults for --profile, --max-lora-rank, --lora-target-modules, --base and --served-as come from a
    [tool.adapterdoc] table in the nearest pyproject.toml.
    """
    from adapterdoc.verify import verify, verify_own_bases
    from adapterdoc.verify.project import project_base, project_defaults, verify_settings

    defaults = project_defaults()
    base = project_base(base, defaults)
    opt.check_report_files(output, junit_file, [*adapters, base or ""])
    try:
        options = verify_settings(
            defaults,
            profile=profile,
            engine_options=engine,
            load=load,
            scan=scan,
            max_inert_share=max_inert_share,
        )
    except AdapterdocError:
        raise  # a [tool.adapterdoc] value: exit 3, naming the file
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    # without --base, each adapter is checked against the base its adapter_config.json names
    run = verify(list(adapters), base, options) if base else verify_own_bases(list(adapters), options)
    if exit_zero:  # the run's findings stay; only the exit code changes
        run = replace(run, exit_zero=True)
    if junit_file:
        from adapterdoc.report.formats import render

        opt.write_report(junit_file, render(run, "junit"))
    opt.finish(run, output, per_group=True)
