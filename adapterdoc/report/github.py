"""GitHub Actions workflow commands: one ``::error``/``::warning``/``::notice`` annotation per finding.

An annotation attaches to a file, not a folder: a finding about a tensor or module points at the adapter's weights
file, every other finding at its ``adapter_config.json`` (on the line of the field it names, when the file is there
to read): a finding about a config field carries that field's line from when it was made.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from adapterdoc.codes import catalogue
from adapterdoc.report.registry import view_of

if TYPE_CHECKING:
    from adapterdoc.report.base import Envelope
    from adapterdoc.report.findings import Finding

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")

LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(s: str) -> str:
    """The message part of a workflow command (GitHub's escaping: %, CR, LF)."""
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(s: str) -> str:
    """A property value (``file=``, ``title=``): also ``:`` and ``,``."""
    return escape_data(s).replace(":", "%3A").replace(",", "%2C")


def render_github(report: Envelope) -> str:
    """One annotation per finding of every group of the report's view, then a summary line."""
    view = view_of(report)
    lines: list[str] = []
    for group in view.groups:
        if group.error:
            props = (
                f"file={escape_property(group.name)},title={escape_property('adapterdoc: unusable input')}"
            )
            lines.append(f"::error {props}::{escape_data(group.error)}")
            continue
        for f in group.findings:
            root = group.path or f.path or (group.name if view.named_by_input else None)
            subject = group.name if view.named_by_input else ""
            lines.append(annotation(f, subject, target(f, root) if root else None))
    failed = sum(1 for g in view.groups if not g.ok)
    n = len(view.groups)
    lines.append(f"adapterdoc {view.command}: {n - failed} of {n} {view.unit}(s) passed")
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
    props = [f"file={escape_property(file)}"] if file else []
    if file and line is not None:
        props.append(f"line={line}")
    props.append(f"title={escape_property(title)}")
    return f"::{LEVEL[f.severity]} {','.join(props)}::{escape_data(msg)}"


def target(f: Finding, root: str) -> tuple[str, int | None]:
    """The file (and line) an annotation for ``f`` about the input ``root`` attaches to.

    A key with a dot is a tensor name or module path: the weights file. A bare key is a config field, and no key
    means the adapter as a whole: ``adapter_config.json``, on the field's line when the finding carries it (set
    when it was made: :attr:`Finding.line`).
    """
    if root.endswith((".safetensors", ".bin", ".json")) and not os.path.isdir(root):
        return root, None  # a single-file input: everything is about that file
    present = [w for w in WEIGHTS_FILES if os.path.isfile(os.path.join(root, w))]
    weights = os.path.join(root, (present or WEIGHTS_FILES)[0])
    config = os.path.join(root, CONFIG_FILE)
    if (f.key and "." in f.key) or (present and not os.path.isfile(config)):
        return weights, None
    return config, f.line if f.key else None
