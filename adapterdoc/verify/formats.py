"""``verify`` of an adapter in another runtime's format (MLX, GGUF; :mod:`adapterdoc.formats.hooks`): the format
module's own ``check`` against the base when it has one, else the adapter converted to PEFT in a temporary folder
and verified as PEFT."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from adapterdoc.report.findings import sort_findings
from adapterdoc.report.verify_report import VerifyReport


def verify_foreign(
    spec: str, found: Any, mod: Any, base: Any, options: Any, verify_one: Any = None
) -> VerifyReport:
    """The verdict on ``spec`` (detected as ``found.format``) against ``base``: a resolved
    :class:`~adapterdoc.verify.base.Base`, or the ``--base`` text when only the format's module reads it.
    ``verify_one`` (:func:`adapterdoc.verify.run.verify_one`, passed in) verifies the PEFT conversion of a format
    without ``check``."""
    base_spec = base if isinstance(base, str) else base.spec.spec
    path = Path(os.path.expanduser(spec))
    check = getattr(mod, "check", None)
    if check is not None:
        report = VerifyReport(adapter=spec, path=os.fspath(path), layout=found.format)
        report.findings = sort_findings(list(check(path, base_spec)))
    else:
        if isinstance(base, str):
            from adapterdoc.verify.base import Base

            base = Base.resolve(base)
        with tempfile.TemporaryDirectory(prefix="adapterdoc-verify-") as tmp:
            peft = Path(tmp) / "peft"
            mod.to_peft(path, peft, base=base_spec, outtype=None)
            report = verify_one(os.fspath(peft), base, options)
        report.adapter, report.path = spec, os.fspath(path)
    report.config = {**report.config, "format": found.format, "format_evidence": list(found.evidence)}
    return report
