"""Tiny real models and real PEFT adapters for the GGUF tests (built by code, small, seeded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LINEAR_ATTN = ["in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "out_proj"]


def generic_config(kind: str) -> Any:
    """A tiny generic decoder config (``llama``, ``qwen2``, ``qwen3``): 2 layers, GQA, untied head."""
    import transformers

    cls = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}[kind]
    return getattr(transformers, cls)(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )


def generic_model(kind: str, seed: int = 0) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]
    return getattr(transformers, cls)(generic_config(kind)).eval()


def save_config(model: Any, folder: Path) -> Path:
    """The base's config.json only (no weights), with ``architectures`` as save_pretrained writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    return folder


def peft_adapter(model: Any, folder: Path, seed: int = 1, autocast: bool = True, **lora: Any) -> Path:
    """A real PEFT LoRA on ``model`` with non-zero A and B (``init_lora_weights=False``), saved to ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    lora.setdefault("r", 4)
    lora.setdefault("lora_alpha", 8)
    lora.setdefault("target_modules", LINEAR)
    peft_model = get_peft_model(
        model, LoraConfig(init_lora_weights=False, **lora), autocast_adapter_dtype=autocast
    )
    peft_model.save_pretrained(folder)
    peft_model.unload()
    return folder


def fused_expert_peft(model: Any, folder: Path, *, r: int, std: float) -> Any:
    """PEFT's fused expert LoRA (``target_parameters`` on the experts, ``q_proj``/``v_proj`` beside them) on
    ``model``, every LoRA factor drawn from N(0, std²) (seed 0, alpha 2r), saved to ``folder``; the PEFT model."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = LoraConfig(
        r=r,
        lora_alpha=2 * r,
        target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.normal_(0, std)
    pm.save_pretrained(folder)
    return pm


def config_of(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "adapter_config.json").read_text())


def write_gguf(
    path: Path, arch: str, tensors: dict[str, Any], kv: dict[str, Any] | None = None, adapter: bool = True
) -> Path:
    """A GGUF file written by llama.cpp's own gguf-py writer: ``tensors`` are numpy arrays (numpy shape order)."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    if adapter:
        w.add_type("adapter")
    kv = {"adapter.type": "lora", "adapter.lora.alpha": 8.0} if kv is None and adapter else (kv or {})
    for k, v in kv.items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, v)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def lora_tensors(hidden: int = 64, kv_out: int = 32, r: int = 4, layers: int = 2) -> dict[str, Any]:
    """A q/k/down LoRA in llama.cpp's naming (numpy shapes: lora_a [r, in], lora_b [out, r])."""
    import numpy as np

    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for i in range(layers):
        for name, (o, n) in {
            "attn_q": (hidden, hidden),
            "attn_k": (kv_out, hidden),
            "ffn_down": (hidden, 96),
        }.items():
            out[f"blk.{i}.{name}.weight.lora_a"] = rng.standard_normal((r, n)).astype(np.float32)
            out[f"blk.{i}.{name}.weight.lora_b"] = rng.standard_normal((o, r)).astype(np.float32)
    return out


def base_tensors(
    hidden: int = 64, kv_out: int = 32, layers: int = 2, vocab: int = 256, tied: bool = False
) -> dict[str, Any]:
    """A llama-shaped GGUF model's tensors (zeros; shapes are what a header check reads)."""
    import numpy as np

    z = np.zeros
    out: dict[str, Any] = {"token_embd.weight": z((vocab, hidden), np.float32)}
    if not tied:
        out["output.weight"] = z((vocab, hidden), np.float32)
    for i in range(layers):
        out[f"blk.{i}.attn_q.weight"] = z((hidden, hidden), np.float32)
        out[f"blk.{i}.attn_k.weight"] = z((kv_out, hidden), np.float32)
        out[f"blk.{i}.attn_v.weight"] = z((kv_out, hidden), np.float32)
        out[f"blk.{i}.ffn_down.weight"] = z((hidden, 96), np.float32)
        out[f"blk.{i}.attn_norm.weight"] = z((hidden,), np.float32)
    return out


MROPE_SECTION = [1, 1, 0]
"""Interleaved M-RoPE sections for a tiny Qwen3.5 base that llama.cpp runs (see :func:`llama_cpp_qwen35`)."""


def llama_cpp_qwen35(layout: str, seed: int = 0) -> Any:
    """The registry's tiny Qwen3.5 model of ``layout`` with ``rope_parameters.mrope_section`` set so llama.cpp runs it.

    Without ``mrope_section`` llama.cpp's converter writes the upstream default sections [11, 11, 10] (32 rotary
    pairs) and ggml's ``ggml_mrope_cache_init`` aborts on ``GGML_ASSERT(sect_dims <= ne0)``: the tiny head
    (head_dim 16 × partial_rotary_factor 0.25 = 4 rotary dims) is below the sections' sum. The smallest sections
    that run and give transformers' logits: sum(sections) <= rotary dims (the assert), and every rotary pair p
    (sector p % sum) covered by the interleaved t/h/w slots (sector % 3 == k and sector < 3 × sections[k]): an
    uncovered pair takes the 4th position, which llama.cpp sets to 0 for text tokens, where transformers rotates it
    by the token position. For 2 pairs that is [1, 1, 0]; transformers reads the same key (its text positions are
    equal on t/h/w, so any sections give plain RoPE there)."""
    import torch
    import transformers

    from adapterdoc.ml.tiny import model_class, tiny_config

    cfg = tiny_config(layout)
    cfg.rope_parameters = {**cfg.rope_parameters, "mrope_section": list(MROPE_SECTION)}
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(layout)._from_config(cfg, dtype=torch.float32)
    assert isinstance(model, transformers.PreTrainedModel)
    return model.eval()
