"""The generic hook ``inspect`` and ``verify`` use for adapters that are not PEFT folders (MLX, GGUF): which format
an input is (:func:`adapterdoc.formats.detect`) and its format module.

A format module may also provide, for these commands (each optional):

- ``describe(path) -> dict``: the format's own facts for ``inspect`` (JSON-able; shown under ``format``);
- ``tensors_file(path) -> Path | None``: a safetensors file holding its tensors, which ``inspect`` then describes
  as it describes any safetensors file;
- ``check(path, base: str | None) -> list[Finding]``: ``verify``'s findings against ``base`` (``None``: the checks
  that need no base, which ``inspect`` also runs). Without ``check``, ``verify`` converts the adapter to PEFT in a
  temporary folder and verifies that.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from adapterdoc import formats
from adapterdoc.formats import Detection


def foreign(spec: str) -> tuple[Detection, ModuleType] | None:
    """(detection, format module) when ``spec`` is a local adapter of a format other than PEFT, else ``None``."""
    if spec.startswith("hf://"):
        return None
    path = os.path.expanduser(spec)
    if not os.path.exists(path):
        return None
    found = formats.detect(Path(path))
    if found is None or found.format == "peft":
        return None
    try:
        return found, formats.module(found.format)
    except ImportError:
        return None
