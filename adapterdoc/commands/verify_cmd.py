"""`adapterdoc verify ADAPTER... --base BASE`: the pre-deploy gate."""

from __future__ import annotations

import os
from dataclasses import replace

import click

from adapterdoc.commands import options as opt
from adapterdoc.engines import PROFILES as _REGISTRY
from adapterdoc.engines.served import SERVED_AS
from adapterdoc.engines.vllm import VLLM_MAX_LORA_RANKS as RANKS
from adapterdoc.errors import AdapterdocError

PROFILES = tuple(_REGISTRY)
"""The profile registry's names (read when the command line starts)."""
SCANS = ("all", "lora-b", "nonzero")


def _profile_help() -> str:
    """``Rules to apply: A, B or C.``, from each registered profile's summary."""
    summaries = [p.summary for p in _REGISTRY.values()]
    listed = ", ".join(summaries[:-1]) + " or " + summaries[-1] if len(summaries) > 1 else summaries[0]
    return f"Rules to apply: {listed}."


@click.command("verify", epilog=opt.INPUT_FORMS)
@opt.adapter_argument("adapters", many=True)
@opt.base_option(
    "Model directory, config.json, cached repo id, or tiny:LAYOUT. Default: [tool.adapterdoc] base, else "
    "each adapter's own base_model_name_or_path (when it resolves locally)."
)
@click.option("--profile", type=click.Choice(PROFILES), help=_profile_help())
@click.option(
    "--max-lora-rank",
    type=click.IntRange(min=1),
    metavar="N",
    help=f"The server's --max-lora-rank: vLLM one of {', '.join(map(str, RANKS))} (default 16); SGLang any "
    "rank (default: none, no rank check).",
)
@click.option(
    "--lora-target-modules",
    multiple=True,
    metavar="MODULES",
    help="The SGLang server's --lora-target-modules (repeat it or give a comma list; `all`). Default: inferred "
    "from the adapter, as SGLang does for a startup adapter.",
)
@click.option(
    "--served-as", type=click.Choice(SERVED_AS), help="How vLLM serves the base (default: inferred)."
)
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
@click.option(
    "--junit-file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Also write a JUnit XML report to FILE, whatever --format prints (e.g. --format github annotations on "
    "stdout and a JUnit file for the test dashboard, in one run).",
)
@click.option(
    "--exit-zero", is_flag=True, help="Exit 0 even when findings are errors (unusable inputs still exit 3)."
)
@opt.handle_errors
def command(
    adapters: tuple[str, ...],
    base: str | None,
    profile: str | None,
    max_lora_rank: int | None,
    lora_target_modules: tuple[str, ...],
    served_as: str | None,
    load: bool,
    scan: str,
    max_inert_share: float | None,
    output: opt.Output,
    junit_file: str | None,
    exit_zero: bool,
) -> None:
    """Check adapters against a base before they are deployed: keys, shapes, weights, serving rules.

    Defaults for --profile, --max-lora-rank, --lora-target-modules, --base and --served-as come from a
    [tool.adapterdoc] table in the nearest pyproject.toml.
    """
    from adapterdoc.verify import verify, verify_own_bases
    from adapterdoc.verify.project import project_base, project_defaults, verify_settings

    defaults = project_defaults()
    base = project_base(base, defaults)
    for option, path in (("--output-file", output.file), ("--junit-file", junit_file)):
        if path:
            opt.check_output_file(path, [*adapters, base or ""], option)
    if output.file and junit_file and os.path.realpath(output.file) == os.path.realpath(junit_file):
        raise click.BadParameter(
            "--junit-file and --output-file name the same file", param_hint="--junit-file"
        )
    try:
        options = verify_settings(
            defaults,
            profile=profile,
            max_lora_rank=max_lora_rank,
            lora_target_modules=lora_target_modules,
            served_as=served_as,
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
