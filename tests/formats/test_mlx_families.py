"""PEFT → MLX → PEFT on every family mlx-lm runs (the registry's and the generic decoders): a real PEFT adapter of
each tiny model comes back with its names and bytes, and ``roundtrip``'s convert trip says so ("bit for bit").
mlx-lm itself loading these conversions is tests/formats/test_mlx_oracle.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from safetensors.numpy import load_file, save_file

from tests.formats.mlx_oracle import generic_config

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

ATTN = ["q_proj", "v_proj", "o_proj", "down_proj", "in_proj_qkv", "out_proj"]
FUSED = "fused"

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "ministral3_text": {},
    "qwen3_5_text": {},
    "mistral3_vl": {"vl": True},
    "qwen3_5_vl": {"vl": True},
    "qwen3_moe_text": {FUSED: True},
    "qwen3_5_moe_text": {FUSED: True},
    "qwen3_5_moe_vl": {"vl": True, FUSED: True},
}
"""Family → how its adapter is made: ``vl``: LoRA on the text part only (towers excluded, as mlx-lm drops them);
``fused``: the routed experts through ``target_parameters`` too."""


def _adapter(family: str, folder: Path) -> str | None:
    """A real PEFT adapter (random, non-zero lora_B) of ``family``'s tiny model in ``folder``; the --base."""
    import transformers as tf

    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.ml.tiny import build_tiny

    how = FAMILIES[family]
    torch.manual_seed(0)
    if family in ("llama", "qwen2", "qwen3"):
        model, base = tf.AutoModelForCausalLM.from_config(generic_config(family)).eval(), None
    else:
        model, base = build_tiny(family), f"tiny:{family}"
    lay = LAYOUTS.get(family)
    targets = ["q_proj", "v_proj", "o_proj", "in_proj_qkv", "out_proj"] if how.get(FUSED) else ATTN
    lora: dict[str, Any] = {"r": 4, "lora_alpha": 8, "init_lora_weights": False}
    if how.get(FUSED):
        assert lay is not None
        lora["target_parameters"] = list(lay.target_parameters)
    if how.get("vl"):
        assert lay is not None
        lora["exclude_modules"] = lay.exclude_regex
    model = peft.get_peft_model(model, peft.LoraConfig(target_modules=targets, **lora))
    model.save_pretrained(folder)
    return base


@pytest.mark.parametrize("family", list(FAMILIES))
def test_peft_to_mlx_to_peft_is_byte_exact(family: str, tmp_path: Path) -> None:
    from adapterdoc import formats
    from adapterdoc.roundtrip.common import Fail
    from adapterdoc.roundtrip.convert import _compare, _trip

    src = tmp_path / "peft"
    base = _adapter(family, src)
    detail = _trip(formats.module("mlx"), "mlx", str(src), str(tmp_path / "trip"), base)
    assert "bit for bit" in detail, detail
    want = load_file(str(src / "adapter_model.safetensors"))
    back = tmp_path / "trip" / "peft"
    got = load_file(str(back / "adapter_model.safetensors"))
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes() for k in want)
    if FAMILIES[family].get(FUSED):
        assert any(".experts." in k or k.endswith("experts.lora_A.weight") for k in got)
    # and the trip can fail: one element of one lora_B changed
    bad = tmp_path / "bad"
    shutil.copytree(back, bad)
    k = next(k for k in sorted(got) if k.endswith("lora_B.weight"))
    got[k][0, 0] += 1.0
    save_file(got, str(bad / "adapter_model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(Fail, match="the delta changed"):
        _compare(src, bad, rounded=False)
