"""Adapter formats: one module per format (``peft``, ``mlx``, ``gguf``), each torch-free at import.

The contract every format module keeps (``convert`` and ``inspect`` go through it):

- ``NAME``: the format's name as ``convert --to`` spells it.
- ``detect(path: Path) -> Detection | None``: whether ``path`` is an adapter of this format, with the evidence (file
  names, config fields, GGUF keys) that decided it; header-only, never raises on a foreign input (``None``).
- ``to_peft(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted``: write the PEFT adapter
  folder ``out`` (``adapter_config.json`` + ``adapter_model.safetensors``) holding exactly ``src``'s adapter.
- ``from_peft(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted``: the reverse, from a PEFT
  adapter folder.

Conversions go through PEFT (hub and spoke): MLX → GGUF is MLX → PEFT (a temporary folder) → GGUF. What the target
cannot hold is an :class:`~adapterdoc.errors.AdapterdocError` (exit 3) raised before anything is written; every write
is atomic (``adapterdoc.st.atomic``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from adapterdoc import opened

if TYPE_CHECKING:
    from adapterdoc.st.header import Header

FORMATS = ("peft", "mlx", "gguf")
"""The only list of format names; ``adapterdoc.formats.<name>`` is each one's module."""


@dataclass(frozen=True)
class Detection:
    """A format recognised, and why."""

    format: str
    evidence: tuple[str, ...]
    header: Header | None = field(default=None, compare=False, repr=False)
    """The safetensors header detection read, when the input is one safetensors file: opening the input as a
    checkpoint takes it (``open_checkpoint(..., header=)``) instead of reading it again."""


@dataclass(frozen=True)
class Converted:
    """What one conversion wrote."""

    source_format: str
    target_format: str
    out: Path
    tensors: int
    """Tensors written."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Exact-but-worth-saying facts (zero-padded ranks, folded scalings, the dtype chosen)."""


def module(name: str) -> ModuleType:
    """The format module of ``name`` (one of :data:`FORMATS`)."""
    if name not in FORMATS:
        raise KeyError(f"unknown adapter format {name!r}")
    return importlib.import_module(f"adapterdoc.formats.{name}")


GGUF_MAGIC = opened.GGUF_MAGIC
"""The first four bytes of a GGUF file (:data:`adapterdoc.formats.gguf.header.MAGIC`; a test keeps them equal)."""


def _folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # a name too long, a folder we may not look into: no adapter of any format
        return False


def _gguf_magic(path: Path) -> bool:
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except (OSError, ValueError):
        return False


SCREENS: dict[str, Callable[[Path], bool]] = {"mlx": _folder, "gguf": _gguf_magic}
"""For a format, a test every input its ``detect`` recognises passes (an mlx-lm adapter is a folder; a GGUF file
starts with the magic), made without importing its module and never raising (``detect`` never does): :func:`detect`
asks a format module only about inputs that pass its screen, so a ``.safetensors`` file imports neither MLX's nor
GGUF's machinery (``tests/formats`` checks the screens against each module's ``detect``). A format without a
screen is always asked."""


def detect(path: Path) -> Detection | None:
    """The first format that recognises ``path``; non-PEFT formats are asked first (a PEFT folder is the fallback)."""
    for name in (*(f for f in FORMATS if f != "peft"), "peft"):
        screen = SCREENS.get(name)
        if screen is not None and not screen(Path(path)):
            continue
        try:
            mod = module(name)
        except ImportError:  # a format whose module is not written yet
            continue
        found: Detection | None = mod.detect(Path(path))
        if found is not None:
            return found
    return None
