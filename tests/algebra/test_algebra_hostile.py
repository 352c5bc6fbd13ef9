"""combine / resize as a stranger runs them on bad inputs: a factor with NaN or Inf, an output that is one of the
inputs (with --force), a corrupt or truncated weights file: one exit-3 line each, nothing written, the inputs
unchanged (each non-finite case ended in exit 4, `LinAlgError: Eigenvalues did not converge`, or wrote an adapter
holding the NaN)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.peft_helpers import LAYOUT, make_adapter

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from safetensors.numpy import load_file, save_file

    from adapterdoc.ml.tiny import build_tiny

    tmp = tmp_path_factory.mktemp("hostile algebra")
    good = make_adapter(build_tiny(LAYOUT), tmp / "good", 0)
    made = {"good": good}
    tensors = load_file(good / WEIGHTS)
    a_name = next(k for k in tensors if "lora_A" in k)
    for name, value in (("nan", np.nan), ("inf", np.inf)):
        bad = {k: v.copy() for k, v in tensors.items()}
        bad[a_name][0, 0] = value
        shutil.copytree(good, tmp / name)
        save_file(bad, str(tmp / name / WEIGHTS))
        made[name] = tmp / name
    shutil.copytree(good, tmp / "truncated")
    data = (good / WEIGHTS).read_bytes()
    (tmp / "truncated" / WEIGHTS).write_bytes(data[: len(data) // 2])
    made["truncated"] = tmp / "truncated"
    return made


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize(
    "args",
    [
        ("resize", "{bad}", "--rank", "2"),
        ("resize", "{bad}", "--energy", "0.9"),
        ("combine", "{good}", "{bad}", "--method", "cat"),
        ("combine", "{good}", "{bad}", "--method", "svd", "--rank", "2"),
        ("combine", "{good}", "{bad}", "--method", "ties", "--density", "0.5", "--rank", "2"),
    ],
)
def test_a_non_finite_factor_is_one_line(
    cli: Any, adapters: dict[str, Path], tmp_path: Path, bad: str, args: tuple[str, ...]
) -> None:
    out = tmp_path / "out"
    r = cli(*[a.format(bad=adapters[bad], good=adapters["good"]) for a in args], "--out", out)
    assert r.exit_code == 3, r.output
    assert "holds NaN or infinite values" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()


def test_a_truncated_weights_file_is_one_line(cli: Any, adapters: dict[str, Path], tmp_path: Path) -> None:
    r = cli("resize", adapters["truncated"], "--rank", "2", "--out", tmp_path / "out")
    assert r.exit_code == 3 and "truncated" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "out").exists()


def test_an_input_is_never_the_output_even_with_force(
    cli: Any, adapters: dict[str, Path], tmp_path: Path
) -> None:
    """An adapterdoc output (it has the marker, so --force may replace it) given as the input and as --out: refused,
    the input unchanged; so is --out holding the input."""
    first = tmp_path / "first"
    assert cli("resize", adapters["good"], "--rank", "3", "--out", first).exit_code == 0
    before = _digest(first)
    for args in (
        ("resize", first, "--rank", "2", "--out", first, "--force"),
        ("combine", adapters["good"], first, "--method", "cat", "--out", first, "--force"),
    ):
        r = cli(*args)
        assert r.exit_code == 3 and "never replaces an input" in r.stderr, r.output
        assert _digest(first) == before


def test_a_new_output_inside_an_input_is_refused(cli: Any, adapters: dict[str, Path]) -> None:
    """A new --out inside the input adapter's folder (merge and convert refuse it too): exit 3, nothing added."""
    before = sorted(p.name for p in adapters["good"].iterdir())
    r = cli("resize", adapters["good"], "--rank", "2", "--out", adapters["good"] / "sub")
    assert r.exit_code == 3 and "is inside the input" in r.stderr, r.output
    assert sorted(p.name for p in adapters["good"].iterdir()) == before


@pytest.mark.parametrize(("where", "value"), [("tuned", "nan"), ("tuned", "inf"), ("base", "nan")])
def test_extract_of_a_non_finite_change_is_one_line(cli: Any, tmp_path: Path, where: str, value: str) -> None:
    """A NaN or infinite value in either checkpoint of ``extract``: one exit-3 line naming the tensor, found before
    any factorisation (every route), nothing written (it was exit 4, numpy's ``SVD did not converge``)."""
    import torch

    from tests.algebra.llama_helpers import tiny_llama

    model = tiny_llama(hidden=64, vocab=100, layers=1, intermediate=128)
    folders = {"base": tmp_path / "base", "tuned": tmp_path / "tuned"}
    model.save_pretrained(folders["base"] if where == "tuned" else folders["tuned"])
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[0, 0] = float(value)
    model.save_pretrained(folders[where])
    out = tmp_path / "out"
    r = cli("extract", "--base", folders["base"], "--tuned", folders["tuned"], "--rank", "2", "--out", out)
    assert r.exit_code == 3, r.output
    assert "q_proj.weight" in r.stderr and "NaN or infinite" in r.stderr and r.stderr.count("\n") == 1, (
        r.stderr
    )
    assert not out.exists()


@pytest.mark.parametrize("command", ["resize", "combine", "extract"])
def test_a_refused_out_is_said_before_anything_is_read(
    cli: Any, adapters: dict[str, Path], tmp_path: Path, command: str
) -> None:
    """A non-empty ``--out`` that is no adapterdoc output is refused before the inputs are read (a bad input, here
    a NaN the reads would find, would otherwise be said first, after all the reading and computing of a large
    input): the one line names the folder, which is left as it was."""
    if command == "extract":
        import torch

        from tests.algebra.llama_helpers import tiny_llama

        model = tiny_llama(hidden=64, vocab=100, layers=1, intermediate=128)
        model.save_pretrained(tmp_path / "base")
        with torch.no_grad():
            model.model.layers[0].self_attn.q_proj.weight[0, 0] = float("nan")
        model.save_pretrained(tmp_path / "tuned")
        args: list[Any] = ["extract", "--base", tmp_path / "base", "--tuned", tmp_path / "tuned", "--rank", 2]
    elif command == "combine":
        args = ["combine", adapters["good"], adapters["nan"], "--method", "cat"]
    else:
        args = ["resize", adapters["nan"], "--energy", "0.9"]
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = cli(*[str(a) for a in args], "--out", out)
    assert r.exit_code == 3 and "not empty" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
