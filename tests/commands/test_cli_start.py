"""What ``adapterdoc inspect --json`` imports in a fresh process (issue 26, row 4): the modules only other commands
or outputs need stay out of its start, and the output is the one the full imports give."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.commands.test_cli_lazy import run_fresh
from tests.small_adapters import write_small_adapter

NOT_AT_START = (
    "typing_extensions",  # commands.options needs `Self` for its annotations only
    "difflib",  # adapter.config's typo suggestions
    "shlex",  # layouts.moves' remap commands in findings
    "adapterdoc.bases",  # open_checkpoint of a repo id, not of a path
    "adapterdoc.report.audit_report",  # --weights
    "adapterdoc.report.render",  # the text renderers (to_json lives in report.base)
    "adapterdoc.formats.mlx",  # a file is no MLX folder and holds no GGUF magic (formats.SCREENS)
    "adapterdoc.formats.mlx.plan",
    "adapterdoc.formats.gguf",
    "adapterdoc.formats.gguf.header",
    "adapterdoc.codes.serving",  # get_code reads the area module of the code it is asked for
    "adapterdoc.codes.convert",
    "adapterdoc.codes.weights",
    "rich",  # --json prints no rich text
    "adapterdoc.layouts.moves",  # renames between layouts: remap, verify, the engines (layouts.__getattr__)
    "adapterdoc.st.atomic",
)


_run = run_fresh


def test_inspect_json_leaves_other_commands_modules_out(tmp_path: Path) -> None:
    adapter = write_small_adapter(tmp_path / "a") / "adapter_model.safetensors"  # a file, as row 4 reads
    res = _run("inspect", "--json", str(adapter))
    loaded = set(res["loaded"])  # type: ignore[arg-type]
    assert not loaded & set(NOT_AT_START), sorted(loaded & set(NOT_AT_START))
    assert "adapterdoc.codes.keys" in loaded  # the AD2xx finding it made came from its area module
    body = json.loads(str(res["out"]))
    assert body["tensors"] == 2 and body["lora"]["modules"] == 1


def test_get_code_by_area_is_the_catalogue_s_code(monkeypatch: pytest.MonkeyPatch) -> None:
    import adapterdoc.codes as codes

    full = dict(codes.catalogue())
    monkeypatch.setattr(codes, "_CATALOGUE", None)  # as in a fresh process: the area route
    monkeypatch.setattr(codes, "_BY_AREA", {})
    for code, info in full.items():
        assert codes.get_code(code) is info
        assert codes.get_code(code.lower()) is info
    assert codes._CATALOGUE is None  # every code was found in its own area module
    with pytest.raises(KeyError, match="AD999"):
        codes.get_code("AD999")


def test_get_code_reads_one_area_module_first() -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, adapterdoc.codes as c; i = c.get_code('AD209'); "
            "print(i.code, sorted(m for m in sys.modules if m.startswith('adapterdoc.codes.')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert p.stdout.split(" ", 1) == ["AD209", "['adapterdoc.codes.keys']\n"]


def test_reading_a_header_and_its_facts_leaves_the_collector_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Library code never switches the cyclic garbage collector (only the program's exit freezes it)."""
    import gc

    from adapterdoc.checkpoint import open_checkpoint
    from adapterdoc.facts import header_facts

    def refuse() -> None:
        raise AssertionError("the collector was switched")

    monkeypatch.setattr(gc, "disable", refuse)
    monkeypatch.setattr(gc, "enable", refuse)
    assert gc.isenabled()
    facts = header_facts(open_checkpoint(write_small_adapter(tmp_path / "a")))
    assert gc.isenabled() and facts.lora is not None and facts.lora.modules == 1


_AS_PROGRAM = """
import atexit, gc, runpy, sys
atexit.register(lambda: sys.stderr.write(f"\\nfrozen={gc.get_freeze_count()}\\n"))
sys.argv = ["adapterdoc", *sys.argv[2:]]
if sys.argv_mode == "module":
    runpy.run_module("adapterdoc", run_name="__main__", alter_sys=True)
else:
    from adapterdoc.precommit import precommit_script
    precommit_script()
"""


def _as_program(mode: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = _AS_PROGRAM.replace("sys.argv_mode", repr(mode))
    return subprocess.run([sys.executable, "-c", code, "-", *args], capture_output=True, text=True)


def test_the_program_exits_without_the_last_collection_and_keeps_output_and_exit_code(
    tmp_path: Path, cli: Any
) -> None:
    """``python -m adapterdoc`` (and the script, ``cli.run``) freezes the collector once the command is done: the
    atexit hooks still run after it, the report and exit code are those of ``main`` in-process, and a failure is
    still one line and exit 3. The pre-commit script does the same; in-process ``main`` freezes nothing."""
    import gc

    adapter = write_small_adapter(tmp_path / "a")
    res = _as_program("module", "inspect", "--json", str(adapter))
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines()[-1] != "frozen=0" and "frozen=" in res.stderr
    in_process = cli("inspect", "--json", str(adapter))
    assert json.loads(res.stdout) == json.loads(in_process.stdout) and in_process.exit_code == 0
    assert gc.get_freeze_count() == 0

    missing = _as_program("module", "inspect", "--json", str(tmp_path / "nope"))
    assert missing.returncode == 3 and "frozen=" in missing.stderr and missing.stderr.count("Traceback") == 0
    assert json.loads(missing.stdout)["ok"] is False

    hook = _as_program("hook", "--", str(adapter / "adapter_config.json"))
    assert "frozen=" in hook.stderr and hook.stderr.strip().splitlines()[-1] != "frozen=0", hook.stderr


@pytest.mark.parametrize(("mode", "collected"), [("none", True), ("disable", True), ("freeze", False)])
def test_cpython_s_exit_collects_unless_the_objects_are_frozen(mode: str, collected: bool) -> None:
    """The fact ``cli.as_program`` stands on (CPython 3.11, probed): the interpreter's exit runs one last full
    collection, ``gc.disable()`` or not (a cycle's finalizer still runs), and skips what ``gc.freeze()`` moved to
    the permanent generation. So a command's cyclic garbage is not finalized at the program's exit; nothing of
    adapterdoc's needs it (every temp file and folder is removed in a ``finally``)."""
    code = (
        "import gc, sys\n"
        "class C:\n"
        "    def __del__(self): sys.stdout.write('collected')\n"
        "c = C(); c.self = c; del c\n"
        f"mode = {mode!r}\n"
        "if mode == 'disable': gc.disable()\n"
        "if mode == 'freeze': gc.freeze()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert (out == "collected") is collected
