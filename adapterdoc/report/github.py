"""GitHub Actions workflow commands: one ``::error``/``::warning``/``::notice`` annotation per finding.

An annotation attaches to a file, not a folder: a finding about a tensor or module points at the adapter's weights
file, every other finding at its ``adapter_config.json`` (on the line of the field it names, when the file is there
to read).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from adapterdoc.codes import catalogue

if TYPE_CHECKING:
    from adapterdoc.report.findings import Finding
    from adapterdoc.report.verify_report import VerifyReport, VerifyRun

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")

LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(s: str) -> str:
    """The message part of a workflow command (GitHub's escaping: %, CR, LF)."""
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    """A property value (``file=``, ``title=``): also ``:`` and ``,``."""
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def render_github(run: VerifyRun) -> str:
    lines: list[str] = []
    for report in run.adapters:
        if report.error:
            props = f"file={escape_property(report.adapter)},title={escape_property('adapterdoc: unusable input')}"
            lines.append(f"::error {props}::{escape_data(report.error)}")
            continue
        for f in report.findings:
            lines.append(annotation(f, report.adapter, target(f, report)))
    failed = sum(1 for a in run.adapters if not a.ok)
    lines.append(f"adapterdoc verify: {len(run.adapters) - failed} of {len(run.adapters)} adapter(s) passed")
    return "\n".join(lines) + "\n"


def annotation(f: Finding, adapter: str, where: tuple[str, int | None] | None = None) -> str:
    """One workflow command; ``where`` is the (file, line) to attach it to (default: the finding's path)."""
    info = catalogue().get(f.code)
    title = f"{f.code} {info.name}" if info else f.code
    msg = f.message
    if f.key:
        msg += f" (key: {f.key})"
    if f.hint:
        msg += f"\nfix: {f.hint}"
    file, line = where or (f.path or adapter, None)
    props = f"file={escape_property(file)}"
    if line is not None:
        props += f",line={line}"
    props += f",title={escape_property(title)}"
    return f"::{LEVEL[f.severity]} {props}::{escape_data(msg)}"


def target(f: Finding, report: VerifyReport) -> tuple[str, int | None]:
    """The file (and line) an annotation for ``f`` attaches to.

    A key with a dot is a tensor name or module path: the weights file. A bare key is a config field, and no key
    means the adapter as a whole: ``adapter_config.json``, on the field's line when it can be found.
    """
    root = report.path or f.path or report.adapter
    if root.endswith((".safetensors", ".bin", ".json")) and not os.path.isdir(root):
        return root, None  # a single-file input: everything is about that file
    present = [w for w in WEIGHTS_FILES if os.path.isfile(os.path.join(root, w))]
    weights = os.path.join(root, (present or WEIGHTS_FILES)[0])
    config = os.path.join(root, CONFIG_FILE)
    if (f.key and "." in f.key) or (present and not os.path.isfile(config)):
        return weights, None
    return config, _field_line(config, f.key) if f.key else None


def _field_line(config: str, field: str) -> int | None:
    """The 1-based line of ``"field":`` in a JSON file, or None (no file, not found, unreadable)."""
    pattern = re.compile(r'^\s*"' + re.escape(field) + r'"\s*:')
    try:
        with open(config, encoding="utf-8") as fh:
            for n, text in enumerate(fh, 1):
                if pattern.match(text):
                    return n
    except (OSError, UnicodeDecodeError):
        return None
    return None
