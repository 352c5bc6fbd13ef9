"""`adapterdoc explain [CODE] [--json]`: what a finding means, why it matters, an example, what to do instead."""

from __future__ import annotations

import difflib

import click

from adapterdoc.commands._common import emit, handle_errors


@click.command("explain")
@click.argument("code", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
@handle_errors
def command(code: str | None, as_json: bool) -> None:
    """Explain a finding code (AD301) or name (lora-b-all-zero); without CODE, list every code."""
    from adapterdoc.codes import catalogue

    codes = catalogue()
    if code is None:
        _list(codes, as_json)
        return
    info = lookup(code)
    if info is None:
        names = list(codes) + [c.name for c in codes.values()]
        close = difflib.get_close_matches(code.upper() if code[:2].lower() == "ad" else code, names, n=3)
        more = f"; did you mean {', '.join(close)}?" if close else "; run `adapterdoc explain` for the list"
        raise click.BadParameter(f"unknown finding code {code!r}{more}", param_hint="CODE")
    if as_json:
        from dataclasses import asdict

        from adapterdoc.report.render import to_json

        emit(to_json({"ok": True, "findings": [], "area": area_of(info.code), **asdict(info)}))
        return
    emit(render_code(info))


def lookup(code: str):  # type: ignore[no-untyped-def]
    from adapterdoc.codes import catalogue

    codes = catalogue()
    if code.upper() in codes:
        return codes[code.upper()]
    return next((c for c in codes.values() if c.name == code.lower()), None)


def area_of(code: str) -> str:
    from adapterdoc.codes import AREAS

    digit = int(code[2]) if len(code) > 2 and code[2].isdigit() else 0
    return AREAS[digit - 1] if 1 <= digit <= len(AREAS) else "other"


def render_code(info, width: int | None = None) -> str:  # type: ignore[no-untyped-def]
    """The code's explanation at the output width (wrapped at spaces, names in backticks kept whole)."""
    from adapterdoc.report.render import Writer

    w = Writer(width)
    w.line(f"{info.code} {info.name} ({info.severity}, area {area_of(info.code)}, since {info.since})")
    for title, text in (
        ("What it means", info.summary),
        ("Why it matters", info.why),
        ("Example", info.example),
        ("What to do instead", info.instead),
    ):
        w.blank()
        w.line(title)
        w.para(text, indent=2, hang=2)
    return w.getvalue()


def _list(codes, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    if as_json:
        from adapterdoc.report.render import to_json

        rows = [
            {
                "code": c.code,
                "name": c.name,
                "severity": c.severity,
                "summary": c.summary,
                "area": area_of(c.code),
            }
            for c in codes.values()
        ]
        emit(to_json({"ok": True, "findings": [], "codes": rows}))
        return
    width = max(len(c.name) for c in codes.values())
    emit("\n".join(f"{c.code}  {c.name:<{width}}  {c.severity:<7}  {c.summary}" for c in codes.values()))
