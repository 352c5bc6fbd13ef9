"""The README and docs/ pages say what the code does: the README is short, its generated tables are current, every
link resolves, every example names real commands and options, and the tour's commands exit as it shows."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
sys.path.insert(0, str(ROOT / "scripts"))

import render_readme  # noqa: E402

from adapterdoc import __version__  # noqa: E402
from adapterdoc.cli import main  # noqa: E402


def test_the_readme_reads_in_minutes():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_the_generated_tables_are_current():
    # the commands table comes from click, the layouts table from the registry, the layer picture from
    # adapterdoc/layers.py, the package table from the source tree: a new command, option, layout, layer or module
    # without `python scripts/render_readme.py` fails here (and in CI's `--check`)
    blocks = {
        "commands": render_readme.commands(),
        "layouts": render_readme.layouts(),
        "layers": render_readme.layers(),
        "packages": render_readme.packages(),
    }
    stale = render_readme.render(blocks, check=True)
    assert stale == []


def test_the_commands_table_lists_every_command():
    table = render_readme.commands()
    ctx = click.Context(main, info_name="adapterdoc")
    for name in main.list_commands(ctx):
        assert f"`adapterdoc {name}" in table
    assert "`--profile`" in table and "`--base`" in table


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    missing = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (page.parent / target).exists():
            missing.append(target)
    assert missing == []


def _examples(text: str) -> list[list[str]]:
    """Each ``adapterdoc ...`` command line inside a bash/text code block, as argv (comments dropped)."""
    out = []
    for block in re.findall(r"```(?:bash|text|sh)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.strip().removeprefix("$ ")
            for part in re.split(r"&&|\|\||;", line):
                part = part.split(" #")[0].strip()
                if part.startswith("adapterdoc "):
                    try:
                        out.append(shlex.split(part)[1:])
                    except ValueError:  # an unbalanced quote inside a comment-free fragment: not an example
                        continue
    return out


def _options(cmd: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for p in cmd.params:
        names.update(getattr(p, "opts", []))
        names.update(getattr(p, "secondary_opts", []))
    return names


EXAMPLES = [(page, argv) for page in PAGES for argv in _examples(page.read_text(encoding="utf-8"))]


def test_the_examples_are_found():
    assert len(EXAMPLES) > 20


@pytest.mark.parametrize(
    "page,argv", EXAMPLES, ids=[f"{p.relative_to(ROOT).as_posix()}:{' '.join(a)[:50]}" for p, a in EXAMPLES]
)
def test_each_example_names_a_real_command_and_options(page, argv):
    ctx = click.Context(main, info_name="adapterdoc")
    args = [a for a in argv if a not in ("-q", "--quiet", "--debug")]
    if args[0] == "--version":
        return
    cmd = main.get_command(ctx, args[0])
    assert cmd is not None, f"{page.name}: no command {args[0]!r}"
    known = _options(cmd)
    unknown = [a.split("=")[0] for a in args[1:] if a.startswith("--") and a.split("=")[0] not in known]
    assert unknown == [], f"{page.name}: `adapterdoc {' '.join(argv)}` uses options {cmd.name} does not have"


def test_the_documented_release_is_this_version():
    # the pre-commit `rev:` and the Action's `@vX.Y.Z` in the README name the tag the release steps create
    text = README.read_text(encoding="utf-8")
    revs = set(re.findall(r"rev: (v[\w.]+)", text)) | set(re.findall(r"OWNER/adapterdoc@(v[\w.]+)", text))
    assert revs == {f"v{__version__}"}


def test_the_tour_exits_as_it_shows(tmp_path, monkeypatch, cli):
    # the quickstart block is generated from these very commands; their exit codes and the lines that carry the
    # verdict must still be what the README shows
    text = README.read_text(encoding="utf-8")
    block = text.split("<!-- BEGIN generated:quickstart", 1)[1].split("<!-- END generated:quickstart", 1)[0]
    runs = re.findall(r"^\$ (adapterdoc .+?)\n(.*?)\[exit code (\d+)\]", block, re.S | re.M)
    assert [c for c, _, _ in runs] == render_readme.QUICKSTART
    monkeypatch.chdir(tmp_path)
    for command, shown, code in runs:
        res = cli(*shlex.split(command)[1:], env={"NO_COLOR": "1", "COLUMNS": "80"})
        assert res.exit_code == int(code), (command, res.output[-2000:])
        verdict = [line for line in shown.splitlines() if line.startswith(("OK ", "FAIL ", "no findings"))]
        for line in verdict:
            assert line in res.output, (command, line)


FILE = re.compile(
    r"`((?:adapterdoc|tests|scripts|benchmarks|fixtures|docs|\.ci)/[\w./-]+\.(?:py|md|sh|json|jsonl))`"
)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_named_file_exists(page):
    # a page that names `adapterdoc/layouts.py` after the registry became a package sends a newcomer nowhere
    missing = sorted({f for f in FILE.findall(page.read_text(encoding="utf-8")) if not (ROOT / f).exists()})
    assert missing == []
