"""`verify` against full-size configs: seconds and peak memory, each case in a fresh process.

Cases: transformers' default configs for Qwen3.5-MoE, Qwen3-Omni (thinker only: ``enable_audio_output=False``; the
default talker config does not build in transformers 5.24) and Mistral3, plus a 60-layer / 512-expert Qwen3.5-MoE
variant (the Qwen3.5-397B-A17B shape, ~397B parameters). For each, the script writes config.json and a PEFT-shaped BF16 adapter (the keys and
shapes PEFT builds for that config; random BF16 factors, so every module and every expert has a non-zero,
full-rank ``B A``; or holes with one non-zero element per lora_B with ``--sparse``, which the default scan's
audit rightly fails with AD310) and runs `adapterdoc verify` in
a child process that reports its own wall time and peak RSS (``resource.getrusage``).

Rows per case: verify with the registry's torch-free expected keys (``registry``), verify forced onto the
meta-device path (``meta-device``, how verify worked before the registry path), the default scan (``all``:
the weights audit of every factor, the gate), and the anchors: the import of
torch + transformers + peft alone, and PEFT's own ``load_adapter(..., low_cpu_mem_usage=True)`` on the
meta-device base. Wall time is each fresh process's whole life; peak RSS is ``/usr/bin/time``'s (the process's
own), else ``resource.getrusage``. The last lines give registry verify / PEFT's check, wall and peak.

    python benchmarks/verify_scale.py [--keep DIR] [--sparse] [--skip-meta] [--gpm-anchor] [--peft-anchor default|all|none]
        [--case TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

CASES: dict[str, dict[str, Any]] = {
    "qwen3_5_moe (default)": {"layout": "qwen3_5_moe_vl", "r": 8},
    "qwen3_omni thinker (default)": {"layout": "qwen3_omni", "r": 8},
    "mistral3 (default)": {"layout": "mistral3_vl", "r": 8},
    "qwen3_5_moe 60L x 512E (397B)": {
        "layout": "qwen3_5_moe_vl",
        "r": 2,
        "text": {  # the Qwen3.5-397B-A17B shape: 60 layers, 512 experts, hidden 4096
            "num_hidden_layers": 60,
            "num_experts": 512,
            "hidden_size": 4096,
            "moe_intermediate_size": 1024,
            "shared_expert_intermediate_size": 1024,
            "num_attention_heads": 32,
            "linear_num_value_heads": 64,
        },
    },
}


def make_config(layout: str, text: dict[str, Any] | None = None) -> Any:
    import transformers as tf

    if layout == "qwen3_5_moe_vl":
        cfg = tf.Qwen3_5MoeConfig()
        if text:
            tc = cfg.text_config.to_dict()
            tc.update(text)
            if "num_hidden_layers" in text:
                n = text["num_hidden_layers"]
                tc["layer_types"] = [
                    "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)
                ]
            cfg = tf.Qwen3_5MoeConfig(text_config=tc, vision_config=cfg.vision_config.to_dict())
    elif layout == "qwen3_omni":
        cfg = tf.Qwen3OmniMoeConfig(enable_audio_output=False)
    elif layout == "mistral3_vl":
        cfg = tf.Mistral3Config()
    else:
        raise KeyError(layout)
    cfg.architectures = [
        {
            "qwen3_5_moe_vl": "Qwen3_5MoeForConditionalGeneration",
            "qwen3_omni": "Qwen3OmniMoeForConditionalGeneration",
            "mistral3_vl": "Mistral3ForConditionalGeneration",
        }[layout]
    ]
    return cfg


def write_case(root: str, name: str, spec: dict[str, Any], sparse: bool = False) -> dict[str, Any]:
    """config.json + adapter dir for one case; returns sizes."""
    import peft

    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.ml.meta import BaseSpec, PeftLoad, build_meta_adapter
    from adapterdoc.st.header import DTYPE_BITS, TensorInfo, serialize_header

    lay = LAYOUTS[spec["layout"]]
    slug = "".join(c if c.isalnum() else "_" for c in name).strip("_")
    base_dir = os.path.join(root, slug, "base")
    ad_dir = os.path.join(root, slug, "adapter")
    os.makedirs(base_dir, exist_ok=True)
    os.makedirs(ad_dir, exist_ok=True)
    cfg = make_config(spec["layout"], spec.get("text"))
    cfg.save_pretrained(base_dir)
    raw = {
        "peft_type": "LORA",
        "r": spec["r"],
        "lora_alpha": 2 * spec["r"],
        "target_modules": list(lay.lora_leaves),
        "target_parameters": list(lay.target_parameters) or None,
        "exclude_modules": lay.exclude_regex,
        "lora_dropout": 0.0,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    lc = peft.LoraConfig(**{k: v for k, v in raw.items() if k != "peft_type"})
    base = BaseSpec(base_dir, "dir", root=base_dir, config_path=os.path.join(base_dir, "config.json"))
    meta = build_meta_adapter(base, lc, config=cfg)
    assert isinstance(meta.matcher, PeftLoad)  # the meta-device path: PEFT's own model
    pm = meta.matcher.pm
    params = sum(p.numel() for n, p in pm.get_base_model().named_parameters() if "lora_" not in n)
    eff = pm.peft_config["default"]
    raw["target_modules"] = (
        sorted(eff.target_modules) if isinstance(eff.target_modules, (set, list)) else eff.target_modules
    )
    raw["target_parameters"] = sorted(eff.target_parameters or []) or None
    raw["rank_pattern"], raw["alpha_pattern"] = dict(eff.rank_pattern or {}), dict(eff.alpha_pattern or {})
    with open(os.path.join(ad_dir, "adapter_config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    infos: list[TensorInfo] = []
    pos = 0
    for key in sorted(meta.expected):
        shape = meta.expected[key]
        n = 1
        for d in shape:
            n *= d
        size = n * DTYPE_BITS["BF16"] // 8
        infos.append(TensorInfo(key, "BF16", tuple(shape), pos, pos + size))
        pos += size
    header = serialize_header({"format": "pt"}, infos)
    header += b" " * (-(8 + len(header)) % 8)
    path = os.path.join(ad_dir, "adapter_model.safetensors")
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        if sparse:  # holes read as zeros; one non-zero element per lora_B
            start = f.tell()
            f.truncate(start + pos)
            for t in infos:
                if ".lora_B." in t.name:
                    f.seek(start + t.begin)
                    f.write(b"\x80\x3f")  # BF16 1.0
        else:  # random BF16 (A ~ N(0, 0.02²), B ~ N(0, 0.002²)): every module and expert has a full-rank B A
            import numpy as np

            rng = np.random.default_rng(0)
            pool = {
                sd: ((rng.standard_normal(1 << 24, dtype=np.float32) * sd).view(np.uint32) >> 16).astype(
                    "<u2"
                )
                for sd in (0.02, 0.002)
            }
            for t in infos:  # each tensor: windows of the pool at random offsets (no two experts alike)
                src = pool[0.002 if ".lora_B." in t.name else 0.02]
                left = (t.end - t.begin) // 2
                while left:
                    n = min(left, src.size // 2)
                    at = int(rng.integers(0, src.size - n + 1))
                    f.write(src[at : at + n].tobytes())
                    left -= n
    return {"params": params, "tensors": len(infos), "bytes": pos, "base": base_dir, "adapter": ad_dir}


def cached_case(root: str, name: str, spec: dict[str, Any], sparse: bool, keep: bool) -> dict[str, Any]:
    """:func:`write_case`, or with ``--keep`` the case a previous run wrote there (same data kind)."""
    slug = "".join(c if c.isalnum() else "_" for c in name).strip("_")
    stamp = os.path.join(root, slug, f"case-{'sparse' if sparse else 'random'}.json")
    if keep and os.path.exists(stamp):
        with open(stamp) as f:
            return json.load(f)
    info = write_case(root, name, spec, sparse)
    with open(stamp, "w") as f:
        json.dump(info, f)
    return info


CHILD = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
t0 = time.perf_counter()
mode, a, b, c = sys.argv[1:5]
if mode == "imports":
    import torch, transformers, peft  # noqa
    out = {}
elif mode in ("verify", "registry"):
    if mode == "verify":  # the meta-device path, as verify ran before the registry path existed
        import torch, transformers, peft  # noqa
    t1 = time.perf_counter()
    from adapterdoc.verify import VerifyOptions, verify
    keys = "meta-device" if mode == "verify" else "auto"
    run = verify([a], b, VerifyOptions(scan=c, expected_keys=keys))
    r = run.adapters[0]
    out = {"verify_s": time.perf_counter() - t1, "ok": r.ok, "error": r.error, "missing": len(r.missing),
           "unexpected": len(r.unexpected), "lora_b": r.lora_b, "codes": sorted({f.code for f in r.findings}),
           "from": r.expected_keys_from, "torch": "torch" in sys.modules}
elif mode == "peft":
    import torch, transformers, peft
    from peft import PeftModel
    t1 = time.perf_counter()
    cfg = transformers.AutoConfig.from_pretrained(b)
    cls = getattr(transformers, cfg.architectures[0])
    with torch.device("meta"):
        model = cls._from_config(cfg)
    pm = PeftModel.from_pretrained(model, a, low_cpu_mem_usage=True)
    out = {"verify_s": time.perf_counter() - t1}
elif mode == "peft_gpm":  # PEFT's own check as a user writes it: get_peft_model, then load_adapter
    import torch, transformers, peft
    t1 = time.perf_counter()
    cfg = transformers.AutoConfig.from_pretrained(b)
    cls = getattr(transformers, cfg.architectures[0])
    with torch.device("meta"):
        model = cls._from_config(cfg)
    pm = peft.get_peft_model(model, peft.PeftConfig.from_pretrained(a))
    pm.load_adapter(a, adapter_name="default")
    out = {"verify_s": time.perf_counter() - t1}
out["total_s"] = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
out["peak_mb"] = usage.ru_maxrss / 1024
out["cpu_s"] = usage.ru_utime + usage.ru_stime
print(json.dumps(out))
"""


def child(mode: str, a: str = "", b: str = "", c: str = "") -> dict[str, Any]:
    """One fresh process; ``wall_s`` is its whole life (interpreter start to exit) seen from here."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # /usr/bin/time reports the child's own peak RSS: a process forked from this one (which holds torch) would
    # otherwise report this process's peak too (Linux keeps ru_maxrss across execve)
    timer = ["/usr/bin/time", "-f", "peak_kb=%M"] if os.path.exists("/usr/bin/time") else []
    t = time.perf_counter()
    p = subprocess.run(
        [*timer, sys.executable, "-c", CHILD, mode, a, b, c],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    out = {**json.loads(p.stdout.strip().splitlines()[-1]), "wall_s": wall}
    peaks = [line for line in p.stderr.splitlines() if line.startswith("peak_kb=")]
    if peaks:
        out["peak_mb"] = int(peaks[-1].split("=")[1]) / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", help="write the cases here and keep them")
    ap.add_argument("--sparse", action="store_true", help="write adapter data as holes (fast, little disk)")
    ap.add_argument("--peft-anchor", choices=("default", "all", "none"), default="default")
    ap.add_argument(
        "--gpm-anchor",
        action="store_true",
        help="also time PEFT's get_peft_model + load_adapter on the meta model",
    )
    ap.add_argument("--skip-meta", action="store_true", help="leave out the forced meta-device verify rows")
    ap.add_argument("--case", action="append", help="only cases whose name contains this (repeatable)")
    args = ap.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="verify-scale-")
    t = time.perf_counter()
    chosen = {n: s for n, s in CASES.items() if not args.case or any(c in n for c in args.case)}
    cases = {
        name: cached_case(root, name, spec, args.sparse, bool(args.keep)) for name, spec in chosen.items()
    }
    print(f"wrote {len(cases)} cases under {root} in {time.perf_counter() - t:.1f} s\n")
    # bytecode compiled, as pip leaves an installed package (PYTHONDONTWRITEBYTECODE would otherwise make
    # every fresh process compile every module)
    import adapterdoc

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", os.path.dirname(adapterdoc.__file__)], capture_output=True
    )
    imp = child("imports")
    print(
        f"anchor: import torch + transformers + peft alone: {imp['total_s']:.2f} s, peak {imp['peak_mb']:.0f} MB\n"
    )
    head = (
        f"| {'case':<29} | {'base params':>11} | {'tensors':>7} | {'adapter':>9} | {'mode':<22} | "
        f"{'wall s':>7} | {'verify s':>8} | {'peak MB':>7} | result |"
    )
    print(head)
    print("|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|")
    ratios: list[str] = []
    for i, (name, info) in enumerate(cases.items()):
        rows = [("registry, scan nonzero", child("registry", info["adapter"], info["base"], "nonzero"))]
        if not args.skip_meta:
            rows.append(("meta-device, nonzero", child("verify", info["adapter"], info["base"], "nonzero")))
        rows.append(("registry, scan all", child("registry", info["adapter"], info["base"], "all")))
        if args.peft_anchor == "all" or (args.peft_anchor == "default" and i in (0, len(cases) - 1)):
            rows.append(("PEFT load (anchor)", child("peft", info["adapter"], info["base"])))
            if args.gpm_anchor:
                rows.append(("PEFT get_peft_model+load", child("peft_gpm", info["adapter"], info["base"])))
        for mode, res in rows:
            if "error" in res and "total_s" not in res:
                result = f"FAILED: {res['error'][:60]}"
                print(
                    f"| {name:<29} | {info['params'] / 1e9:>10.1f}B | {info['tensors']:>7} | "
                    f"{info['bytes'] / 2**30:>6.2f}GiB | {mode:<22} | {'-':>7} | {'-':>8} | {'-':>7} | {result} |"
                )
                continue
            if mode.startswith("PEFT"):
                result = "loaded"
            else:
                result = "ok" if res["ok"] else "errors: " + ",".join(c for c in res["codes"] if c < "AD3")
                result += f" (lora_B {res['lora_b']['nonzero']}/{res['lora_b']['total']}; {res['from']}"
                result += ", torch imported)" if res["torch"] else ", no torch)"
            print(
                f"| {name:<29} | {info['params'] / 1e9:>10.1f}B | {info['tensors']:>7} | "
                f"{info['bytes'] / 2**30:>6.2f}GiB | {mode:<22} | {res['wall_s']:>7.2f} | {res['verify_s']:>8.2f} | "
                f"{res['peak_mb']:>7.0f} | {result} |"
            )
        by_mode = {m: r for m, r in rows if "wall_s" in r}
        for amode, alabel in (
            ("PEFT load (anchor)", "PEFT meta-device from_pretrained(low_cpu_mem_usage)"),
            ("PEFT get_peft_model+load", "PEFT meta-device get_peft_model + load_adapter"),
        ):
            anchor = by_mode.get(amode)
            for mode, label in (
                ("registry, scan all", "default scan"),
                ("registry, scan nonzero", "scan nonzero"),
            ):
                fast = by_mode.get(mode)
                if fast and anchor:
                    ratios.append(
                        f"{name}: verify ({label}) / {alabel} = "
                        f"{fast['wall_s'] / anchor['wall_s']:.3f}x wall "
                        f"({fast['wall_s']:.2f} / {anchor['wall_s']:.2f} s), "
                        f"{fast['cpu_s'] / anchor['cpu_s']:.3f}x CPU "
                        f"({fast['cpu_s']:.2f} / {anchor['cpu_s']:.2f} s), "
                        f"{fast['peak_mb'] / anchor['peak_mb']:.3f}x peak RSS"
                    )
    for line in ratios:
        print("\n" + line)
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
