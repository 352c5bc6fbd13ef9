"""The header plan (no transformers, no peft) against the meta-model plan: the same plan and the same bytes on every
tiny layout and config where it vouches for the merge, and the meta-model plan wherever it cannot."""
# ruff: noqa: F811  (pytest fixtures imported from test_merge_helpers are shadowed by parameters)

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
from test_merge_helpers import lora_kwargs, save_adapter, saved_base  # noqa: F401

from adapterdoc.merge import merge
from adapterdoc.merge.edits import HEADERS, META_MODEL, Plan
from adapterdoc.merge.header_plan import Unvouched, header_plan
from adapterdoc.merge.output import write
from adapterdoc.merge.plan import make_plan
from adapterdoc.merge.run import _open_adapter, _open_base
from adapterdoc.ml.tiny import TINY_LAYOUTS

HEADER_PLANNED = {
    "qwen3_5_vl",
    "ministral3_text",
    "modernbert_mlm",
    "modernbert",
    "embeddinggemma2",
    "embeddinggemma2_text",
}
"""The tiny layouts whose default LoRA targets the header plan vouches for (the others convert keys on load)."""


def _summary(plan: Plan) -> dict[str, object]:
    """Everything the writer reads from a plan, in comparable form."""
    shards = []
    for rel, header, outs in plan.shards:
        rows = []
        for o in outs:
            edits = [(e.kind, e.label, sorted(e.keys.items()), e.target) for e in o.edits]
            piece = plan.pieces.get(o.name) if o.edits else None
            rows.append((o.name, o.dtype, tuple(o.shape), o.source, o.source_file, edits, piece))
        shards.append((rel, header.path, rows))
    return {
        "shards": shards,
        "applied": plan.applied,
        "unused": plan.unused,
        "findings": [f.to_dict() for f in plan.findings],
        "untie": plan.untie,
        "added": plan.added,
        "model_class": plan.model_class,
    }


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _both(tmp_path: Path, adapter: str, base: str, dtype: str = "auto") -> tuple[Plan, Plan]:
    """(header plan, meta-model plan) of one merge, after checking they are equal and write the same bytes."""
    a, b = _open_adapter(adapter), _open_base(base)
    fast = header_plan(a, b, dtype)
    slow = make_plan(_open_adapter(adapter), b, dtype)
    assert fast.planner == HEADERS and slow.planner == META_MODEL
    assert _summary(fast) == _summary(slow)
    for name, plan in (("fast", fast), ("slow", slow)):
        write(plan, str(tmp_path / name), dtype, force=False, progress=None)
    fast_files, slow_files = _files(tmp_path / "fast"), _files(tmp_path / "slow")
    assert set(fast_files) == set(slow_files)
    for name in fast_files:
        assert fast_files[name] == slow_files[name], name
    return fast, slow


def _default_lora(layout: str, **extra: object) -> dict[str, object]:
    kw = lora_kwargs(layout, **extra)
    kw.pop("target_parameters", None)
    return kw


@pytest.mark.parametrize("layout", TINY_LAYOUTS)
def test_header_plan_equals_the_meta_plan_on_every_layout(tmp_path, tiny_model, saved_base, layout):
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), **_default_lora(layout))
    base = saved_base(layout)
    if layout not in HEADER_PLANNED:
        with pytest.raises(Unvouched):
            header_plan(_open_adapter(adapter), _open_base(base), "auto")
        return
    fast, _slow = _both(tmp_path, adapter, base)
    assert fast.applied and not fast.findings


@pytest.mark.parametrize(
    ("layout", "lora", "dtype"),
    [
        (
            "ministral3_text",
            dict(
                target_modules=["q_proj", "v_proj", "down_proj"],
                use_rslora=True,
                r=4,
                lora_alpha=8,
                rank_pattern={"v_proj": 2, r"layers\.3\..*down_proj": 6},
                alpha_pattern={"q_proj": 3},
            ),
            "auto",
        ),
        ("ministral3_text", dict(target_modules="all-linear", r=2, lora_alpha=5), "bfloat16"),
        (
            "ministral3_text",
            dict(
                target_modules=["q_proj", "o_proj"],
                layers_to_transform=[1, 3],
                r=2,
                exclude_modules=["o_proj"],
            ),
            "auto",
        ),
        ("ministral3_text", dict(target_modules=r".*layers\.[02]\.mlp\.(up|down)_proj", r=3), "float16"),
        ("qwen3_5_vl", dict(target_modules=["embed_tokens", "lm_head", "qkv"], r=2, lora_alpha=3), "auto"),
    ],
)
def test_header_plan_equals_the_meta_plan_on_configs(tmp_path, tiny_model, saved_base, layout, lora, dtype):
    """rsLoRA with rank and alpha patterns, all-linear, layers_to_transform with exclusions, a regex, an untied
    embedding and head (saved without the whole embedding weights) and a tower, casts."""
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), **lora)
    _drop_whole_weights(adapter)
    _both(tmp_path, adapter, saved_base(layout), dtype)


def _drop_whole_weights(adapter: str) -> None:
    """The adapter as ``save_pretrained(save_embedding_layers=False)`` writes it: LoRA factors only."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(adapter, "adapter_model.safetensors")
    tensors = load_file(path)
    save_file({k: v for k, v in tensors.items() if ".base_layer." not in k}, path, metadata={"format": "pt"})


def test_header_plan_on_a_sharded_bfloat16_base(tmp_path, tiny_model, saved_base):
    import torch

    layout = "ministral3_text"
    adapter = save_adapter(
        tiny_model(layout).to(torch.bfloat16), str(tmp_path / "adapter"), **_default_lora(layout)
    )
    _both(tmp_path, adapter, saved_base(layout, torch.bfloat16, "100KB"))


def test_merge_reports_the_plan_that_ran(tmp_path, tiny_model, saved_base, cli):
    layout = "ministral3_text"
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), **_default_lora(layout, r=2))
    res = cli("merge", adapter, "--base", saved_base(layout), "--out", tmp_path / "out", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["plan"] == "headers" and data["plan_fallback"] is None
    other = save_adapter(tiny_model("qwen3_5_text"), str(tmp_path / "other"), **_default_lora("qwen3_5_text"))
    report = merge(other, saved_base("qwen3_5_text"), tmp_path / "out2")
    assert report.ok and report.plan == "meta-model"
    assert report.plan_fallback == "transformers or PEFT convert qwen3_5_text checkpoints on load"


def _edit_config(adapter: str, **fields: object) -> None:
    path = os.path.join(adapter, "adapter_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(fields)
    with open(path, "w") as f:
        json.dump(cfg, f)


FALLBACKS = [
    # (name, layout, LoRA kwargs, config fields written over the saved ones, the reason's words)
    ("dora", "ministral3_text", dict(target_modules=["q_proj"], use_dora=True), {}, "use_dora"),
    ("lora bias", "ministral3_text", dict(target_modules=["q_proj"], lora_bias=True), {}, "lora_bias"),
    (
        "modules_to_save",
        "qwen3_5_vl",
        dict(target_modules=["q_proj"], modules_to_save=["lm_head"]),
        {},
        "modules_to_save",
    ),
    (
        "tokens",
        "ministral3_text",
        dict(target_modules=["q_proj"], trainable_token_indices=[1, 5]),
        {},
        "trainable_token",
    ),
    ("tied", "ministral3_text", dict(target_modules=["embed_tokens"]), {}, "tied embeddings"),
    (
        "fused experts",
        "qwen3_5_moe_vl",
        lora_kwargs("qwen3_5_moe_vl", r=2),
        {},
        "not stored under its in-memory name",
    ),
    (
        "load conversion",
        "mistral3_vl",
        _default_lora("mistral3_vl"),
        {},
        "convert mistral3 checkpoints on load",
    ),
    (
        "target_parameters",
        "ministral3_text",
        dict(target_modules=["q_proj"]),
        {"target_parameters": ["mlp.experts.down_proj"]},
        "target_parameters",
    ),
    (
        "unknown field",
        "ministral3_text",
        dict(target_modules=["q_proj"]),
        {"layer_replication": [[0, 2]]},
        "layer_replication",
    ),
    (
        "fewer modules",
        "ministral3_text",
        dict(target_modules=["q_proj"]),
        {"target_modules": ["q_proj", "k_proj"]},
        "not the ones PEFT creates",
    ),
    ("a truthy string", "ministral3_text", dict(target_modules=["q_proj"]), {"use_dora": "no"}, "use_dora"),
]


@pytest.mark.parametrize(
    ("name", "layout", "lora", "fields", "why"), FALLBACKS, ids=[c[0] for c in FALLBACKS]
)
def test_the_meta_plan_runs_where_the_header_plan_cannot_vouch(
    tmp_path, tiny_model, saved_base, name, layout, lora, fields, why
):
    adapter = save_adapter(tiny_model(layout), str(tmp_path / "adapter"), **lora)
    _edit_config(adapter, **fields)
    base = saved_base(layout)
    with pytest.raises(Unvouched, match=why):
        header_plan(_open_adapter(adapter), _open_base(base), "auto")
    report = merge(adapter, base, tmp_path / "out")
    assert report.plan == META_MODEL and why in (report.plan_fallback or "")


@pytest.fixture(scope="module")
def family_base(tmp_path_factory):
    root = Path(__file__).resolve().parents[2] / "fixtures" / "make_families.py"
    spec = importlib.util.spec_from_file_location("make_families", root)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["make_families"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.make(tmp_path_factory.mktemp("families"), ["llama"])["llama"]


def test_a_family_outside_the_registry_takes_the_header_plan(tmp_path, family_base):
    """Its module tree is read off its own headers (tests/merge/test_header_plan_any_family.py has the families)."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(family_base)
    adapter = save_adapter(model, str(tmp_path / "adapter"), target_modules=["q_proj", "v_proj"], r=2)
    plan = header_plan(_open_adapter(adapter), _open_base(str(family_base)), "auto")
    assert plan.planner == HEADERS and len(plan.applied) == 4
    report = merge(adapter, str(family_base), tmp_path / "out")
    assert report.ok and report.plan == HEADERS and report.plan_fallback is None
