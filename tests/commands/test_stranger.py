"""An outside acceptance trial of issue 12, kept: what a stranger met running adapterdoc from a clean clone and a
non-editable install (qa12), each case as a test that failed before its fix.

- a pyproject.toml above the working folder that is not UTF-8, or whose ``tool`` is not a table: exit 3, not a
  crash (exit 4);
- ``remap --out`` / ``train-smoke --out`` / ``roundtrip --keep`` onto a file (or a link to one): exit 3, like
  ``merge --out`` (CLI.md), not click's usage error (exit 2);
- stdout or an ``--output-file`` that cannot take the report (``/dev/full``): one exit-3 line naming it, never a
  traceback (``--json`` included);
- every ``--help`` fits an 80-column terminal;
- Ctrl-C during ``train-smoke`` leaves no half-made layout folder, and the tiny base it saves gets the umask
  mode (safetensors writes 0600).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from small_adapters import write_small_adapter

BASE = "tiny:ministral3_text"


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    return write_small_adapter(tmp_path / "adapter")


def _run(*args: str, cwd: Path | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapterdoc", *args], cwd=cwd, capture_output=True, text=True, **kw
    )


def _one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adapterdoc: error: "), stderr
    return lines[0]


# ------------------------------------------------------------------------------------------ [tool.adapterdoc]


@pytest.mark.parametrize(
    "body",
    [b"\xff\xfe[tool.adapterdoc]\nprofile = 'vllm'\n", b'tool = "x"\n'],
    ids=["not-utf8", "tool-not-a-table"],
)
def test_an_unreadable_pyproject_is_exit_3_not_a_crash(
    cli: Any, adapter: Path, tmp_path: Path, body: bytes
) -> None:
    (tmp_path / "pyproject.toml").write_bytes(body)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        r = cli("verify", adapter)
    finally:
        os.chdir(cwd)
    assert r.exit_code == 3, r.stderr
    line = _one_error_line(r.stderr)
    assert "pyproject.toml" in line and "internal error" not in line


# ------------------------------------------------------------------------------------------- --out onto a file


@pytest.mark.parametrize("kind", ["file", "link-to-file"])
@pytest.mark.parametrize(
    "command",
    [("remap", "{adapter}", "--vl", "--out"), ("roundtrip", "{adapter}", "--keep")],
    ids=["remap", "roundtrip"],
)
def test_an_out_folder_that_is_a_file_is_exit_3(
    cli: Any, adapter: Path, tmp_path: Path, kind: str, command: tuple[str, ...]
) -> None:
    target = tmp_path / "afile"
    target.write_text("mine\n")
    if kind == "link-to-file":
        (tmp_path / "alink").symlink_to(target)
        target = tmp_path / "alink"
    args = [a.format(adapter=adapter) for a in command]
    r = cli(*args, target)
    assert r.exit_code == 3, r.output
    assert str(target.name) in _one_error_line(r.stderr)
    assert (tmp_path / "afile").read_text() == "mine\n"
    assert target.is_symlink() == (kind == "link-to-file")


def test_train_smoke_out_onto_a_file_is_exit_3_before_torch_is_imported(tmp_path: Path) -> None:
    """The refusal comes first: before, the user waited for torch, transformers and peft (11 s quiet) to be told
    that --out is a file."""
    target = tmp_path / "afile"
    target.write_text("mine\n")
    code = (
        "import sys\n"
        "from adapterdoc.cli import main\n"
        "try:\n"
        "    main(['train-smoke', '--layout', 'qwen3_5_vl', '--steps', '1', '--out', sys.argv[1]])\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True)
    assert r.stdout.split() == ["exit", "3", "False"], r.stdout + r.stderr
    assert "afile" in _one_error_line(r.stderr)
    assert target.read_text() == "mine\n"


# ---------------------------------------------------------------------------------------- a stdout that is full


needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")


@needs_dev_full
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_full_stdout_is_one_exit_3_line(adapter: Path, as_json: bool) -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "adapterdoc", "inspect", str(adapter), *(["--json"] if as_json else [])],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert r.returncode == 3, r.stderr
    assert (
        _one_error_line(r.stderr) == "adapterdoc: error: stdout: no space left on the device (or over quota)"
    )


@needs_dev_full
def test_an_output_file_that_is_full_is_named(cli: Any, adapter: Path) -> None:
    r = cli("verify", adapter, "--base", BASE, "--output-file", "/dev/full")
    assert r.exit_code == 3, r.output
    assert _one_error_line(r.stderr).startswith("adapterdoc: error: /dev/full: no space left")
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")


# --------------------------------------------------------------------------------------------------- help


@pytest.mark.parametrize(
    "command", ["", "inspect", "remap", "verify", "merge", "roundtrip", "train-smoke", "explain"]
)
def test_help_fits_an_80_column_terminal(command: str) -> None:
    env = {**os.environ, "COLUMNS": "80"}
    r = _run(*([command] if command else []), "--help", env=env)
    assert r.returncode == 0, r.stderr
    long = [line for line in r.stdout.splitlines() if len(line) > 80]
    assert long == []


# ------------------------------------------------------------------------------------------- Ctrl-C, modes


def test_interrupted_train_smoke_leaves_only_finished_layouts_with_umask_modes(tmp_path: Path) -> None:
    """SIGINT just after the first layout finished lands in the second one: exit 130, and every layout folder
    left is a finished one (before the fix the interrupted layout's folder stayed with a partial
    progress.jsonl). The finished layout's saved tiny base is 0644 under umask 022, like every other output."""
    out = tmp_path / "smoke"

    def child() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a shell's background job would inherit SIG_IGN
        os.umask(0o022)

    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "adapterdoc",
            "train-smoke",
            "--layout",
            "all",
            "--steps",
            "4",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=child,
    )
    done: list[str] = []
    assert p.stderr is not None
    deadline = time.monotonic() + 1800
    for line in p.stderr:
        if line.startswith("train-smoke: ") and line.rstrip().endswith(")") and ": ok (" in line:
            done.append(line.split(":")[1].strip())
            break
        assert time.monotonic() < deadline
    time.sleep(0.5)  # inside the next layout's training
    p.send_signal(signal.SIGINT)
    rest = p.stderr.read()
    assert p.wait(timeout=1800) == 130, rest
    assert "interrupted" in rest and "Traceback" not in rest
    left = sorted(x.name for x in out.iterdir())
    assert left == done, f"half-made layout folders left: {sorted(set(left) - set(done))}"
    assert not [x for x in out.rglob("*") if x.name.startswith(".adapterdoc-tmp-")]
    finished = out / done[0]
    assert (finished / "adapter" / "adapter_model.safetensors").is_file()
    modes = {
        str(f.relative_to(finished)): oct(f.stat().st_mode & 0o777) for f in finished.rglob("*.safetensors")
    }
    assert set(modes.values()) == {"0o644"}, modes
