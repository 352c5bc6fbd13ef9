"""The report model every command returns and every emitter consumes: ``ok``, ``findings`` and the JSON envelope.

A command's report is a frozen dataclass that subclasses :class:`FrozenReport` and adds its own fields, built once
at the end of its run from the checks' results; it writes those fields in :meth:`Envelope.body`, never the envelope
itself. The envelope (``ok``, ``findings``, then the body) is built
here once, and so is the envelope of an input that could not be used at all (finding ``AD100``, exit code 3).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from adapterdoc.report.findings import Finding, has_errors

UNUSABLE = "AD100"
"""The code of "this input cannot be used at all" (exit code 3), in every command's JSON."""


def to_json(obj: Mapping[str, object]) -> str:
    """Exactly one JSON object, as the contract asks (here, not in :mod:`~adapterdoc.report.render`: ``--json``
    needs no text renderer)."""
    return json.dumps(obj, indent=2, ensure_ascii=False, default=_default)


def _default(o: object) -> object:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def envelope(
    ok: bool, findings: Sequence[Finding] | Sequence[Mapping[str, object]], body: Mapping[str, object]
) -> dict[str, object]:
    """The one JSON envelope: ``{"ok": ..., "findings": [...], **body}`` (findings as objects or dicts)."""
    rows = [f if isinstance(f, Mapping) else f.to_dict() for f in findings]
    return {"ok": ok, "findings": rows, **body}


def pick(obj: object, names: Iterable[str]) -> dict[str, object]:
    """``{name: obj.name}`` for each of ``names``, in that order: a JSON body whose keys are the fields' names."""
    return {name: getattr(obj, name) for name in names}


def unusable_finding(message: str, *, path: str | None = None, key: str | None = None) -> dict[str, object]:
    """Finding ``AD100`` as a JSON object: the input could not be examined at all."""
    row: dict[str, object] = {"code": UNUSABLE, "severity": "error", "message": message}
    if path:
        row["path"] = path
    if key:
        row["key"] = key
    return row


class Envelope:
    """What every report is, whoever built it: its ``findings``, ``ok`` (no error finding), the exit code and the
    JSON envelope. :class:`FrozenReport` adds the ``findings`` field."""

    findings: Sequence[Finding]

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

    @property
    def exit_code(self) -> int:
        """0 when no finding is an error, else 1 (CLI.md); a report may refine it (verify: 3, unusable input)."""
        return 0 if self.ok else 1

    def body(self) -> dict[str, object]:
        """The command's own fields for the JSON form (everything but ``ok`` and ``findings``)."""
        return {}

    def to_dict(self) -> dict[str, object]:
        return envelope(self.ok, list(self.findings), self.body())


@dataclass(frozen=True, kw_only=True)
class FrozenReport(Envelope):
    """The base of a command's report built once, at the end of the run, from the checks' results (frozen:
    :func:`dataclasses.replace` makes a changed copy). ``findings`` is keyword-only, so a subclass declares its own
    fields first, positional or not."""

    findings: Sequence[Finding] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Unusable(FrozenReport):
    """The report of a run whose input could not be used at all (exit code 3), for the formats that always need a
    document (``junit``, ``sarif``, ``github``): one group holding the error, as ``--json`` holds finding AD100."""

    command: str
    error: str
    path: str | None = None

    @property
    def ok(self) -> bool:
        return False

    @property
    def exit_code(self) -> int:
        return 3

    def to_dict(self) -> dict[str, object]:
        return envelope(False, [unusable_finding(self.error, path=self.path)], {"error": self.error})
