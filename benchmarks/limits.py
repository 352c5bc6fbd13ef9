"""Limits (issue 8): a header listing 1,000,000 tensors, an overflowing shape, a 100 MB header and an announced
4 GiB header — time and peak memory of each, ours beside safetensors' own reader, each in a fresh process.

    python benchmarks/limits.py [--tensors 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

OURS = "from adapterdoc.st.header import read_header as r\ntry:\n    r(P)\nexcept Exception as e:\n    print(type(e).__name__)"
REFERENCE = (
    "from safetensors import safe_open\ntry:\n    with safe_open(P, 'numpy') as f: list(f.keys())\n"
    "except Exception as e:\n    print(type(e).__name__)"
)


def write(path: str, header: dict, data_bytes: int) -> None:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + data_bytes)


def million(path: str, n: int) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    for i in range(n):
        header[f"m.{i // 1000}.e.{i % 1000}.w"] = {
            "dtype": "F32",
            "shape": [1],
            "data_offsets": [4 * i, 4 * i + 4],
        }
    write(path, header, 4 * n)


def overflow(path: str) -> None:
    write(path, {"t": {"dtype": "F32", "shape": [2**40, 2**40, 2**40], "data_offsets": [0, 4]}}, 4)


def huge_header(path: str) -> None:
    """A header of 99,999,992 bytes (under the 100 MB limit) that is one long padding run: valid JSON, no tensors."""
    raw = b"{}" + b" " * (99_999_992 - 2)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)


def announced(path: str) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 4 * 2**30))
        f.write(b"{}")


def measure(code: str, path: str) -> tuple[float, float, str]:
    script = (
        "import resource, time, sys\nP = sys.argv[1]\nt = time.perf_counter()\n"
        + code
        + "\nprint('T', time.perf_counter() - t)\nprint('M', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True).stdout.split(
        "\n"
    )
    seconds = float(next(line for line in out if line.startswith("T ")).split()[1])
    peak = int(next(line for line in out if line.startswith("M ")).split()[1]) / 1024
    verdict = next((line for line in out if line and not line.startswith(("T ", "M "))), "accepted")
    return seconds, peak, verdict


def cli(path: str) -> tuple[float, int]:
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "adapterdoc", "inspect", "--json", path], capture_output=True
    )
    return time.perf_counter() - t, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tensors", type=int, default=1_000_000)
    parser.add_argument("--make", nargs=2, metavar=("CASE", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    makers = {
        "million": lambda p: million(p, args.tensors),
        "overflow": overflow,
        "huge": huge_header,
        "announced": announced,
    }
    if args.make:  # in a child process, so the parent's peak memory never leaks into the measured processes
        makers[args.make[0]](args.make[1])
        return
    cases = [
        (f"{args.tensors:,} tensors", "million"),
        ("shape product overflows", "overflow"),
        ("header of 99,999,992 bytes", "huge"),
        ("4 GiB header announced", "announced"),
    ]
    print(
        "| case | file | ours: s | ours: peak MB | ours | safetensors: s | safetensors: peak MB | safetensors | CLI inspect s (exit) |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: |")
    with tempfile.TemporaryDirectory() as d:
        for name, make in cases:
            path = os.path.join(d, "case.safetensors")
            subprocess.run(
                [sys.executable, __file__, "--tensors", str(args.tensors), "--make", make, path], check=True
            )
            size = os.path.getsize(path)
            o = measure(OURS, path)
            r = measure(REFERENCE, path)
            c = cli(path)
            print(
                f"| {name} | {size / 2**20:.1f} MiB | {o[0]:.2f} | {o[1]:.0f} | {o[2]} | {r[0]:.2f} | {r[1]:.0f} | "
                f"{r[2]} | {c[0]:.2f} ({c[1]}) |"
            )
            os.unlink(path)


if __name__ == "__main__":
    main()
