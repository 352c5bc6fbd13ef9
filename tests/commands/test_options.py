"""The options several commands share are declared once, in ``adapterdoc.commands.options`` (issue 28): no command
module spells ``--base``, ``--out``, ``--dtype`` or the output options itself, each shared option looks the same in
every command that takes it, and the command modules hold no library work (the ``[tool.adapterdoc]`` loader and
inspect's weights audit live below them)."""

from __future__ import annotations

import ast
from pathlib import Path

import click

import adapterdoc.commands as catalogue
from adapterdoc.commands import COMMANDS, load

SHARED = (
    "--base",
    "--out",
    "--dtype",
    "--data",
    "--steps",
    "--seed",
    "--batch-size",
    "--max-length",
    "--force",
)
OUTPUT = ("--format", "--json", "--output-file")
FOLDER = Path(catalogue.__file__).parent


def _declared(path: Path) -> set[str]:
    """The option names a module passes to ``click.option(...)`` itself."""
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
    options = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "option"]
    return {
        a.value for c in options for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
    }


def test_no_command_module_declares_a_shared_option() -> None:
    assert _declared(FOLDER / "options.py") >= {*SHARED, *OUTPUT}
    for path in sorted(FOLDER.glob("*_cmd.py")):
        declared = _declared(path) & {*SHARED, *OUTPUT}
        assert not declared, (path.name, declared)


def _options(name: str) -> dict[str, click.Option]:
    return {o: p for p in load(name).params if isinstance(p, click.Option) for o in p.opts}


def test_a_shared_option_is_the_same_in_every_command() -> None:
    seen: dict[str, set[tuple[str, str, bool]]] = {}
    for name in COMMANDS:
        for opt, p in _options(name).items():
            if opt in SHARED + OUTPUT:
                kind = type(p.type).__name__ if opt != "--out" else repr(getattr(p.type, "readable", None))
                seen.setdefault(opt, set()).add((p.name or "", kind, p.is_flag))
    assert set(seen) == set(SHARED + OUTPUT)
    for opt, shapes in seen.items():
        assert len({(n, flag) for n, _, flag in shapes}) == 1, (opt, shapes)
    assert seen["--out"] == {
        ("out", "False", False)
    }  # click checks nothing: the library's output rules refuse
    for name in COMMANDS:
        base = _options(name).get("--base")
        if base is not None:
            assert base.metavar == "BASE", name


def test_command_modules_hold_no_library_work() -> None:
    verify_src = (FOLDER / "verify_cmd.py").read_text()
    assert "tomllib" not in verify_src and "def project_defaults" not in verify_src
    inspect_src = (FOLDER / "inspect_cmd.py").read_text()
    assert "audit" not in inspect_src.replace("--weights", "")
    from adapterdoc.verify.project import TABLE_KEYS, project_defaults

    assert callable(project_defaults) and "max-lora-rank" in TABLE_KEYS
