"""`adapterdoc train-smoke --layout all` on this machine: total wall time against the 120 s budget, and where it goes.

    python benchmarks/train_smoke.py [--steps N] [--reps N] [--threads-anchor]

Each repetition runs the real CLI in a fresh process (cold imports, ``--json``) and reads its per-layout seconds
(training and the doctor checks). Anchors in the same run: a fresh process that only imports torch, transformers,
peft and accelerate (the floor every ML command pays), and the 120 s budget. ``--threads-anchor`` also runs the
library once with torch's default intra-op thread count instead of train-smoke's single thread. Medians over
``--reps``; the machine's load average is printed because other processes change the numbers a lot on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BUDGET_S = 120.0
IMPORTS = "import torch, transformers, peft, accelerate"


def _env() -> dict[str, str]:
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def cold_import_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True, env=_env(), capture_output=True)
    return time.perf_counter() - t0


def cli_run(steps: int | None) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as out:
        cmd = [sys.executable, "-m", "adapterdoc", "train-smoke", "--layout", "all", "--out", out, "--json"]
        if steps is not None:
            cmd += ["--steps", str(steps)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        sys.exit(f"train-smoke failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout)


def library_run(steps: int | None, threads: int | None) -> dict:
    code = (
        "import json, sys; from adapterdoc.smoke import run_smoke; from adapterdoc.train.settings import "
        f"TrainSettings; r = run_smoke(settings=TrainSettings(threads={threads!r}), steps={steps!r}); "
        "print(json.dumps(r.to_dict()))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="steps per layout (default: train-smoke's own)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads-anchor", action="store_true")
    a = ap.parse_args()

    print(f"machine: {os.cpu_count()} CPUs, load average before: {os.getloadavg()[0]:.2f}")
    imports = statistics.median(cold_import_seconds() for _ in range(max(1, a.reps)))
    runs = [cli_run(a.steps) for _ in range(max(1, a.reps))]
    walls = [w for w, _ in runs]
    doc = runs[len(runs) // 2][1]
    rows = doc["layouts"]

    print(
        f"\ntrain-smoke --layout all ({doc['steps']} steps per layout); wall: median of {len(runs)} run(s), "
        "rows: one of them"
    )
    print(f"{'layout':<20}{'train s':>9}{'checks s':>10}{'total s':>9}  {'loss before → after':<22}ok")
    for r in rows:
        checks = r["seconds"] - r["train_seconds"]
        loss = f"{r['loss_before']:.3f} → {r['loss_after']:.3f}" if r["loss_before"] is not None else "-"
        print(
            f"{r['layout']:<20}{r['train_seconds']:>9.2f}{checks:>10.2f}{r['seconds']:>9.2f}  {loss:<22}{r['ok']}"
        )
    layouts_s = sum(r["seconds"] for r in rows)
    wall = statistics.median(walls)
    print(f"{'sum of layouts':<20}{'':>9}{'':>10}{layouts_s:>9.2f}")
    print()
    print(f"{'what':<46}{'seconds':>9}{'share':>8}")
    print(f"{'train-smoke wall (cold process, CLI)':<46}{wall:>9.2f}{1:>8.0%}")
    print(
        f"{'  imports inside it (torch, transformers, peft)':<46}{doc['import_seconds']:>9.2f}"
        f"{doc['import_seconds'] / wall:>8.0%}"
    )
    print(f"{'  the seven layouts':<46}{layouts_s:>9.2f}{layouts_s / wall:>8.0%}")
    print(f"{'anchor: cold import-only process':<46}{imports:>9.2f}{imports / wall:>8.0%}")
    print(f"{'anchor: budget':<46}{BUDGET_S:>9.2f}{BUDGET_S / wall:>8.0%}")
    verdict = "within" if wall <= BUDGET_S else "OVER"
    print(f"\n{verdict} budget: {wall:.1f} s of {BUDGET_S:.0f} s; all layouts ok: {doc['ok']}")
    if a.threads_anchor:
        one = library_run(a.steps, 1)
        many = library_run(a.steps, None)
        print("\nthreads anchor (library, same process per setting): layouts' seconds")
        print(f"{'layout':<20}{'1 thread':>10}{'torch default':>15}")
        for x, y in zip(one["layouts"], many["layouts"]):
            print(f"{x['layout']:<20}{x['seconds']:>10.2f}{y['seconds']:>15.2f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
