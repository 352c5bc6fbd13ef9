"""``verify`` of an adapter in another runtime's format (MLX, GGUF; :mod:`adapterdoc.formats.hooks`): the format
module's own ``check`` against the base when it has one, else the adapter converted to PEFT in a temporary folder
and verified as PEFT."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from adapterdoc.report.findings import sort_findings
from adapterdoc.report.verify_report import VerifyReport

if TYPE_CHECKING:
    from adapterdoc.formats import Detection
    from adapterdoc.verify.base import Base
    from adapterdoc.verify.options import VerifyOptions

VerifyOne = Callable[[str, "Base", "VerifyOptions"], VerifyReport]
""":func:`adapterdoc.verify.run.verify_one`."""


def verify_foreign(
    spec: str,
    found: Detection,
    mod: ModuleType,
    base: Base | str,
    options: VerifyOptions,
    verify_one: VerifyOne,
) -> VerifyReport:
    """The verdict on ``spec`` (detected as ``found.format``) against ``base``: a resolved
    :class:`~adapterdoc.verify.base.Base`, or the ``--base`` text when only the format's module reads it.
    ``verify_one`` (:func:`adapterdoc.verify.run.verify_one`, passed in to keep the import one way) verifies the PEFT conversion of a format
    without ``check``."""
    base_spec = base if isinstance(base, str) else base.spec.spec
    path = Path(os.path.expanduser(spec))
    fmt = {"format": found.format, "format_evidence": list(found.evidence)}
    check = getattr(mod, "check", None)
    if check is not None:
        return VerifyReport(
            adapter=spec,
            path=os.fspath(path),
            layout=found.format,
            config=fmt,
            findings=sort_findings(list(check(path, base_spec))),
        )
    if isinstance(base, str):
        from adapterdoc.verify.base import Base

        base = Base.resolve(base)
    with tempfile.TemporaryDirectory(prefix="adapterdoc-verify-") as tmp:
        peft = Path(tmp) / "peft"
        mod.to_peft(path, peft, base=base_spec, outtype=None)
        report = verify_one(os.fspath(peft), base, options)
    return dataclasses.replace(report, adapter=spec, path=os.fspath(path), config={**report.config, **fmt})
