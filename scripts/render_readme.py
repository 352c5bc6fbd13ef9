"""Regenerate the generated blocks of README.md and docs/*.md: the quickstart (from real runs), the commands table
(from click), the layout table, the layer picture and the package table (docs/architecture.md), the matrix.

python scripts/render_readme.py            # quickstart, commands, layouts, layers, packages
python scripts/render_readme.py --matrix   # also the layout x operation matrix (a few minutes)
python scripts/render_readme.py --check    # exit 1 if a table or picture other than the quickstart is stale (CI)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
"""Every file whose generated blocks this script writes; a block lives in exactly one of them."""

QUICKSTART = [
    "adapterdoc train-smoke --layout qwen3_5_vl --steps 8 --out runs/quick",
    "adapterdoc inspect runs/quick/qwen3_5_vl/adapter",
    "adapterdoc verify runs/quick/qwen3_5_vl/adapter --base tiny:qwen3_5_text",
    "adapterdoc remap runs/quick/qwen3_5_vl/adapter --vl --out runs/quick/text-adapter",
    "adapterdoc verify runs/quick/text-adapter --base tiny:qwen3_5_text --profile vllm",
]


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(
        rf"(<!-- BEGIN (?:generated|section):{name}[^>]*-->\n)(.*?)(<!-- END (?:generated|section):{name} -->)",
        re.S,
    )
    if not pattern.search(text):
        raise SystemExit(f"README has no block {name!r}")
    return pattern.sub(lambda m: m[1] + body.rstrip("\n") + "\n" + m[3], text)


def quickstart() -> str:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80", "TERM": "dumb", "PYTHONPATH": str(ROOT)}
    out = []
    with tempfile.TemporaryDirectory() as work:
        for cmd in QUICKSTART:
            argv = shlex.split(
                cmd
            )  # `adapterdoc ...` runs as this interpreter's module (this checkout's code)
            argv = [sys.executable, "-m", "adapterdoc", *argv[1:]] if argv[0] == "adapterdoc" else argv
            proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True)
            text = (proc.stdout + proc.stderr).replace(work + "/", "").rstrip()
            text = "\n".join(line.rstrip() for line in text.splitlines())
            out.append(f"$ {cmd}\n{text}\n[exit code {proc.returncode}]")
    return "```text\n" + "\n\n".join(out) + "\n```\n"


def layouts() -> str:
    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.ml.tiny import TINY_LAYOUTS

    lines = [
        "| layout | transformers class | what it is | moves to | tiny model |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, lay in LAYOUTS.items():
        moves = ", ".join(f"`{t}`" for t in lay.remaps) or "—"
        tiny = "yes" if name in TINY_LAYOUTS else "no"
        lines.append(f"| `{name}` | `{lay.model_class}` | {lay.description} | {moves} | {tiny} |")
    return "\n".join(lines) + "\n"


def commands() -> str:
    """One row per command, from click itself: its usage line and its short help."""
    import click

    from adapterdoc.cli import main

    ctx = click.Context(main, info_name="adapterdoc")
    lines = ["| command | what it does | options |", "| --- | --- | --- |"]
    shared = {"--help", "-h", "--quiet", "-q", "--debug"}
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        args = " ".join(
            p.make_metavar(click.Context(cmd)) for p in cmd.params if isinstance(p, click.Argument)
        )
        opts = [o for p in cmd.params if isinstance(p, click.Option) for o in p.opts if o.startswith("--")]
        options = ", ".join(f"`{o}`" for o in opts if o not in shared)
        short = cmd.get_short_help_str(limit=300).replace("|", "\\|")
        usage = f"adapterdoc {name} {args}".rstrip()
        lines.append(f"| `{usage}` | {short} | {options} |")
    return "\n".join(lines) + "\n"


def matrix() -> str:
    import time

    from adapterdoc.matrix import render_markdown, run_matrix

    t = time.perf_counter()
    cells = run_matrix()
    return (
        render_markdown(cells)
        + f"\n({len(cells)} cells in {time.perf_counter() - t:.0f} s on this 2-core machine.)\n"
    )


def layers() -> str:
    """The layer picture of docs/architecture.md, top first, from adapterdoc/layers.py."""
    from adapterdoc.layers import LAYERS

    def name(member: str) -> str:
        path = ROOT / "adapterdoc" / member
        return f"{member}/" if path.is_dir() else f"{member}.py"

    rows = [(title, "  ".join(name(m) for m in members), what) for title, what, members in LAYERS]
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    out = [f"{t:<{w1}}  {m:<{w2}}  {w}".rstrip() for t, m, w in rows]
    out.insert(
        0, f"{'layer':<{w1}}  {'adapterdoc/':<{w2}}  holds (imports only from its own row and the rows below)"
    )
    return "```\n" + "\n".join(out) + "\n```\n"


def _first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, its reST roles and double backquotes made Markdown."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    para = " ".join(doc.split("\n\n", 1)[0].split())
    m = re.match(r"(.+?[.?!])(?=\s|$)", para)
    text = m[1] if m else para
    text = re.sub(r":\w+:`~[^`]*?([^.`]+)`", r"`\1`", text)  # :class:`~a.b.C` -> `C`
    text = re.sub(r":\w+:`\.?([^`]+)`", r"`\1`", text)  # :mod:`a.b` -> `a.b`
    return text.replace("``", "`").replace("|", "\\|")


def packages() -> str:
    """The package table of docs/architecture.md, in the layer order of adapterdoc/layers.py (top first): one row per
    top-level module and per package or subpackage, with its docstring's first sentence and a package's modules."""
    from adapterdoc.layers import LAYERS

    pkg = ROOT / "adapterdoc"

    def rows(path: Path) -> list[str]:
        name = f"`{path.relative_to(ROOT).as_posix()}{'/' if path.is_dir() else ''}`"
        if not path.is_dir():
            return [f"| {name} | {_first_sentence(path)} | |"]
        subs = sorted(d for d in path.iterdir() if (d / "__init__.py").is_file())
        mods = sorted(f.name for f in path.glob("*.py") if f.name != "__init__.py")
        listed = ", ".join(f"`{m}`" for m in [*mods, *(f"{d.name}/" for d in subs)])
        out = [f"| {name} | {_first_sentence(path / '__init__.py')} | {listed} |"]
        for sub in subs:
            out += rows(sub)
        return out

    lines = ["| adapterdoc/ | holds | modules |", "| --- | --- | --- |"]
    for _, _, members in LAYERS:
        for member in members:
            path = pkg / member if (pkg / member).is_dir() else pkg / f"{member}.py"
            lines += rows(path)
    return "\n".join(lines) + "\n"


def has_block(text: str, name: str) -> bool:
    return f"<!-- BEGIN generated:{name}" in text or f"<!-- BEGIN section:{name}" in text


def render(blocks: dict[str, str], *, check: bool = False) -> list[Path]:
    """Write each block into the page that holds it; with ``check``, write nothing and return the stale pages."""
    stale, placed = [], set()
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        new = text
        for name, body in blocks.items():
            if has_block(new, name):
                new = replace_block(new, name, body)
                placed.add(name)
        if new != text:
            stale.append(page)
            if not check:
                page.write_text(new, encoding="utf-8")
    missing = set(blocks) - placed
    if missing:
        raise SystemExit(f"no page has the block(s) {', '.join(sorted(missing))}")
    return stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--matrix", action="store_true")
    parser.add_argument("--check", action="store_true", help="compare the commands and layouts tables only")
    args = parser.parse_args()
    blocks = {"commands": commands(), "layouts": layouts(), "layers": layers(), "packages": packages()}
    if args.check:
        stale = render(blocks, check=True)
        for page in stale:
            print(
                f"{page.relative_to(ROOT)} is out of date; run python scripts/render_readme.py",
                file=sys.stderr,
            )
        return 1 if stale else 0
    blocks["quickstart"] = quickstart()
    if args.matrix:
        blocks["matrix"] = matrix()
    for page in render(blocks):
        print(f"{page.relative_to(ROOT)} updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
