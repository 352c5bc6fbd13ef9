"""`convert --out` follows CLI.md's output rules as `merge --out` does (issue 39, item 1): an existing file or
non-empty folder is refused with exit 3 unless `--force`, `--force` replaces only a previous convert output and never
an input, a symlink is refused (its target unchanged), a device is written through; an input that cannot be read says
why (item 9); the light install names the extra (item 7); `convert --help` lists the three input formats.

Adapters are written with numpy (no torch); GGUF targets need the `gguf` package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.st.atomic import OUTPUT_MARKER, TEMP_PREFIX
from tests.formats.test_mlx import base_folder, dense, peft_folder


def _llama_base(folder: Path) -> Path:
    """A llama base (config.json with `architectures`, and zero weights) that both MLX and GGUF accept."""
    base = base_folder(folder)
    cfg = json.loads((base / "config.json").read_text())
    cfg.update(
        architectures=["LlamaForCausalLM"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=24,
        vocab_size=32,
    )
    (base / "config.json").write_text(json.dumps(cfg))
    return base


@pytest.fixture
def made(tmp_path: Path) -> dict[str, Path]:
    return {"peft": peft_folder(tmp_path / "peft", dense()), "base": _llama_base(tmp_path / "base")}


def _snapshot(*roots: Path) -> dict[str, bytes]:
    """Every regular file under ``roots`` (links not followed) → its bytes."""
    out: dict[str, bytes] = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        out.update({str(p): p.read_bytes() for p in files if not p.is_symlink()})
    return out


def _no_leftovers(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.startswith((TEMP_PREFIX, ".adapterdoc-convert-"))]


def _refused(res: Any, *needles: str) -> None:
    assert res.exit_code == 3, res.output
    assert res.stderr.startswith("adapterdoc: error: ") and res.stderr.count("\n") == 1, res.stderr
    for n in needles:
        assert n in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------ GGUF: one file


def test_gguf_out_over_a_base_weights_file_is_refused_with_and_without_force(
    tmp_path: Path, made: dict[str, Path], cli: Any
) -> None:
    """The issue's report: `--out base/model.safetensors` replaced the base's weights with a GGUF."""
    pytest.importorskip("gguf")
    before = _snapshot(made["base"], made["peft"])
    target = made["base"] / "model.safetensors"
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", target)
    _refused(res, str(target), "inside the --base folder")
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", target, "--force")
    _refused(res, "never replaces an input")
    # the base given as its config.json: its folder is still the base
    cfg = made["base"] / "config.json"
    res = cli("convert", made["peft"], "--to", "gguf", "--base", cfg, "--out", target, "--force")
    _refused(res, "inside the --base folder")
    assert _snapshot(made["base"], made["peft"]) == before
    _no_leftovers(made["base"])


def test_gguf_out_over_an_existing_file(tmp_path: Path, made: dict[str, Path], cli: Any) -> None:
    pytest.importorskip("gguf")
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"keep me")
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", notes)
    _refused(res, "exists; refusing to overwrite it", "--force")
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", notes, "--force")
    _refused(res, "is not a GGUF adapter")  # --force replaces a previous output only
    assert notes.read_bytes() == b"keep me"
    _no_leftovers(tmp_path)


def test_gguf_force_replaces_a_previous_output(tmp_path: Path, made: dict[str, Path], cli: Any) -> None:
    pytest.importorskip("gguf")
    out = tmp_path / "a.gguf"
    assert cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", out).exit_code == 0
    first = out.read_bytes()
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", out)
    _refused(res, "exists", "--force")
    res = cli(
        "convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", out, "--outtype", "f16"
    )
    _refused(res, "exists")
    assert out.read_bytes() == first
    res = cli(
        "convert",
        made["peft"],
        "--to",
        "gguf",
        "--base",
        made["base"],
        "--out",
        out,
        "--outtype",
        "f16",
        "--force",
    )
    assert res.exit_code == 0, res.output
    assert out.read_bytes() != first and out.read_bytes()[:4] == b"GGUF"
    _no_leftovers(tmp_path)


def test_gguf_out_through_a_symlink_is_refused_and_its_target_unchanged(
    tmp_path: Path, made: dict[str, Path], cli: Any
) -> None:
    """A link to a file (a Hugging Face cache blob, say) is never written through, --force or not; a link to a
    previous GGUF output neither (CLI.md: a link is never replaced)."""
    pytest.importorskip("gguf")
    blob = tmp_path / "blob"
    blob.write_bytes(b"shared content")
    link = tmp_path / "link.gguf"
    link.symlink_to(blob)
    for force in ((), ("--force",)):
        res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", link, *force)
        _refused(res, "is a symlink", str(blob))
    assert blob.read_bytes() == b"shared content" and os.readlink(link) == str(blob)
    prev = tmp_path / "prev.gguf"
    assert cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", prev).exit_code == 0
    kept = prev.read_bytes()
    link2 = tmp_path / "link2.gguf"
    link2.symlink_to(prev)
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", link2, "--force")
    _refused(res, "is a symlink")
    assert prev.read_bytes() == kept and link2.is_symlink()
    dangling = tmp_path / "dangling.gguf"
    dangling.symlink_to(tmp_path / "nowhere.gguf")
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", dangling)
    _refused(res, "is a symlink")
    assert not (tmp_path / "nowhere.gguf").exists()
    _no_leftovers(tmp_path)


def test_gguf_input_is_never_its_own_output(tmp_path: Path, made: dict[str, Path], cli: Any) -> None:
    pytest.importorskip("gguf")
    src = tmp_path / "a.gguf"
    assert cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", src).exit_code == 0
    before = src.read_bytes()
    res = cli("convert", src, "--to", "gguf", "--base", made["base"], "--out", src, "--force")
    _refused(res, "is the input")
    res = cli("convert", src, "--to", "peft", "--out", tmp_path, "--force")  # the folder holding the input
    _refused(res, "is the input or inside")
    assert src.read_bytes() == before


def test_gguf_out_dev_null_is_written_through(tmp_path: Path, made: dict[str, Path], cli: Any) -> None:
    """/dev/null is not a file convert replaces: it is written through like a shell redirect (no --force), stays
    the character device, and no temp file is left in /dev. A folder target refuses it."""
    pytest.importorskip("gguf")
    before = set(os.listdir("/dev"))
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", "/dev/null", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["out"] == "/dev/null"
    assert Path("/dev/null").is_char_device() and set(os.listdir("/dev")) <= before
    mlx = tmp_path / "m"
    assert cli("convert", made["peft"], "--to", "mlx", "--base", made["base"], "--out", mlx).exit_code == 0
    res = cli("convert", mlx, "--to", "gguf", "--base", made["base"], "--out", "/dev/null")  # through PEFT
    assert res.exit_code == 0, res.output
    assert set(os.listdir("/dev")) <= before
    res = cli("convert", made["peft"], "--to", "mlx", "--out", "/dev/null", "--force")
    _refused(res, "is a character device, not a folder")
    assert Path("/dev/null").is_char_device()


# ----------------------------------------------------------------------------------- PEFT / MLX: a folder


def test_folder_out_non_empty_and_force_on_a_previous_output(
    tmp_path: Path, made: dict[str, Path], cli: Any
) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep")
    for force in ((), ("--force",)):
        res = cli("convert", made["peft"], "--to", "mlx", "--out", full, *force)
        _refused(res, "not" if not force else "did not write")
    assert [p.name for p in full.iterdir()] == ["x"] and (full / "x").read_text() == "keep"
    out = tmp_path / "mlx"
    assert cli("convert", made["peft"], "--to", "mlx", "--out", out).exit_code == 0
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    assert marker["written_by"] == "adapterdoc convert"
    first = (out / "adapters.safetensors").read_bytes()
    _refused(cli("convert", made["peft"], "--to", "mlx", "--out", out), "not empty", "--force")
    res = cli("convert", made["peft"], "--to", "mlx", "--out", out, "--force", "--outtype", "f16")
    assert res.exit_code == 3 or (out / "adapters.safetensors").read_bytes() != first  # f16 needs numpy
    res = cli("convert", made["peft"], "--to", "mlx", "--out", out, "--force")
    assert res.exit_code == 0, res.output
    assert (out / "adapters.safetensors").read_bytes() == first
    assert sorted(p.name for p in out.iterdir()) == [
        OUTPUT_MARKER,
        "adapter_config.json",
        "adapters.safetensors",
    ]
    back = tmp_path / "back"
    assert cli("convert", out, "--to", "peft", "--out", back).exit_code == 0
    assert (back / OUTPUT_MARKER).is_file()
    assert cli("convert", out, "--to", "peft", "--out", back, "--force").exit_code == 0
    _no_leftovers(tmp_path)


def test_folder_out_that_is_an_input_or_a_link_is_refused(
    tmp_path: Path, made: dict[str, Path], cli: Any
) -> None:
    before = _snapshot(made["base"], made["peft"])
    res = cli(
        "convert", made["peft"], "--to", "mlx", "--base", made["base"], "--out", made["base"], "--force"
    )
    _refused(res, "is the --base folder", "never replaces an input")
    res = cli("convert", made["peft"], "--to", "mlx", "--out", made["peft"], "--force")
    _refused(res, "is the input")
    res = cli(
        "convert",
        made["peft"],
        "--to",
        "peft",
        "--out",
        made["peft"] / "adapter_model.safetensors",
        "--force",
    )
    _refused(res, "inside the input")
    link = tmp_path / "link"
    link.symlink_to(made["base"])
    res = cli("convert", made["peft"], "--to", "mlx", "--out", link, "--force")
    _refused(res, "symlink")
    assert _snapshot(made["base"], made["peft"]) == before
    _no_leftovers(tmp_path)


# ------------------------------------------------------------------------------- inputs that cannot be read


def test_an_unreadable_input_says_why(tmp_path: Path, made: dict[str, Path], cli: Any) -> None:
    """A FIFO named like a GGUF, a FIFO as an MLX folder's weights, a broken link: what is wrong, not "not an
    adapter in a format adapterdoc converts" (and a FIFO is never opened: the command would hang)."""
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    res = cli("convert", fifo, "--to", "peft", "--out", tmp_path / "o")
    _refused(res, "x.gguf: is a FIFO (named pipe), not a regular file")
    mlx = tmp_path / "mlx"
    assert cli("convert", made["peft"], "--to", "mlx", "--out", mlx).exit_code == 0
    (mlx / "adapters.safetensors").unlink()
    os.mkfifo(mlx / "adapters.safetensors")
    res = cli("convert", mlx, "--to", "peft", "--out", tmp_path / "o")
    _refused(res, "adapters.safetensors: is a FIFO (named pipe), not a regular file")
    (mlx / "adapters.safetensors").unlink()
    (mlx / "adapters.safetensors").symlink_to(tmp_path / "gone")
    res = cli("convert", mlx, "--to", "peft", "--out", tmp_path / "o")
    _refused(res, "adapters.safetensors: is a broken symlink")
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli("convert", empty, "--to", "peft", "--out", tmp_path / "o")
    _refused(res, "is not an adapter in a format adapterdoc converts")
    assert not (tmp_path / "o").exists()


def _unprivileged(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m adapterdoc ARGS`` unable to bypass file permissions: as root (a CI container), with the
    capabilities that bypass them dropped from the bounding set (setpriv); else as the user itself."""
    cmd = [sys.executable, "-m", "adapterdoc", *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: no way to make a file unreadable")
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *cmd]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_permission_denied_is_said(tmp_path: Path, made: dict[str, Path], cli: Any) -> None:
    pytest.importorskip("gguf")
    gguf = tmp_path / "a.gguf"
    assert cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", gguf).exit_code == 0
    mlx = tmp_path / "mlx"
    assert cli("convert", made["peft"], "--to", "mlx", "--out", mlx).exit_code == 0
    gguf.chmod(0)
    (mlx / "adapters.safetensors").chmod(0)
    res = _unprivileged(["convert", str(gguf), "--to", "peft", "--out", str(tmp_path / "o")], tmp_path)
    if res.returncode != 3 and "Operation not permitted" in res.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {res.stderr.strip()}")
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stderr == f"adapterdoc: error: {gguf}: cannot read: Permission denied\n"
    res = _unprivileged(["convert", str(mlx), "--to", "peft", "--out", str(tmp_path / "o")], tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr
    assert (
        res.stderr == f"adapterdoc: error: {mlx / 'adapters.safetensors'}: cannot read: Permission denied\n"
    )


# ------------------------------------------------------------------------------------------------- --help


def test_help_lists_the_three_input_formats_and_the_output_rules(cli: Any) -> None:
    text = cli("convert", "--help").stdout
    for needle in (
        "adapters.safetensors",
        "FILE.gguf",
        "GGUF LoRA adapter",
        "PEFT adapter folder",
        "--force",
    ):
        assert needle in text, needle
    assert "symlink" in text and "/dev/null" in text
    assert "sharded checkpoint" not in text and "hf://" not in text  # convert reads neither
    assert all(len(line) <= 80 for line in text.splitlines())


# ------------------------------------------------------------------------------------------- light install


def test_light_install_names_the_extra(
    tmp_path: Path, made: dict[str, Path], light_venv: Any, cli: Any
) -> None:
    """No numpy, no gguf: a GGUF hop is one exit-3 line naming `adapterdoc[gguf]` (it was exit 4, `No module named
    'numpy'`); PEFT ⇄ MLX needs neither; `--outtype` names the numpy extra (`weights`), not the ML one."""
    pytest.importorskip("gguf")
    gguf = tmp_path / "a.gguf"
    assert cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", gguf).exit_code == 0
    assert not light_venv.run_py("import importlib.util as u; print(u.find_spec('numpy') or '')").strip()

    def run(*args: Any) -> subprocess.CompletedProcess[str]:
        cmd = [str(light_venv.python), "-m", "adapterdoc", *map(str, args)]
        return subprocess.run(
            cmd, capture_output=True, text=True, env=light_venv.env, cwd=tmp_path, timeout=300
        )

    gguf_extra = "install the gguf extra: pip install 'adapterdoc[gguf]'"
    for args in (
        ("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", tmp_path / "b.gguf"),
        ("convert", gguf, "--to", "peft", "--out", tmp_path / "p"),
        ("convert", gguf, "--to", "mlx", "--base", made["base"], "--out", tmp_path / "m2"),
    ):
        res = run(*args)
        assert res.returncode == 3, res.stdout + res.stderr
        assert res.stderr.count("\n") == 1 and gguf_extra in res.stderr and "`numpy`" in res.stderr, (
            res.stderr
        )
    assert not (tmp_path / "b.gguf").exists() and not (tmp_path / "p").exists()
    res = run("convert", made["peft"], "--to", "mlx", "--base", made["base"], "--out", tmp_path / "m")
    assert res.returncode == 0, res.stdout + res.stderr
    res = run("convert", tmp_path / "m", "--to", "peft", "--out", tmp_path / "back")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "back/adapter_model.safetensors").read_bytes() == (
        made["peft"] / "adapter_model.safetensors"
    ).read_bytes()
    res = run("convert", made["peft"], "--to", "mlx", "--out", tmp_path / "m16", "--outtype", "f16")
    assert res.returncode == 3 and "pip install 'adapterdoc[weights]'" in res.stderr, res.stderr
    _no_leftovers(tmp_path)


def test_gguf_out_a_fifo_or_stdout_gets_the_file_bytes(
    tmp_path: Path, made: dict[str, Path], cli: Any
) -> None:
    """A FIFO or /dev/stdout as --out: the GGUF is written into the work folder, checked, then copied through (the
    gguf writer seeks, which a pipe cannot: it was exit 4 'Illegal seek'); the bytes are the file's."""
    import threading

    ref = tmp_path / "ref.gguf"
    assert cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", ref).exit_code == 0
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    res = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", fifo)
    reader.join(timeout=60)
    assert res.exit_code == 0, res.output
    assert got == [ref.read_bytes()]
    out = subprocess.run(
        [sys.executable, "-m", "adapterdoc", "convert", str(made["peft"]), "--to", "gguf", "--base", str(made["base"]),
         "--out", "/dev/stdout", "--json"],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    gguf = ref.read_bytes()
    assert out.stdout[: len(gguf)] == gguf  # then the report, which goes to stdout too
    assert json.loads(out.stdout[len(gguf) :])["ok"]


def test_an_inert_adapter_to_a_device_is_still_said(tmp_path: Path, made: dict[str, Path], cli: Any) -> None:
    """The weight checks run on what was written before it goes through to the device."""
    from safetensors.numpy import load_file, save_file

    zero = Path(shutil.copytree(made["peft"], tmp_path / "zero"))
    w = load_file(str(zero / "adapter_model.safetensors"))
    save_file(
        {k: v * 0 if "lora_B" in k else v for k, v in w.items()}, str(zero / "adapter_model.safetensors")
    )
    res = cli("convert", zero, "--to", "gguf", "--base", made["base"], "--out", "/dev/null", "--json")
    assert res.exit_code == 1 and "AD301" in res.stdout
