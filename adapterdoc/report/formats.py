"""The format registry: every output format is an emitter from a report to text (``text``, ``json``, ``junit``,
``github``, ``sarif``). Emitters return strings and never print; ``commands.options.finish`` decides where the
text goes. Adding a format is one emitter here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from adapterdoc.report.github import render_github
from adapterdoc.report.junit import render_junit
from adapterdoc.report.registry import text_renderer
from adapterdoc.report.sarif import render_sarif

if TYPE_CHECKING:
    from adapterdoc.report.base import Envelope

Emitter = Callable[..., str]


def emit_text(report: Envelope, **options: object) -> str:
    """The report kind's registered human renderer (options such as ``width`` or ``verbose`` pass through)."""
    return text_renderer(report)(report, **options)


def emit_json(report: Envelope, **_: object) -> str:
    """Exactly one JSON object: the report's envelope."""
    from adapterdoc.report.render import to_json

    return to_json(report.to_dict()) + "\n"


EMITTERS: dict[str, Emitter] = {
    "text": emit_text,
    "json": emit_json,
    "junit": lambda report, **_: render_junit(report),
    "github": lambda report, **_: render_github(report),
    "sarif": lambda report, **_: render_sarif(report),
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
