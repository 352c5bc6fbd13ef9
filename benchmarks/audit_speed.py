"""Wall time, CPU time and peak memory of `adapterdoc inspect --weights` on a ~1 GiB bfloat16 adapter, beside
`safetensors.torch.load_file` of the same file and a plain read of its bytes.

The adapter is generated (no torch): a Llama-7B-shaped decoder (hidden 4096, MLP 11008) with LoRA r=128 on all
seven attention and MLP projections, as many layers as it takes to reach ``--gib``, random bfloat16 factors,
saved as one ``adapter_model.safetensors`` with an ``adapter_config.json``. Each tool runs in its own fresh
process with the file in the page cache (read once before each run); peak RSS and CPU time (user + system)
come from ``os.wait4``, wall time from the parent. The anchors:

- ``read``: the file read in 8 MiB chunks (the I/O floor; memory stays flat);
- ``load_file``: ``safetensors.torch.load_file`` (every tensor materialised, torch imported);
- ``inspect --weights --json``: the audit (numpy, no torch; QR of both factors and an SVD of the r×r core for
  every module) plus inspect's header work;
- ``python -m adapterdoc --version``: the interpreter + CLI baseline the memory figures sit on.

    python benchmarks/audit_speed.py [--gib 1.0] [--rank 128] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HIDDEN, INTER = 4096, 11008
SHAPES = {  # leaf: (in, out)
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (HIDDEN, HIDDEN),
    "self_attn.v_proj": (HIDDEN, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (HIDDEN, INTER),
    "mlp.up_proj": (HIDDEN, INTER),
    "mlp.down_proj": (INTER, HIDDEN),
}
LOAD_CHILD = "import sys\nfrom safetensors.torch import load_file\nload_file(sys.argv[1])\n"
FLOOR_CHILD = """\
import json, os, struct, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np
path = sys.argv[1]
with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
wide, out = {}, {}
def decode(name):
    e = header[name]
    a, b = e["data_offsets"]
    raw = data[a:b].view("<u2").reshape(e["shape"])
    w = wide.setdefault(raw.shape, np.empty(raw.shape, np.uint32))
    o = out.setdefault((name[-14:], raw.shape), np.empty(raw.shape, np.float64))
    np.left_shift(raw, 16, out=w, dtype=np.uint32)
    o[...] = w.view(np.float32)
    return o
dec = gram = core = 0.0
for key in [k[: -len(".lora_A.weight")] for k in header if k.endswith(".lora_A.weight")]:
    t0 = time.perf_counter()
    a, b = decode(key + ".lora_A.weight"), decode(key + ".lora_B.weight")
    t1 = time.perf_counter()
    ga, gb = a @ a.T, b.T @ b
    t2 = time.perf_counter()
    low = np.linalg.cholesky(ga)
    np.linalg.eigvalsh(low.T @ gb @ low)
    t3 = time.perf_counter()
    dec, gram, core = dec + t1 - t0, gram + t2 - t1, core + t3 - t2
print(json.dumps({"decode": dec, "gram": gram, "core": core}))
"""
"""A lower bound of the audit's arithmetic, measured on one thread with plain numpy (no adapterdoc) and halved for
two cores: each factor decoded from BF16 to float64 (the precision the 1e-6 agreement needs) into reused buffers,
its ``r × r`` Gram products, and the singular values of ``B A`` from them (a Cholesky of ``A Aᵀ``, ``eigvalsh`` of
``Lᵀ (BᵀB) L``: what the effective ranks ``inspect --weights`` shows need); the interpreter, numpy's import, the
header work and the findings come on top."""
READ_CHILD = "import sys\nf = open(sys.argv[1], 'rb', buffering=0)\nwhile f.read(8 << 20):\n    pass\n"


def layers_for(gib: float, rank: int) -> int:
    per_layer = sum(rank * (i + o) for i, o in SHAPES.values()) * 2
    return max(1, round(gib * 2**30 / per_layer))


def build(folder: str, gib: float, rank: int) -> tuple[str, int, int, int]:
    """Write the adapter; return (weights file, file bytes, tensor data bytes, modules)."""
    import numpy as np

    layers = layers_for(gib, rank)
    tensors: list[tuple[str, list[int]]] = []
    for i in range(layers):
        for leaf, (fan_in, fan_out) in SHAPES.items():
            key = f"base_model.model.model.layers.{i}.{leaf}"
            tensors += [(f"{key}.lora_A.weight", [rank, fan_in]), (f"{key}.lora_B.weight", [fan_out, rank])]
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name, shape in tensors:
        n = shape[0] * shape[1] * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "adapter_model.safetensors")
    rng = np.random.default_rng(0)
    pool = {  # random BF16 values; each tensor is a window at a random offset (generating 1 GiB takes too long)
        s: ((rng.standard_normal(1 << 23, dtype=np.float32) * s).view(np.uint32) >> 16).astype("<u2")
        for s in (0.02, 0.002)
    }
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in tensors:
            src = pool[0.02 if "lora_A" in name else 0.002]
            n = shape[0] * shape[1]
            start = int(rng.integers(0, src.size - n))
            f.write(src[start : start + n].tobytes())
    cfg = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": [leaf.rpartition(".")[2] for leaf in SHAPES],
        "base_model_name_or_path": "synthetic-llama-7b",
        "task_type": "CAUSAL_LM",
    }
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    return path, os.path.getsize(path), pos, len(tensors) // 2


def warm(path: str) -> None:
    """Read the file into the page cache through one small buffer (the parent's peak RSS is every child's floor)."""
    buf = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def run(cmd: list[str], path: str) -> tuple[float, float, int, str]:
    warm(path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
    }
    out_fd, out_path = tempfile.mkstemp(prefix="audit-bench-")
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out_fd, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise SystemExit(f"{cmd[:4]} failed with exit code {code}:\n{err[-2000:]}")
        with open(out_path) as f:
            out = f.read()
    finally:
        os.close(out_fd)
        os.unlink(out_path)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--build-only", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_only:
        print(json.dumps(build(args.build_only, args.gib, args.rank)))
        return
    work = args.workdir or tempfile.mkdtemp(prefix="adapterdoc-audit-bench-")
    folder = os.path.join(work, "adapter")
    try:
        t0 = time.perf_counter()
        # built in a child: ru_maxrss survives fork, so a parent holding numpy buffers would inflate every figure
        made = subprocess.run(
            [
                sys.executable,
                __file__,
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
        path, size, data_bytes, modules = json.loads(made.stdout)
        built = time.perf_counter() - t0
        print(
            f"adapter: {modules} modules, r={args.rank}, {size / 2**30:.2f} GiB BF16 (built in {built:.1f} s)"
        )
        # bytecode compiled, as pip leaves an installed package (PYTHONDONTWRITEBYTECODE would otherwise make
        # every fresh process compile every module)
        import adapterdoc

        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", os.path.dirname(adapterdoc.__file__)],
            capture_output=True,
        )
        py = sys.executable
        rows = [
            ("python -m adapterdoc --version", [py, "-m", "adapterdoc", "--version"]),
            ("read (8 MiB chunks)", [py, "-c", READ_CHILD, path]),
            ("safetensors.torch.load_file", [py, "-c", LOAD_CHILD, path]),
            (
                "adapterdoc inspect --weights --json",
                [py, "-m", "adapterdoc", "inspect", folder, "--weights", "--json"],
            ),
        ]
        results = []
        for label, cmd in rows:
            wall, cpu, rss, out = run(cmd, path)
            results.append((label, wall, cpu, rss))
            if "inspect" in label:
                data = json.loads(out)
                audit = data["weights"]
                assert len(data["modules"]) == modules and audit["bytes_read"] == data_bytes, audit
        print(f"\n| {'run':<38} | {'wall s':>7} | {'CPU s':>7} | {'peak RSS MiB':>12} |")
        print(f"|{'-' * 40}|{'-' * 9}|{'-' * 9}|{'-' * 14}|")
        for label, wall, cpu, rss in results:
            print(f"| {label:<38} | {wall:7.2f} | {cpu:7.2f} | {rss / 2**20:12.0f} |")
        largest = max(r * max(i, o) * 2 for r in [args.rank] for i, o in SHAPES.values())
        by = {label: wall for label, wall, _, _ in results}
        cpu = {label: c for label, _, c, _ in results}
        ours, anchor = by["adapterdoc inspect --weights --json"], by["safetensors.torch.load_file"]
        print(
            f"\ninspect --weights --json / safetensors.torch.load_file: {ours / anchor:.2f}× wall "
            f"({ours:.2f} / {anchor:.2f} s), "
            f"{cpu['adapterdoc inspect --weights --json'] / cpu['safetensors.torch.load_file']:.2f}× CPU (goal ≤ 1.0×)"
        )
        warm(path)
        floor = json.loads(
            subprocess.run([py, "-c", FLOOR_CHILD, path], check=True, capture_output=True, text=True).stdout
        )
        bound = (floor["decode"] + floor["gram"] + floor["core"]) / 2
        print(
            f"floor (plain numpy on one thread, halved for two cores): decode BF16 → float64 {floor['decode']:.2f} s "
            f"+ float64 Gram products {floor['gram']:.2f} s + singular values of the r×r cores {floor['core']:.2f} s "
            f"= {bound:.2f} s wall at best = {bound / anchor:.2f}× load_file; inspect --weights --json is "
            f"{ours / bound:.2f}× that bound"
        )
        print(
            f"audit: {audit['modules']} modules, {audit['bytes_read'] / 2**30:.2f} GiB of factors decoded, "
            f"total delta norm {audit['total_delta_norm']:.4g}; largest tensor {largest / 2**20:.1f} MiB (BF16)"
        )
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
