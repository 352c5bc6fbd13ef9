"""Hand-built quantized Llama bases and a LoRA adapter for them, for verify and inspect (tests/quant): one layer,
hidden 256, 4 heads (2 for k/v), intermediate 768; the config a transformers Llama writes, so that verify builds
the model PEFT would wrap on it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tests.quant.quant_helpers import (
    BNB_NF4_QC,
    CT_W4A16_WEIGHTS,
    Spec,
    ct_qc,
    i64_pair,
    json_bytes,
    plain,
    write_st,
)

LAYER = "model.layers.0"
Q = f"{LAYER}.self_attn.q_proj"
V = f"{LAYER}.self_attn.v_proj"
DOWN = f"{LAYER}.mlp.down_proj"
SHAPES = {Q: (256, 256), V: (128, 256), DOWN: (256, 768)}
"""(out, in) of the modules the adapter targets."""
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 1,
    "vocab_size": 320,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
GPTQ_QC = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
FP8_QC = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
}


def _gptq(path: str, out: int, inn: int) -> dict[str, Spec]:
    return {
        f"{path}.qweight": ("I32", (inn // 8, out)),
        f"{path}.qzeros": ("I32", (inn // 128, out // 8)),
        f"{path}.scales": ("F16", (inn // 128, out)),
        f"{path}.g_idx": ("I32", (inn,)),
    }


def _fp8(path: str, out: int, inn: int) -> dict[str, Spec]:
    return {
        f"{path}.weight": ("F8_E4M3", (out, inn)),
        f"{path}.weight_scale_inv": ("F32", (-(-out // 128), -(-inn // 128))),
    }


def _w4a16(path: str, out: int, inn: int) -> dict[str, Spec]:
    return {
        f"{path}.weight_packed": ("I32", (out, inn // 8)),
        f"{path}.weight_scale": ("BF16", (out, inn // 128)),
        f"{path}.weight_shape": ("I64", (2,), i64_pair(out, inn)),
    }


def _nf4(path: str, out: int, inn: int) -> dict[str, Spec]:
    n = out * inn
    state = {
        "quant_type": "nf4",
        "blocksize": 64,
        "dtype": "bfloat16",
        "shape": [out, inn],
        "nested_blocksize": 256,
        "nested_dtype": "float32",
        "nested_offset": 0.05,
    }
    return {
        f"{path}.weight": ("U8", (n // 2, 1)),
        f"{path}.weight.absmax": ("U8", (n // 64,)),
        f"{path}.weight.nested_absmax": ("F32", (n // 64 // 256,)),
        f"{path}.weight.nested_quant_map": ("F32", (256,)),
        f"{path}.weight.quant_map": ("F32", (16,)),
        f"{path}.weight.quant_state.bitsandbytes__nf4": json_bytes(state),
    }


SCHEMES = {
    "gptq": (GPTQ_QC, _gptq),
    "fp8-block": (FP8_QC, _fp8),
    "ct-w4a16": (ct_qc("pack-quantized", CT_W4A16_WEIGHTS), _w4a16),
    "bnb-nf4": (BNB_NF4_QC, _nf4),
}
"""Scheme → (its quantization_config, the tensors of one quantized linear)."""


def quantized_base(folder: Path, scheme: str, shapes: dict[str, tuple[int, int]] | None = None) -> Path:
    """A one-layer Llama base folder whose seven projections are stored in ``scheme`` (``shapes`` overrides a
    module's stored (out, in)); ``none``: plain BF16."""
    every = {
        **SHAPES,
        f"{LAYER}.self_attn.k_proj": (128, 256),
        f"{LAYER}.self_attn.o_proj": (256, 256),
        f"{LAYER}.mlp.gate_proj": (768, 256),
        f"{LAYER}.mlp.up_proj": (768, 256),
        **(shapes or {}),
    }
    tensors: dict[str, Spec] = dict(plain())
    config: dict[str, object] = dict(LLAMA)
    for path, (out, inn) in every.items():
        if scheme == "none":
            tensors[f"{path}.weight"] = ("BF16", (out, inn))
            continue
        qc, make = SCHEMES[scheme]
        config["quantization_config"] = qc
        tensors.update(make(path, out, inn))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    write_st(folder / "model.safetensors", tensors)
    return folder


def lora_adapter(
    folder: Path, shapes: dict[str, tuple[int, int]] | None = None, r: int = 4, layers: int = 1
) -> Path:
    """A PEFT LoRA adapter on q_proj, v_proj and down_proj of each of ``layers`` layers (``shapes`` overrides a
    layer-0 module's (out, in), in every layer), with small non-zero factors."""
    tensors: dict[str, Spec] = {}
    modules = {**SHAPES, **(shapes or {})}
    every = {
        p.replace(f"{LAYER}.", f"model.layers.{i}."): s for i in range(layers) for p, s in modules.items()
    }
    for path, (out, inn) in every.items():
        key = f"base_model.model.{path}"
        tensors[f"{key}.lora_A.weight"] = ("F32", (r, inn), struct.pack(f"<{r * inn}f", *[0.01] * (r * inn)))
        tensors[f"{key}.lora_B.weight"] = ("F32", (out, r), struct.pack(f"<{r * out}f", *[0.02] * (r * out)))
    folder.mkdir(parents=True, exist_ok=True)
    write_st(folder / "adapter_model.safetensors", tensors)
    config = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": 2 * r,
        "target_modules": ["q_proj", "v_proj", "down_proj"],
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "unused",
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
