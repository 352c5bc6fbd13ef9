"""The reports of ``inspect X.gguf`` and ``verify X.gguf [--base MODEL.gguf]``, with their text renderers and views.

A minimal stand-in for the generic format hooks of ``inspect`` / ``verify`` (``adapterdoc.formats.detect``): the
commands hand a GGUF path here before their PEFT path; JSON, junit, github and sarif come from the shared registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapterdoc.report.base import Report
from adapterdoc.report.registry import Group, View, register
from adapterdoc.report.render import Writer, write_findings


@dataclass
class GgufInspectReport(Report):
    """``inspect`` of a GGUF file: :func:`adapterdoc.formats.gguf.describe`'s fields."""

    path: str
    info: dict[str, Any]
    command: str = "inspect"

    def body(self) -> dict[str, Any]:
        return {"path": self.path, **{k: v for k, v in self.info.items() if k != "path"}}


@dataclass
class GgufVerifyReport(Report):
    """``verify`` of GGUF LoRA files against one GGUF base (llama.cpp's load checks)."""

    adapters: list[str]
    base: str | None
    per_adapter: dict[str, list[Any]] = field(default_factory=dict)
    command: str = "verify"

    def body(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "runtime": "llama.cpp",
            "adapters": [
                {
                    "path": a,
                    "ok": not any(f.severity == "error" for f in fs),
                    "findings": [f.to_dict() for f in fs],
                }
                for a, fs in self.per_adapter.items()
            ],
        }


def inspect_gguf(path: str) -> GgufInspectReport:
    from adapterdoc.formats.gguf import describe

    return GgufInspectReport(path=path, info=describe(Path(path)))


def verify_gguf_run(adapters: list[str], base: str | None) -> GgufVerifyReport:
    from adapterdoc.formats.gguf_verify import verify_gguf

    report = GgufVerifyReport(adapters=adapters, base=base)
    for a in adapters:
        found = verify_gguf(Path(a), Path(base) if base else None)
        report.per_adapter[a] = found
        report.findings.extend(found)
    return report


def _inspect_view(r: GgufInspectReport) -> View:
    return View("inspect", [Group(r.path, r.findings, path=r.path)])


def _verify_view(r: GgufVerifyReport) -> View:
    return View("verify", [Group(a, fs, path=a) for a, fs in r.per_adapter.items()], unit="adapter")


@register("GgufInspectReport", view=_inspect_view)
def render_inspect(r: GgufInspectReport, *, width: int | None = None) -> str:
    from adapterdoc.formats.gguf import describe_lines

    w = Writer(width)
    w.para((r.path, "bold"), hang=2)
    for line in describe_lines(Path(r.path)):
        w.para(line, indent=2, hang=6)
    return w.getvalue()


@register("GgufVerifyReport", view=_verify_view)
def render_verify(r: GgufVerifyReport, *, width: int | None = None) -> str:
    w = Writer(width)
    for a, fs in r.per_adapter.items():
        ok = not any(f.severity == "error" for f in fs)
        w.para(
            ("✓" if ok else "✗", "green" if ok else "bold red"), (a, "bold"), f"on {r.base or '(no base)'}"
        )
        write_findings(w, fs, context=(a,))
    return w.getvalue()
