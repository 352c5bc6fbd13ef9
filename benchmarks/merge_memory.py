"""Peak memory and wall time of `adapterdoc merge` against PEFT's `merge_and_unload` on a synthetic base.

The base is a decoder of the ``--family`` (``ministral3``: the registry's tiny reference config scaled up;
``llama``: a plain ``LlamaForCausalLM``, a family outside the registry whose plan is read off its own headers; both the
same shape: hidden 2048, 16 heads, MLP 5632, vocab 32000, bfloat16, untied) with as many layers as it takes to reach
``--gib``, saved with ``save_pretrained`` in sharded safetensors. The adapter is LoRA r=16 on every attention and MLP projection. Each tool runs in its own
fresh process; peak RSS and CPU time (user + system) come from ``os.wait4`` (the child's own rusage),
wall time from the parent. On a shared machine wall time swings with other load; CPU time much less.
The parent never imports torch (``ru_maxrss`` survives ``fork``, so a
large parent would inflate every child's figure); the base is built, and the outputs compared, in a child too. Both start with the base in the page cache (read once just before each run), both end with a merged
checkpoint on disk (the anchor: ``from_pretrained`` → ``PeftModel.from_pretrained`` → ``merge_and_unload`` →
``save_pretrained``). A spot check compares the two outputs tensor by tensor.

    python benchmarks/merge_memory.py [--gib 2.0] [--family ministral3,llama] [--runs 1] [--workdir DIR] [--keep]

Runs alternate the order of the two tools; medians are reported, with the load average before and after (others'
work on a shared machine swings wall times) and the planner adapterdoc's merge used (``plan`` in its JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 2048, 5632, 16, 8, 128, 32000
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

PEFT_CHILD = """
import sys, warnings
warnings.filterwarnings("ignore")
import torch, transformers as tf
from peft import PeftModel
base, adapter, out = sys.argv[1:4]
model = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
merged.save_pretrained(out)
"""


def _layers_for(gib: float) -> int:
    per_layer = HIDDEN * HEADS * HEAD_DIM * 2 + HIDDEN * KV_HEADS * HEAD_DIM * 2 + 3 * HIDDEN * INTER
    fixed = 2 * VOCAB * HIDDEN
    want = gib * 2**30 / 2  # bfloat16 parameters
    return max(1, -(-int(want - fixed) // per_layer))


FAMILIES = ("ministral3", "llama")


def build(workdir: str, gib: float, family: str) -> tuple[str, str, int]:
    """Save the synthetic base and a LoRA adapter for it; return (base dir, adapter dir, base bytes)."""
    import warnings

    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    from adapterdoc.ml.tiny import tiny_config

    warnings.filterwarnings("ignore")
    if family == "llama":
        cfg, cls = tf.LlamaConfig(max_position_embeddings=4096), tf.LlamaForCausalLM
    else:
        cfg, cls = tiny_config("ministral3_text"), tf.Ministral3ForCausalLM
    for k, v in dict(
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        vocab_size=VOCAB,
        num_hidden_layers=_layers_for(gib),
        tie_word_embeddings=False,
    ).items():
        setattr(cfg, k, v)
    with torch.device("meta"):
        model = cls._from_config(cfg, dtype=torch.bfloat16)
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        for b in model.buffers():
            b.zero_()
    base = os.path.join(workdir, "base")
    model.save_pretrained(base, max_shard_size="500MB")
    pm = get_peft_model(model, LoraConfig(target_modules=TARGETS, r=16, lora_alpha=32))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    adapter = os.path.join(workdir, "adapter")
    pm.save_pretrained(adapter)
    size = sum(os.path.getsize(os.path.join(base, f)) for f in os.listdir(base) if f.endswith(".safetensors"))
    return base, adapter, size


def _warm(folder: str) -> None:
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with open(os.path.join(folder, f), "rb") as fh:
                while fh.read(64 << 20):
                    pass


def measure(cmd: list[str], warm: str, stdout: str | None = None) -> tuple[float, int, float]:
    """(wall seconds, peak RSS bytes, user+system CPU seconds) of ``cmd`` in a fresh process; its stdout goes to
    the file ``stdout`` (or nowhere)."""
    _warm(warm)
    sink = open(stdout, "wb") if stdout else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if stdout:
        sink.close()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{cmd[:4]} failed with exit code {code}:\n{err[-2000:]}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def spot_check(ours: str, peft: str) -> str:
    """Compare every tensor of the first shard of both outputs: bitwise equal, or within one bfloat16 ulp."""
    import torch
    from safetensors import safe_open

    def shard_of(folder: str) -> dict[str, str]:
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                return json.load(f)["weight_map"]
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
            return dict.fromkeys(f.keys(), "model.safetensors")

    a_map, b_map = shard_of(ours), shard_of(peft)
    assert set(a_map) == set(b_map), "the two outputs hold different tensors"
    first = sorted(set(a_map.values()))[0]
    names = [n for n, s in a_map.items() if s == first]
    equal = within = 0
    worst = 0.0
    for n in names:
        with (
            safe_open(os.path.join(ours, a_map[n]), "pt") as fa,
            safe_open(os.path.join(peft, b_map[n]), "pt") as fb,
        ):
            a, b = fa.get_tensor(n).float(), fb.get_tensor(n).float()
        ulp = torch.exp2(torch.floor(torch.log2(b.abs().clamp_min(2.0**-126))) - 7)
        ratio = ((a - b).abs() / ulp).max().item()
        worst = max(worst, ratio)
        equal += int(torch.equal(a, b))
        within += int(ratio <= 1.0)
    return f"{len(names)} tensors of {first}: {equal} bitwise equal, {within} within 1 ulp (worst {worst:.2f} ulp)"


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0, help="base size in GiB (at least 1)")
    ap.add_argument(
        "--family",
        default="ministral3",
        help=f"the base's family, or several comma-separated, each with its own PEFT anchor ({', '.join(FAMILIES)})",
    )
    ap.add_argument("--runs", type=int, default=1, help="runs per tool (medians are reported)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spot-check", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.spot_check:
        print(spot_check(*args.spot_check))
        return
    if args.gib < 1:
        raise SystemExit("--gib must be at least 1")
    families = args.family.split(",")
    for family in families:
        if family not in FAMILIES:
            raise SystemExit(f"--family must be among {', '.join(FAMILIES)}, got {family!r}")
    workdir = args.workdir or tempfile.mkdtemp(prefix="adapterdoc-merge-bench-")
    os.makedirs(workdir, exist_ok=True)
    if args.build_only:
        print(json.dumps(build(workdir, args.gib, families[0])))
        return
    try:
        summary = []
        for family in families:
            print(f"## {family}\n")
            summary.append(run_family(family, os.path.join(workdir, family), args))
            print()
        if len(summary) > 1:
            print("| family | plan | wall vs PEFT | peak RSS vs PEFT |")
            print("| --- | --- | ---: | ---: |")
            for row in summary:
                print(row)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept {workdir}")


def run_family(family: str, workdir: str, args: argparse.Namespace) -> str:
    """Build (or reuse) one family's base and adapter, run both tools, print the table; return a summary row."""
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    stamp = os.path.join(workdir, "built.json")
    if args.keep and os.path.exists(stamp):  # --keep: reuse the base and adapter a previous run built
        with open(stamp) as f:
            base, adapter, size = json.load(f)
    else:
        built = subprocess.run(
            [
                sys.executable,
                __file__,
                "--build-only",
                "--gib",
                str(args.gib),
                "--family",
                family,
                "--workdir",
                workdir,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        base, adapter, size = json.loads(built.stdout.strip().splitlines()[-1])
        with open(stamp, "w") as f:
            json.dump([base, adapter, size], f)
    n_files = len([f for f in os.listdir(base) if f.endswith(".safetensors")])
    print(
        f"synthetic {family} base: {size / 2**30:.2f} GiB, {n_files} shards "
        f"({time.perf_counter() - t0:.0f} s to build)"
    )
    names = ["adapterdoc merge", "PEFT merge_and_unload"]
    results: dict[str, list[tuple[float, int, float]]] = {n: [] for n in names}
    outs = {name: os.path.join(workdir, f"out-{i}") for i, name in enumerate(names)}
    cmds = {
        names[0]: [
            sys.executable,
            "-m",
            "adapterdoc",
            "merge",
            adapter,
            "--base",
            base,
            "--out",
            outs[names[0]],
            "--json",
        ],
        names[1]: [sys.executable, "-c", PEFT_CHILD, base, adapter, outs[names[1]]],
    }
    print("load average before:", _loadavg())
    report_json = os.path.join(workdir, "merge-report.json")
    for run in range(args.runs):
        for name in names if run % 2 == 0 else names[::-1]:
            shutil.rmtree(outs[name], ignore_errors=True)
            results[name].append(measure(cmds[name], base, report_json if name == names[0] else None))
    print("load average after:", _loadavg())
    with open(report_json) as f:
        report = json.load(f)
    print(
        f"adapterdoc's plan: {report['plan']}"
        + (f" ({report['plan_fallback']})" if report["plan_fallback"] else "")
    )
    anchor_wall = statistics.median(w for w, _, _ in results[names[1]])
    anchor_rss = statistics.median(r for _, r, _ in results[names[1]])
    anchor_cpu = statistics.median(c for _, _, c in results[names[1]])
    print()
    print(
        "| tool | wall time (s) | CPU time (s) | peak RSS (MiB) | RSS vs PEFT | wall vs PEFT | CPU vs PEFT |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, rows in results.items():
        wall = statistics.median(w for w, _, _ in rows)
        rss = statistics.median(r for _, r, _ in rows)
        cpu = statistics.median(c for _, _, c in rows)
        print(
            f"| {name} | {wall:.1f} | {cpu:.1f} | {rss / 2**20:.0f} | {100 * rss / anchor_rss:.0f}% | "
            f"{wall / anchor_wall:.2f}x | {cpu / anchor_cpu:.2f}x |"
        )
    if args.runs > 1:
        print()
        for name, rows in results.items():
            print(
                f"{name}: "
                + ", ".join(f"{w:.1f} s wall / {c:.1f} s CPU / {r / 2**20:.0f} MiB" for w, r, c in rows)
            )
    ours_rows = results[names[0]]
    wall_ratio = statistics.median(w for w, _, _ in ours_rows) / anchor_wall
    rss_ratio = statistics.median(r for _, r, _ in ours_rows) / anchor_rss
    print(
        f"\nadapterdoc merge / PEFT merge_and_unload + save: "
        f"{wall_ratio:.2f}x wall, {rss_ratio:.2f}x peak RSS (goal <= 0.5x, <= 0.15x)"
    )
    print()
    check = (
        subprocess.run(  # in a child: torch in this process would inflate the next family's children's RSS
            [sys.executable, __file__, "--spot-check", outs[names[0]], outs[names[1]]],
            check=True,
            capture_output=True,
            text=True,
        )
    )
    print("spot check:", check.stdout.strip().splitlines()[-1])
    return f"| {family} | {report['plan']} | {wall_ratio:.2f}x | {rss_ratio:.2f}x |"


if __name__ == "__main__":
    main()
