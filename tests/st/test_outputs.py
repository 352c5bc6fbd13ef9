"""CLI.md's output-path rules: devices, pipes and descriptors are written through, symlinks are followed, read-only and
foreign targets are refused (exit 3), "cannot write here" is one exit-3 line, and every file we create respects umask.

Run as root (the usual CI container) these are the cases that used to break the machine, so the tests never point a
possibly-regressed writer at the machine's own ``/dev/null`` or ``/dev/stdout``: they make their own twins in the test
folder (``mknod`` of the same character device 1:3, a symlink to ``/proc/self/fd/1``), which are the same kind of file.
"""

# ruff: noqa: F811  (pytest fixtures imported from test_merge_helpers are shadowed by parameters)

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from small_adapters import write_small_adapter

from adapterdoc.st.atomic import OUTPUT_MARKER, TEMP_PREFIX
from tests.merge.test_merge_helpers import lora_kwargs, save_adapter, saved_base, tree_digest  # noqa: F401

BASE = "tiny:ministral3_text"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_adapter = write_small_adapter


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    return _adapter(tmp_path / "adapter")


@pytest.fixture
def null_device(tmp_path: Path) -> Path:
    """A twin of /dev/null (character device 1:3) in the test folder."""
    path = tmp_path / "null"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with open(path, "wb") as f:
            f.write(b"probe")
    except (OSError, AttributeError) as e:
        pytest.skip(f"cannot make a character device here: {e}")
    return path


def _is_null(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


@pytest.fixture
def unwritable_dir(tmp_path: Path) -> Any:
    """A folder with write permission bits in which even root cannot create files: ``chattr +i`` where the file
    system supports it, else ``/sys/kernel`` (sysfs refuses new files with EACCES)."""
    folder = tmp_path / "immutable"
    folder.mkdir()
    chattr = shutil.which("chattr")
    if chattr and subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode == 0:
        yield folder
        subprocess.run([chattr, "-i", str(folder)], capture_output=True)
        return
    sysfs = Path("/sys/kernel")
    if sysfs.is_dir() and os.stat(sysfs).st_mode & 0o222:
        yield sysfs
        return
    pytest.skip("no folder here refuses writes despite its permission bits")


def _one_line_3(res: Any) -> str:
    assert res.exit_code == 3, (res.exit_code, res.stderr)
    assert res.stderr.startswith("adapterdoc: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    return res.stderr


def _run(*args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "adapterdoc", *args], env=env, capture_output=True, **kw)


# ------------------------------------------------------------------------------------------ --output-file


def test_output_file_on_a_null_device_is_written_through(cli: Any, adapter: Path, null_device: Path) -> None:
    res = cli("verify", adapter, "--base", BASE, "--json", "--output-file", null_device)
    assert res.exit_code in (0, 1), res.stderr
    assert _is_null(null_device) and res.stdout == ""
    assert not [n for n in os.listdir(null_device.parent) if n.startswith(TEMP_PREFIX)]


@pytest.mark.slow  # a fresh process with the meta-device verify (torch, transformers, peft): ~15 s
def test_output_file_through_a_link_to_stdout_writes_stdout_and_keeps_the_link(
    adapter: Path, tmp_path: Path
) -> None:
    link = tmp_path / "stdout"  # what /dev/stdout is: a symlink to /proc/self/fd/1
    link.symlink_to("/proc/self/fd/1")
    res = _run("verify", str(adapter), "--base", BASE, "--json", "--output-file", str(link))
    assert res.returncode in (0, 1), res.stderr
    assert "findings" in json.loads(res.stdout)
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


@pytest.mark.slow  # a fresh process with the meta-device verify (torch, transformers, peft): ~15 s
def test_output_file_on_a_descriptor_like_process_substitution(adapter: Path) -> None:
    """``--output-file >(wc -c)`` hands us ``/dev/fd/N``, the write end of a pipe."""
    r, w = os.pipe()
    args = [sys.executable, "-m", "adapterdoc", "verify", str(adapter), "--base", BASE, "--json"]
    try:
        proc = subprocess.Popen(
            [*args, "--output-file", f"/dev/fd/{w}"],
            env={**os.environ, "PYTHONPATH": ROOT},
            pass_fds=(w,),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(w)
        w = -1
        with os.fdopen(r, "rb") as reader:
            r = -1
            got = reader.read()
        out, err = proc.communicate(timeout=1800)
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
    assert proc.returncode in (0, 1), err
    assert "findings" in json.loads(got) and out == b""


def test_output_file_on_a_fifo_waits_for_its_reader(cli: Any, adapter: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        res = cli("verify", adapter, "--base", BASE, "--json", "--output-file", fifo)
        reader.join(timeout=600)
    finally:
        if stat.S_ISFIFO(os.lstat(fifo).st_mode) and reader.is_alive():  # release a reader nobody wrote to
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert res.exit_code in (0, 1), res.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and "findings" in json.loads(got[0])


def test_output_file_symlink_to_a_file_replaces_the_target_and_keeps_link_and_mode(
    cli: Any, adapter: Path, tmp_path: Path
) -> None:
    target = tmp_path / "reports" / "verify.json"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "latest.json"
    link.symlink_to(os.path.relpath(target, tmp_path))
    res = cli("verify", adapter, "--base", BASE, "--json", "--output-file", link)
    assert res.exit_code in (0, 1), res.stderr
    assert link.is_symlink() and os.readlink(link) == "reports/verify.json"
    assert "findings" in json.loads(target.read_text())
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert not [n for n in os.listdir(target.parent) if n.startswith(TEMP_PREFIX)]


def test_read_only_output_file_and_folder_are_refused(cli: Any, adapter: Path, tmp_path: Path) -> None:
    ro = tmp_path / "ro.json"
    ro.write_text("keep")
    ro.chmod(0o444)
    err = _one_line_3(cli("verify", adapter, "--base", BASE, "--output-file", ro))
    assert "read-only" in err and ro.read_text() == "keep" and stat.S_IMODE(ro.stat().st_mode) == 0o444
    folder = tmp_path / "ro-folder"
    folder.mkdir()
    (folder / "old.json").write_text("keep")
    folder.chmod(0o555)
    try:
        for name in ("new.json", "old.json"):
            err = _one_line_3(cli("verify", adapter, "--base", BASE, "--output-file", folder / name))
            assert "not writable" in err
        assert sorted(os.listdir(folder)) == ["old.json"] and (folder / "old.json").read_text() == "keep"
    finally:
        folder.chmod(0o755)


def test_output_file_on_a_socket_or_folder_is_refused(cli: Any, adapter: Path, tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert "socket" in _one_line_3(cli("verify", adapter, "--base", BASE, "--output-file", path))
        assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_output_file_in_a_folder_root_cannot_write_is_one_exit_3_line(
    cli: Any, adapter: Path, unwritable_dir: Path
) -> None:
    err = _one_line_3(cli("verify", adapter, "--base", BASE, "--output-file", unwritable_dir / "r.json"))
    assert f"{unwritable_dir}: folder is not writable" in err and TEMP_PREFIX not in err


def test_new_files_respect_the_umask(cli: Any, adapter: Path, tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        res = cli("verify", adapter, "--base", BASE, "--json", "--output-file", tmp_path / "new.json")
    finally:
        os.umask(old)
    assert res.exit_code in (0, 1), res.stderr
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640


# ------------------------------------------------------------------------------------------------- folders


@pytest.fixture
def merge_inputs(tmp_path: Path, tiny_model: Any, saved_base: Any) -> tuple[str, str]:
    base = saved_base("ministral3_text")
    ad = save_adapter(
        tiny_model("ministral3_text"), str(tmp_path / "ad"), **lora_kwargs("ministral3_text", r=2)
    )
    return ad, base


def test_merge_out_onto_a_device_is_refused_even_with_force(
    cli: Any, merge_inputs: tuple[str, str], null_device: Path
) -> None:
    ad, base = merge_inputs
    for extra in ((), ("--force",)):
        err = _one_line_3(cli("merge", ad, "--base", base, "--out", null_device, *extra))
        assert "character device" in err
        assert _is_null(null_device)


def test_merge_out_symlink_is_refused_and_left_alone(
    cli: Any, merge_inputs: tuple[str, str], tmp_path: Path
) -> None:
    ad, base = merge_inputs
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    err = _one_line_3(cli("merge", ad, "--base", base, "--out", link, "--force"))
    assert "symlink" in err and link.is_symlink() and os.listdir(real) == []


def test_force_replaces_only_a_previous_merge_output(
    cli: Any, merge_inputs: tuple[str, str], tmp_path: Path
) -> None:
    ad, base = merge_inputs
    mine = tmp_path / "models"
    mine.mkdir()
    for name in ("config.json", "model.safetensors", "notes.txt"):
        (mine / name).write_text(name)
    before = tree_digest(str(mine))
    err = _one_line_3(cli("merge", ad, "--base", base, "--out", mine, "--force"))
    assert "did not write" in err and "config.json, model.safetensors, notes.txt" in err
    assert tree_digest(str(mine)) == before
    out = tmp_path / "merged"
    assert cli("merge", ad, "--base", base, "--out", out).exit_code == 0
    marker = json.loads((out / OUTPUT_MARKER).read_text())
    assert marker["written_by"] == "adapterdoc merge"
    assert "not empty" in _one_line_3(cli("merge", ad, "--base", base, "--out", out))
    (out / "stale.txt").write_text("from the first run")
    res = cli("merge", ad, "--base", base, "--out", out, "--force")
    assert res.exit_code == 0, res.stderr
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(TEMP_PREFIX)]


def test_merge_out_read_only_folder_is_refused(
    cli: Any, merge_inputs: tuple[str, str], tmp_path: Path
) -> None:
    ad, base = merge_inputs
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        assert "read-only" in _one_line_3(cli("merge", ad, "--base", base, "--out", out))
        assert os.listdir(out) == []
    finally:
        out.chmod(0o755)


def test_merge_into_a_folder_root_cannot_write_is_one_exit_3_line(
    cli: Any, merge_inputs: tuple[str, str], unwritable_dir: Path
) -> None:
    ad, base = merge_inputs
    err = _one_line_3(cli("merge", ad, "--base", base, "--out", unwritable_dir / "merged"))
    assert f"{unwritable_dir}: folder is not writable" in err


def test_merged_files_get_the_umask_mode(cli: Any, merge_inputs: tuple[str, str], tmp_path: Path) -> None:
    ad, base = merge_inputs
    old = os.umask(0o027)
    try:
        res = cli("merge", ad, "--base", base, "--out", tmp_path / "m")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.stderr
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "m").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o750


def test_merge_with_a_tiny_base_says_it_needs_weights(
    cli: Any, merge_inputs: tuple[str, str], tmp_path: Path
) -> None:
    ad, _ = merge_inputs
    err = _one_line_3(cli("merge", ad, "--base", BASE, "--out", tmp_path / "m"))
    assert "real weights" in err and "save_pretrained" in err


def test_remap_out_onto_a_device_or_symlink_is_refused(cli: Any, adapter: Path, null_device: Path) -> None:
    before = tree_digest(str(adapter))
    assert "character device" in _one_line_3(
        cli("remap", adapter, "--rule", "q_proj=>k_proj", "--out", null_device)
    )
    assert _is_null(null_device)
    link = null_device.parent / "out-link"
    link.symlink_to(null_device.parent / "elsewhere")
    assert "symlink" in _one_line_3(cli("remap", adapter, "--rule", "q_proj=>k_proj", "--out", link))
    assert link.is_symlink() and tree_digest(str(adapter)) == before


def test_remap_in_place_in_a_read_only_folder_is_refused(cli: Any, adapter: Path) -> None:
    before = tree_digest(str(adapter))
    adapter.chmod(0o555)
    try:
        err = _one_line_3(
            cli("remap", adapter, "--rule", r"layers\.0\.self_attn\.q_proj=>layers.0.self_attn.x")
        )
        assert "not writable" in err
    finally:
        adapter.chmod(0o755)
    assert tree_digest(str(adapter)) == before


def test_train_smoke_out_onto_a_device_is_refused(cli: Any, null_device: Path) -> None:
    pytest.importorskip("peft")
    err = _one_line_3(cli("train-smoke", "--layout", "mistral3_vl", "--steps", "1", "--out", null_device))
    assert "character device" in err and _is_null(null_device)


def test_train_smoke_into_a_folder_root_cannot_write_is_one_exit_3_line(
    cli: Any, unwritable_dir: Path
) -> None:
    pytest.importorskip("peft")
    err = _one_line_3(
        cli("train-smoke", "--layout", "mistral3_vl", "--steps", "1", "--out", unwritable_dir / "r")
    )
    assert "not writable" in err


# --------------------------------------------------------------------------------------------- one place


def test_every_rename_and_replace_is_in_the_atomic_module() -> None:
    package = os.path.join(ROOT, "adapterdoc")
    offenders = []
    for folder, _, files in os.walk(package):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path == os.path.join(package, "st", "atomic.py"):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            offenders += [f"{path}: {w}" for w in ("os.replace", "os.rename") if w in text]
    assert offenders == []


def test_roundtrip_keep_onto_a_device_is_refused(cli: Any, adapter: Path, null_device: Path) -> None:
    err = _one_line_3(cli("roundtrip", adapter, "--keep", null_device))
    assert "character device" in err and "--keep" in err and _is_null(null_device)


def test_a_permission_error_outside_the_writers_is_still_one_exit_3_line(unwritable_dir: Path) -> None:
    """The CLI's last line of defence: a real PermissionError from a plain ``open`` in a command body."""
    import click
    from click.testing import CliRunner

    from adapterdoc.commands.options import handle_errors

    @click.command()
    @handle_errors
    def write_there() -> None:
        with open(unwritable_dir / "plain.txt", "w") as f:
            f.write("x")

    res = CliRunner().invoke(write_there, [], catch_exceptions=False)
    err = _one_line_3(res)
    assert f"{unwritable_dir / 'plain.txt'}: " in err and (
        "permission denied" in err or "not permitted" in err
    )
