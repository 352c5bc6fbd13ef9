"""CLI plumbing shared by every command: exit codes, one-line errors, --json on failure, --version, NO_COLOR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from small_adapters import write_small_adapter

from adapterdoc import __version__

COMMANDS = ["inspect", "remap", "verify", "merge", "roundtrip", "train-smoke", "explain"]


def _adapter(folder: Path) -> Path:
    return write_small_adapter(folder, hidden=8)


def test_version(cli: Any) -> None:
    res = cli("--version")
    assert res.exit_code == 0 and __version__ in res.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, cli: Any) -> None:
    res = cli(command, "--help")
    assert res.exit_code == 0 and "Usage:" in res.stdout


def test_usage_error_is_exit_2(cli: Any) -> None:
    assert cli("inspect").exit_code == 2
    assert cli("no-such-command").exit_code == 2


@pytest.mark.parametrize("command", ["inspect", "remap", "roundtrip"])
def test_json_mode_still_prints_one_object_on_exit_3(command: str, cli: Any, tmp_path: Path) -> None:
    args = [command, tmp_path / "missing", "--json"] + (["--vl"] if command == "remap" else [])
    res = cli(*args)
    assert res.exit_code == 3
    out = json.loads(res.stdout)
    assert out["ok"] is False and out["findings"][0]["code"] == "AD100"
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("adapterdoc: error: ")


def test_human_output_has_no_color_when_not_a_terminal(cli: Any, tmp_path: Path) -> None:
    res = cli("inspect", _adapter(tmp_path / "a"))
    assert res.exit_code == 0
    assert "\x1b[" not in res.stdout


def test_no_color_env_in_a_real_terminal_like_run(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path / "a")
    env = {**os.environ, "NO_COLOR": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "adapterdoc", "inspect", str(adapter)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and "\x1b[" not in proc.stdout and "qwen" not in proc.stderr


def test_quiet_prints_nothing_but_keeps_the_exit_code(cli: Any, tmp_path: Path) -> None:
    res = cli("--quiet", "inspect", _adapter(tmp_path / "a"))
    assert res.exit_code == 0 and res.stdout == ""


def test_internal_errors_exit_4_with_one_line_asking_for_a_report(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (here an injected RuntimeError in the library call: the error mapping is what is under test) is exit 4,
    not 3: CI must not read it as "your input is bad"."""
    import adapterdoc.inspection as mod

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("synthetic failure")

    monkeypatch.setattr(mod, "inspect", boom)
    res = cli("inspect", _adapter(tmp_path / "a"))
    assert res.exit_code == 4 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.startswith("adapterdoc: error: internal error (a bug in adapterdoc")
    assert (
        "RuntimeError: synthetic failure" in res.stderr
        and "report it with the output of --debug" in res.stderr
    )
    res = cli("--debug", "inspect", tmp_path / "a")
    assert res.exit_code == 4 and "Traceback" in res.stderr and "synthetic failure" in res.stderr
    assert res.stderr.rstrip().splitlines()[-1].startswith("adapterdoc: error: internal error")


def test_quiet_and_debug_after_the_command(cli: Any, tmp_path: Path) -> None:
    a = _adapter(tmp_path / "a")
    loud = cli("inspect", a)
    assert loud.exit_code == 0 and loud.stdout
    for args in (("inspect", a, "-q"), ("inspect", "-q", a), ("inspect", a, "--quiet")):
        res = cli(*args)
        assert res.exit_code == 0 and res.stdout == "", args
    res = cli("inspect", tmp_path / "missing", "--debug")
    assert res.exit_code == 3 and "Traceback" in res.stderr


def test_help_lists_input_forms_and_exit_codes(cli: Any) -> None:
    top = cli("--help").stdout
    assert "Exit codes:" in top and "4    an internal error" in top and "130" in top
    for command in ("inspect", "remap", "verify", "merge", "roundtrip"):
        text = cli(command, "--help").stdout
        for form in (
            "FILE.safetensors",
            "adapter folder",
            "sharded checkpoint folder",
            "org/name[@revision]",
        ):
            assert form in text, (command, form)
        assert "hf://" in text


def test_debug_keeps_exit_3_and_the_json_object(cli: Any, tmp_path: Path) -> None:
    res = cli("--debug", "inspect", tmp_path / "missing", "--json")
    assert res.exit_code == 3
    assert json.loads(res.stdout)["ok"] is False
    assert "Traceback" in res.stderr and res.stderr.rstrip().endswith("no such file or directory")


def test_verify_output_file_never_overwrites_an_input(cli: Any, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    adapter = _adapter(tmp_path / "a")
    before = {p.name: p.read_bytes() for p in adapter.iterdir()}
    for target in (
        adapter / "adapter_config.json",
        adapter / "adapter_model.safetensors",
        adapter / "report.xml",
    ):
        res = cli(
            "verify", adapter, "--base", "tiny:qwen3_5_text", "--format", "junit", "--output-file", target
        )
        assert res.exit_code == 3 and "--output-file" in res.stderr
    assert {p.name: p.read_bytes() for p in adapter.iterdir()} == before
    res = cli("verify", adapter, "--base", "tiny:qwen3_5_text", "--output-file", tmp_path / "no" / "x.xml")
    assert res.exit_code == 3 and "does not exist" in res.stderr and "internal error" not in res.stderr


def test_verify_exit_zero_keeps_the_json_contract(cli: Any, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    adapter = _adapter(tmp_path / "a")
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["r"] = 16  # rank mismatch: an error finding
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    res = cli("verify", adapter, "--base", "tiny:qwen3_5_text", "--json")
    assert res.exit_code == 1 and json.loads(res.stdout)["ok"] is False
    res = cli("verify", adapter, "--base", "tiny:qwen3_5_text", "--json", "--exit-zero")
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["ok"] is True and out["passed"] is False


def test_remap_out_inside_the_input_is_refused(cli: Any, tmp_path: Path) -> None:
    adapter = _adapter(tmp_path / "a")
    res = cli("remap", adapter, "--rule", "q_proj=>k_proj", "--out", adapter / "sub")
    assert res.exit_code == 3 and "inside the input" in res.stderr
    assert not (adapter / "sub").exists()


def test_quiet_verify_prints_only_its_errors(cli: Any, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    adapter = _adapter(tmp_path / "a")
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["r"] = 16  # a rank mismatch: an error finding
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    res = cli("--quiet", "verify", adapter, "--base", "tiny:qwen3_5_text")
    assert res.exit_code == 1 and res.stdout == ""
    assert res.stderr and all(" AD" in line for line in res.stderr.splitlines())


def test_every_listed_command_module_exists_and_registers() -> None:
    import importlib.util

    from adapterdoc.commands import COMMANDS, MODULES, load_all

    for name in MODULES:
        assert importlib.util.find_spec(f"adapterdoc.commands.{name}") is not None, name
    assert [c.name for c in load_all()] == list(COMMANDS)


def test_a_missing_command_module_is_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import adapterdoc.commands as catalogue

    monkeypatch.setitem(catalogue.COMMANDS, "no-such", ("no_such_cmd", "A command whose module is missing."))
    with pytest.raises(ImportError):
        catalogue.load_all()


def test_the_format_choices_are_the_registry_s() -> None:
    from adapterdoc.commands.options import ALL_FORMATS
    from adapterdoc.report.formats import FORMATS

    assert ALL_FORMATS == FORMATS


def test_json_error_is_the_one_envelope(tmp_path: Path, cli: Any) -> None:
    res = cli("inspect", tmp_path / "missing", "--json")
    assert res.exit_code == 3
    d = json.loads(res.stdout)
    assert list(d) == ["ok", "findings", "error"] and d["ok"] is False
    assert d["findings"][0]["code"] == "AD100" and d["findings"][0]["path"]
