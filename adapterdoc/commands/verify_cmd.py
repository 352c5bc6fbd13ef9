"""`adapterdoc verify ADAPTER... --base BASE`: the pre-deploy gate."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import click

from adapterdoc.commands._common import (
    INPUT_FORMS,
    Output,
    check_output_file,
    finish,
    handle_errors,
    output_options,
    write_report,
)
from adapterdoc.engines import PROFILES as _REGISTRY
from adapterdoc.engines.served import SERVED_AS
from adapterdoc.engines.sglang import split_targets
from adapterdoc.engines.vllm import VLLM_MAX_LORA_RANKS as RANKS

PROFILES = tuple(_REGISTRY)
"""The profile registry's names (read when the command line starts)."""
SCANS = ("all", "lora-b", "nonzero")
TABLE_KEYS = {
    "profile": "profile",
    "max-lora-rank": "max_lora_rank",
    "lora-target-modules": "lora_target_modules",
    "base": "base",
    "served-as": "served_as",
    "max-inert-share": "max_inert_share",
}
"""``[tool.adapterdoc]`` keys (underscores accepted too) → option names."""


def _profile_help() -> str:
    """``Rules to apply: A, B or C.``, from each registered profile's summary."""
    summaries = [p.summary for p in _REGISTRY.values()]
    listed = ", ".join(summaries[:-1]) + " or " + summaries[-1] if len(summaries) > 1 else summaries[0]
    return f"Rules to apply: {listed}."


@click.command("verify", epilog=INPUT_FORMS)
@click.argument("adapters", nargs=-1, required=True)
@click.option(
    "--base",
    help="Model directory, config.json, cached repo id, or tiny:LAYOUT. Default: [tool.adapterdoc] base, else "
    "each adapter's own base_model_name_or_path (when it resolves locally).",
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
@output_options(output_file=True)
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
@click.pass_context
@handle_errors
def command(
    ctx: click.Context,
    adapters: tuple[str, ...],
    base: str | None,
    profile: str | None,
    max_lora_rank: int | None,
    lora_target_modules: tuple[str, ...],
    served_as: str | None,
    load: bool,
    scan: str,
    max_inert_share: float | None,
    output: Output,
    junit_file: str | None,
    exit_zero: bool,
) -> None:
    """Check adapters against a base before they are deployed: keys, shapes, weights, serving rules.

    Defaults for --profile, --max-lora-rank, --lora-target-modules, --base and --served-as come from a
    [tool.adapterdoc] table in the nearest pyproject.toml.
    """
    defaults = project_defaults()
    base = base or defaults.get("base")
    from adapterdoc.verify import VerifyOptions, verify, verify_own_bases

    for option, path in (("--output-file", output.file), ("--junit-file", junit_file)):
        if path:
            check_output_file(path, [*adapters, base or ""], option)
    if output.file and junit_file and os.path.realpath(output.file) == os.path.realpath(junit_file):
        raise click.BadParameter(
            "--junit-file and --output-file name the same file", param_hint="--junit-file"
        )

    targets = split_targets(list(lora_target_modules)) if lora_target_modules else None
    from_table = [
        name
        for name, flag in (("max_lora_rank", max_lora_rank), ("lora_target_modules", targets))
        if flag is None and name in defaults
    ]
    try:
        options = VerifyOptions(
            profile=profile or defaults.get("profile", "peft"),
            max_lora_rank=max_lora_rank or defaults.get("max_lora_rank"),
            lora_target_modules=targets or defaults.get("lora_target_modules"),
            served_as=served_as or defaults.get("served_as"),
            load=load,
            scan=scan,
            max_inert_share=max_inert_share
            if max_inert_share is not None
            else defaults.get("max_inert_share"),
        )
    except ValueError as e:
        bad = next((n for n in from_table if str(e).startswith(n)), None)
        if bad:  # a [tool.adapterdoc] value the running profile cannot use: an input error, as for the others
            from adapterdoc.errors import ConfigError

            raise ConfigError(
                find_pyproject() or "pyproject.toml",
                f"[tool.adapterdoc] {str(e).replace(bad, bad.replace('_', '-'), 1)}",
            ) from None
        raise click.BadParameter(str(e)) from None
    # without --base, each adapter is checked against the base its adapter_config.json names
    run = verify(list(adapters), base, options) if base else verify_own_bases(list(adapters), options)
    run = dataclasses.replace(run, exit_zero=exit_zero)  # the run is not changed once made
    if junit_file:
        from adapterdoc.report.formats import render

        write_report(junit_file, render(run, "junit"))
    finish(run, output, per_group=True)


def _unknown_table_key(key: str) -> str:
    import difflib

    known = sorted(TABLE_KEYS)
    close = difflib.get_close_matches(key.replace("_", "-"), known, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]}? " if close else ""
    return f"unknown key `{key}` in [tool.adapterdoc]; {guess}known keys: {', '.join(known)}"


def find_pyproject(start: str | None = None) -> str | None:
    """The nearest ``pyproject.toml`` at or above ``start`` (the working directory)."""
    here = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def project_defaults(start: str | None = None) -> dict[str, Any]:
    """``[tool.adapterdoc]`` of the nearest pyproject.toml, as option names; a relative ``base`` path is taken
    relative to that file. An unknown key is an error (exit 3) naming the key and the known ones: a typo such as
    ``profle`` must not silently run the default profile."""
    path = find_pyproject(start)
    if path is None:
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        try:
            import tomli as tomllib
        except ImportError:
            return {}
    from adapterdoc.errors import ConfigError

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:  # TOML is UTF-8 only
        raise ConfigError(path, f"cannot read [tool.adapterdoc]: {e}") from None
    tool = data.get("tool", {})
    table = tool.get("adapterdoc", {}) if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        raise ConfigError(path, "[tool.adapterdoc] must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = TABLE_KEYS.get(key.replace("_", "-"))
        if name is None:
            raise ConfigError(path, _unknown_table_key(key))
        out[name] = value
    if "profile" in out and out["profile"] not in PROFILES:
        raise ConfigError(path, f"[tool.adapterdoc] profile must be one of {', '.join(PROFILES)}")
    if "served_as" in out and out["served_as"] not in SERVED_AS:
        raise ConfigError(path, "[tool.adapterdoc] served-as must be text or vl")
    rank = out.get("max_lora_rank")
    if "max_lora_rank" in out and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        raise ConfigError(path, "[tool.adapterdoc] max-lora-rank must be a positive integer")
    if "lora_target_modules" in out:
        mods = out["lora_target_modules"]
        if isinstance(mods, str) or (isinstance(mods, list) and all(isinstance(m, str) for m in mods)):
            out["lora_target_modules"] = split_targets(mods)
        else:
            raise ConfigError(
                path, "[tool.adapterdoc] lora-target-modules must be a list of names or a string"
            )
    share = out.get("max_inert_share")
    if "max_inert_share" in out and (
        isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1
    ):
        raise ConfigError(path, "[tool.adapterdoc] max-inert-share must be a number from 0 to 1")
    if "base" in out:
        base = out["base"]
        if not isinstance(base, str) or not base:
            raise ConfigError(path, "[tool.adapterdoc] base must be a string")
        rel = os.path.join(os.path.dirname(path), base)
        if not base.startswith("tiny:") and not os.path.isabs(base) and os.path.exists(rel):
            out["base"] = rel
    return out
