"""How fast is header-only inspection? One table for a 2 GiB safetensors file of 4096 tensors (a real decoder
adapter's names and shapes, random data).

Rows: adapterdoc's header read, ``safe_open`` + keys, ``safetensors.torch.load_file`` (the anchor that reads
everything), and the wall time of ``adapterdoc inspect --json`` in a fresh process against ``python -c pass``.
Each operation is timed with the page cache warm and, where the kernel lets us drop this file's pages
(``posix_fadvise(DONTNEED)``), evicted. Medians of several runs. The file lives in a temp folder and is deleted.

Usage: python benchmarks/inspect_speed.py [--gib 2] [--tensors 4096] [--repeat 15] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CHUNK = 8 << 20


HIDDEN, INTER = 4096, 11008
PROJECTIONS = (  # leaf: (in, out), a Llama-style decoder layer
    ("self_attn.q_proj", HIDDEN, HIDDEN),
    ("self_attn.k_proj", HIDDEN, 1024),
    ("self_attn.v_proj", HIDDEN, 1024),
    ("self_attn.o_proj", HIDDEN, HIDDEN),
    ("mlp.gate_proj", HIDDEN, INTER),
    ("mlp.up_proj", HIDDEN, INTER),
    ("mlp.down_proj", INTER, HIDDEN),
)


def write_file(path: Path, gib: float, n_tensors: int) -> tuple[int, int]:
    """A valid safetensors file of ``n_tensors`` BF16 LoRA factors adding up to about ``gib`` GiB of random bytes,
    as PEFT saves them: the seven projections of each decoder layer in turn (``lora_A`` ``r × in``, ``lora_B``
    ``out × r``, real Llama-7B widths, grouped-query k/v), as many layers as the count takes, the rank chosen
    for the size. Names, shapes and offsets vary as a real header's do."""
    modules = [
        (layer, leaf, fan_in, fan_out)
        for layer in range(-(-n_tensors // (2 * len(PROJECTIONS))))
        for leaf, fan_in, fan_out in PROJECTIONS
    ][: (n_tensors + 1) // 2]
    per_rank = sum(2 * (fan_in + fan_out) for _, _, fan_in, fan_out in modules)  # BF16 bytes at r = 1
    r = max(1, round(gib * (1 << 30) / per_rank))
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for layer, leaf, fan_in, fan_out in modules:
        for role, shape in (("A", [r, fan_in]), ("B", [fan_out, r])):
            if len(header) > n_tensors:
                break
            name = f"base_model.model.model.layers.{layer}.{leaf}.lora_{role}.weight"
            size = 2 * shape[0] * shape[1]
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [pos, pos + size]}
            pos += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    block = os.urandom(CHUNK)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        left = pos
        while left:
            n = min(left, CHUNK)
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    return pos, len(text)


def evict(path: Path) -> bool:
    """Drop ``path``'s pages from the page cache (no root needed for clean pages); False if unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def timed(
    fn: Callable[[], object], repeat: int, *, before: Callable[[], object] | None = None
) -> list[float]:
    out = []
    for _ in range(repeat):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=15, help="runs per fast operation (load_file gets fewer)")
    ap.add_argument(
        "--dir", default=None, help="where to put the temporary file (default: the system temp dir)"
    )
    args = ap.parse_args()

    from safetensors import safe_open

    from adapterdoc.st.header import read_header

    tmp = Path(tempfile.mkdtemp(prefix="adapterdoc-bench-", dir=args.dir))
    path = tmp / "big.safetensors"
    try:
        t0 = time.perf_counter()
        data_bytes, header_len = write_file(path, args.gib, args.tensors)
        write_s = time.perf_counter() - t0
        size = path.stat().st_size
        h = read_header(path)
        assert len(h.tensors) == args.tensors and h.data_bytes == data_bytes
        with safe_open(str(path), framework="np") as f:
            assert len(list(f.keys())) == args.tensors

        def stdlib_floor() -> None:
            """What any header read on the standard library pays before its checks: the header's bytes read,
            decoded and given to ``json.loads`` (the only parser a torch-free install has), its tree freed."""
            with open(path, "rb") as f:
                raw = f.read(8 + header_len)[8:]
            json.loads(raw.decode("utf-8"))

        def header_cpu_times(n: int, block: int = 5) -> tuple[list[float], list[float], list[float]]:
            """CPU times in ms of ``n`` header reads and ``n`` ``safe_open`` + keys, in alternating blocks of
            ``block`` (a drift in the machine's speed reaches both; alternating call by call would instead make
            each header parse follow a ``safe_open``, which on this 2-core VM slows the parse by 10-30 %: the two
            share the allocator and the caches), taken before torch is imported (as in `adapterdoc inspect`,
            which never imports it): with torch's objects in the process, the garbage collections the header's
            Python objects trigger walk them all, which ``safe_open`` (objects in Rust) never pays."""
            hs: list[float] = []
            ss: list[float] = []
            js: list[float] = []
            while len(hs) < n:
                for _ in range(block):
                    t0 = time.process_time()
                    header_read()
                    hs.append((time.process_time() - t0) * 1000)
                for _ in range(block):
                    t0 = time.process_time()
                    with safe_open(str(path), framework="np") as f:
                        list(f.keys())
                    ss.append((time.process_time() - t0) * 1000)
                for _ in range(block):
                    t0 = time.process_time()
                    stdlib_floor()
                    js.append((time.process_time() - t0) * 1000)
            return hs, ss, js

        def first_read_ms(n: int) -> tuple[list[float], list[float]]:
            """CPU time in ms of the first header read in each of ``n`` fresh processes, ours and ``safe_open``'s
            in turn: what one CLI run pays (its allocations are new pages). The ``safe_open`` child imports
            numpy and opens a one-tensor file first, so its lazy setup is not counted against it."""
            tiny = tmp / "tiny.safetensors"
            if not tiny.exists():
                import numpy as np
                from safetensors.numpy import save_file

                save_file({"x": np.zeros(1, np.float32)}, str(tiny))
            timed_call = (
                "import sys, time\n"
                "if sys.argv[1] == 'ours':\n"
                "    from adapterdoc.st.header import read_header\n"
                "    t0 = time.process_time(); read_header(sys.argv[2])\n"
                "else:\n"
                "    import numpy\n"
                "    from safetensors import safe_open\n"
                "    with safe_open(sys.argv[3], framework='np') as f: list(f.keys())\n"
                "    t0 = time.process_time()\n"
                "    with safe_open(sys.argv[2], framework='np') as f: list(f.keys())\n"
                "print((time.process_time() - t0) * 1000)\n"
            )
            ours: list[float] = []
            theirs: list[float] = []
            for _ in range(n):
                for who, out in (("ours", ours), ("safe_open", theirs)):
                    res = subprocess.run(
                        [sys.executable, "-c", timed_call, who, str(path), str(tiny)],
                        capture_output=True,
                        text=True,
                        check=True,
                        env=env,
                    )
                    out.append(float(res.stdout))
            return ours, theirs

        def header_read() -> None:
            read_header(path)

        def safe_open_keys() -> None:
            with safe_open(str(path), framework="pt") as f:
                list(f.keys())

        def load_all() -> None:
            from safetensors.torch import load_file

            load_file(str(path))

        env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERDOC_")}

        def cli() -> None:
            p = subprocess.run(
                [sys.executable, "-m", "adapterdoc", "inspect", "--json", str(path)],
                capture_output=True,
                env=env,
            )
            assert p.returncode == 0, p.stderr

        def bare_python() -> None:
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def import_cli() -> None:
            subprocess.run([sys.executable, "-c", "import adapterdoc.cli"], check=True, env=env)

        def import_click_rich() -> None:
            subprocess.run([sys.executable, "-c", "import click, rich"], check=True, env=env)

        # an installed package has its bytecode compiled (pip does it); a checkout run with
        # PYTHONDONTWRITEBYTECODE would compile every module in every fresh process instead
        import adapterdoc

        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", os.path.dirname(adapterdoc.__file__)],
            check=True,
            capture_output=True,
        )

        can_evict = evict(path)
        fast, slow, procs = args.repeat, max(3, args.repeat // 3), max(5, args.repeat // 2)
        rows: list[tuple[str, list[float], list[float] | None]] = []

        def interleaved_children(cmds: list[list[str]], n: int) -> list[tuple[list[float], list[float]]]:
            """Wall and CPU (user + system, from ``os.wait4``) times in ms of ``n`` fresh processes of each
            command, run in turn (a, b, a, b, ...) so that a drift in the machine's speed reaches both alike."""
            out: list[tuple[list[float], list[float]]] = [([], []) for _ in cmds]
            for _ in range(n):
                for cmd, (walls, cpus) in zip(cmds, out):
                    t0 = time.perf_counter()
                    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
                    _, _, usage = os.wait4(proc.pid, 0)
                    walls.append((time.perf_counter() - t0) * 1000)
                    cpus.append((usage.ru_utime + usage.ru_stime) * 1000)
            return out

        # before torch comes in (load_file, framework="pt")
        header_cpus, safe_open_cpus, floor_cpus = header_cpu_times(3 * fast)
        cpu_header, cpu_safe_open = min(header_cpus), min(safe_open_cpus)
        first_ours, first_theirs = first_read_ms(procs)
        (cli_wall, cli_cpu), (anchor_wall, anchor_cpu) = interleaved_children(
            [
                [sys.executable, "-m", "adapterdoc", "inspect", "--json", str(path)],
                [sys.executable, "-c", "import click, rich"],
            ],
            2 * procs,
        )
        cpu_cli, cpu_anchor = min(cli_cpu), min(anchor_cpu)
        for label, fn, n in (
            ("adapterdoc header read (read_header)", header_read, fast),
            ("safe_open + keys", safe_open_keys, fast),
            ("safetensors.torch.load_file", load_all, slow),
        ):
            fn()  # warm the page cache and any lazy imports
            warm = timed(fn, n)
            cold = timed(fn, n, before=lambda: evict(path)) if can_evict else None
            rows.append((label, warm, cold))
        cli()
        rows.append(("`python -c pass` (interpreter start)", timed(bare_python, procs), None))
        rows.append(("`python -c 'import adapterdoc.cli'`", timed(import_cli, procs), None))
        rows.append(("`adapterdoc inspect --json` (fresh process)", timed(cli, procs), None))
        cold_cli = timed(cli, procs, before=lambda: evict(path)) if can_evict else None
        rows[-1] = (rows[-1][0], rows[-1][1], cold_cli)
        rows.append(("`python -c 'import click, rich'` (anchor)", timed(import_click_rich, procs), None))

        load_warm = median_ms(rows[2][1])
        load_cold = median_ms(rows[2][2]) if rows[2][2] else None
        print(
            f"file: {size / (1 << 30):.2f} GiB, {args.tensors} tensors, header {header_len:,} bytes; "
            f"written in {write_s:.1f} s; python {sys.version.split()[0]}; "
            f"page-cache eviction {'available' if can_evict else 'unavailable'}"
        )
        print()
        print(
            "| operation | warm median (ms) | evicted median (ms) | load_file ÷ this (warm / evicted) | runs |"
        )
        print("| --- | ---: | ---: | ---: | ---: |")
        for label, warm, cold in rows:
            w = median_ms(warm)
            c = median_ms(cold) if cold else None
            ratio = f"{load_warm / w:.0f}×" + (f" / {load_cold / c:.0f}×" if c and load_cold else "")
            if "python" in label or "adapterdoc inspect" in label or "click" in label:
                ratio = "—"
            cs = f"{c:.1f}" if c is not None else "—"
            print(f"| {label} | {w:.1f} | {cs} | {ratio} | {len(warm)} |")
        start = median_ms(rows[3][1])
        cli_ms = median_ms(rows[5][1])
        imp = median_ms(rows[4][1])
        print()
        print(
            f"CLI wall {cli_ms:.0f} ms = interpreter start {start:.0f} ms ({100 * start / cli_ms:.0f}%) "
            f"+ importing adapterdoc.cli {imp - start:.0f} ms + inspect itself {cli_ms - imp:.0f} ms"
        )
        hdr = median_ms(rows[0][1])
        print(
            f"header read vs load_file: {load_warm / hdr:.0f}× faster warm"
            + (f", {load_cold / median_ms(rows[0][2]):.0f}× evicted" if rows[0][2] and load_cold else "")
        )
        so = median_ms(rows[1][1])
        print(
            f"header read / safe_open + keys: {hdr / so:.2f}× warm"
            + (
                f", {median_ms(rows[0][2]) / median_ms(rows[1][2]):.2f}× evicted"
                if rows[0][2] and rows[1][2]
                else ""
            )
            + " (goal ≤ 1.5×)"
        )
        print(
            f"header read / safe_open + keys, best CPU time (no torch in the process): {cpu_header:.1f} / "
            f"{cpu_safe_open:.1f} ms = "
            f"{cpu_header / cpu_safe_open:.2f}×"
        )
        print(
            f"header read / safe_open + keys, {len(header_cpus)} each in alternating blocks of 5 in process: "
            f"median CPU {statistics.median(header_cpus):.1f} / {statistics.median(safe_open_cpus):.1f} ms = "
            f"{statistics.median(header_cpus) / statistics.median(safe_open_cpus):.2f}× (goal ≤ 1.5×)"
        )
        floor, so_med = statistics.median(floor_cpus), statistics.median(safe_open_cpus)
        print(
            f"  stdlib floor in the same blocks: the header read, decoded and given to json.loads alone (no "
            f"checks, no result) {floor:.1f} ms = {floor / so_med:.2f}× safe_open + keys; the checks and the "
            f"{args.tensors} TensorInfos add {statistics.median(header_cpus) - floor:.1f} ms = "
            f"{(statistics.median(header_cpus) - floor) / so_med:.2f}×"
        )
        print(
            f"header read / safe_open + keys, the first read of {len(first_ours)} fresh processes each, in turn: "
            f"median CPU {statistics.median(first_ours):.1f} / {statistics.median(first_theirs):.1f} ms = "
            f"{statistics.median(first_ours) / statistics.median(first_theirs):.2f}×"
        )
        anchor = median_ms(rows[6][1])
        print(
            f"inspect --json (fresh process) / `python -c 'import click, rich'`: {cli_ms / anchor:.2f}× "
            f"({cli_ms:.0f} / {anchor:.0f} ms; goal ≤ 2×)"
        )
        print(
            f"inspect --json / `import click, rich`, best CPU time of fresh processes: {cpu_cli:.0f} / "
            f"{cpu_anchor:.0f} ms = {cpu_cli / cpu_anchor:.2f}×"
        )
        med = statistics.median
        print(
            f"inspect --json / `import click, rich`, {len(cli_wall)} interleaved pairs of fresh processes: "
            f"median wall {med(cli_wall):.0f} / {med(anchor_wall):.0f} ms = {med(cli_wall) / med(anchor_wall):.2f}×, "
            f"median CPU {med(cli_cpu):.0f} / {med(anchor_cpu):.0f} ms = {med(cli_cpu) / med(anchor_cpu):.2f}× "
            "(goal ≤ 2×)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
