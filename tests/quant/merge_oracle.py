"""The formats' own libraries against ``adapterdoc merge`` on tiny real quantized bases (run in the quant oracle
environment by tests/quant/test_quant_merge_real.py):

    python merge_oracle.py BASES_DIR WORK_DIR NAME... > result.json

For each base NAME (made by fixtures/make_quantized.py): two real PEFT adapters on every projection (``realistic``,
‖ΔW‖/‖W‖ ≈ 2%, and ``strong``, ≈ 50%); then

- ``decoded``: ``adapterdoc merge --dtype float32`` against PEFT's ``merge_and_unload`` on the base the library
  dequantized in float32 (transformers' FineGrainedFP8 / compressed-tensors decompression, bitsandbytes'
  ``dequantize_4bit`` / int8; DeepSeek's ceil grid and GPTQ/AWQ, which no library here decodes, by their published
  rules written out below): the largest relative difference per tensor, the tensor names on both sides;
- ``requantized``: ``adapterdoc merge --requantize`` of the strong adapter against the library quantizing PEFT's
  merged weight (transformers' ``Fp8Quantize``, compressed-tensors' min-max qparams and compressor, bitsandbytes'
  ``quantize_4bit`` / int8): the tensors that differ in any byte, and those untouched that are not byte-equal;
- ``survival``: ``merge --dry-run --json`` of the realistic adapter, and the exit code of ``--requantize``.

Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def plain_config(base: Path) -> Any:
    import transformers

    raw = json.loads((base / "config.json").read_text())
    raw.pop("quantization_config", None)
    return transformers.LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures",)})


def make_adapter(base: Path, out: Path, rel: float) -> None:
    """A PEFT LoRA (r=8) on every projection whose update is about ``rel`` of each weight's norm."""
    import peft
    import transformers

    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(plain_config(base))
    pm = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=PROJ))
    with torch.no_grad():
        for module in pm.modules():
            if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
                a = module.lora_A["default"].weight
                b = module.lora_B["default"].weight
                a.normal_(0, 1.0)
                b.normal_(0, 1.0)
                delta = (b @ a) * module.scaling["default"]
                w = module.base_layer.weight.float()
                b.mul_(rel * float(w.norm()) / float(delta.norm()))
    pm.save_pretrained(str(out))


# ------------------------------------------------------------------------------------------ library dequantization


def library_decoded(base: Path, name: str) -> dict[str, torch.Tensor]:
    """The base's weights as the format's library (or published rule) decodes them, float32, by tensor name."""
    if name.startswith("fp8-transformers"):
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(
            base, dtype=torch.float32, quantization_config=transformers.FineGrainedFP8Config(dequantize=True)
        )
        return {k: v.float() for k, v in model.state_dict().items()}
    if name.startswith("ct-"):
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(
            base,
            dtype=torch.float32,
            quantization_config=transformers.CompressedTensorsConfig(run_compressed=False),
        )
        return {
            k: v.float() for k, v in model.state_dict().items() if not k.endswith(("_scale", "_zero_point"))
        }
    stored = load_file(str(base / "model.safetensors"))
    if name.startswith("bnb-"):
        return bnb_decoded(base)
    out: dict[str, torch.Tensor] = {}
    for key, value in stored.items():
        if key.endswith(".weight_scale_inv"):
            continue
        if name == "fp8-deepseek" and key + "_scale_inv" in stored:
            out[key] = deepseek_dequant(value, stored[key + "_scale_inv"])
        elif key.endswith(".qweight"):
            module = key.removesuffix(".qweight")
            parts = {s: stored[f"{module}.{s}"] for s in ("qweight", "qzeros", "scales")}
            out[module + ".weight"] = (
                gptq_dequant(parts, stored[module + ".g_idx"]) if name == "gptq" else awq_dequant(parts)
            )
        elif not key.endswith((".qzeros", ".scales", ".g_idx")):
            out[key] = value.float()
    return out


def deepseek_dequant(q: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    """DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant_kernel``: ``y = x · s`` per block, ceil grid, float32."""
    full = s.repeat_interleave(block, 0).repeat_interleave(block, 1)[: q.shape[0], : q.shape[1]]
    return q.to(torch.float32) * full


def _unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """int32 ``[n, m]`` → 4-bit fields ``[n·8, m]`` (field j at bits 4j), as AutoGPTQ's ``torch.bitwise_right_shift``."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    fields = torch.bitwise_right_shift(words[:, None, :], shifts[None, :, None]) & 15
    return fields.reshape(-1, words.shape[1])


def gptq_dequant(p: dict[str, torch.Tensor], g_idx: torch.Tensor) -> torch.Tensor:
    """gptqmodel's torch dequant (v1): ``scales[g] · (q − (qzeros + 1))[g]`` in the scales' dtype (fp16)."""
    q = _unpack_rows(p["qweight"])  # [in, out]
    zeros = _unpack_rows(p["qzeros"].t().contiguous()).t() + 1  # [groups, out]
    g = g_idx.long()
    w = p["scales"][g] * (q - zeros[g]).to(p["scales"].dtype)
    return w.t().contiguous().float()


AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)


def _unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """AutoAWQ ``unpack_awq`` + ``reverse_awq_order``: int32 ``[n, m]`` → ``[n, m·8]`` in column order."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    fields = (torch.bitwise_right_shift(words[:, :, None], shifts[None, None, :]) & 15).reshape(
        words.shape[0], -1
    )
    order = torch.arange(fields.shape[1]).reshape(-1, 8)[:, list(AWQ_REVERSE)].reshape(-1)
    return fields[:, order]


def awq_dequant(p: dict[str, torch.Tensor], group: int = 128) -> torch.Tensor:
    """AutoAWQ ``dequantize_gemm``: ``(iweight − izeros[g]) · scales[g]`` in the scales' dtype, ``[out, in]``."""
    iw = _unpack_awq(p["qweight"])  # [in, out]
    iz = _unpack_awq(p["qzeros"]).repeat_interleave(group, 0)
    sc = p["scales"].repeat_interleave(group, 0)
    return ((iw - iz).to(sc.dtype) * sc).t().contiguous().float()


def bnb_decoded(base: Path) -> dict[str, torch.Tensor]:
    import bitsandbytes as bnb
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, device_map="cpu")
    out: dict[str, torch.Tensor] = {}
    for mname, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            w = bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
            out[mname + ".weight"] = w.float()
        elif isinstance(module, bnb.nn.Linear8bitLt):
            w = bnb.functional.int8_vectorwise_dequant(module.weight.data, module.weight.SCB)
            out[mname + ".weight"] = w.float()
    for k, v in model.state_dict().items():
        if k.endswith(".weight") and k not in out and v.is_floating_point():
            out[k] = v.float()
    return out


# ------------------------------------------------------------------------------------------------- quantization


def library_quantized(base: Path, name: str, merged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The stored tensors of each merged projection as the format's library quantizes the merged weight."""
    out: dict[str, torch.Tensor] = {}
    if name.startswith("fp8-transformers"):
        from transformers import FineGrainedFP8Config
        from transformers.integrations.finegrained_fp8 import Fp8Quantize

        op = Fp8Quantize(
            types.SimpleNamespace(quantization_config=FineGrainedFP8Config(weight_block_size=[128, 128]))
        )
        for k, w in merged.items():
            out.update(op.convert({k: w}))
        return out
    if name.startswith("bnb-") and name != "bnb-int8":
        import bitsandbytes.functional as F

        qt = name.removeprefix("bnb-")
        stored = load_file(str(base / "model.safetensors"))
        for k, w in merged.items():
            key = f"{k}.quant_state.bitsandbytes__{qt}"
            state = json.loads(bytes(stored[key].tolist()))
            # PEFT's bnb merge quantizes W + Δ as it is (float32 here); the quant_state keeps the base's dtype
            q, st = F.quantize_4bit(
                w,
                blocksize=state["blocksize"],
                compress_statistics="nested_blocksize" in state,
                quant_type=qt,
            )
            out[k] = q
            for sk, sv in st.as_dict(packed=True).items():
                out[f"{k}.{sk}"] = sv
            packed = json.loads(bytes(out[key].tolist()))
            packed["dtype"] = state["dtype"]
            out[key] = torch.tensor(list(json.dumps(packed).encode()), dtype=torch.uint8)
        return out
    if name.startswith("ct-"):
        return ct_quantized(name, merged)
    raise SystemExit(f"no library quantizer for {name}")


def ct_quantized(name: str, merged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """compressed-tensors on the merged weights, as fixtures/make_quantized.py made the base: the preset applied to
    the bf16 model holding them, min-max qparams by its own functions, ``compress_model``."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures"))
    import make_quantized as mq

    preset, intermediate = mq.CT[name]
    model = mq.tiny(intermediate)
    state = model.state_dict()
    model.load_state_dict({k: merged[k].to(v.dtype) if k in merged else v for k, v in state.items()})
    scheme = preset_name_to_scheme(preset, ["Linear"])
    apply_quantization_config(
        model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    )
    for _, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is not None:
            mq.calibrate(module)
    ModelCompressor.from_pretrained_model(model).compress_model(model)
    modules = {k.removesuffix(".weight") for k in merged}
    return {k: v for k, v in model.state_dict().items() if k.rpartition(".")[0] in modules}


# ------------------------------------------------------------------------------------------------------- the run


def adapterdoc(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapterdoc", *map(str, args)], capture_output=True, text=True, timeout=600
    )


def peft_merged(decoded: dict[str, torch.Tensor], base: Path, adapter: Path) -> dict[str, torch.Tensor]:
    import peft
    import transformers

    model = transformers.LlamaForCausalLM(plain_config(base)).float()
    missing, unexpected = model.load_state_dict(decoded, strict=False)
    assert not unexpected, unexpected
    assert all("rotary" in m for m in missing), missing
    merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return {k: v.detach().clone() for k, v in merged.state_dict().items() if k in decoded}


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    raw = [t.contiguous().view(-1).view(torch.uint8) for t in (a, b)]
    return a.dtype == b.dtype and torch.equal(*raw)


def is_codes(t: torch.Tensor) -> bool:
    return not t.is_floating_point() or t.dtype == torch.float8_e4m3fn


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) / max(float(b.float().abs().max()), 1e-30)


def one(bases: Path, work: Path, name: str) -> dict[str, Any]:
    base = bases / name
    res: dict[str, Any] = {}
    adapters = {}
    for label, rel in (("realistic", 0.02), ("strong", 0.5)):
        adapters[label] = work / f"{name}-{label}"
        if not adapters[label].exists():
            make_adapter(base, adapters[label], rel)
    decoded = library_decoded(base, name)
    out = work / f"{name}-decoded"
    r = adapterdoc(
        "merge", adapters["strong"], "--base", base, "--out", out, "--dtype", "float32", "--force", "--json"
    )
    res["decoded_exit"] = r.returncode
    res["decoded_stderr"] = r.stderr[-2000:]
    if r.returncode == 0:
        ours = load_file(str(out / "model.safetensors"))
        want = peft_merged(decoded, base, adapters["strong"])
        res["decoded_names_ours_only"] = sorted(set(ours) - set(want))
        res["decoded_names_lib_only"] = sorted(set(want) - set(ours))
        res["decoded_max_rel"] = {k: rel_diff(ours[k], want[k]) for k in sorted(set(ours) & set(want))}
        res["decoded_config_quantized"] = "quantization_config" in json.loads(
            (out / "config.json").read_text()
        )
    dry = adapterdoc("merge", adapters["realistic"], "--base", base, "--dry-run", "--json")
    res["dry_exit"] = dry.returncode
    res["dry_stderr"] = dry.stderr[-2000:]
    if dry.stdout.strip():
        body = json.loads(dry.stdout)
        res["survival"] = body.get("survival")
        res["dry_codes"] = sorted({f["code"] for f in body.get("findings", [])})
    look = adapterdoc("inspect", adapters["realistic"], "--base", base, "--json")
    res["inspect_exit"] = look.returncode
    res["inspect_stderr"] = look.stderr[-2000:]
    if look.stdout.strip():
        res["inspect_survival_matches"] = json.loads(look.stdout)["requantized"]["modules"] == res.get(
            "survival"
        )
    req = adapterdoc(
        "merge",
        adapters["realistic"],
        "--base",
        base,
        "--requantize",
        "--out",
        work / f"{name}-rq-weak",
        "--json",
    )
    res["requantize_realistic_exit"] = req.returncode
    res["requantize_realistic_codes"] = sorted(
        {f["code"] for f in json.loads(req.stdout or "{}").get("findings", [])}
    )
    res["requantize_realistic_written"] = (work / f"{name}-rq-weak").exists()
    if name.startswith(("fp8-transformers", "bnb-nf4", "bnb-fp4", "ct-")):
        out = work / f"{name}-rq"
        r = adapterdoc(
            "merge", adapters["strong"], "--base", base, "--requantize", "--out", out, "--force", "--json"
        )
        res["requantize_exit"] = r.returncode
        res["requantize_stdout"] = r.stdout[-3000:]
        if r.returncode == 0:
            ours = load_file(str(out / "model.safetensors"))
            stored = load_file(str(base / "model.safetensors"))
            want_merged = peft_merged(decoded, base, adapters["strong"])
            quantized = {k.rpartition(".")[0] for k, v in stored.items() if is_codes(v)}
            projections = {k: v for k, v in want_merged.items() if k.removesuffix(".weight") in quantized}
            lib = library_quantized(base, name, projections)
            res["requantize_names_differ"] = sorted(set(ours) ^ set(stored))
            res["requantize_lib_mismatch"] = sorted(
                k for k, v in lib.items() if k not in ours or not same_bytes(ours[k], v)
            )
            res["requantize_lib_checked"] = len(lib)
            res["requantize_untouched_changed"] = sorted(
                k for k in stored if "_proj." not in k and not same_bytes(ours[k], stored[k])
            )
    return res


def gpt_oss(bases: Path, work: Path) -> dict[str, Any]:
    """The MXFP4 base (a tiny gpt-oss): LoRA on attention (stored in bf16) and PEFT's ``target_parameters`` on the
    MXFP4 experts, merged, against PEFT on the base transformers dequantizes (``Mxfp4Config(dequantize=True)``)."""
    import peft
    import transformers

    base = bases / "mxfp4"
    raw = json.loads((base / "config.json").read_text())
    raw.pop("quantization_config")
    config = transformers.GptOssConfig(**{k: v for k, v in raw.items() if k != "architectures"})
    res: dict[str, Any] = {}
    kinds = {
        "attention": {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "experts": {
            "target_modules": ["q_proj"],
            "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        },
    }
    for label, kw in kinds.items():
        adapter = work / f"mxfp4-{label}"
        torch.manual_seed(0)
        pm = peft.get_peft_model(
            transformers.GptOssForCausalLM(config), peft.LoraConfig(r=4, lora_alpha=8, **kw)
        )
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
        pm.save_pretrained(str(adapter))
        out = work / f"mxfp4-{label}-merged"
        r = adapterdoc(
            "merge", adapter, "--base", base, "--out", out, "--dtype", "float32", "--force", "--json"
        )
        res[f"{label}_exit"] = r.returncode
        res[f"{label}_stderr"] = r.stderr[-2000:]
        if r.returncode:
            continue
        res[f"{label}_merged"] = json.loads(r.stdout)["merged_tensors"]
        model = transformers.AutoModelForCausalLM.from_pretrained(
            base, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True)
        )
        want = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().state_dict()
        ours = load_file(str(out / "model.safetensors"))
        res[f"{label}_names_differ"] = sorted(set(ours) ^ set(want))
        res[f"{label}_max_rel"] = max(rel_diff(ours[k], want[k]) for k in set(ours) & set(want))
    return res


def main(argv: list[str]) -> int:
    bases, work = Path(argv[0]), Path(argv[1])
    work.mkdir(parents=True, exist_ok=True)
    print(
        json.dumps(
            {name: gpt_oss(bases, work) if name == "mxfp4" else one(bases, work, name) for name in argv[2:]},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
