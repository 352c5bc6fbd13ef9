"""Wall time, CPU time and peak memory of `adapterdoc resize --rank 16` on a generated ~1 GiB bfloat16 r=128 adapter
(Llama-7B-shaped, the adapter of ``benchmarks/audit_speed.py``), beside its anchor, ``safetensors.torch.load_file``
of the same file (the issue's target: resize ≤ 1.5× load_file). Each runs in its own fresh process with the file
in the page cache; peak RSS and CPU time come from ``os.wait4``.

    python benchmarks/algebra_resize.py [--gib 1.0] [--rank 128] [--to 16] [--threads N]
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
        "--threads", type=int, default=1, help="BLAS threads of the resize (OPENBLAS/OMP_NUM_THREADS)"
    )
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
            os.environ[var] = str(args.threads)
        rows = [
            ("load_file (anchor)", [sys.executable, "-c", LOAD_CHILD, path]),
            (
                "adapterdoc resize",
                [
                    sys.executable,
                    "-m",
                    "adapterdoc",
                    "resize",
                    folder,
                    "--rank",
                    str(args.to),
                    "--out",
                    os.path.join(work, "out"),
                    "--json",
                ],
            ),
        ]
        results = []
        for name, cmd in rows:
            wall, cpu, rss, _ = run(cmd, path)
            results.append((name, wall, cpu, rss))
        anchor = results[0][1]
        print(f"{'':22}{'wall s':>8}{'cpu s':>8}{'peak MiB':>10}{'× anchor':>10}")
        for name, wall, cpu, rss in results:
            print(f"{name:22}{wall:8.2f}{cpu:8.2f}{rss / 2**20:10.0f}{wall / anchor:10.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
