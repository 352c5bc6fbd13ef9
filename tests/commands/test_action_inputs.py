"""The Action's inputs as a new user reads them (issue 25): every verify profile and output format described,
and a glob's matches handed to verify in one stable (byte) order, not the file system's."""

from __future__ import annotations

import os
from pathlib import Path

from tests.commands.test_action import _action, _calls, _env, _run_step, _step


def test_the_inputs_describe_every_profile_and_every_format() -> None:
    from adapterdoc.commands.options import ALL_FORMATS
    from adapterdoc.engines import profile_names

    inputs = _action()["inputs"]
    profile, fmt = inputs["profile"]["description"], inputs["format"]["description"]
    assert [p for p in profile_names() if p not in profile] == []
    assert [f for f in ALL_FORMATS if f not in fmt] == []


def test_glob_matches_reach_verify_sorted(tmp_path: Path) -> None:
    work = tmp_path / "work"
    names = ["b", "A", "a b", "_x", "10", "9", "B", "a"]
    for name in names:  # created in this order; the directory lists them in its own (hash) order
        (work / "adapters" / name).mkdir(parents=True)
    bindir, log = tmp_path / "fake bin", tmp_path / "calls.log"
    bindir.mkdir()
    exe = bindir / "python"
    exe.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> "{log}"\necho >> "{log}"\n')
    exe.chmod(0o755)
    env = _env(_step("Verify"), Path(__file__).resolve().parents[2], adapters="adapters/*")
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    res = _run_step(_step("Verify"), env, work)
    assert res.returncode == 0, res.stderr
    (call,) = _calls(log)
    got = call[call.index("--") + 1 :]
    assert got == sorted(f"adapters/{n}" for n in names)  # byte order: 1 < 9 < A < B < _ < a
