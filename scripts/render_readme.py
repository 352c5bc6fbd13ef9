"""Regenerate the README's generated blocks from real runs: quickstart output, the layout table, the codes, the matrix.

python scripts/render_readme.py            # quickstart, layouts, codes
python scripts/render_readme.py --matrix   # also the layout x operation matrix (a few minutes)
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


def codes() -> str:
    from adapterdoc.codes import catalogue

    lines = ["| code | name | severity | meaning |", "| --- | --- | --- | --- |"]
    for c in catalogue().values():
        summary = c.summary.replace("|", "\\|")
        lines.append(f"| `{c.code}` | {c.name} | {c.severity} | {summary} |")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--matrix", action="store_true")
    args = parser.parse_args()
    text = README.read_text()
    text = replace_block(text, "quickstart", quickstart())
    text = replace_block(text, "layouts", layouts())
    text = replace_block(text, "codes", codes())
    if args.matrix:
        text = replace_block(text, "matrix", matrix())
    README.write_text(text)
    print("README.md updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
