"""mlx-lm's own package and loader as the oracle of the names and config fields the MLX format writes and checks
(issue #39 items 4, 11, 13): the stored list of mlx-lm's model types is the installed mlx-lm's; a PEFT adapter of
every family transformers builds tiny and mlx-lm loads gives PEFT's logits in mlx-lm after ``convert --to mlx``
(GPT-NeoX and GPT-J, whose mlx-lm models rename transformers' modules, included); the names the old converter wrote
for GPT-NeoX are refused by mlx-lm and by verify; each config field verify refuses is one ``load_adapters`` fails on
(or, for a NaN scale, computes NaN with); embedding LoRA on an untied base gives PEFT's logits."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.formats.mlx_oracle import mlx_base, mlx_logits, peft_adapter, rel, save_base, torch_logits

pytestmark = pytest.mark.oracle

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4
SMALL = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    head_dim=8,
    pad_token_id=0,
)

ATTN_MLP = ["q_proj", "v_proj", "o_proj", "down_proj", "gate_proj"]
FAMILIES: dict[str, list[str]] = {
    "llama": ATTN_MLP,
    "granite": ATTN_MLP,
    "olmo2": ATTN_MLP,
    "stablelm": ["q_proj", "v_proj", "o_proj", "down_proj"],
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "gemma3_text": ATTN_MLP,
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h", "embed_out"],
    "gptj": ["q_proj", "v_proj", "out_proj", "fc_in", "fc_out"],
}
"""model_type → the PEFT targets of its adapter (attention and MLP; the output head where the family has one)."""


EXTRA: dict[str, dict[str, Any]] = {
    "gemma3_text": {"num_hidden_layers": 6},  # mlx-lm's mask needs one whole sliding-window period
    "gpt_neox": {"intermediate_size": 128},  # mlx-lm's gpt_neox MLP is 4 * hidden_size
    "gptj": {"rotary_dim": 8},  # within a head (head_dim 8)
}


def _model(model_type: str) -> Any:
    import torch
    import transformers as tf

    torch.manual_seed(0)
    extra = EXTRA.get(model_type, {})
    cfg = tf.AutoConfig.for_model(model_type, **(SMALL | extra))
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


def _mlx_base(base: Path) -> Path:
    """:func:`mlx_base`, plus the fields mlx-lm 0.32's ``gpt_neox`` ``ModelArgs`` requires under their old names
    (transformers 5 writes ``rope_parameters``)."""
    out = mlx_base(base)
    cfg = json.loads((out / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    if cfg["model_type"] == "gpt_neox":
        cfg.setdefault("rotary_emb_base", rope.get("rope_theta", 10000.0))
        cfg.setdefault("rotary_pct", rope.get("partial_rotary_factor", cfg.get("rotary_pct", 1.0)))
    for k, v in rope.items():
        if k != "rope_type":
            cfg.setdefault(k, v)
    (out / "config.json").unlink()
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_the_stored_model_list_is_the_installed_mlx_lms(oracle_env: Any) -> None:
    """adapterdoc/layouts/mlx_models.py is what scripts/mlx_models.py prints from the installed mlx-lm."""
    python = oracle_env("mlx")
    res = subprocess.run(
        [str(python), str(ROOT / "scripts" / "mlx_models.py")], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == (ROOT / "adapterdoc" / "layouts" / "mlx_models.py").read_text()
    from adapterdoc.layouts.mlx_prefixes import mlx_model

    for family in ("granite", "olmo2", "stablelm", "phi3", "qwen3_5", "gpt_neox", "llama", "mistral"):
        assert mlx_model(family) is not None, family
    assert mlx_model("qwen3_5_text") is None and mlx_model("bert") is None


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_converts_to_names_mlx_lm_loads_with_peft_logits(
    family: str, tmp_path: Path, cli: Any, oracle_env: Any
) -> None:
    python = oracle_env("mlx")
    model = _model(family)
    base = save_base(model, tmp_path / "base")
    peft = peft_adapter(model, tmp_path / "peft", FAMILIES[family])
    want = torch_logits(peft)
    res = cli(
        "convert", tmp_path / "peft", "--to", "mlx", "--base", base, "--out", tmp_path / "mlx", "--json"
    )
    assert res.exit_code == 0, res.output
    assert "AD816" not in {f["code"] for f in json.loads(res.stdout)["findings"]}
    res = cli("verify", tmp_path / "mlx", "--base", base, "--json")
    assert not [f for f in json.loads(res.stdout)["findings"] if f["code"].startswith("AD8")], res.stdout
    mb = _mlx_base(base)
    got = mlx_logits(python, mb, tmp_path / "mlx", tmp_path)
    assert rel(mlx_logits(python, mb, None, tmp_path), want) > 1e-3  # the adapter moves the logits
    assert rel(got, want) < TOL
    # and back to PEFT, with the family's own names
    res = cli("convert", tmp_path / "mlx", "--to", "peft", "--base", base, "--out", tmp_path / "back")
    assert res.exit_code == 0, res.output
    assert sorted(load_file(str(tmp_path / "back/adapter_model.safetensors"))) == sorted(
        load_file(str(tmp_path / "peft/adapter_model.safetensors"))
    )


def test_gpt_neox_names_as_transformers_has_them_are_refused_by_mlx_lm_and_verify(
    tmp_path: Path, cli: Any, oracle_env: Any
) -> None:
    """Before: `convert --to mlx` wrote `gpt_neox.layers.0.attention.dense.lora_a` and verify passed it; mlx-lm
    refuses it ("not an adapter parameter")."""
    python = oracle_env("mlx")
    model = _model("gpt_neox")
    base = save_base(model, tmp_path / "base")
    peft_adapter(model, tmp_path / "peft", ["query_key_value", "dense"])
    assert (
        cli("convert", tmp_path / "peft", "--to", "mlx", "--base", base, "--out", tmp_path / "mlx").exit_code
        == 0
    )
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "mlx", old)
    t = load_file(str(old / "adapters.safetensors"))
    t = {k.replace("model.h.", "gpt_neox.layers."): v for k, v in t.items()}
    save_file(t, str(old / "adapters.safetensors"))
    with pytest.raises(AssertionError, match="not an adapter parameter"):
        mlx_logits(python, _mlx_base(base), old, tmp_path)
    res = cli("verify", old, "--base", base, "--json")
    codes = {f["code"] for f in json.loads(res.stdout)["findings"]}
    assert res.exit_code == 1 and "AD812" in codes


BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "rank-string": ({"rank": "4"}, "lora_parameters.rank must be a positive integer"),
    "rank-fraction": ({"rank": 4.5}, "lora_parameters.rank must be a positive integer"),
    "scale-string": ({"scale": "x"}, "lora_parameters.scale must be a finite number"),
    "scale-nan": ({"scale": float("nan")}, "lora_parameters.scale must be a finite number"),
    "keys-string": ({"keys": "self_attn.q_proj"}, "lora_parameters.keys must be a list of module paths"),
    "no-dropout": ({"dropout": None}, "lacks lora_parameters.dropout"),
    "num-layers-float": ({"num_layers": 2.0}, "num_layers must be an integer"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_each_config_verify_refuses_is_one_mlx_lm_fails_on(
    case: str, tmp_path: Path, cli: Any, oracle_env: Any
) -> None:
    python = oracle_env("mlx")
    model = _model("llama")
    base = save_base(model, tmp_path / "base")
    peft_adapter(model, tmp_path / "peft", ["q_proj", "v_proj"])
    assert cli("convert", tmp_path / "peft", "--to", "mlx", "--out", tmp_path / "mlx").exit_code == 0
    mb = _mlx_base(base)
    fields, message = BAD_CONFIGS[case]
    path = tmp_path / "mlx" / "adapter_config.json"
    cfg = json.loads(path.read_text())
    for k, v in fields.items():
        where = cfg if k == "num_layers" else cfg["lora_parameters"]
        if v is None:
            del where[k]
        else:
            where[k] = v
    path.write_text(json.dumps(cfg))
    res = cli("verify", tmp_path / "mlx", "--base", base, "--json")
    found = json.loads(res.stdout)["findings"]
    assert res.exit_code == 1 and [f["code"] for f in found if f["code"].startswith("AD8")] == ["AD815"]
    assert message in next(f["message"] for f in found if f["code"] == "AD815")
    res = cli("convert", tmp_path / "mlx", "--to", "peft", "--out", tmp_path / "back")
    assert res.exit_code == 3 and message in res.stderr
    try:
        got = mlx_logits(python, mb, tmp_path / "mlx", tmp_path)
    except AssertionError:
        return  # mlx-lm's load_adapters (or its forward pass) fails on it
    assert not np.isfinite(got).all(), f"mlx-lm ran {case} and gave finite logits"


def test_embedding_lora_on_an_untied_base_gives_peft_logits(
    tmp_path: Path, cli: Any, oracle_env: Any
) -> None:
    """Before: refused (AD804) citing a tied lm_head although the base is untied; mlx-lm's LoRAEmbedding adds
    scale · lora_a[x] @ lora_b to the rows as PEFT does, and on an untied base nothing else."""
    python = oracle_env("mlx")
    model = _model("llama")
    base = save_base(model, tmp_path / "base")
    peft = peft_adapter(model, tmp_path / "peft", ["embed_tokens", "q_proj", "v_proj"])
    import torch

    with torch.no_grad():  # PEFT starts lora_embedding_A at zero: move it
        for name, p in peft.named_parameters():
            if "lora_embedding_A" in name:
                p.add_(torch.randn_like(p) * 0.5)
    peft.save_pretrained(tmp_path / "peft")
    want = torch_logits(peft)
    res = cli("convert", tmp_path / "peft", "--to", "mlx", "--base", base, "--out", tmp_path / "mlx")
    assert res.exit_code == 0, res.output
    assert (
        "model.embed_tokens"
        in json.loads((tmp_path / "mlx/adapter_config.json").read_text())["lora_parameters"]["keys"]
    )
    assert cli("verify", tmp_path / "mlx", "--base", base).exit_code == 0
    mb = _mlx_base(base)
    assert rel(mlx_logits(python, mb, tmp_path / "mlx", tmp_path), want) < TOL
    # without the embedding's LoRA mlx-lm gives other logits: the embedding part is what is compared
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "mlx", cut)
    t = {k: v for k, v in load_file(str(cut / "adapters.safetensors")).items() if "embed_tokens" not in k}
    save_file(t, str(cut / "adapters.safetensors"))
    assert rel(mlx_logits(python, mb, cut, tmp_path), want) > 1e-3
    res = cli("convert", tmp_path / "mlx", "--to", "peft", "--base", base, "--out", tmp_path / "back")
    assert res.exit_code == 0, res.output
    from peft import PeftModel

    again = PeftModel.from_pretrained(_model("llama"), str(tmp_path / "back")).eval()
    assert rel(torch_logits(again), want) < TOL
