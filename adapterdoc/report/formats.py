"""The format registry: every output format is an emitter from a report to text (``text``, ``json``, ``junit``,
``github``, ``sarif``). Emitters return strings and never print; ``commands.options.finish`` decides where the
text goes. Adding a format is one emitter here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adapterdoc.report.base import Envelope

Emitter = Callable[..., str]


def emit_text(report: Envelope, **options: object) -> str:
    """The report kind's registered human renderer (options such as ``width`` or ``verbose`` pass through)."""
    from adapterdoc.report.registry import text_renderer  # each emitter imports its renderer when used

    return text_renderer(report)(report, **options)


def emit_json(report: Envelope, **_: object) -> str:
    """Exactly one JSON object: the report's envelope."""
    from adapterdoc.report.base import to_json

    return to_json(report.to_dict()) + "\n"


def emit_junit(report: Envelope, **_: object) -> str:
    from adapterdoc.report.junit import render_junit

    return render_junit(report)


def emit_github(report: Envelope, **_: object) -> str:
    from adapterdoc.report.github import render_github

    return render_github(report)


def emit_sarif(report: Envelope, **_: object) -> str:
    from adapterdoc.report.sarif import render_sarif

    return render_sarif(report)


EMITTERS: dict[str, Emitter] = {
    "text": emit_text,
    "json": emit_json,
    "junit": emit_junit,
    "github": emit_github,
    "sarif": emit_sarif,
}
FORMATS = tuple(EMITTERS)
"""Every format name, in the order ``--format`` lists them."""
MACHINE = frozenset(FORMATS) - {"text"}
"""The formats for machines: never silenced by ``--quiet``."""


def render(report: Envelope, fmt: str = "text", **options: object) -> str:
    """``report`` in format ``fmt``; text options (``width``, ``verbose``) are ignored by the other formats."""
    try:
        emitter = EMITTERS[fmt]
    except KeyError:
        raise ValueError(f"unknown output format {fmt!r}; known: {', '.join(FORMATS)}") from None
    return emitter(report, **options)
