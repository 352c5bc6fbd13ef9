"""`adapterdoc explain [CODE] [--json]`: what a finding means, why it matters, an example, what to do instead."""

from __future__ import annotations

import difflib

import click

from adapterdoc.codes import area_of
from adapterdoc.commands import options as opt

__all__ = ["area_of", "command", "lookup", "render_code"]


@click.command("explain")
@click.argument("code", required=False)
@opt.output_options(("text", "json"))
@opt.handle_errors
def command(code: str | None, output: opt.Output) -> None:
    """Explain a finding code (AD301) or name (lora-b-all-zero); without CODE, list every code."""
    from adapterdoc.codes import catalogue
    from adapterdoc.report.explain_report import ExplainReport

    codes = catalogue()
    if code is None:
        opt.finish(ExplainReport(list(codes.values()), listing=True), output, quiet=False)
    info = lookup(code)
    if info is None:
        names = list(codes) + [c.name for c in codes.values()]
        close = difflib.get_close_matches(code.upper() if code[:2].lower() == "ad" else code, names, n=3)
        more = f"; did you mean {', '.join(close)}?" if close else "; run `adapterdoc explain` for the list"
        raise click.BadParameter(f"unknown finding code {code!r}{more}", param_hint="CODE")
    opt.finish(ExplainReport([info]), output, quiet=False)


def lookup(code: str):  # type: ignore[no-untyped-def]
    from adapterdoc.codes import catalogue

    codes = catalogue()
    if code.upper() in codes:
        return codes[code.upper()]
    return next((c for c in codes.values() if c.name == code.lower()), None)


def render_code(info, width: int | None = None) -> str:  # type: ignore[no-untyped-def]
    """The code's explanation at the output width (:func:`adapterdoc.report.explain_text.render_code`)."""
    from adapterdoc.report.explain_text import render_code as render

    return render(info, width)
