"""The per-report-kind registry: each ``*_text`` module registers its report type's text renderer and, where a
report has more structure than one list of findings, its :class:`View` (verify: one group per adapter).

A report's kind is its class name (``InspectReport``, ``VerifyRun``), so registering needs no import of the
report type. The CI formats (junit, github, sarif) read a report through :func:`view_of` only.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adapterdoc.report.findings import Finding, has_errors

if TYPE_CHECKING:
    from adapterdoc.report.base import Envelope, Unusable

TEXT_MODULES = (
    "inspect_text",
    "explain_text",
    "remap_text",
    "verify_text",
    "merge_text",
    "roundtrip_text",
    "train_text",
    "convert_text",
    "probe_text",
)
"""The modules under ``adapterdoc.report`` that register renderers; every one must import (a test checks)."""


@dataclass(frozen=True)
class Group:
    """Findings about one subject (an adapter, an input): a JUnit test case, a block of annotations."""

    name: str
    findings: Sequence[Finding]
    path: str | None = None
    """The file or folder the group is about (annotations attach to its files)."""
    error: str | None = None
    """Why the subject could not be examined at all (an unusable input), instead of findings."""

    @property
    def ok(self) -> bool:
        return self.error is None and not has_errors(list(self.findings))


@dataclass(frozen=True)
class View:
    """What the CI formats need of a report: the command, its groups, and the run's properties."""

    command: str
    groups: list[Group]
    unit: str = "input"
    """What one group is, for summary lines ("1 of 3 adapter(s) passed")."""
    properties: list[tuple[str, object]] = field(default_factory=list)
    """``(name, value)`` pairs describing the run (JUnit properties, SARIF invocation properties)."""
    named_by_input: bool = True
    """Whether each group's name is an input path (an annotation falls back to it when it has no path)."""


Renderer = Callable[..., str]
_TEXT: dict[str, Renderer] = {}
_VIEWS: dict[str, Callable[..., View]] = {}
_loaded = False


def register(kind: str, *, view: Callable[..., View] | None = None) -> Callable[[Renderer], Renderer]:
    """Decorator: ``render`` is the text renderer of reports of class ``kind`` (and ``view`` their view)."""

    def deco(render: Renderer) -> Renderer:
        _TEXT[kind] = render
        if view is not None:
            _VIEWS[kind] = view
        return render

    return deco


def one_group(command: str, subject: str) -> Callable[[Envelope], View]:
    """The view of a report about one input: one group named by the report's field ``subject``, holding all its
    findings (inspect, merge, roundtrip)."""

    def view(report: Envelope) -> View:
        return View(command, [Group(getattr(report, subject), report.findings)])

    return view


def _unusable_view(report: Unusable) -> View:
    name = report.path or report.command
    return View(report.command, [Group(name, [], path=report.path, error=report.error)])


_VIEWS["Unusable"] = _unusable_view
_TEXT["Unusable"] = lambda report, **_: f"adapterdoc: error: {report.error}\n"


def load() -> None:
    """Import every module of :data:`TEXT_MODULES` once (a missing one is an ImportError, never skipped)."""
    global _loaded
    if not _loaded:
        for name in TEXT_MODULES:
            importlib.import_module(f"adapterdoc.report.{name}")
        _loaded = True


def kind_of(report: object) -> str:
    return type(report).__name__


def text_renderer(report: object) -> Renderer:
    load()
    try:
        return _TEXT[kind_of(report)]
    except KeyError:
        raise LookupError(f"no text renderer registered for {kind_of(report)}") from None


def command_of(report: object) -> str:
    """``InspectReport`` → ``inspect``, ``VerifyRun`` → ``verify`` (a report may name itself: ``command``)."""
    named = getattr(report, "command", None)
    if isinstance(named, str) and named:
        return named
    return re.sub(r"(Report|Run)$", "", kind_of(report)).lower() or "adapterdoc"


def view_of(report: Envelope) -> View:
    """The report's registered view, else one group holding all its findings."""
    load()
    make = _VIEWS.get(kind_of(report))
    if make is not None:
        return make(report)
    command = command_of(report)
    return View(command, [Group(command, list(report.findings))], named_by_input=False)
