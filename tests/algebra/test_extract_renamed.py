"""extract on a family whose checkpoint names differ from its modules' (transformers renames at load: Mistral3 stores
``language_model.model.layers.*`` for ``model.language_model.layers.*``): the LoRA is written under the modules'
names and PEFT's reload of it on the base gives the tuned model's logits (it said "nothing to extract" before)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

LAYOUT = "mistral3_vl"
MODULES = ("model.language_model.layers.0.self_attn.q_proj", "model.language_model.layers.1.mlp.down_proj")


def test_extract_names_the_modules_transformers_loads(tmp_path: Path, cli: Any) -> None:
    import transformers
    from peft import PeftModel
    from safetensors import safe_open

    from adapterdoc.ml.tiny import build_tiny

    torch.manual_seed(0)
    base = build_tiny(LAYOUT).eval()
    base.save_pretrained(tmp_path / "base")
    with safe_open(str(tmp_path / "base" / "model.safetensors"), "pt") as f:
        assert any(k.startswith("language_model.model.layers.") for k in f.keys())  # noqa: SIM118  (old names)
    gen = torch.Generator().manual_seed(1)
    params = dict(base.named_parameters())
    with torch.no_grad():
        for m in MODULES:
            w = params[f"{m}.weight"]
            w += 0.05 * torch.randn(w.shape[0], 2, generator=gen) @ torch.randn(2, w.shape[1], generator=gen)
    base.save_pretrained(tmp_path / "tuned")
    tuned_logits = base(input_ids=torch.tensor([[3, 5, 7, 9, 11]])).logits

    r = cli("extract", "--base", tmp_path / "base", "--tuned", tmp_path / "tuned", "--rank", "2",
            "--out", tmp_path / "lora", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    with safe_open(str(tmp_path / "lora" / "adapter_model.safetensors"), "pt") as f:
        modules = {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in f.keys()}  # noqa: SIM118
    assert modules == set(MODULES)
    fresh = transformers.AutoModelForImageTextToText.from_pretrained(tmp_path / "base").eval()
    got = PeftModel.from_pretrained(fresh, tmp_path / "lora")(
        input_ids=torch.tensor([[3, 5, 7, 9, 11]])
    ).logits
    assert torch.allclose(got, tuned_logits, atol=1e-5), (got - tuned_logits).abs().max()
    assert cli("verify", tmp_path / "lora", "--base", tmp_path / "base").exit_code == 0
