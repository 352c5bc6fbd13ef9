"""The generic hook ``inspect`` and ``verify`` use for adapters that are not PEFT folders (MLX, GGUF): which format
an input is (:func:`adapterdoc.formats.detect`), its format module, and its PEFT view.

Every check runs on the PEFT view (:func:`peft_view`: the format's exact ``to_peft`` into a temporary folder), so a
GGUF or MLX adapter gets the same doctor as a PEFT folder. A format module adds, for these commands (each optional):

- ``describe(path) -> dict``: the format's own facts for ``inspect`` (JSON-able; shown under ``format``);
- ``tensors_file(path) -> Path | None``: a safetensors file holding its tensors, which ``inspect`` then describes
  as it describes any safetensors file;
- ``check(path, base: str | None) -> list[Finding]``: the format's own container rules (what its runtime's loader
  refuses) against ``base`` (``None``: the rules that need no base, which ``inspect`` also runs), added to the
  doctor's findings, never in their place;
- ``READ_EXTRA``: ``(extra, packages)`` that its ``to_peft`` imports (GGUF: numpy and gguf-py); without them
  the view is one exit-3 line naming the extra;
- ``base_config_file(base: Path, folder: Path) -> str | None``: for a base only the format reads (a GGUF model
  file), a model folder with the ``config.json`` facts the PEFT view needs, written into ``folder``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from adapterdoc import formats
from adapterdoc.formats import Detection


def foreign(spec: str) -> tuple[Detection, ModuleType] | None:
    """(detection, format module) when ``spec`` is a local adapter of a format other than PEFT, else ``None``."""
    return foreign_of(detect_local(spec))


def detect_local(spec: str) -> Detection | None:
    """The format of a local input (:func:`adapterdoc.formats.detect`); ``None`` for ``hf://`` or a missing path."""
    if spec.startswith("hf://"):
        return None
    path = os.path.expanduser(spec)
    if not os.path.exists(path):
        return None
    return formats.detect(Path(path))


def foreign_of(found: Detection | None) -> tuple[Detection, ModuleType] | None:
    """(``found``, its format module) when ``found`` is a format other than PEFT, else ``None``."""
    if found is None or found.format == "peft":
        return None
    try:
        return found, formats.module(found.format)
    except ImportError:
        return None


def refuse_model_gguf(spec: str) -> None:
    """A GGUF file no format module reads as an adapter is a model: say so (exit 3), not "not safetensors"."""
    from adapterdoc.errors import UnsupportedInputError

    path = os.path.expanduser(spec)
    if not formats.SCREENS["gguf"](Path(path)):  # the GGUF machinery is imported for GGUF files only
        return
    from adapterdoc.formats.gguf import is_model_file

    if is_model_file(path):
        raise UnsupportedInputError(spec, "is a model GGUF (llama.cpp), not an adapter")


def require_read_extra(mod: ModuleType, what: str) -> None:
    """Exit 3 naming the extra when a package the format reads or writes its tensors with (its ``READ_EXTRA``) is
    not installed; ``what`` says what needed it."""
    import importlib.util

    from adapterdoc.errors import MissingExtraError

    extra, packages = getattr(mod, "READ_EXTRA", ("", ()))
    for package in packages:
        if importlib.util.find_spec(package) is None:
            raise MissingExtraError(what, package, extra=extra)


@contextlib.contextmanager
def peft_view(
    path: Path, mod: ModuleType, base: str | None, *, base_file: str | None = None
) -> Iterator[Path]:
    """The adapter at ``path`` (of ``mod``'s format) as a PEFT adapter folder in a temporary folder, removed on exit:
    the format's own exact conversion, with ``base`` (a base the PEFT side resolves) or, without one, the facts of
    ``base_file`` (a base only the format reads). Raises what the conversion raises (exit 3)."""
    from adapterdoc.errors import AdapterdocError
    from adapterdoc.st.paths import inside

    require_read_extra(mod, f"reading {path} as PEFT")
    with tempfile.TemporaryDirectory(prefix="adapterdoc-view-") as tmp:
        view_base = base
        derive = getattr(mod, "base_config_file", None)
        if view_base is None and base_file is not None and derive is not None:
            view_base = derive(Path(os.path.expanduser(base_file)), Path(tmp))
        view = Path(tmp) / "peft"
        try:
            mod.to_peft(Path(path), view, base=view_base, outtype=None)
            yield view
        except AdapterdocError as e:  # an error about the temporary view is an error about the adapter
            if e.what is not None and inside(e.what, tmp):
                e.what = os.fspath(path)
            raise
