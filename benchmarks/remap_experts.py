"""``remap --experts`` on an adapter for a realistically sized MoE, beside a plain streamed copy of the same file.

Writes a per-expert adapter (default 60 layers × 128 experts, r=8, bf16, Qwen3-MoE-like hidden 2048 and expert
intermediate 768: attention q/k/v/o plus gate/up/down of every expert) as a sparse safetensors file, then in one run,
each step in its own child process (so ``ru_maxrss`` is that step's peak):

1. ``copy``: the same bytes streamed into a new file (the floor: one read and one write of the data), and the
   same with the ``fsync`` every atomic write ends with;
2. ``fused``: ``remap --experts fused --out`` (per-expert → PEFT's fused layout);
3. ``per-expert``: ``remap --experts per-expert --out`` on step 2's output (back again).

Prints seconds and peak RSS per step as a table; the largest tensor is shown too (memory must stay O(largest
tensor), not O(adapter)). ``--layers/--experts`` shrink it.

    python benchmarks/remap_experts.py [--layers 60] [--experts 128] [--rank 8] [--dir DIR]
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

HIDDEN, INTER, HEADS_KV = 2048, 768, 512


def write_adapter(folder: str, layers: int, experts: int, rank: int) -> tuple[int, int, int]:
    """A sparse per-expert adapter; (tensors, data bytes, largest tensor bytes)."""
    os.makedirs(folder, exist_ok=True)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    pos = largest = 0

    def add(name: str, shape: tuple[int, int]) -> None:
        nonlocal pos, largest
        n = shape[0] * shape[1] * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
        largest = max(largest, n)

    for layer in range(layers):
        p = f"base_model.model.model.layers.{layer}"
        for proj, (fin, fout) in {
            "q_proj": (HIDDEN, HIDDEN),
            "k_proj": (HIDDEN, HEADS_KV),
            "v_proj": (HIDDEN, HEADS_KV),
            "o_proj": (HIDDEN, HIDDEN),
        }.items():
            add(f"{p}.self_attn.{proj}.lora_A.weight", (rank, fin))
            add(f"{p}.self_attn.{proj}.lora_B.weight", (fout, rank))
        for e in range(experts):
            for proj, (fin, fout) in {
                "gate_proj": (HIDDEN, INTER),
                "up_proj": (HIDDEN, INTER),
                "down_proj": (INTER, HIDDEN),
            }.items():
                add(f"{p}.mlp.experts.{e}.{proj}.lora_A.weight", (rank, fin))
                add(f"{p}.mlp.experts.{e}.{proj}.lora_B.weight", (fout, rank))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    path = os.path.join(folder, "adapter_model.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        os.ftruncate(f.fileno(), 8 + len(text) + pos)
    cfg = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "target_parameters": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "base_model_name_or_path": "Qwen/Qwen3-30B-A3B",
    }
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return len(header) - 1, pos, largest


CHILD = r"""
import json, os, resource, sys, time, shutil
t = time.perf_counter()
step, src, dst = sys.argv[1:4]
if step in ("copy", "copy+fsync"):
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 16 << 20)
        if step == "copy+fsync":
            fout.flush()
            os.fsync(fout.fileno())
else:
    from adapterdoc.remap import remap
    remap(src, experts=step, out=dst)
print(json.dumps({"s": time.perf_counter() - t, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def child(step: str, src: str, dst: str) -> dict[str, float]:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, step, src, dst], capture_output=True, text=True, check=False
    )
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--dir", default=None, help="work folder (default: a temp folder, removed after)")
    args = ap.parse_args()
    work = args.dir or tempfile.mkdtemp(prefix="remap-experts-")
    try:
        src = os.path.join(work, "per_expert")
        n, data, largest = write_adapter(src, args.layers, args.experts, args.rank)
        rows = [
            ("copy (streamed, 16 MiB chunks)", child("copy", os.path.join(src, "adapter_model.safetensors"),
                                                      os.path.join(work, "copy.safetensors"))),
            ("copy + fsync (as every atomic write)", child("copy+fsync",
                                                          os.path.join(src, "adapter_model.safetensors"),
                                                          os.path.join(work, "copy2.safetensors"))),
            ("remap --experts fused", child("fused", src, os.path.join(work, "fused"))),
            ("remap --experts per-expert (back)", child("per-expert", os.path.join(work, "fused"),
                                                         os.path.join(work, "back"))),
        ]  # fmt: skip
        print(
            f"adapter: {args.layers} layers x {args.experts} experts, r={args.rank}, bf16: {n} tensors, "
            f"{data / 2**30:.2f} GiB data, largest tensor {largest / 2**20:.2f} MiB "
            f"(fused gate_up lora_B {2 * INTER * 2 * args.rank * args.experts * 2 / 2**20:.2f} MiB)"
        )
        print(f"{'step':<40}{'seconds':>10}{'peak RSS MiB':>15}")
        for name, r in rows:
            print(f"{name:<40}{r['s']:>10.2f}{r['rss'] / 2**20:>15.1f}")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
