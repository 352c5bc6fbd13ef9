"""The lazy command group: ``adapterdoc --help`` lists every command from :data:`adapterdoc.commands.COMMANDS`
without importing one, each table line matches its real command (name, and the short help click makes from it
at any width), every ``*_cmd.py`` module is in the table, and running a command imports only its own module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click

import adapterdoc.commands as catalogue
from adapterdoc.commands import COMMANDS, load


def test_each_table_line_is_its_command_s_name_and_help() -> None:
    for name, (_, text) in COMMANDS.items():
        real = load(name)
        assert real.name == name and not real.short_help
        stub = click.Command(name, help=text)
        for limit in range(10, 240, 7):
            assert stub.get_short_help_str(limit) == real.get_short_help_str(limit), (name, limit)


def test_every_command_module_is_in_the_table() -> None:
    folder = Path(catalogue.__file__).parent
    on_disk = {p.stem for p in folder.glob("*_cmd.py")}
    assert on_disk == set(catalogue.MODULES)


CHILD = """
import io, json, sys
from contextlib import redirect_stdout
from adapterdoc.cli import main
out = io.StringIO()
with redirect_stdout(out):
    try:
        main(sys.argv[1:], prog_name="adapterdoc")
    except SystemExit:
        pass
print(json.dumps({"out": out.getvalue(), "loaded": sorted(sys.modules)}))
"""


def run_fresh(*args: str) -> dict[str, object]:
    """``adapterdoc ARGS`` in a fresh interpreter: its stdout (``out``) and every module it had imported
    (``loaded``), for the tests of what a command's start imports."""
    p = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _run(*args: str) -> dict[str, object]:
    res = run_fresh(*args)
    loaded = res["loaded"]
    res["loaded"] = [m for m in loaded if m.startswith("adapterdoc.commands.") and m.endswith("_cmd")]  # type: ignore[union-attr]
    return res


def test_help_lists_every_command_and_imports_none() -> None:
    res = _run("--help")
    assert res["loaded"] == []
    listed = [
        line.split()[0]
        for line in str(res["out"]).split("Commands:")[1].split("\n\n")[0].splitlines()
        if line
    ]
    assert listed == sorted(COMMANDS)


def test_a_command_imports_only_its_own_module() -> None:
    res = _run("explain", "AD301")
    assert res["loaded"] == ["adapterdoc.commands.explain_cmd"] and "AD301" in str(res["out"])
