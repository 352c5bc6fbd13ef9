"""What a refused write says (issue 25): an immutable file is not "read-only (mode 0644)", a full disk names the
folder being written (not an input), and remap's refusals never point at a ``--force`` it does not have."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.small_adapters import write_small_adapter

ROOT = Path(__file__).resolve().parents[2]


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def immutable_adapter(tmp_path: Path) -> Any:
    """An adapter whose weights file carries ``chattr +i`` (mode 0644 still): even root cannot replace it."""
    ad = write_small_adapter(tmp_path / "a")
    w = ad / "adapter_model.safetensors"
    w.chmod(0o644)
    chattr = shutil.which("chattr")
    done = chattr and subprocess.run([chattr, "+i", str(w)], capture_output=True).returncode == 0
    if not done:
        pytest.skip("chattr +i is not available or this file system does not support it")
    yield ad
    subprocess.run([chattr, "-i", str(w)], capture_output=True)


def test_an_immutable_file_is_called_immutable_not_read_only(immutable_adapter: Path, cli: Any) -> None:
    before = _digest(immutable_adapter)
    w = immutable_adapter / "adapter_model.safetensors"
    r = cli("remap", immutable_adapter, "--rule", r"q_proj=>k_proj")
    assert r.exit_code == 3, r.output
    line = r.stderr.strip()
    assert line.startswith(f"adapterdoc: error: {w}: is immutable") and "\n" not in line
    assert "read-only (mode" not in line and "chattr -i" in line
    assert _digest(immutable_adapter) == before


def test_remap_refusals_never_mention_force(tmp_path: Path, cli: Any) -> None:
    ad = write_small_adapter(tmp_path / "a")
    file_out = tmp_path / "out.txt"
    file_out.write_text("x")
    full_out = tmp_path / "full"
    full_out.mkdir()
    (full_out / "keep").write_text("mine")
    for out in (file_out, full_out):
        r = cli("remap", ad, "--rule", r"q_proj=>k_proj", "--out", out)
        assert r.exit_code == 3 and r.stderr.startswith("adapterdoc: error: "), r.output
        assert "--force" not in r.stderr, r.stderr
    assert "--force" not in cli("remap", "--help").stdout  # the premise: remap has no --force


def _in_a_full_tmpfs(mount: Path, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` (sh) in a private mount namespace where ``mount`` is an 8 KiB tmpfs, already full."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here to mount a small private tmpfs")
    mount.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    setup = (
        f"mount -t tmpfs -o size=8k tmpfs {mount} && (head -c 8192 /dev/zero > {mount}/pad 2>/dev/null; true)"
    )
    for argv in ([unshare, "-m"], [unshare, "-rm"]):  # root, else an unprivileged user namespace
        probe = subprocess.run([*argv, "sh", "-c", setup], capture_output=True, text=True)
        if probe.returncode == 0:
            return subprocess.run(
                [*argv, "sh", "-c", f"{setup} && {script}"],
                capture_output=True,
                text=True,
                env=env,
                timeout=1800,
            )
    pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.strip()[-200:]}")


def test_a_full_disk_names_the_folder_being_written(tmp_path: Path) -> None:
    ad = write_small_adapter(tmp_path / "a")
    (ad / "README.md").write_text("an extra file remap copies beside the weights\n" * 20)
    before = _digest(ad)
    mount = tmp_path / "mnt"
    out = mount / "out"
    cmd = f"{sys.executable} -m adapterdoc remap {ad} --rule 'q_proj=>k_proj' --out {out}; echo rc=$?"
    proc = _in_a_full_tmpfs(mount, cmd)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.stdout.strip().splitlines()[-1] == "rc=3", proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"adapterdoc: error: {out}: no space left"), lines
    assert str(ad) not in lines[0]  # never the input that was being read
    assert _digest(ad) == before
