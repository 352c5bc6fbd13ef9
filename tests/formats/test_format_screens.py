"""The format screens (:data:`adapterdoc.formats.SCREENS`): every input a format module's ``detect`` recognises
passes its screen, so :func:`adapterdoc.formats.detect` answers what asking every module would answer, and a
``.safetensors`` file is detected without importing the MLX or GGUF modules."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapterdoc import formats
from adapterdoc.formats.gguf.header import MAGIC
from tests.formats.test_mlx import dense, peft_folder
from tests.small_adapters import write_small_adapter


def _unscreened(path: Path) -> formats.Detection | None:
    for name in (*(f for f in formats.FORMATS if f != "peft"), "peft"):
        found = formats.module(name).detect(path)
        if found is not None:
            return found
    return None


def _inputs(tmp_path: Path, cli: Any) -> list[Path]:
    peft = peft_folder(tmp_path / "peft", dense())
    assert cli("convert", peft, "--to", "mlx", "--out", tmp_path / "mlx").exit_code == 0
    small = write_small_adapter(tmp_path / "small")
    (tmp_path / "empty").mkdir()
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(MAGIC + b"\x00" * 20)  # the magic, then no readable header
    short = tmp_path / "short"
    short.write_bytes(b"GG")
    out = [
        peft,
        tmp_path / "mlx",
        small,
        small / "adapter_model.safetensors",
        tmp_path / "empty",
        fake,
        short,
    ]
    out += [tmp_path / "missing", tmp_path / "mlx" / "adapters.safetensors", tmp_path]
    out += [tmp_path / ("x" * 300), small / "adapter_model.safetensors" / "below", Path("a\0b")]  # stat fails
    gguf = pytest.importorskip("gguf", reason="llama.cpp's gguf-py writes the GGUF inputs")
    del gguf
    from tests.formats.gguf_helpers import lora_tensors, write_gguf

    out.append(write_gguf(tmp_path / "a.gguf", "llama", lora_tensors()))
    out.append(write_gguf(tmp_path / "model.gguf", "llama", lora_tensors(), adapter=False))
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        out.append(tmp_path / "fifo")
    return out


def test_gguf_magic_is_the_gguf_reader_s() -> None:
    assert formats.GGUF_MAGIC == MAGIC


def test_a_path_that_cannot_be_stat_ed_is_no_adapter(tmp_path: Path) -> None:
    """A name too long for the file system (``stat`` raises ENAMETOOLONG, which ``Path.is_dir`` passes on) is no
    adapter of any format, as each module's ``detect`` says: the screens never raise."""
    long = tmp_path / ("x" * 300)
    for screen in formats.SCREENS.values():
        assert screen(long) is False
    assert formats.detect(long) is None


def test_every_detected_input_passes_its_screen_and_detect_is_unchanged(tmp_path: Path, cli: Any) -> None:
    seen = set()
    for path in _inputs(tmp_path, cli):
        for name, screen in formats.SCREENS.items():
            if formats.module(name).detect(path) is not None:
                assert screen(path), (name, path)
                seen.add(name)
        assert formats.detect(path) == _unscreened(path), path
    assert seen == set(formats.SCREENS)  # each screened format recognised at least one input here


def test_a_safetensors_file_is_detected_without_the_mlx_and_gguf_modules(tmp_path: Path) -> None:
    small = write_small_adapter(tmp_path / "small") / "adapter_model.safetensors"
    code = (
        "import sys; from pathlib import Path; from adapterdoc import formats; "
        f"print(formats.detect(Path({str(small)!r})).format, "
        "sorted(m for m in sys.modules if m.startswith('adapterdoc.formats.')))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "peft ['adapterdoc.formats.peft']"
    importlib.import_module("adapterdoc.formats.mlx")  # the screened modules still import
    importlib.import_module("adapterdoc.formats.gguf")
