"""Wall time and peak memory of `adapterdoc merge` into a block-FP8 base, beside transformers + PEFT (issue 41).

The base is a Llama (hidden 2048, 16 heads, 8 KV heads, MLP 5632, vocab 32000, untied; ``--layers`` decoder layers,
20 by default: 1.2 GB of safetensors, about 1.1 GiB) with random bfloat16 weights, every projection quantized by
transformers' own ``Fp8Quantize`` op (F8_E4M3 ``.weight`` + F32 ``.weight_scale_inv``, 128×128 blocks) and
``FineGrainedFP8Config(weight_block_size=[128, 128]).to_dict()`` as its ``quantization_config``, as
``fixtures/make_quantized.py`` makes ``fp8-transformers``; embeddings, norms and ``lm_head`` stay bfloat16. It is
written in ~500 MB shards with an index. The adapter is a PEFT LoRA (r=16, alpha 32, all seven projections) saved by
PEFT's own ``save_pretrained``, its factors random with ‖scaling·BA‖/‖W‖ ≈ 2%. Both are built once into ``--work``
and reused.

Each tool runs in its own fresh process, the base read once just before (page cache warm); wall time from the parent,
peak RSS and CPU time (user + system) from ``os.wait4`` (the parent never imports torch):

- anchor: ``AutoModelForCausalLM.from_pretrained(base, quantization_config=FineGrainedFP8Config(dequantize=True),
  dtype=torch.bfloat16)`` (on the CPU it loads every projection as a plain bfloat16 ``nn.Linear``, weights
  ``bf16(q · scale)``), ``PeftModel.from_pretrained``, ``merge_and_unload()``, ``save_pretrained(out)``;
- ``adapterdoc merge ADAPTER --base BASE --out OUT --json`` (default dtype). A refusal (exit 1 and a finding, AD520
  while quantized bases are refused) is a row of the table, not an error.

Then a check, in a child, reads both outputs tensor by tensor beside a float32 reference (``q · scale`` + scaling·BA
in float32, the issue's rule): the two outputs must hold the same tensors, the untouched ones bitwise equal, every
merged element within 2 bfloat16 ulps of ``max(|W|, |W + Δ|)`` of each other (the anchor rounds W to bfloat16 before
it adds, adapterdoc after), and each output must keep the whole delta (⟨out − W, Δ⟩ / ⟨Δ, Δ⟩ within 1% of 1), so a
fast wrong merge cannot pass. Targets: adapterdoc ≤ 0.5× the anchor's wall, ≤ 0.15× its peak RSS.

    python benchmarks/quant_merge.py --work /work/bench-quant [--layers 20] [--repeat 1] [--json]
    python benchmarks/quant_merge.py --work DIR --quick      # 2 layers, vocab 4096: a smoke run under a minute
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, NamedTuple

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS = 2048, 5632, 16, 8, 128, 32000, 20
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 16, 32
SHARD_BYTES = 500 * 10**6
WALL_GOAL, PEAK_GOAL = 0.5, 0.15
ULPS, KEPT_TOL = 2.0, 0.01
ANCHOR, OURS = "transformers+PEFT (anchor)", "adapterdoc merge"
QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}

ANCHOR_CHILD = """
import sys, warnings
warnings.filterwarnings("ignore")
import torch, transformers as tf
from peft import PeftModel
base, adapter, out = sys.argv[1:4]
qc = tf.FineGrainedFP8Config(dequantize=True)
model = tf.AutoModelForCausalLM.from_pretrained(base, quantization_config=qc, dtype=torch.bfloat16)
q = model.model.layers[0].self_attn.q_proj
assert type(q) is torch.nn.Linear and q.weight.dtype == torch.bfloat16, (type(q), q.weight.dtype)
merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
merged.save_pretrained(out)
"""


# ------------------------------------------------------------------------------------------------ the inputs


def llama_config(layers: int, vocab: int) -> Any:
    import transformers as tf

    return tf.LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        vocab_size=vocab,
        num_hidden_layers=layers,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


def is_projection(name: str) -> bool:
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def build(folder: str, layers: int, vocab: int) -> dict[str, Any]:
    """Write the block-FP8 base and a PEFT adapter for it into ``folder``; return what was built."""
    import types
    import warnings

    import torch
    import transformers as tf
    from safetensors.torch import save_file
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    warnings.filterwarnings("ignore")
    cfg = llama_config(layers, vocab)
    with torch.device("meta"):
        meta = tf.LlamaForCausalLM(cfg)
    shapes = {n: tuple(t.shape) for n, t in meta.state_dict().items()}
    fp8 = tf.FineGrainedFP8Config(weight_block_size=[128, 128])  # type: ignore[arg-type]  # as make_quantized.py
    op = Fp8Quantize(types.SimpleNamespace(quantization_config=fp8))  # type: ignore[no-untyped-call]
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():  # bytes on disk: 1 per FP8 code, 2 per bfloat16 value
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        step = n if is_projection(name) else 2 * n
        if size and size + step > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += step
    base = os.path.join(folder, "base")
    os.makedirs(base)
    g = torch.Generator().manual_seed(0)
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for name in names:
            if name.endswith("norm.weight"):
                value = torch.ones(shapes[name], dtype=torch.bfloat16)
            else:
                value = (torch.randn(shapes[name], generator=g) * 0.02).to(torch.bfloat16)
            if is_projection(name):
                tensors.update(op.convert({name: value}))  # type: ignore[arg-type]
            else:
                tensors[name] = value
        for name, t in tensors.items():
            weight_map[name] = file
            total += t.numel() * t.element_size()
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(base, file), {"format": "pt"})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(base, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    config = cfg.to_dict()
    config["quantization_config"] = fp8.to_dict()
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    config["architectures"] = ["LlamaForCausalLM"]  # what save_pretrained writes (the header plan reads it)
    with open(os.path.join(base, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    adapter = os.path.join(folder, "adapter")
    make_adapter(meta, adapter, g)
    return {"base": base, "adapter": adapter, "bytes": total, "shards": len(shards), "layers": layers}


def make_adapter(meta: Any, folder: str, g: Any) -> None:
    """PEFT's LoRA on the meta-device Llama, factors filled with random values, saved by PEFT itself."""
    import torch
    from peft import LoraConfig, get_peft_model

    pm = get_peft_model(meta, LoraConfig(target_modules=TARGETS, r=RANK, lora_alpha=ALPHA))
    for module in pm.modules():  # A std 0.01, B std 0.004: ‖2·BA‖/‖W‖ ≈ 2·4·0.01·0.004/0.02 ≈ 1.6%
        for attr, std in (("lora_A", 0.01), ("lora_B", 0.004)):
            factors = getattr(module, attr, None)
            if isinstance(factors, torch.nn.ModuleDict):
                for linear in factors.values():
                    assert isinstance(linear, torch.nn.Linear)
                    linear.weight = torch.nn.Parameter(torch.randn(linear.weight.shape, generator=g) * std)
    pm.save_pretrained(folder)


def ensure_built(work: str, layers: int, vocab: int) -> tuple[dict[str, Any], float]:
    """The base and adapter for this shape, built in a child into ``work`` unless already there."""
    folder = os.path.join(work, f"llama-fp8-L{layers}-V{vocab}")
    stamp = os.path.join(folder, "built.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            return json.load(f), 0.0
    t0 = time.perf_counter()
    partial = folder + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    cmd = [sys.executable, __file__, "--build", partial, "--layers", str(layers), "--vocab", str(vocab)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **QUIET_ENV})
    if r.returncode != 0:
        raise SystemExit(f"building the base failed:\n{r.stderr[-3000:]}")
    built = json.loads(r.stdout.strip().splitlines()[-1])
    built = {k: v.replace(partial, folder) if isinstance(v, str) else v for k, v in built.items()}
    with open(os.path.join(partial, "built.json"), "w") as f:
        json.dump(built, f)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(partial, folder)
    return built, time.perf_counter() - t0


# --------------------------------------------------------------------------------------------- measuring


class Run(NamedTuple):
    wall: float
    rss: int
    cpu: float
    code: int
    stdout: str
    stderr: str


def warm(folder: str) -> None:
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with open(os.path.join(folder, f), "rb") as fh:
                while fh.read(64 << 20):
                    pass


def measure(cmd: list[str], base: str, logs: str) -> Run:
    """Wall seconds, peak RSS bytes and CPU seconds of ``cmd`` in a fresh process, its exit code and output (kept in
    files under ``logs``: a pipe would need reading while it runs, and ``communicate`` would reap it before
    ``wait4``)."""
    warm(base)
    env = {**os.environ, **QUIET_ENV}
    os.makedirs(logs, exist_ok=True)
    out_path, err_path = os.path.join(logs, "stdout"), os.path.join(logs, "stderr")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(
        status
    )  # reaped by wait4: tell Popen, so it never waits again
    with open(out_path, errors="replace") as o, open(err_path, errors="replace") as e:
        stdout, stderr = o.read(), e.read()
    return Run(wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime, proc.returncode, stdout, stderr)


def refusal(run: Run) -> str:
    """'ok', or what the failure was: 'refused (AD520)' from adapterdoc's findings, else 'failed (exit N)'."""
    if run.code == 0:
        return "ok"
    try:
        findings = json.loads(run.stdout)["findings"]
        codes = sorted({f["code"] for f in findings if f.get("severity") == "error"})
    except (ValueError, KeyError, TypeError):
        codes = []
    return f"refused ({', '.join(codes)})" if codes else f"failed (exit {run.code})"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


# ------------------------------------------------------------------------------------------- the equality check


def weight_map(folder: str) -> dict[str, str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return dict(json.load(f)["weight_map"])
    from safetensors import safe_open

    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return dict.fromkeys(f.keys(), "model.safetensors")


def check(ours: str, anchor: str, base: str, adapter: str) -> dict[str, Any]:
    """Compare the two merged checkpoints tensor by tensor, beside the float32 reference merge of the base."""
    import contextlib

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    with open(os.path.join(adapter, "adapter_config.json")) as f:
        acfg = json.load(f)
    scaling = acfg["lora_alpha"] / acfg["r"]
    lora = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    maps = {"ours": weight_map(ours), "anchor": weight_map(anchor), "base": weight_map(base)}
    folders = {"ours": ours, "anchor": anchor, "base": base}
    r: dict[str, Any] = {
        "missing": sorted(set(maps["anchor"]) - set(maps["ours"])),
        "extra": sorted(set(maps["ours"]) - set(maps["anchor"])),
        "merged": 0,
        "merged_bitwise_equal": 0,
        "merged_beyond_tolerance": 0,
        "untouched": 0,
        "untouched_differ": 0,
        "dtype_differ": 0,
        "max_abs_diff": 0.0,
        "max_ulps": 0.0,
        "kept": {"ours": [float("inf"), float("-inf")], "anchor": [float("inf"), float("-inf")]},
    }
    with contextlib.ExitStack() as stack:
        handles: dict[tuple[str, str], Any] = {}

        def get(which: str, name: str) -> torch.Tensor:
            file = maps[which][name]
            if (which, file) not in handles:
                path = os.path.join(folders[which], file)
                handles[which, file] = stack.enter_context(safe_open(path, "pt"))
            tensor: torch.Tensor = handles[which, file].get_tensor(name)
            return tensor

        for name in sorted(set(maps["anchor"]) & set(maps["ours"])):
            a, b = get("ours", name), get("anchor", name)
            r["dtype_differ"] += int(a.dtype != b.dtype or a.shape != b.shape)
            prefix = "base_model.model." + name.removesuffix(".weight")
            if prefix + ".lora_A.weight" not in lora:
                r["untouched"] += 1
                r["untouched_differ"] += int(not (a.dtype == b.dtype and torch.equal(a, b)))
                continue
            r["merged"] += 1
            q, s = get("base", name), get("base", name + "_scale_inv")
            rows, cols = q.shape
            w = q.float().reshape(s.shape[0], rows // s.shape[0], s.shape[1], cols // s.shape[1])
            w = (w * s[:, None, :, None].float()).reshape(rows, cols)
            delta = scaling * (
                lora[prefix + ".lora_B.weight"].float() @ lora[prefix + ".lora_A.weight"].float()
            )
            mag = torch.maximum(w.abs(), (w + delta).abs()).clamp_min(2.0**-126)
            ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
            diff = (a.float() - b.float()).abs()
            r["merged_bitwise_equal"] += int(torch.equal(a, b))
            r["merged_beyond_tolerance"] += int(bool((diff > ULPS * ulp).any()))
            r["max_abs_diff"] = max(r["max_abs_diff"], diff.max().item())
            r["max_ulps"] = max(r["max_ulps"], (diff / ulp).max().item())
            dd = torch.sum(delta * delta, dtype=torch.float64).item()
            for which, t in (("ours", a), ("anchor", b)):
                kept = torch.sum((t.float() - w) * delta, dtype=torch.float64).item() / dd
                lo_hi = r["kept"][which]
                r["kept"][which] = [min(lo_hi[0], kept), max(lo_hi[1], kept)]
    r["ok"] = bool(
        not r["missing"]
        and not r["extra"]
        and r["merged"] == len(lora) // 2
        and r["dtype_differ"] == r["untouched_differ"] == r["merged_beyond_tolerance"] == 0
        and all(abs(k - 1) <= KEPT_TOL for lo_hi in r["kept"].values() for k in lo_hi)
    )
    return r


# ------------------------------------------------------------------------------------------------- the run


def run_check(ours: str, anchor: str, built: dict[str, Any]) -> dict[str, Any]:
    """The equality check, in a child (torch in this process would inflate the next children's RSS)."""
    cmd = [sys.executable, __file__, "--check", ours, anchor, built["base"], built["adapter"]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the equality check failed to run:\n{r.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def verdict(ratio: float | None, goal: float) -> str:
    return "n/a" if ratio is None else ("PASS" if ratio <= goal else "FAIL")


def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Build or reuse the inputs, run both tools ``--repeat`` times (alternating), check the outputs."""
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    built, build_s = ensure_built(work, args.layers, args.vocab)
    base, adapter = built["base"], built["adapter"]
    outs = {ANCHOR: os.path.join(work, "out-anchor"), OURS: os.path.join(work, "out-adapterdoc")}
    cmds = {
        ANCHOR: [sys.executable, "-c", ANCHOR_CHILD, base, adapter, outs[ANCHOR]],
        OURS: [
            sys.executable,
            "-m",
            "adapterdoc",
            "merge",
            adapter,
            "--base",
            base,
            "--out",
            outs[OURS],
            "--json",
        ],
    }
    runs: dict[str, list[Run]] = {ANCHOR: [], OURS: []}
    load_before = loadavg()
    for i in range(args.repeat):
        for name in (ANCHOR, OURS) if i % 2 == 0 else (OURS, ANCHOR):
            shutil.rmtree(outs[name], ignore_errors=True)
            run = measure(cmds[name], base, os.path.join(work, "logs", f"{name.split()[0]}-{i}"))
            if name == ANCHOR and run.code != 0:
                raise SystemExit(f"the anchor failed (exit {run.code}):\n{run.stderr[-3000:]}")
            runs[name].append(run)
    rows: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        status = refusal(rs[-1])
        rows[name] = {
            "result": status,
            "wall_s": statistics.median(r.wall for r in rs),
            "cpu_s": statistics.median(r.cpu for r in rs),
            "peak_rss_bytes": int(statistics.median(r.rss for r in rs)),
            "runs": [{"wall_s": r.wall, "cpu_s": r.cpu, "peak_rss_bytes": r.rss, "exit": r.code} for r in rs],
        }
    ok = rows[OURS]["result"] == "ok"
    wall_ratio = rows[OURS]["wall_s"] / rows[ANCHOR]["wall_s"] if ok else None
    peak_ratio = rows[OURS]["peak_rss_bytes"] / rows[ANCHOR]["peak_rss_bytes"] if ok else None
    plan = None
    if ok:
        try:
            plan = json.loads(runs[OURS][-1].stdout).get("plan")
        except ValueError:
            plan = None
    return {
        "base": base,
        "adapter": adapter,
        "base_bytes": built["bytes"],
        "shards": built["shards"],
        "layers": built["layers"],
        "build_s": build_s,
        "load_before": load_before,
        "load_after": loadavg(),
        "rows": rows,
        "plan": plan,
        "wall_ratio": wall_ratio,
        "peak_ratio": peak_ratio,
        "wall_verdict": verdict(wall_ratio, WALL_GOAL),
        "peak_verdict": verdict(peak_ratio, PEAK_GOAL),
        "equality": run_check(outs[OURS], outs[ANCHOR], built) if ok else None,
    }


def print_table(res: dict[str, Any]) -> None:
    built = "reused" if res["build_s"] == 0 else f"built in {res['build_s']:.0f} s"
    print(
        f"block-FP8 Llama base: {res['base_bytes'] / 2**30:.2f} GiB, {res['layers']} layers, "
        f"{res['shards']} shards ({built}); load average {res['load_before']} before, {res['load_after']} after"
    )
    print()
    print("| tool | result | wall (s) | CPU (s) | peak RSS (MiB) | wall vs anchor | peak vs anchor |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    anchor = res["rows"][ANCHOR]
    for name, row in res["rows"].items():
        ok = row["result"] == "ok"
        wall = f"{row['wall_s'] / anchor['wall_s']:.2f}x" if ok else "—"
        peak = f"{row['peak_rss_bytes'] / anchor['peak_rss_bytes']:.3f}x" if ok else "—"
        print(
            f"| {name} | {row['result']} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} | "
            f"{row['peak_rss_bytes'] / 2**20:.0f} | {wall} | {peak} |"
        )
    if any(len(row["runs"]) > 1 for row in res["rows"].values()):
        print()
        for name, row in res["rows"].items():
            each = (
                f"{r['wall_s']:.1f} s wall / {r['cpu_s']:.1f} s CPU / {r['peak_rss_bytes'] / 2**20:.0f} MiB"
                for r in row["runs"]
            )
            print(f"{name}: " + ", ".join(each))
    print()
    ours = res["rows"][OURS]["result"]
    why = "" if res["wall_ratio"] is not None else f" (adapterdoc {ours})"
    wall = f"{res['wall_ratio']:.2f}x" if res["wall_ratio"] is not None else "—"
    peak = f"{res['peak_ratio']:.3f}x" if res["peak_ratio"] is not None else "—"
    print(f"wall vs anchor: {wall} (goal <= {WALL_GOAL}x) {res['wall_verdict']}{why}")
    print(f"peak RSS vs anchor: {peak} (goal <= {PEAK_GOAL}x) {res['peak_verdict']}{why}")
    if res["plan"]:
        print(f"adapterdoc's plan: {res['plan']}")
    eq = res["equality"]
    if eq is None:
        print(f"equality: n/a{why}")
        return
    kept = ", ".join(f"{w} {lo:.4f}-{hi:.4f}" for w, (lo, hi) in eq["kept"].items())
    print(
        f"equality: {'PASS' if eq['ok'] else 'FAIL'}: {eq['merged']} merged tensors, max abs diff "
        f"{eq['max_abs_diff']:.3g} ({eq['max_ulps']:.2f} bf16 ulp), {eq['merged'] - eq['merged_bitwise_equal']} "
        f"not bitwise equal, {eq['merged_beyond_tolerance']} beyond {ULPS:g} ulp; {eq['untouched']} untouched "
        f"tensors, {eq['untouched_differ']} differ; {eq['dtype_differ']} dtype/shape differ; "
        f"{len(eq['missing'])} missing, {len(eq['extra'])} extra; delta kept {kept}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", help="cache folder: the base and adapter are built here once and reused")
    ap.add_argument("--layers", type=int, default=LAYERS, help=f"decoder layers (default {LAYERS}: ~1.1 GiB)")
    ap.add_argument("--vocab", type=int, default=VOCAB, help=argparse.SUPPRESS)
    ap.add_argument(
        "--repeat", type=int, default=1, help="runs per tool, alternating order (medians reported)"
    )
    ap.add_argument("--quick", action="store_true", help="2 layers and a 4096 vocabulary: a smoke run")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    ap.add_argument("--build", help=argparse.SUPPRESS)
    ap.add_argument("--check", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.check:
        print(json.dumps(check(*args.check)))
        return
    if args.quick:
        args.layers, args.vocab = 2, 4096
    if args.build:
        print(json.dumps(build(args.build, args.layers, args.vocab)))
        return
    if not args.work:
        ap.error("--work DIR is required")
    if args.layers < 1 or args.repeat < 1:
        ap.error("--layers and --repeat must be at least 1")
    res = bench(args)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)


if __name__ == "__main__":
    main()
