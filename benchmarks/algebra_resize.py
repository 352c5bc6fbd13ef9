"""Wall time, CPU time and peak memory of `adapterdoc resize --rank 16` on a generated ~1 GiB bfloat16 r=128 adapter
(Llama-7B-shaped, the adapter of ``benchmarks/audit_speed.py``), beside its anchor, ``safetensors.torch.load_file``
of the same file (the issue's target: resize ≤ 1.5× load_file). Each runs in its own fresh process with the file
in the page cache; peak RSS and CPU time come from ``os.wait4``. The two alternate ``--repeat`` times and the table
gives each one's median run (the machine's load average is printed beside it: on a shared machine the wall
times move with it, the CPU times much less).

    python benchmarks/algebra_resize.py [--gib 1.0] [--rank 128] [--to 16] [--threads N] [--repeat 3]

Without ``--threads`` the BLAS thread variables are unset, as a user runs it (``resize`` then gives OpenBLAS one
thread itself: it computes modules on two threads of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from audit_speed import LOAD_CHILD, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--to", type=int, default=16)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="BLAS threads (OPENBLAS/OMP/MKL_NUM_THREADS); default: unset, as a user runs it",
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs of each (the median is shown)")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="adapterdoc-resize-bench-")
    folder = os.path.join(work, "adapter")
    try:
        made = subprocess.run(
            [
                sys.executable,
                os.path.join(os.path.dirname(__file__), "audit_speed.py"),
                "--build-only",
                folder,
                "--gib",
                str(args.gib),
                "--rank",
                str(args.rank),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        path, size, _, modules = json.loads(made.stdout)
        print(f"adapter: {modules} modules, r={args.rank}, {size / 2**30:.2f} GiB BF16 → r={args.to}")
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            if args.threads is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = str(args.threads)
        load_cmd = [sys.executable, "-c", LOAD_CHILD, path]
        resize_cmd = [sys.executable, "-m", "adapterdoc", "resize", folder, "--rank", str(args.to), "--json"]
        out = os.path.join(work, "out")
        runs: dict[str, list[tuple[float, float, int]]] = {"load_file (anchor)": [], "adapterdoc resize": []}
        load = os.getloadavg()[0]
        for _ in range(args.repeat):
            for name, cmd in (
                ("load_file (anchor)", load_cmd),
                ("adapterdoc resize", [*resize_cmd, "--out", out]),
            ):
                wall, cpu, rss, _ = run(cmd, path)
                runs[name].append((wall, cpu, rss))
                shutil.rmtree(out, ignore_errors=True)
        print(
            f"BLAS threads {args.threads or 'unset'}; load average {load:.2f} before, {os.getloadavg()[0]:.2f} "
            f"after; median of {args.repeat} runs each"
        )
        results = [(name, *sorted(r)[len(r) // 2]) for name, r in runs.items()]
        anchor, anchor_cpu = results[0][1], results[0][2]
        print(f"{'':22}{'wall s':>8}{'cpu s':>8}{'peak MiB':>10}{'× anchor':>10}{'cpu ×':>8}")
        for name, wall, cpu, rss in results:
            print(
                f"{name:22}{wall:8.2f}{cpu:8.2f}{rss / 2**20:10.0f}{wall / anchor:10.2f}{cpu / anchor_cpu:8.2f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
