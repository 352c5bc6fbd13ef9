"""The corrupt corpus: adapterdoc's verdict equals safetensors' own reader's on every generated input
(duplicate tensor names excepted, by design), and every refusal is exit 3 with one line on stderr,
no traceback, and every input byte-identical afterwards."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from adapterdoc.cli import main
from adapterdoc.errors import AdapterdocError

ROOT = Path(__file__).resolve().parents[2]


def _load_generator() -> Any:
    name = "adapterdoc_fixtures_generate_corrupt"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "fixtures" / "generate_corrupt.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


GEN = _load_generator()
NAMES = GEN.case_names()
ERROR_PREFIX = "adapterdoc: error: "


def snapshot(path: str | Path) -> dict[str, Any]:
    """Every entry under ``path`` (not following links): file bytes, link targets, modes, mtimes."""
    out: dict[str, Any] = {}
    root = Path(path)
    todo = [root]
    while todo:
        p = todo.pop()
        st = os.lstat(p)
        key = str(p)
        if stat.S_ISLNK(st.st_mode):
            out[key] = ("link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[key] = ("dir", st.st_mode)
            todo.extend(sorted(p.iterdir()))
        elif stat.S_ISREG(st.st_mode):
            out[key] = ("file", st.st_mode, st.st_mtime_ns, p.read_bytes())
        else:
            out[key] = ("other", st.st_mode, st.st_mtime_ns)
    return out


def reference_verdict(path: str) -> str:
    """What safetensors' own reader says: open the file and list its keys."""
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt") as f:
            list(f.keys())
    except Exception:
        return GEN.REJECT
    return GEN.ACCEPT


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("corrupt")
    cases = GEN.generate(folder)
    return {"folder": folder, "cases": {c.name: c for c in cases}, "before": snapshot(folder)}


def run_inspect(path: str, *extra: str) -> Any:
    return CliRunner().invoke(
        main, ["inspect", *extra, path], env={"ADAPTERDOC_DEBUG": None, "NO_COLOR": "1"}
    )


def assert_one_line_error(stderr: str, case: Any) -> None:
    assert stderr.endswith("\n") and stderr.count("\n") == 1, repr(stderr)
    assert stderr.startswith(ERROR_PREFIX), repr(stderr)
    assert "Traceback" not in stderr
    assert "internal error" not in stderr, stderr
    assert case.name in stderr, f"the error should name the input: {stderr!r}"


def test_corpus_size_and_coverage(corpus: dict[str, Any]) -> None:
    cases = list(corpus["cases"].values())
    rejects = [c for c in cases if c.expect == GEN.REJECT]
    assert len(rejects) >= 45
    assert len(NAMES) == len(set(NAMES)) == len(cases)
    categories = {c.category for c in rejects}
    assert categories >= {
        "length",
        "truncation",
        "encoding",
        "json",
        "entry",
        "dtype",
        "shape",
        "offsets",
        "layout",
        "metadata",
        "duplicates",
        "filesystem",
        "adapter",
        "sharded",
    }
    # the only places we are stricter than the reference are duplicate tensor names
    assert {c.category for c in cases if c.stricter} == {"duplicates"}
    assert sum(c.expect == GEN.ACCEPT and c.reference == GEN.ACCEPT for c in cases) >= 15


def test_generator_is_deterministic(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    GEN.generate(a)
    GEN.generate(b)

    def contents(root: Path) -> dict[str, Any]:
        snap = snapshot(root)
        out = {}
        for k, v in snap.items():
            rel = os.path.relpath(k, root)
            if v[0] == "file":
                data = v[3].replace(str(root.resolve()).encode(), b"<ROOT>")
                out[rel] = ("file", v[1], data)
            elif v[0] == "other":
                out[rel] = ("other", v[1])
            else:
                out[rel] = v
        return out

    assert contents(a) == contents(b)
    GEN.generate(a)  # regenerating over an existing corpus works and changes nothing
    assert contents(a) == contents(b)


@pytest.mark.parametrize("name", NAMES)
def test_case(corpus: dict[str, Any], name: str) -> None:
    case = corpus["cases"][name]
    if case.reference is not None:
        assert reference_verdict(case.path) == case.reference, (
            "the generator's claim about safetensors is stale"
        )
    if case.name == "fifo.safetensors":
        pytest.skip("covered by a subprocess with a timeout (a regression would block forever)")
    before = snapshot(corpus["folder"] / name)
    result = run_inspect(case.path, "--json")
    ours = GEN.REJECT if result.exit_code == 3 else GEN.ACCEPT
    assert ours == case.expect, (result.exit_code, result.stderr, result.stdout[:500])
    if case.reference is not None and not case.stricter:
        assert ours == case.reference
    if case.expect == GEN.REJECT:
        assert_one_line_error(result.stderr, case)
        if result.stdout.strip():  # a JSON error object is allowed, nothing else
            obj = json.loads(result.stdout)
            assert obj["ok"] is False
        human = run_inspect(case.path)
        assert human.exit_code == 3
        assert_one_line_error(human.stderr, case)
        assert human.stdout == ""
    else:
        assert result.exit_code in (0, 1), result.stderr
        obj = json.loads(result.stdout)
        assert isinstance(obj, dict) and obj["ok"] is (result.exit_code == 0)
        assert result.stderr == ""
    assert snapshot(corpus["folder"] / name) == before, "inspect changed its input"


def test_library_raises_only_adapterdoc_errors(corpus: dict[str, Any]) -> None:
    """The library itself (not only the CLI wrapper) raises AdapterdocError for every refused input."""
    from adapterdoc.checkpoint import open_checkpoint

    for case in corpus["cases"].values():
        if case.name == "fifo.safetensors":
            continue
        if case.expect == GEN.REJECT:
            with pytest.raises(AdapterdocError):
                open_checkpoint(case.path)
        else:
            open_checkpoint(case.path)


def test_stricter_cases_name_the_duplicate(corpus: dict[str, Any]) -> None:
    for case in corpus["cases"].values():
        if case.stricter:
            result = run_inspect(case.path)
            assert "duplicate tensor name" in result.stderr
            assert "`w`" in result.stderr


def test_corpus_unchanged_after_everything(corpus: dict[str, Any]) -> None:
    assert snapshot(corpus["folder"]) == corpus["before"]


SUBPROCESS_CASES = [
    "fifo.safetensors",
    "truncated_data.safetensors",
    "header_len_u64_max.safetensors",
    "nesting_very_deep.safetensors",
    "symlink_loop.safetensors",
    "index_dotdot_shard",
    "adapter_config_invalid_json",
]


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_real_subprocess(corpus: dict[str, Any], name: str) -> None:
    case = corpus["cases"][name]
    before = snapshot(corpus["folder"] / name)
    env = {k: v for k, v in os.environ.items() if k != "ADAPTERDOC_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-m", "adapterdoc", "inspect", case.path],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert_one_line_error(proc.stderr, case)
    assert snapshot(corpus["folder"] / name) == before


def test_debug_flag_shows_a_traceback(corpus: dict[str, Any]) -> None:
    """The one-line rule has one documented escape hatch: --debug / ADAPTERDOC_DEBUG=1."""
    case = corpus["cases"]["truncated_data.safetensors"]
    env = {**os.environ, "ADAPTERDOC_DEBUG": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "adapterdoc", "inspect", case.path], capture_output=True, text=True, env=env
    )
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr
