"""`remap --vl` in place versus a streamed-copy rewrite and `cp`, on a 2 MiB and a 2 GiB adapter.

    python benchmarks/remap_speed.py [--dir DIR] [--dense] [--reps N]

Both adapters have the same 4096 Qwen3.5-VL style keys (``...model.language_model.layers.N...``, a 500 KB header),
so only the data size differs. Files are sparse unless ``--dense`` (the in-place rewrite touches only the header;
the copies read and write every data byte either way, ``cp`` is run with ``--sparse=never`` so it does too). The page cache is warm;
``sync`` runs (untimed) before each repetition so that no earlier write is flushed by a timed fsync. Medians of the repetitions; the in-place rows restore
the original header between repetitions (not timed), and so does the ``--out`` row (so that it plans the same 4096
renames rather than a no-op). Anchors in the same run: the streamed copy and ``cp``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

from adapterdoc.layouts import strip_language_model
from adapterdoc.remap import remap
from adapterdoc.st import rewrite
from adapterdoc.st.header import TensorInfo, read_header, serialize_header

MIB = 1024 * 1024
GIB = 1024 * MIB


def make_adapter(folder: str, total_bytes: int, tensors: int, *, dense: bool) -> str:
    """A safetensors adapter of ``total_bytes`` data in ``tensors`` F32 lora_A/lora_B tensors."""
    os.makedirs(folder, exist_ok=True)
    per = (total_bytes // tensors) // 4 * 4
    infos = []
    offset = 0
    for i in range(tensors):
        layer, mod, ab = i // 16, (i // 2) % 8, "AB"[i % 2]
        leaf = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "in_proj_qkv")[
            mod
        ]
        part = "linear_attn" if leaf == "in_proj_qkv" else ("self_attn" if mod < 4 else "mlp")
        name = f"base_model.model.model.language_model.layers.{layer}.{part}.{leaf}.lora_{ab}.weight"
        infos.append(TensorInfo(name, "F32", (per // 4,), offset, offset + per))
        offset += per
    body = serialize_header({"format": "pt"}, infos)
    n = rewrite.aligned_length(body)
    path = os.path.join(folder, "adapter_model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + rewrite.padded(body, n))
        if dense:
            chunk = os.urandom(8 * MIB)
            left = offset
            while left:
                f.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))
        else:
            f.truncate(8 + n + offset)
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        f.write('{\n  "peft_type": "LORA",\n  "r": 8,\n  "target_modules": ["q_proj", "v_proj"]\n}')
    return path


def median_time(fn, reps: int, reset=None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(median, best) wall time of ``fn`` over ``reps`` runs; ``reset`` runs untimed before each."""
    times = []
    for _ in range(reps):
        if reset:
            reset()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def bench(
    label: str, size: int, tensors: int, root: str, reps: int, dense: bool
) -> dict[str, tuple[float, float]]:
    folder = os.path.join(root, label)
    path = make_adapter(folder, size, tensors, dense=dense)
    header = read_header(path)
    with open(path, "rb") as f:
        original = f.read(header.data_start)
    mapping = {k: strip_language_model(k) for k in header.tensors}
    body, _ = rewrite.renamed_header(original[8:], mapping)
    other = os.path.join(root, f"{label}-copy.safetensors")

    def restore() -> None:
        with open(path, "r+b") as f:
            f.write(original)
            f.flush()
            os.fsync(f.fileno())
        os.sync()  # no dirty pages left for the timed fsync to flush

    def drop_copy() -> None:
        if os.path.exists(other):
            os.unlink(other)
        os.sync()

    def rw_copy() -> None:
        saved = getattr(os, "copy_file_range", None)
        try:
            if saved is not None:
                del os.copy_file_range
            rewrite.rewrite_copy(path, other, header, body, keep_length=False)
        finally:
            if saved is not None:
                os.copy_file_range = saved

    copy_reps = max(1, reps // 10) if size >= GIB else reps
    out_dir = os.path.join(root, f"{label}-out")

    def drop_out() -> None:  # and the input back to VL names, so the copy plans the same renames
        shutil.rmtree(out_dir, ignore_errors=True)
        restore()

    row = {
        "remap --vl in place (library call)": median_time(lambda: remap(folder, vl=True), reps, restore),
        "remap --vl in place (CLI, process start included)": median_time(
            lambda: subprocess.run(
                [sys.executable, "-m", "adapterdoc", "remap", folder, "--vl", "--json"],
                check=True,
                stdout=subprocess.DEVNULL,
            ),
            max(3, reps // 4),
            restore,
        ),
        "header rewrite alone (pwrite + fsync)": median_time(
            lambda: rewrite.rewrite_in_place(path, header, body), reps, restore
        ),
        "remap --vl --out DIR (same plan, streamed copy, fsync)": median_time(
            lambda: remap(folder, vl=True, out=out_dir), copy_reps, drop_out
        ),
        "streamed copy alone (copy_file_range, fsync)": median_time(
            lambda: rewrite.rewrite_copy(path, other, header, body, keep_length=False), copy_reps, drop_copy
        ),
        "streamed copy alone (read/write 8 MiB, fsync)": median_time(rw_copy, copy_reps, drop_copy),
        "cp --sparse=never && sync FILE": median_time(
            lambda: subprocess.run(
                f"cp --sparse=never '{path}' '{other}' && sync '{other}'", shell=True, check=True
            ),
            copy_reps,
            drop_copy,
        ),
    }
    drop_out()
    drop_copy()
    restore()
    assert read_header(path).header_len == header.header_len
    shutil.rmtree(folder)
    return row


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where to create the files (default: a temp folder)")
    ap.add_argument("--dense", action="store_true", help="write real data instead of sparse files")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="remap-bench-", dir=args.dir)
    try:
        rows = {
            "2 MiB": bench("small", 2 * MIB, 4096, root, args.reps, args.dense),
            "2 GiB": bench("large", 2 * GIB, 4096, root, args.reps, args.dense),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cols = list(rows["2 MiB"])
    print(
        f"remap --vl: in place vs streamed copy vs cp ({'dense' if args.dense else 'sparse'} files, warm cache)"
    )
    print()
    print("| operation | " + " | ".join(rows) + " |")
    print("| --- | " + " | ".join("---:" for _ in rows) + " |")
    for c in cols:
        cells = (f"{fmt(rows[r][c][0])} ({fmt(rows[r][c][1])})" for r in rows)
        print(f"| {c} | " + " | ".join(cells) + " |")
    small, large = rows["2 MiB"], rows["2 GiB"]
    ip = cols[0]
    print()
    print("cells: median (best) of the repetitions")
    print(f"in-place 2 GiB / 2 MiB (medians): {large[ip][0] / small[ip][0]:.2f}x (expected: within 2x)")
    print(f"{cols[3]} / {ip}, at 2 GiB (medians): {large[cols[3]][0] / large[ip][0]:.0f}x")
    alone = cols[2]
    for c in cols[4:]:
        print(f"{c} / {alone}, at 2 GiB (medians): {large[c][0] / large[alone][0]:.0f}x")


if __name__ == "__main__":
    main()
