"""``verify`` of an adapter in another runtime's format (MLX, GGUF; :mod:`adapterdoc.formats.foreign`): one doctor.

The adapter is read into the PEFT view (the format's own exact ``to_peft``, into a temporary folder) and that view
goes through every check a PEFT adapter gets: against a resolved base, the whole of :func:`~adapterdoc.verify.run.
verify_one` (keys and shapes against the base, config, ``lora_B``, NaN/Inf, the inert share, the profile, ``--load``);
against a base only the format reads (a GGUF model file), the checks that need no base model
(:func:`~adapterdoc.verify.run.verify_static`). The format's container rules (``check``: GGUF as llama.cpp's
``gguf_init`` and ``llama_adapter_lora_init`` read it, MLX as mlx-lm's ``load_adapters`` does) are added to those
findings; they never replace them. An adapter the container rules already refuse and that cannot be read into the
view is reported with the container's findings alone (it fails); one that passes them and still cannot be read is
unusable (exit 3, the reason named)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from adapterdoc.errors import AdapterdocError, MissingExtraError
from adapterdoc.report.findings import Finding, has_errors, sort_findings
from adapterdoc.report.verify_report import VerifyReport
from adapterdoc.verify.common import dedupe

if TYPE_CHECKING:
    from adapterdoc.formats import Detection
    from adapterdoc.verify.base import Base
    from adapterdoc.verify.options import VerifyOptions

VerifyOne = Callable[[str, "Base", "VerifyOptions"], VerifyReport]
""":func:`adapterdoc.verify.run.verify_one`."""
VerifyStatic = Callable[[str, "VerifyOptions"], VerifyReport]
""":func:`adapterdoc.verify.run.verify_static`."""

VIEW = "PEFT_DIR"
"""What the temporary view's path becomes in messages and hints (the user converts to it first)."""


def verify_foreign(
    spec: str,
    found: Detection,
    mod: ModuleType,
    base: Base | str,
    options: VerifyOptions,
    verify_one: VerifyOne,
    verify_static: VerifyStatic,
) -> VerifyReport:
    """The verdict on ``spec`` (detected as ``found.format``) against ``base``: a resolved
    :class:`~adapterdoc.verify.base.Base`, or the ``--base`` text of a base only the format's module reads.
    ``verify_one`` and ``verify_static`` are passed in to keep the import one way."""
    from adapterdoc.formats.foreign import peft_view

    path = Path(os.path.expanduser(spec))
    base_spec = base if isinstance(base, str) else base.spec.spec
    rules = [_at(f, spec) for f in mod.check(path, base_spec)]
    fmt = {"format": found.format, "format_evidence": list(found.evidence)}
    try:
        with peft_view(path, mod, None if isinstance(base, str) else base_spec, base_file=base_spec) as view:
            if isinstance(base, str):
                report = verify_static(os.fspath(view), options)
            else:
                report = verify_one(os.fspath(view), base, options)
            report = _relocated(report, os.fspath(view), spec, found.format)
    except MissingExtraError:
        raise
    except AdapterdocError as e:
        refused = container_verdict(spec, found, rules, e)
        return refused or VerifyReport(adapter=spec, path=os.fspath(path), error=str(e), config=fmt)
    return dataclasses.replace(
        report,
        adapter=spec,
        path=os.fspath(path),
        config={**report.config, **fmt},
        findings=sort_findings(dedupe([*rules, *report.findings])),
    )


def container_verdict(
    spec: str, found: Detection, rules: list[Finding], error: AdapterdocError
) -> VerifyReport | None:
    """The report on ``spec`` when its PEFT view could not be read (``error``) and its format's container rules
    (``rules``) already fail it: those findings (exit 1, as ``inspect`` says); ``None`` when they do not (the
    adapter is then unusable: exit 3 with ``error``'s reason)."""
    if not has_errors(rules):
        return None
    return VerifyReport(
        adapter=spec,
        path=os.fspath(Path(os.path.expanduser(spec))),
        layout=found.format,
        expected_keys_from="none",
        config={
            "format": found.format,
            "format_evidence": list(found.evidence),
            "peft_view": f"not read: {error.reason}",
        },
        findings=sort_findings([_at(f, spec) for f in rules]),
    )


def _at(f: Finding, spec: str) -> Finding:
    return dataclasses.replace(f, path=spec)


def _relocated(report: VerifyReport, view: str, spec: str, fmt: str) -> VerifyReport:
    """``report`` on the temporary view, said of ``spec``: the view's path in a message or hint becomes
    :data:`VIEW`, and a hint that names it says how to make it; a config field's line (of the view's
    ``adapter_config.json``) is dropped."""
    first = (
        f"in PEFT form (`adapterdoc convert {spec} --to peft --out {VIEW}`, then back with `--to {fmt}`): "
    )

    def text(s: str | None) -> str | None:
        return None if s is None else s.replace(view, VIEW)

    def finding(f: Finding) -> Finding:
        hint = text(f.hint)
        if hint is not None and VIEW in hint:
            hint = first + hint
        return dataclasses.replace(f, message=text(f.message) or "", hint=hint, path=spec, line=None)

    move = None
    if report.move is not None:
        move = {**report.move}
        if isinstance(move.get("command"), str):
            move["command"] = first + (text(move["command"]) or "")
    return dataclasses.replace(
        report, findings=[finding(f) for f in report.findings], move=move, error=text(report.error)
    )
