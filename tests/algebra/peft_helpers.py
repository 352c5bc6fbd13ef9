"""Adapters made by PEFT on the tiny ministral3_text model, and the references the algebra tests compare with:
PEFT's merged weights of each source, and logits of a model whose weights are given."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

LAYOUT = "ministral3_text"
IDS = torch.tensor([[1, 5, 17, 99, 3, 250, 7, 42]])


def make_adapter(base: Any, folder: Path, seed: int, **lora: Any) -> Path:
    """A PEFT LoRA adapter of ``base`` with random (non-zero) A and B (and saved whole modules), saved in
    ``folder``."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], **lora})
    pm = get_peft_model(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    pm.save_pretrained(folder)
    return folder


def make_dora(base: Any, folder: Path, target_modules: list[str]) -> Path:
    """A PEFT DoRA adapter (r=4, alpha 8) of ``base`` with random factors and magnitudes moved off the base's row
    norms by about 20%, saved in ``folder``."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=target_modules, use_dora=True)
    pm = get_peft_model(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_magnitude_vector" in name:
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            elif "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    pm.save_pretrained(folder)
    return folder


def merged_state(base: Any, adapter: Path) -> dict[str, torch.Tensor]:
    """The base's state dict after PEFT loads ``adapter`` and merges it."""
    from peft import PeftModel

    pm = PeftModel.from_pretrained(copy.deepcopy(base), adapter)
    return {k: v.detach().clone() for k, v in pm.merge_and_unload().state_dict().items()}


def weighted_reference(base: Any, adapters: list[Path], weights: list[float]) -> dict[str, torch.Tensor]:
    """``W + Σ wᵢ ΔWᵢ`` per tensor, each ``ΔWᵢ`` PEFT's own merged delta of adapter i (float64, then float32)."""
    start = {k: v.detach().clone() for k, v in base.state_dict().items()}
    out = {k: v.double() for k, v in start.items()}
    for path, w in zip(adapters, weights, strict=True):
        merged = merged_state(base, path)
        for k in out:
            out[k] += w * (merged[k].double() - start[k].double())
    return {k: v.float() for k, v in out.items()}


def logits_of(base: Any, state: dict[str, torch.Tensor]) -> torch.Tensor:
    model = copy.deepcopy(base)
    model.load_state_dict(state)
    with torch.no_grad():
        out: torch.Tensor = model(IDS).logits
    return out


def peft_logits(base: Any, adapter: Path) -> torch.Tensor:
    """Logits of ``base`` with ``adapter`` merged by PEFT."""
    return logits_of(base, merged_state(base, adapter))
