"""The light install (``pip install adapterdoc``: no torch, transformers, PEFT or numpy) running a command that needs
an extra: one exit-3 line naming the extra to install (each of these ended in exit 4, ``No module named 'numpy'``,
before), nothing written; and the probe with a canaries file needs no extra at all."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.errors import EXTRA_OF, MissingExtraError, missing_extra

ML = "install the ML extra: pip install torch==2.13.0 'adapterdoc[ml]'"
WEIGHTS = "install the weights extra: pip install 'adapterdoc[weights]'"


def test_each_extra_package_names_its_extra() -> None:
    e = missing_extra(ModuleNotFoundError("No module named 'numpy.linalg'", name="numpy.linalg"), "resize")
    assert (
        isinstance(e, MissingExtraError)
        and str(e) == f"resize: this needs `numpy`, which is not installed; {WEIGHTS}"
    )
    assert missing_extra(ModuleNotFoundError("x", name="somethingelse"), "resize") is None  # a bug: exit 4
    assert set(EXTRA_OF.values()) <= {"ml", "weights", "gguf", "plot"}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("peft")
    from adapterdoc.probe.canaries import Canaries, Canary, Position, save, scale_grid
    from tests.probe import tiny

    tmp = tmp_path_factory.mktemp("light extras")
    base = tiny.base(tmp / "base")
    scales = scale_grid(4)
    canary = Canary("w1 w2 w3", [5, 6, 7], [Position(2, 7, [-1.0 - 0.1 * s for s in scales])])
    save(Canaries("a", "b", 4, "float32", list(scales), [canary]), tmp / "canaries.json")
    return {"base": base, "adapter": tiny.adapter(base, tmp / "peft"), "canaries": tmp / "canaries.json"}


@pytest.mark.ml
@pytest.mark.parametrize(
    ("args", "install"),
    [
        (("resize", "{adapter}", "--rank", "2", "--out", "{out}"), WEIGHTS),
        (("resize", "{adapter}", "--to-lora", "--base", "{base}", "--rank", "2", "--out", "{out}"), WEIGHTS),
        (("combine", "{adapter}", "{adapter}", "--method", "svd", "--rank", "2", "--out", "{out}"), WEIGHTS),
        (("extract", "--base", "{base}", "--tuned", "{base}", "--rank", "2", "--out", "{out}"), ML),
        (("probe", "--make-canaries", "{adapter}", "--base", "{base}", "--out", "{out}"), ML),
        (("probe", "http://127.0.0.1:9", "--adapter", "a", "--local", "{adapter}", "--base", "{base}"), ML),
    ],
)
def test_a_command_that_needs_an_extra_names_it(
    light_venv: Any, files: dict[str, Path], tmp_path: Path, args: tuple[str, ...], install: str
) -> None:
    out = tmp_path / "out"
    argv = [a.format(out=out, **files) for a in args]
    res = subprocess.run(
        [str(light_venv.python), "-m", "adapterdoc", *argv],
        capture_output=True,
        text=True,
        env=light_venv.env,
        cwd=tmp_path,
        timeout=300,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.rstrip().endswith(install), res.stderr
    assert not out.exists()


@pytest.mark.ml
def test_the_probe_with_a_canaries_file_needs_no_extra(light_venv: Any, files: dict[str, Path]) -> None:
    argv = ["probe", "http://127.0.0.1:9", "--adapter", "a", "--canaries", str(files["canaries"])]
    res = subprocess.run(
        [str(light_venv.python), "-m", "adapterdoc", *argv],
        capture_output=True,
        text=True,
        env=light_venv.env,
        timeout=300,
    )
    assert res.returncode == 3 and "cannot connect" in res.stderr and "extra" not in res.stderr, res.stderr
