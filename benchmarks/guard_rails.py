"""What users feel, measured beside an older source tree in one run: the guard rails of a change that should not
make anything slower.

Each row runs one command in a fresh process, alternately with this tree's ``adapterdoc`` and the tree given by
``--before`` (a ``git worktree`` of the commit to compare with: ``git worktree add /tmp/before <commit>``), each on
``PYTHONPATH`` so both import the same way, both with their bytecode compiled first (``PYTHONDONTWRITEBYTECODE``
may be set), with the input in the page cache. Medians of ``--repeat`` runs (the fast
``inspect`` row gets 5× as many); wall time from the parent, CPU time and peak RSS from ``os.wait4``.

Rows and their limits (after / before):

- ``inspect --json``, fresh process, on the 4096-tensor file of ``inspect_speed.py`` (header only): ≤ 1.15
- ``verify --json`` of the ~397B Qwen3.5-MoE case of ``verify_scale.py`` (60 layers × 512 experts, r=2): ≤ 1.10
- ``merge`` of ``merge_memory.py``'s plain Llama (a family outside the registry), ``--gib`` GiB: ≤ 1.05
- ``inspect --weights --json`` of ``audit_speed.py``'s 1 GiB BF16 r=128 adapter: ≤ 1.05

The inputs are built once with this tree's benchmark builders (torch and PEFT needed for verify's and merge's).

    python benchmarks/guard_rails.py --before /tmp/before [--repeat 3] [--gib 1.1] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LIMITS = {"inspect --json": 1.15, "verify 397B": 1.10, "merge": 1.05, "inspect --weights": 1.05}


def build(work: Path, gib: float) -> dict[str, list[str]]:
    """Each row's command line (after ``python -m adapterdoc``), its inputs written under ``work``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows: dict[str, list[str]] = {}

    big = work / "inspect" / "big.safetensors"
    if not big.exists():
        big.parent.mkdir(parents=True, exist_ok=True)
        code = "import sys; sys.path.insert(0, sys.argv[1]); import inspect_speed as s; s.write_file(__import__('pathlib').Path(sys.argv[2]), 0.5, 4096)"
        subprocess.run([sys.executable, "-c", code, str(HERE), str(big)], check=True, env=env)
    rows["inspect --json"] = ["inspect", str(big), "--json"]

    scale = work / "verify"
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import verify_scale as v\n"
        "name = 'qwen3_5_moe 60L x 512E (397B)'\n"
        "print(json.dumps(v.cached_case(sys.argv[2], name, v.CASES[name], False, True)))\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(HERE), str(scale)], check=True, env=env, capture_output=True
    )
    case = next(p for p in scale.iterdir() if p.is_dir())
    rows["verify 397B"] = ["verify", str(case / "adapter"), "--base", str(case / "base"), "--json"]

    merge = work / "merge"
    stamp = merge / "built.json"
    if not stamp.exists():
        merge.mkdir(parents=True, exist_ok=True)
        made = subprocess.run(
            [
                sys.executable,
                str(HERE / "merge_memory.py"),
                "--build-only",
                "--gib",
                str(gib),
                "--family",
                "llama",
                "--workdir",
                str(merge),
            ],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        )
        stamp.write_text(made.stdout.strip().splitlines()[-1])
    base, adapter, _ = json.loads(stamp.read_text())
    rows["merge"] = ["merge", adapter, "--base", base, "--out", str(merge / "out"), "--json"]

    audit = work / "audit" / "adapter"
    if not (audit / "adapter_model.safetensors").exists():
        subprocess.run(
            [sys.executable, str(HERE / "audit_speed.py"), "--build-only", str(audit), "--gib", "1.0"],
            check=True,
            capture_output=True,
            env=env,
        )
    rows["inspect --weights"] = ["inspect", str(audit / "adapter_model.safetensors"), "--weights", "--json"]
    return rows


def warm(args: list[str]) -> None:
    """Read every existing input file of a command once (the page cache warm, as a user's second run)."""
    for a in args:
        p = Path(a)
        files = [p] if p.is_file() else sorted(p.glob("*")) if p.is_dir() else []
        for f in files:
            if f.is_file():
                with open(f, "rb") as fh:
                    while fh.read(1 << 24):
                        pass


def run(tree: Path, args: list[str], out: Path | None) -> tuple[float, float, int, int]:
    """(wall s, CPU s, peak RSS bytes, exit code) of ``python -m adapterdoc ARGS`` importing from ``tree``."""
    if out is not None:
        shutil.rmtree(out, ignore_errors=True)
    warm(args)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapterdoc", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if code not in (0, 1):  # 1: findings (the 397B case's random factors may give some); anything else failed
        raise SystemExit(f"{tree}: adapterdoc {' '.join(args[:2])} exit {code}:\n{err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the source tree to compare with (a git worktree)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gib", type=float, default=1.1, help="merge base size")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--only", action="append", help="rows whose name contains this (repeatable)")
    args = ap.parse_args()
    before = Path(args.before).resolve()
    if not (before / "adapterdoc" / "__init__.py").exists():
        raise SystemExit(f"--before {before}: no adapterdoc/ there")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="adapterdoc-guard-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        rows = build(work, args.gib)
        print(f"inputs in {work} ({time.perf_counter() - t0:.0f} s to build)")
        trees = {"before": before, "after": ROOT}
        for tree in trees.values():  # bytecode compiled in both, as an installed package has it
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "adapterdoc")], check=True)
        print(
            f"before: {before} ({_commit(before)})  after: {ROOT} ({_commit(ROOT)})  cores: {os.cpu_count()}"
        )
        print()
        print(
            "| row | before wall (s) | after wall (s) | after/before | limit | CPU after/before | RSS after/before |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        failed = 0
        for name, cmd in rows.items():
            if args.only and not any(o in name for o in args.only):
                continue
            out = Path(cmd[cmd.index("--out") + 1]) if "--out" in cmd else None
            n = args.repeat * (5 if name == "inspect --json" else 1)
            got: dict[str, list[tuple[float, float, int, int]]] = {k: [] for k in trees}
            codes = set()
            for i in range(n):
                for which in trees if i % 2 == 0 else list(trees)[::-1]:
                    r = run(trees[which], cmd, out)
                    got[which].append(r)
                    codes.add((which, r[3]))
            wall = {k: statistics.median(x[0] for x in v) for k, v in got.items()}
            cpu = {k: statistics.median(x[1] for x in v) for k, v in got.items()}
            rss = {k: statistics.median(x[2] for x in v) for k, v in got.items()}
            ratio = wall["after"] / wall["before"]
            ok = ratio <= LIMITS[name]
            failed += not ok
            exits = {c for w, c in codes if w == "after"} == {c for w, c in codes if w == "before"}
            print(
                f"| {name} | {wall['before']:.3f} | {wall['after']:.3f} | {ratio:.3f} {'✓' if ok else '✗'} | "
                f"≤ {LIMITS[name]:.2f} | {cpu['after'] / cpu['before']:.3f} | {rss['after'] / rss['before']:.3f} |"
                + ("" if exits else f" exit codes differ: {sorted(codes)}")
            )
        return 1 if failed else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


def _commit(tree: Path) -> str:
    r = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
