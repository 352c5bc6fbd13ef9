"""Wall time, CPU time and peak memory of `adapterdoc extract --rank 16` on a generated ~1.1 GB bfloat16 base and
tuned pair, beside its two anchors in the same run (issue 43: extract ≤ 2× reading both files; peak memory ≤ 0.2×
the memory anchor's).

The pair is generated without torch: a Llama-shaped decoder (hidden 2048, 32 heads, 4 KV heads, MLP 5632, vocab
32000, untied head; TinyLlama's shapes) with as many layers as it takes to reach ``--gb``, in two safetensors
shards with an index and a config.json. The tuned copy differs on the seven linear projections of every layer by
a rank-8 change plus small noise (then rounded to bfloat16), the embeddings and the head too, as a full fine-tune
changes them; the norms' gains move by about 1%.
Each row runs in its own fresh process with both checkpoints in the page cache (read once before each run); peak
RSS and CPU time (user + system) come from ``os.wait4``, wall time from the parent. The rows:

- ``read both (anchor)``: ``safetensors.torch.load_file`` of every shard of both checkpoints (torch imported,
  every tensor materialised, each shard dropped before the next: the time anchor);
- ``adapterdoc extract``: ``python -m adapterdoc extract --base B --tuned T --rank R --out O --json``, and the same
  with ``--energy F`` (every module's whole spectrum: the Gram route of :mod:`adapterdoc.algebra.large`);
- the memory anchor: ``mergekit-extract-lora --max-rank R`` (mergekit's own, run from a throwaway venv under /tmp
  that sees this environment's CPU torch and holds only ``mergekit`` and ``immutables``, installed with
  ``--no-deps``) where it installs, else ``torch full SVD``: what a PEFT/torch user writes (both state dicts
  loaded, ``torch.linalg.svd`` of every matrix's float32 delta, truncated to R, saved).

    python benchmarks/algebra_extract.py [--gb 1.1] [--rank 16] [--energy 0.9] [--anchor auto|mergekit|torch] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from audit_speed import warm

FULL = {"hidden": 2048, "inter": 5632, "heads": 32, "kv_heads": 4, "vocab": 32000}
QUICK = {"hidden": 256, "inter": 704, "heads": 4, "kv_heads": 2, "vocab": 1000}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MERGEKIT = "mergekit==0.1.5"
VENV = os.path.join(tempfile.gettempdir(), "adapterdoc-bench-mergekit")

READ_CHILD = """\
import sys
from safetensors.torch import load_file
for path in sys.argv[1:]:
    tensors = load_file(path)
    del tensors
"""
KINDS_CHILD = """\
import sys
from adapterdoc.algebra.extract import module_kinds
module_kinds(sys.argv[1])
"""
"""What every extract pays before it reads a weight: torch, transformers and peft imported, the base's class built
on the meta device (:func:`adapterdoc.algebra.extract.module_kinds`)."""
TORCH_CHILD = """\
import glob, os, sys
import torch
from safetensors.torch import load_file, save_file
base, tuned, out, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def state(folder):
    sd = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        sd.update(load_file(path))
    return sd
b, t = state(base), state(tuned)
lora = {}
for name, w in t.items():
    if w.dim() == 2:
        u, s, vh = torch.linalg.svd(w.float() - b[name].float(), full_matrices=False)
        root = s[:rank].sqrt()
        key = "base_model.model." + name[: -len(".weight")]
        lora[key + ".lora_A.weight"] = (root[:, None] * vh[:rank]).contiguous()
        lora[key + ".lora_B.weight"] = (u[:, :rank] * root).contiguous()
os.makedirs(out, exist_ok=True)
save_file(lora, os.path.join(out, "adapter_model.safetensors"))
"""


def shapes(dims: dict[str, int], layers: int) -> list[tuple[str, list[int]]]:
    """Every tensor of the decoder, in file order."""
    h, i, head = dims["hidden"], dims["inter"], dims["hidden"] // dims["heads"]
    kv = dims["kv_heads"] * head
    out: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [dims["vocab"], h])]
    for n in range(layers):
        p = f"model.layers.{n}."
        out += [
            (p + "input_layernorm.weight", [h]),
            (p + "self_attn.q_proj.weight", [h, h]),
            (p + "self_attn.k_proj.weight", [kv, h]),
            (p + "self_attn.v_proj.weight", [kv, h]),
            (p + "self_attn.o_proj.weight", [h, h]),
            (p + "post_attention_layernorm.weight", [h]),
            (p + "mlp.gate_proj.weight", [i, h]),
            (p + "mlp.up_proj.weight", [i, h]),
            (p + "mlp.down_proj.weight", [h, i]),
        ]
    return [*out, ("model.norm.weight", [h]), ("lm_head.weight", [dims["vocab"], h])]


def layers_for(dims: dict[str, int], gb: float) -> int:
    """Layers it takes to reach ``gb`` × 10⁹ bytes of bfloat16."""
    fixed = sum(_count(s) for _, s in shapes(dims, 0))
    per_layer = sum(_count(s) for _, s in shapes(dims, 1)) - fixed
    return max(1, round((gb * 1e9 / 2 - fixed) / per_layer))


def _count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def config(dims: dict[str, int], layers: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dims["hidden"],
        "intermediate_size": dims["inter"],
        "num_attention_heads": dims["heads"],
        "num_key_value_heads": dims["kv_heads"],
        "num_hidden_layers": layers,
        "vocab_size": dims["vocab"],
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def build(work: str, dims: dict[str, int], gb: float) -> dict[str, object]:
    """Write base/ and tuned/ under ``work``; return their paths, shard files, bytes and layers."""
    import numpy as np

    layers = layers_for(dims, gb)
    tensors = shapes(dims, layers)
    half = 1 + 9 * ((layers + 1) // 2)  # the embedding and the first half of the layers in shard 1
    groups = [tensors[:half], tensors[half:]]
    rng = np.random.default_rng(0)
    pool = rng.standard_normal(
        1 << 24, dtype=np.float32
    )  # each tensor: a window of it (1 GB is slow to draw)
    files: dict[str, list[str]] = {"base": [], "tuned": []}
    weight_map: dict[str, str] = {}
    for which in files:
        os.makedirs(os.path.join(work, which))
    with contextlib.ExitStack() as stack:
        for k, group in enumerate(groups):
            shard = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
            header: dict[str, object] = {"__metadata__": {"format": "pt"}}
            pos = 0
            for name, shape in group:
                header[name] = {
                    "dtype": "BF16",
                    "shape": shape,
                    "data_offsets": [pos, pos + 2 * _count(shape)],
                }
                pos += 2 * _count(shape)
                weight_map[name] = shard
            text = json.dumps(header, separators=(",", ":")).encode()
            text += b" " * ((8 - (8 + len(text)) % 8) % 8)
            out = {}
            for which in files:
                path = os.path.join(work, which, shard)
                files[which].append(path)
                out[which] = stack.enter_context(open(path, "wb"))
                out[which].write(struct.pack("<Q", len(text)) + text)
            for name, shape in group:
                base, tuned = _pair(name, shape, pool, rng)
                out["base"].write(base)
                out["tuned"].write(tuned)
    for which in files:
        folder = os.path.join(work, which)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config(dims, layers), f)
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    size = sum(os.path.getsize(p) for p in files["base"])
    return {
        "base": os.path.join(work, "base"),
        "tuned": os.path.join(work, "tuned"),
        "files": files,
        "bytes": size,
        "layers": layers,
        "modules": 7 * layers + 2,
    }


def _pair(name: str, shape: list[int], pool, rng) -> tuple[bytes, bytes]:  # type: ignore[no-untyped-def]
    """One tensor's base and tuned bytes: norms 1, weights a window of ``pool`` × 0.02; a matrix's tuned value adds a
    rank-8 change and noise (both about 2e-4 an entry, above bfloat16's step at 0.02), a norm's about 1%."""
    import numpy as np

    n = _count(shape)
    start = int(rng.integers(0, pool.size - n)) if n < pool.size else 0
    base = (
        np.ones(n, np.float32)
        if len(shape) == 1
        else np.resize(pool[start : start + n], n) * np.float32(0.02)
    )
    if len(shape) == 1:  # a norm's gains, moved above bfloat16's step at 1 (2⁻⁷)
        tuned = base + np.resize(pool[(start + 104729) % (pool.size - 1) :][:n], n) * np.float32(0.01)
    else:  # every matrix, as a full fine-tune changes them: projections, embeddings, the head
        rows, cols = shape
        low = rng.standard_normal((rows, 8), dtype=np.float32) @ (
            rng.standard_normal((8, cols), dtype=np.float32) * np.float32(2e-4)
        )
        noise = np.resize(pool[(start + 7919) % (pool.size - 1) :][:n], n) * np.float32(2e-4)
        tuned = base + low.reshape(-1) + noise
    return _bf16(base).tobytes(), _bf16(tuned).tobytes()


def _bf16(x):  # type: ignore[no-untyped-def]
    """float32 → bfloat16 bits, rounded to nearest even."""
    import numpy as np

    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def mergekit(anchor: str) -> str | None:
    """``mergekit-extract-lora`` from a throwaway venv (made here if need be, in at most 10 minutes), or None."""
    exe = os.path.join(VENV, "bin", "mergekit-extract-lora")
    if anchor == "torch":
        return None
    if not os.path.exists(exe):
        try:
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", VENV], check=True)
            subprocess.run(
                [os.path.join(VENV, "bin", "pip"), "install", "-q", "--no-deps", MERGEKIT, "immutables"],
                check=True,
                timeout=600,
            )
        except (subprocess.SubprocessError, OSError) as e:
            print(f"mergekit did not install ({e}); the memory anchor is torch's full-matrix SVD")
            shutil.rmtree(VENV, ignore_errors=True)
            if anchor == "mergekit":
                raise SystemExit(1) from e
            return None
    return exe


def run(cmd: list[str], paths: list[str]) -> tuple[float, float, int, str]:
    """(wall s, CPU s, peak RSS bytes, stdout) of ``cmd`` in a fresh process, ``paths`` in the page cache."""
    for p in paths:
        warm(p)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
    }
    out_fd, out_path = tempfile.mkstemp(prefix="extract-bench-")
    err_fd, err_path = tempfile.mkstemp(prefix="extract-bench-")
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out_fd, stderr=err_fd, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        code = os.waitstatus_to_exitcode(status)
        with open(out_path) as f:
            out = f.read()
        if code not in (0, 1):
            with open(err_path, errors="replace") as f:
                raise SystemExit(f"{' '.join(cmd[:4])} failed with exit code {code}:\n{f.read()[-3000:]}")
    finally:
        for fd, p in ((out_fd, out_path), (err_fd, err_path)):
            os.close(fd)
            os.unlink(p)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.1, help="size of each checkpoint, 10⁹ bytes")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument(
        "--energy",
        type=float,
        default=0.9,
        help="the second extract row's --energy (the whole-spectrum route)",
    )
    ap.add_argument("--anchor", choices=("auto", "mergekit", "torch"), default="auto")
    ap.add_argument(
        "--quick", action="store_true", help="tiny shapes (a smoke run; torch anchor unless told)"
    )
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--build-only", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    dims = QUICK if args.quick else FULL
    gb = 0.01 if args.quick and args.gb == 1.1 else args.gb
    if args.build_only:
        print(json.dumps(build(args.build_only, dims, gb)))
        return
    work = args.workdir or tempfile.mkdtemp(prefix="adapterdoc-extract-bench-")
    try:
        t0 = time.perf_counter()
        # built in a child: ru_maxrss survives fork, so a parent holding numpy buffers would inflate every figure
        cmd = [sys.executable, __file__, "--build-only", os.path.join(work, "pair"), "--gb", str(gb)]
        made = subprocess.run(
            cmd + (["--quick"] if args.quick else []), check=True, capture_output=True, text=True
        )
        pair = json.loads(made.stdout)
        paths = pair["files"]["base"] + pair["files"]["tuned"]
        print(
            f"pair: {pair['layers']} layers, {pair['modules']} changed matrices, "
            f"{pair['bytes'] / 1e9:.2f} GB BF16 each (built in {time.perf_counter() - t0:.1f} s)"
        )
        import adapterdoc

        subprocess.run(  # bytecode compiled, as pip leaves an installed package
            [sys.executable, "-m", "compileall", "-q", os.path.dirname(adapterdoc.__file__)],
            capture_output=True,
        )
        py, base, tuned, r = sys.executable, pair["base"], pair["tuned"], str(args.rank)
        exe = mergekit("torch" if args.quick and args.anchor == "auto" else args.anchor)
        if exe:
            anchor_name = "mergekit-extract-lora"
            anchor = [
                exe,
                "--model",
                tuned,
                "--base-model",
                base,
                "--out-path",
                os.path.join(work, "mk"),
                "--max-rank",
                r,
                "--device",
                "cpu",
            ]
        else:
            anchor_name = "torch full SVD"
            anchor = [py, "-c", TORCH_CHILD, base, tuned, os.path.join(work, "torch"), r]
        extract = [py, "-m", "adapterdoc", "extract", "--base", base, "--tuned", tuned]
        rows = [
            ("read both (anchor)", [py, "-c", READ_CHILD, *paths]),
            ("adapterdoc extract", [*extract, "--rank", r, "--out", os.path.join(work, "ours"), "--json"]),
            (
                f"adapterdoc extract --energy {args.energy:g}",
                [*extract, "--energy", str(args.energy), "--out", os.path.join(work, "ours-e"), "--json"],
            ),
            ("  its imports + meta model", [py, "-c", KINDS_CHILD, base]),
            (f"{anchor_name} (anchor)", anchor),
        ]
        results = {}
        for name, cmd in rows:
            results[name] = run(cmd, paths)
        report = json.loads(results["adapterdoc extract"][3])
        read, mem = results["read both (anchor)"], results[f"{anchor_name} (anchor)"]
        print(
            f"\n| {'run':<32} | {'wall s':>7} | {'CPU s':>7} | {'peak RSS MiB':>12} | {'ratio to anchor':>22} |"
        )
        print(f"|{'-' * 34}|{'-' * 9}|{'-' * 9}|{'-' * 14}|{'-' * 24}|")
        for name, (wall, cpu, rss, _) in results.items():
            if name.startswith("adapterdoc extract"):
                ratio = f"{wall / read[0]:.2f}× wall, {rss / mem[2]:.3f}× RSS"
            else:
                ratio = "-"
            print(f"| {name:<32} | {wall:7.2f} | {cpu:7.2f} | {rss / 2**20:12.0f} | {ratio:>22} |")
        ours, fixed = results["adapterdoc extract"], results["  its imports + meta model"]
        print(
            f"\nextract less its imports + meta model: {ours[0] - fixed[0]:.2f} s wall "
            f"({(ours[0] - fixed[0]) / read[0]:.2f}× read both), {ours[1] - fixed[1]:.2f} s CPU "
            f"({(ours[1] - fixed[1]) / read[1]:.2f}× read both)"
        )
        rows_out = report.get("modules", [])
        worst = max((m["rel_error"] for m in rows_out), default=0.0)
        print(
            f"extract: {len(rows_out)} modules at rank {r}; targets: ≤ 2× read both "
            f"(got {results['adapterdoc extract'][0] / read[0]:.2f}×), ≤ 0.2× {anchor_name}'s peak RSS "
            f"(got {results['adapterdoc extract'][2] / mem[2]:.3f}×); worst relative error {worst:.4g}"
        )
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
