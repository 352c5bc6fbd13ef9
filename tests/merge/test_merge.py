"""`adapterdoc merge` against PEFT's own `merge_and_unload` on tiny models of every layout."""
# ruff: noqa: F811  (pytest fixtures imported from test_merge_helpers are shadowed by parameters)

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from test_merge_helpers import (  # noqa: F401  (saved_base is a fixture)
    assert_fp32_equal,
    bf16_ulp,
    changed,
    forward,
    input_ids,
    load,
    lora_kwargs,
    peft_reference,
    save_adapter,
    saved_base,
    tree_digest,
)

from adapterdoc.merge import merge
from adapterdoc.ml.tiny import TINY_LAYOUTS, model_class, tiny_config


def _merge_and_compare(tmp_path, tiny_model, saved_base, layout, *, dtype=None, **lora):
    base_dir = saved_base(layout, dtype)
    model = tiny_model(layout)
    if dtype is not None:
        model = model.to(dtype)
    adapter = save_adapter(model, str(tmp_path / "adapter"), **lora)
    before = tree_digest(base_dir)
    report = merge(adapter, base_dir, tmp_path / "out")
    assert tree_digest(base_dir) == before, "the base folder changed"
    assert report.ok, [f.message for f in report.findings]
    assert report.unused == []
    assert report.out == str(tmp_path / "out")
    cls = model_class(layout)
    ids = input_ids()
    unmerged, ref, base_sd = peft_reference(cls, base_dir, adapter, layout, ids, dtype or torch.float32)
    mine_model = load(cls, report.out, dtype or torch.float32)
    return report, mine_model, unmerged, ref, base_sd, ids


@pytest.mark.parametrize("layout", TINY_LAYOUTS)
def test_merge_matches_peft_on_every_layout(tmp_path, tiny_model, saved_base, layout):
    report, mine_model, unmerged, ref, base_sd, ids = _merge_and_compare(
        tmp_path, tiny_model, saved_base, layout, **lora_kwargs(layout)
    )
    mine = mine_model.state_dict()
    assert_fp32_equal(mine, ref)
    assert changed(mine, base_sd) == changed(ref, base_sd) != set()
    # every adapter module in the file was applied
    with open(os.path.join(tmp_path / "adapter", "adapter_config.json")) as f:
        assert json.load(f)["peft_type"] == "LORA"
    from adapterdoc.adapter import parse_key
    from adapterdoc.checkpoint import open_checkpoint

    modules = {parse_key(k).module for k in open_checkpoint(str(tmp_path / "adapter")).tensors}
    assert set(report.applied) == modules
    with torch.no_grad():
        merged_out = forward(mine_model, layout, ids)
    torch.testing.assert_close(merged_out, unmerged, rtol=1e-4, atol=2e-5)


def test_dora_linear_and_embedding(tmp_path, tiny_model, saved_base):
    """DoRA on linears and on the (tied) input embedding: PEFT's formula, and the adapter's outputs."""
    report, mine_model, unmerged, ref, base_sd, ids = _merge_and_compare(
        tmp_path,
        tiny_model,
        saved_base,
        "ministral3_text",
        target_modules=["q_proj", "v_proj", "embed_tokens"],
        use_dora=True,
        r=4,
        lora_alpha=8,
    )
    mine = mine_model.state_dict()
    # Everything but the head equals PEFT's merge; the head keeps the base matrix, because in the adapter
    # model only the embedding lookup sees the embedding's update (PEFT's merge adds it to the tied head too).
    assert [f.code for f in report.findings] == ["AD504"]
    assert_fp32_equal(
        {k: v for k, v in mine.items() if k != "lm_head.weight"},
        {k: v for k, v in ref.items() if k != "lm_head.weight"},
    )
    assert torch.equal(mine["lm_head.weight"], base_sd["model.embed_tokens.weight"])
    with torch.no_grad():
        torch.testing.assert_close(
            forward(mine_model, "ministral3_text", ids), unmerged, rtol=1e-4, atol=2e-5
        )


def test_peft_merge_of_a_tied_embedding_changes_outputs(tmp_path, tiny_model, saved_base):
    """Pins the PEFT behaviour the untie works around: merge_and_unload adds the update to the shared matrix."""
    layout = "ministral3_text"
    base_dir = saved_base(layout)
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), target_modules=["embed_tokens"])
    cls = model_class(layout)
    unmerged, ref, _ = peft_reference(cls, base_dir, adapter, layout, input_ids())
    peft_merged = load(cls, base_dir)
    peft_merged.load_state_dict(ref)
    with torch.no_grad():
        assert (forward(peft_merged, layout, input_ids()) - unmerged).abs().max() > 0.1
        report = merge(adapter, base_dir, tmp_path / "out")
        ours = forward(load(cls, report.out), layout, input_ids())
    torch.testing.assert_close(ours, unmerged, rtol=1e-4, atol=2e-5)


def test_rslora_with_rank_and_alpha_patterns(tmp_path, tiny_model, saved_base):
    _report, mine_model, _unmerged, ref, *_ = _merge_and_compare(
        tmp_path,
        tiny_model,
        saved_base,
        "qwen3_5_text",
        target_modules=["q_proj", "v_proj", "in_proj_qkv", "down_proj"],
        use_rslora=True,
        r=4,
        lora_alpha=8,
        rank_pattern={"v_proj": 2, r"layers\.3\..*down_proj": 6},
        alpha_pattern={"q_proj": 3},
    )
    assert_fp32_equal(mine_model.state_dict(), ref)


def test_modules_to_save_on_a_tied_head_unties(tmp_path, tiny_model, saved_base):
    report, mine_model, unmerged, ref, _base_sd, ids = _merge_and_compare(
        tmp_path,
        tiny_model,
        saved_base,
        "mistral3_vl",
        target_modules=["q_proj"],
        exclude_modules=lora_kwargs("mistral3_vl")["exclude_modules"],
        modules_to_save=["lm_head"],
        r=4,
        lora_alpha=8,
    )
    assert [f.code for f in report.findings] == ["AD504"]
    assert "lm_head.weight" in report.applied
    assert_fp32_equal(mine_model.state_dict(), ref)
    assert mine_model.lm_head.weight is not mine_model.get_input_embeddings().weight
    with open(os.path.join(report.out, "config.json")) as f:
        assert json.load(f)["tie_word_embeddings"] is False
    with torch.no_grad():
        torch.testing.assert_close(forward(mine_model, "mistral3_vl", ids), unmerged, rtol=1e-4, atol=2e-5)


def test_embedding_and_head_lora_on_tied_weights(tmp_path, tiny_model, saved_base):
    """LoRA on both tied sides: each side gets its own update (PEFT's merge would add both to each)."""
    from safetensors.torch import load_file

    report, mine_model, unmerged, ref, base_sd, ids = _merge_and_compare(
        tmp_path,
        tiny_model,
        saved_base,
        "mistral3_vl",
        target_modules=["embed_tokens", "lm_head"],
        r=4,
        lora_alpha=8,
    )
    assert [f.code for f in report.findings] == ["AD504"]
    mine = mine_model.state_dict()
    a = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    w = base_sd["model.language_model.embed_tokens.weight"]
    p = "base_model.model."
    emb = p + "model.language_model.embed_tokens."
    d_emb = (a[emb + "lora_embedding_B"] @ a[emb + "lora_embedding_A"]).T * 2.0
    d_head = (a[p + "lm_head.lora_B.weight"] @ a[p + "lm_head.lora_A.weight"]) * 2.0
    torch.testing.assert_close(mine["model.language_model.embed_tokens.weight"], w + d_emb, rtol=0, atol=1e-6)
    torch.testing.assert_close(mine["lm_head.weight"], w + d_head, rtol=0, atol=1e-6)
    torch.testing.assert_close(ref["lm_head.weight"], w + d_emb + d_head, rtol=0, atol=1e-6)  # PEFT's
    with torch.no_grad():
        torch.testing.assert_close(forward(mine_model, "mistral3_vl", ids), unmerged, rtol=1e-4, atol=2e-5)


def test_lora_bias_and_tower_modules(tmp_path, tiny_model, saved_base):
    _report, mine_model, _unmerged, ref, base_sd, _ = _merge_and_compare(
        tmp_path, tiny_model, saved_base, "qwen3_5_vl", target_modules=["qkv", "linear_fc1"], lora_bias=True
    )
    mine = mine_model.state_dict()
    assert_fp32_equal(mine, ref)
    assert any(k.endswith("attn.qkv.bias") for k in changed(mine, base_sd))


def test_trainable_tokens(tmp_path, tiny_model, saved_base):
    _report, mine_model, _unmerged, ref, base_sd, _ = _merge_and_compare(
        tmp_path,
        tiny_model,
        saved_base,
        "ministral3_text",
        target_modules=["q_proj"],
        trainable_token_indices=[1, 5, 7],
    )
    mine = mine_model.state_dict()
    assert_fp32_equal(mine, ref)
    assert "model.embed_tokens.weight" in changed(mine, base_sd)


def test_bfloat16_base_with_fused_experts(tmp_path, tiny_model, saved_base):
    """bf16: exactly the float32 merge rounded once; PEFT (which rounds the update first) within one ulp."""
    layout = "qwen3_5_moe_text"
    _report, mine_model, _unmerged, ref, _base_sd, _ = _merge_and_compare(
        tmp_path, tiny_model, saved_base, layout, dtype=torch.bfloat16, **lora_kwargs(layout, r=2)
    )
    mine = mine_model.state_dict()
    cls = model_class(layout)
    _, exact, base32 = peft_reference(
        cls, saved_base(layout, torch.bfloat16), str(tmp_path / "adapter"), layout, input_ids()
    )
    for k, want in ref.items():
        assert mine[k].dtype == torch.bfloat16
        assert torch.equal(mine[k], exact[k].to(torch.bfloat16)), k
        delta = exact[k] - base32[k]
        scale = torch.maximum(torch.maximum(base32[k].abs(), delta.abs()), want.float().abs())
        assert ((mine[k].float() - want.float()).abs() <= bf16_ulp(scale)).all(), k


def test_dtype_option_casts_and_updates_config(tmp_path, tiny_model, saved_base):
    layout = "qwen3_5_text"
    base_dir = saved_base(layout)
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), target_modules=["q_proj"], r=2)
    report = merge(adapter, base_dir, tmp_path / "out", dtype="bfloat16")
    assert report.ok
    cls = model_class(layout)
    _, ref, _ = peft_reference(cls, base_dir, adapter, layout, input_ids())
    mine = load(cls, report.out, "auto").state_dict()
    for k, v in ref.items():
        assert mine[k].dtype == torch.bfloat16
        assert torch.equal(mine[k], v.to(torch.bfloat16)), k
    with open(os.path.join(report.out, "config.json")) as f:
        assert json.load(f)["dtype"] == "bfloat16"


def test_sharded_base_keeps_the_sharding_plan(tmp_path, tiny_model, saved_base):
    layout = "qwen3_5_moe_vl"
    base_dir = saved_base(layout, None, "100KB")
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), **lora_kwargs(layout, r=2))
    report = merge(adapter, base_dir, tmp_path / "out")
    assert report.ok
    with open(os.path.join(base_dir, "model.safetensors.index.json")) as f:
        base_index = json.load(f)
    with open(os.path.join(report.out, "model.safetensors.index.json")) as f:
        out_index = json.load(f)
    assert out_index["weight_map"] == base_index["weight_map"]
    assert len(set(base_index["weight_map"].values())) > 3
    shards = sorted(set(out_index["weight_map"].values()))
    assert out_index["metadata"]["total_size"] == base_index["metadata"]["total_size"]
    for s in shards:
        assert os.path.getsize(os.path.join(report.out, s)) > 0
    cls = model_class(layout)
    _, ref, _ = peft_reference(cls, base_dir, adapter, layout, input_ids())
    assert_fp32_equal(load(cls, report.out).state_dict(), ref)
    assert {"config.json", "generation_config.json"} <= set(os.listdir(report.out))


def test_fused_experts_non_square_against_peft(tmp_path):
    """2·I ≠ H and r ≠ E, so a transposed or mis-strided expert slice cannot pass by accident."""
    import transformers as tf
    from peft import PeftModel

    cfg = tiny_config("qwen3_5_moe_text")
    cfg.moe_intermediate_size = 24
    torch.manual_seed(3)
    model = tf.Qwen3_5MoeForCausalLM._from_config(cfg).eval()
    base_dir = str(tmp_path / "base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(base_dir)
    from safetensors import safe_open

    with safe_open(os.path.join(base_dir, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert tuple(f.get_slice("model.layers.0.mlp.experts.3.up_proj.weight").get_shape()) == (24, 64)
    assert "model.layers.0.mlp.experts.gate_up_proj" not in keys  # experts are stored unfused

    adapter = save_adapter(
        model,
        str(tmp_path / "adapter"),
        target_modules=[],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        r=2,
        lora_alpha=5,
    )
    report = merge(adapter, base_dir, tmp_path / "out")
    assert report.ok and report.unused == []
    assert len(report.applied) == 8  # two wrappers per layer
    base = load(tf.Qwen3_5MoeForCausalLM, base_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = PeftModel.from_pretrained(base, adapter)
    ref = pm.merge_and_unload().state_dict()
    mine = load(tf.Qwen3_5MoeForCausalLM, report.out).state_dict()
    assert_fp32_equal(mine, ref)
    base_sd = load(tf.Qwen3_5MoeForCausalLM, base_dir).state_dict()
    assert {k for k in changed(mine, base_sd)} == {
        f"model.layers.{i}.mlp.experts.{p}" for i in range(4) for p in ("gate_up_proj", "down_proj")
    }


@pytest.mark.parametrize(
    ("layout", "lora", "dtype"),
    [
        (
            "ministral3_text",
            dict(target_modules=["q_proj", "down_proj", "embed_tokens"], use_dora=True),
            "auto",
        ),
        (
            "ministral3_text",
            dict(target_modules=["o_proj"], trainable_token_indices=[0, 9, 500, 999]),
            "auto",
        ),
        ("mistral3_vl", dict(target_modules=["q_proj"], modules_to_save=["lm_head"]), "float16"),
        ("qwen3_5_moe_text", lora_kwargs("qwen3_5_moe_text", r=2), "auto"),
    ],
)
def test_row_blocks_give_the_same_result(tmp_path, tiny_model, saved_base, monkeypatch, layout, lora, dtype):
    """Tiny tensors fit one block; shrink the block so every row-local edit runs across many blocks."""
    import adapterdoc.merge.delta as merge_mod

    base_dir = saved_base(layout)
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), **lora)
    whole = merge(adapter, base_dir, tmp_path / "whole", dtype=dtype)
    monkeypatch.setattr(merge_mod, "_BLOCK_BYTES", 1000)
    blocked = merge(adapter, base_dir, tmp_path / "blocked", dtype=dtype)
    assert whole.ok and blocked.ok
    cls = model_class(layout)
    a = load(cls, whole.out, "auto").state_dict()
    b = load(cls, blocked.out, "auto").state_dict()
    assert_fp32_equal(b, a, rel=1e-6 if dtype == "auto" else 1e-3)


def test_read_ahead_writes_the_same_bytes(tmp_path, tiny_model, saved_base, monkeypatch):
    """The helper thread that reads each next row block changes no output byte: every file of a many-block merge
    equals the one written with the blocks read in line."""
    import adapterdoc.merge.delta as merge_mod

    class InLine:
        def __init__(self, fn, items):
            self.fn, self.items, self.i = fn, items, 0

        def next(self):
            self.i += 1
            return self.fn(self.items[self.i - 1])

    base_dir = saved_base("ministral3_text")
    adapter = save_adapter(
        tiny_model("ministral3_text"), str(tmp_path / "adapter"), target_modules=["q_proj", "down_proj"]
    )
    monkeypatch.setattr(merge_mod, "_BLOCK_BYTES", 1000)
    ahead = merge(adapter, base_dir, tmp_path / "ahead")
    monkeypatch.setattr(merge_mod, "Prefetch", InLine)
    inline = merge(adapter, base_dir, tmp_path / "inline")
    assert ahead.ok and inline.ok and ahead.merged_tensors > 0
    files = sorted(p.name for p in (tmp_path / "inline").iterdir() if p.name.endswith(".safetensors"))
    assert files
    for name in files:
        assert (tmp_path / "ahead" / name).read_bytes() == (tmp_path / "inline" / name).read_bytes(), name
