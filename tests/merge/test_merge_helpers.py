"""Shared helpers for the merge tests: saved tiny bases, random adapters, PEFT references, forwards."""

from __future__ import annotations

import hashlib
import os
import warnings
from typing import Any

import torch

from adapterdoc.layouts import get_layout


def lora_kwargs(layout: str, **extra: Any) -> dict[str, Any]:
    """The registry's default LoRA targets for ``layout`` (attention/MLP leaves, tower exclusion, fused experts)."""
    lay = get_layout(layout)
    kw: dict[str, Any] = dict(target_modules=list(lay.lora_leaves), r=4, lora_alpha=8)
    if lay.exclude_regex:
        kw["exclude_modules"] = lay.exclude_regex
    if lay.target_parameters:
        kw["target_parameters"] = list(lay.target_parameters)
    kw.update(extra)
    return kw


def save_adapter(model: Any, folder: str, *, seed: int = 1, **lora: Any) -> str:
    """Wrap ``model`` with PEFT, give every adapter tensor random non-zero values, save, return the folder."""
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = get_peft_model(model, LoraConfig(**lora))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if any(s in name for s in ("lora_", "trainable_tokens", "modules_to_save")):
                noise = torch.randn(p.shape, generator=g) * 0.1
                if "magnitude" in name:
                    noise += 1.0
                p.copy_(noise.to(p.dtype))
    pm.save_pretrained(folder)
    return folder


def load(cls: Any, folder: str, dtype: Any = torch.float32) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls.from_pretrained(folder, dtype=dtype).eval()


def peft_reference(
    cls: Any, base_dir: str, adapter_dir: str, layout: str, ids: Any, dtype: Any = torch.float32
):
    """(unmerged adapter model's output, PEFT ``merge_and_unload`` state dict, base state dict)."""
    from peft import PeftModel

    base = load(cls, base_dir, dtype)
    base_sd = {k: v.clone() for k, v in base.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = PeftModel.from_pretrained(base, adapter_dir).eval()
        with torch.no_grad():
            unmerged = forward(pm.get_base_model(), layout, ids)
        merged = pm.merge_and_unload()
    return unmerged, merged.state_dict(), base_sd


def forward(model: Any, layout: str, ids: Any) -> Any:
    if layout == "qwen3_omni":
        model = model.thinker
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def input_ids(seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (2, 7), generator=g)


def assert_fp32_equal(mine: dict[str, Any], ref: dict[str, Any], rel: float = 1e-6) -> None:
    assert set(mine) == set(ref)
    for k, want in ref.items():
        got = mine[k]
        assert got.dtype == want.dtype, k
        scale = max(want.abs().max().item(), 1e-30)
        diff = (got.float() - want.float()).abs().max().item()
        assert diff <= rel * scale, f"{k}: max abs diff {diff} > {rel} x {scale}"


def bf16_ulp(x: Any) -> Any:
    x = x.abs().float().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(x)) - 7)


def changed(sd: dict[str, Any], base: dict[str, Any]) -> set[str]:
    return {k for k, v in sd.items() if not torch.equal(v, base[k])}


def tree_digest(folder: str) -> dict[str, str]:
    out = {}
    for root, _dirs, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, folder)] = hashlib.sha256(fh.read()).hexdigest()
    return out


# ---- session fixtures (import them into a test module to use them)
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def saved_base(tmp_path_factory: Any, tiny_model: Any) -> Any:
    """``saved_base(layout, dtype=None, shard=None)``: the tiny model saved with ``save_pretrained``, once per session."""
    cache: dict[tuple[str, Any, Any], str] = {}

    def get(layout: str, dtype: Any = None, shard: str | None = None) -> str:
        key = (layout, dtype, shard)
        if key not in cache:
            folder = str(tmp_path_factory.mktemp(f"base-{layout}"))
            model = tiny_model(layout)
            if dtype is not None:
                model = model.to(dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
            cache[key] = folder
        return cache[key]

    return get
