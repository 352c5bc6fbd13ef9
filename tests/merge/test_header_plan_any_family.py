"""The header plan outside the registry: a plain causal LM's module tree read off its own headers
(:mod:`adapterdoc.merge.header_tree`), against the meta-model plan (the oracle) and PEFT's ``merge_and_unload``, on
tiny real models of the families transformers builds here and real PEFT adapters; and every case the header cannot
vouch for falls back to the meta-model plan with its reason."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from test_merge_helpers import assert_fp32_equal, load, save_adapter

from adapterdoc.layouts.trees import LINEAR, OTHER, Unmodeled
from adapterdoc.merge import merge
from adapterdoc.merge.edits import HEADERS, META_MODEL, Plan
from adapterdoc.merge.header_plan import Unvouched, header_plan
from adapterdoc.merge.header_tree import SIZED, header_tree
from adapterdoc.merge.output import write
from adapterdoc.merge.plan import make_plan
from adapterdoc.merge.run import _open_adapter, _open_base
from adapterdoc.st.header import TensorInfo

SMALL = dict(
    vocab_size=384,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
PLANNED = [
    "llama",
    "mistral",
    "qwen2",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "granite",
    "olmo2",
    "stablelm",
]
"""Families outside the registry whose tiny base the header plan vouches for."""
REFUSED = {
    "gpt_neox": "without converting its keys",  # GPTNeoXForCausalLM renames embed_out on load
    "gpt2": "Conv1D",  # its Linear weights are stored [in, out]
}


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """``family(model_type, tie=None)``: (base folder, a fresh copy of the model) of a tiny random model saved with
    save_pretrained (PEFT wraps the model it is given in place)."""
    import copy

    import torch
    import transformers as tf

    cache: dict[tuple[str, Any], tuple[str, Any]] = {}

    def get(model_type: str, tie: bool | None = None) -> tuple[str, Any]:
        if (model_type, tie) not in cache:
            extra = {} if tie is None else {"tie_word_embeddings": tie}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                config = tf.AutoConfig.for_model(model_type, **SMALL, **extra)
                torch.manual_seed(0)
                model = tf.AutoModelForCausalLM.from_config(config)
                folder = str(tmp_path_factory.mktemp(f"base-{model_type}"))
                model.save_pretrained(folder)
            cache[(model_type, tie)] = (folder, model)
        folder, model = cache[(model_type, tie)]
        return folder, copy.deepcopy(model)

    return get


def _summary(plan: Plan) -> dict[str, object]:
    """Everything the writer reads from a plan, in comparable form; ``applied`` as a set (the header tree lists
    modules in name order, PEFT in definition order: the bytes written do not depend on it)."""
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
        "applied": sorted(plan.applied),
        "unused": plan.unused,
        "findings": [f.to_dict() for f in plan.findings],
        "untie": plan.untie,
        "added": plan.added,
        "model_class": plan.model_class,
    }


def _same_plan(tmp_path: Path, adapter: str, base: str, dtype: str = "auto") -> Plan:
    """The header plan, after checking it equals the meta-model plan and writes the same bytes."""
    fast = header_plan(_open_adapter(adapter), _open_base(base), dtype)
    slow = make_plan(_open_adapter(adapter), _open_base(base), dtype)
    assert fast.planner == HEADERS and slow.planner == META_MODEL
    assert _summary(fast) == _summary(slow)
    assert fast.applied and not fast.findings
    for name, plan in (("fast", fast), ("slow", slow)):
        write(plan, str(tmp_path / name), dtype, force=False, progress=None)
    names = sorted(os.listdir(tmp_path / "fast"))
    assert names == sorted(os.listdir(tmp_path / "slow"))
    for name in names:
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "slow" / name).read_bytes(), name
    return fast


def _peft_merged(base: str, adapter: str) -> dict[str, Any]:
    import transformers as tf
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load(tf.AutoModelForCausalLM, base)
        return PeftModel.from_pretrained(model, adapter).merge_and_unload().state_dict()


@pytest.mark.parametrize("model_type", PLANNED)
def test_every_family_plans_all_linear_from_headers(tmp_path, family, model_type):
    """all-linear on each family: the header plan equals the meta-model plan (bytes included) and `merge` writes
    what PEFT's merge_and_unload gives (fp32, 1e-6 relative), with `plan: headers`."""
    import transformers as tf

    base, model = family(model_type)
    adapter = save_adapter(model, str(tmp_path / "adapter"), target_modules="all-linear", r=2, lora_alpha=5)
    plan = _same_plan(tmp_path, adapter, base)
    assert len(plan.applied) == 3 * sum(1 for n in plan.applied if n.startswith("model.layers.0."))
    report = merge(adapter, base, tmp_path / "merged")
    assert report.ok and report.plan == HEADERS and report.plan_fallback is None
    assert_fp32_equal(
        load(tf.AutoModelForCausalLM, str(report.out)).state_dict(), _peft_merged(base, adapter)
    )


LORAS = [
    # (family, LoRA kwargs): the target_modules forms and scalings PEFT reads
    (
        "llama",
        dict(
            target_modules=["q_proj", "v_proj", "down_proj"],
            use_rslora=True,
            r=4,
            lora_alpha=8,
            rank_pattern={"v_proj": 2, r"layers\.2\..*down_proj": 6},
            alpha_pattern={"q_proj": 3},
        ),
    ),
    ("llama", dict(target_modules=r".*layers\.[02]\.mlp\.(up|down)_proj", r=3)),
    ("llama", dict(target_modules=["q_proj", "o_proj"], layers_to_transform=[0, 2], r=2)),
    ("llama", dict(target_modules=["q_proj", "o_proj", "k_proj"], exclude_modules=["o_proj"], r=2)),
    ("mistral", dict(target_modules=r"model\.layers\.\d+\.self_attn\.(q|k|v|o)_proj", r=2)),
    ("qwen2", dict(target_modules=["q_proj", "k_proj", "v_proj"], r=4, alpha_pattern={"k_proj": 1})),
    ("phi3", dict(target_modules=["qkv_proj", "gate_up_proj"], layers_to_transform=1, r=2, use_rslora=True)),
    ("gemma2", dict(target_modules=["o_proj", "up_proj"], rank_pattern={"up_proj": 1}, r=3)),
    ("stablelm", dict(target_modules=r".*\.(q_proj|o_proj|down_proj)", r=2)),
]


@pytest.mark.parametrize(("model_type", "lora"), LORAS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(LORAS)])
def test_header_plan_equals_the_meta_plan_on_configs(tmp_path, family, model_type, lora):
    import transformers as tf

    base, model = family(model_type)
    adapter = save_adapter(model, str(tmp_path / "adapter"), **lora)
    _same_plan(tmp_path, adapter, base)
    report = merge(adapter, base, tmp_path / "merged")
    assert report.ok and report.plan == HEADERS
    assert_fp32_equal(
        load(tf.AutoModelForCausalLM, str(report.out)).state_dict(), _peft_merged(base, adapter)
    )


def test_a_sharded_bfloat16_base_and_casts(tmp_path, family):
    """A bf16 base in shards, merged as it is and cast to float16: the header plan's bytes are the meta plan's."""
    import torch

    _, model = family("llama")
    model = model.to(torch.bfloat16)
    base = str(tmp_path / "base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(base, max_shard_size="20KB")
    assert os.path.exists(os.path.join(base, "model.safetensors.index.json"))
    adapter = save_adapter(model, str(tmp_path / "adapter"), target_modules="all-linear", r=2)
    _same_plan(tmp_path / "auto", adapter, base)
    _same_plan(tmp_path / "f16", adapter, base, "float16")


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_families_the_header_cannot_vouch_for_take_the_meta_plan(tmp_path, family, model_type):
    import transformers as tf

    base, model = family(model_type)
    adapter = save_adapter(model, str(tmp_path / "adapter"), target_modules="all-linear", r=2)
    with pytest.raises(Unvouched, match=REFUSED[model_type]):
        header_plan(_open_adapter(adapter), _open_base(base), "auto")
    report = merge(adapter, base, tmp_path / "merged")
    assert report.ok and report.plan == META_MODEL and REFUSED[model_type] in (report.plan_fallback or "")
    assert_fp32_equal(
        load(tf.AutoModelForCausalLM, str(report.out)).state_dict(), _peft_merged(base, adapter)
    )


def _edit(folder: str, name: str, **fields: object) -> None:
    path = os.path.join(folder, name)
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(fields)
    with open(path, "w") as f:
        json.dump(cfg, f)


FALLBACKS = [
    # (name, family, tie, LoRA kwargs, adapter config fields written over, base config fields, the reason's words)
    (
        "head",
        "llama",
        None,
        dict(target_modules=["lm_head", "q_proj"]),
        {},
        {},
        "`lm_head` is not a plain Linear",
    ),
    ("embedding", "llama", None, dict(target_modules=["embed_tokens"]), {}, {}, "(embedding or head)"),
    (
        "tied head",
        "qwen2",
        True,
        dict(target_modules=["lm_head"]),
        {},
        {},
        "names `lm_head`, which is no module",
    ),
    (
        "a listed module without tensors",
        "llama",
        None,
        dict(target_modules=["down_proj"]),
        {"target_modules": ["down_proj", "act_fn"]},
        {},
        "names `act_fn`",
    ),
    (
        "a regex naming a module without tensors",
        "llama",
        None,
        dict(target_modules=r".*\.mlp\.down_proj"),
        {"target_modules": r".*\.mlp\.(down_proj|act_fn)"},
        {},
        "`model.layers.0.mlp.act_fn`, a module without tensors",
    ),
    (
        "a regex matching any child",
        "llama",
        None,
        dict(target_modules=r".*\.mlp\.down_proj"),
        {"target_modules": r".*\.mlp\..*"},
        {},
        "`model.layers.0.mlp.*`",
    ),
    (
        "layers beyond the config's",
        "llama",
        None,
        dict(target_modules=["q_proj"]),
        {},
        {"num_hidden_layers": 2},
        "stores 3 layers under `model.layers`, config.json says num_hidden_layers 2",
    ),
    (
        "another class",
        "llama",
        None,
        dict(target_modules=["q_proj"]),
        {},
        {"architectures": ["LlamaForSequenceClassification"]},
        "architectures",
    ),
    (
        "remote code",
        "llama",
        None,
        dict(target_modules=["q_proj"]),
        {},
        {"auto_map": {"AutoModelForCausalLM": "modeling.Model"}},
        "not a plain transformers config",
    ),
    ("dora", "llama", None, dict(target_modules=["q_proj"], use_dora=True), {}, {}, "use_dora"),
]


@pytest.mark.parametrize(
    ("name", "model_type", "tie", "lora", "fields", "base_fields", "why"),
    FALLBACKS,
    ids=[c[0] for c in FALLBACKS],
)
def test_the_meta_plan_runs_where_the_header_cannot_vouch(
    tmp_path, family, name, model_type, tie, lora, fields, base_fields, why
):
    import shutil

    folder, model = family(model_type, tie)
    base = str(tmp_path / "base")
    shutil.copytree(folder, base)
    _edit(base, "config.json", **base_fields)
    adapter = save_adapter(model, str(tmp_path / "adapter"), **lora)
    _edit(adapter, "adapter_config.json", **fields)
    with pytest.raises(Unvouched) as info:
        header_plan(_open_adapter(adapter), _open_base(base), "auto")
    assert why in str(info.value)
    if name == "remote code":
        return  # the meta model would run the folder's own code
    report = merge(adapter, base, tmp_path / "merged")
    assert report.plan == META_MODEL and why in (report.plan_fallback or "")


def test_merge_json_says_headers_on_a_llama_base(tmp_path, family, cli):
    """Before the header tree, `merge --json` said `plan: meta-model` on every family outside the registry."""
    base, model = family("llama")
    adapter = save_adapter(model, str(tmp_path / "adapter"), target_modules=["q_proj", "v_proj"], r=2)
    res = cli("merge", adapter, "--base", base, "--out", tmp_path / "out", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["plan"] == "headers" and data["plan_fallback"] is None
    assert data["model_class"] == "LlamaForCausalLM"


def test_the_header_plan_imports_no_torch(tmp_path, family):
    base, model = family("llama")
    adapter = save_adapter(model, str(tmp_path / "adapter"), target_modules="all-linear", r=2)
    code = (
        "import sys\n"
        "from adapterdoc.merge.header_plan import header_plan\n"
        "from adapterdoc.merge.run import _open_adapter, _open_base\n"
        f"plan = header_plan(_open_adapter({adapter!r}), _open_base({base!r}), 'auto')\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'transformers', 'peft') if m in sys.modules)\n"
        "print(plan.planner, len(plan.applied), heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["headers", "21", "[]"]


# ---- the tree itself, from made-up headers (torch-free)


def _infos(shapes: dict[str, tuple[int, ...]], dtype: str = "F32") -> dict[str, TensorInfo]:
    return {name: TensorInfo(name, dtype, shape, 0, 0) for name, shape in shapes.items()}


CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 1,
    "vocab_size": 10,
}
TENSORS = {
    "model.embed_tokens.weight": (10, 4),
    "model.layers.0.self_attn.q_proj.weight": (4, 4),
    "model.layers.0.self_attn.q_proj.bias": (4,),
    "model.layers.0.mlp.down_proj.weight": (4, 6),
    "model.layers.0.input_layernorm.weight": (4,),
    "model.norm.weight": (4,),
    "lm_head.weight": (10, 4),
}


def test_the_tree_read_off_headers():
    tree = header_tree(CONFIG, _infos(TENSORS))
    kinds = {n.name: n.kind for n in tree.nodes}
    assert kinds == {
        "lm_head": SIZED,
        "model": OTHER,
        "model.embed_tokens": SIZED,
        "model.layers": OTHER,
        "model.layers.0": OTHER,
        "model.layers.0.input_layernorm": OTHER,
        "model.layers.0.mlp": OTHER,
        "model.layers.0.mlp.down_proj": LINEAR,
        "model.layers.0.self_attn": OTHER,
        "model.layers.0.self_attn.q_proj": LINEAR,
        "model.norm": OTHER,
    }
    assert dict(next(n for n in tree.nodes if n.name.endswith("q_proj")).params) == {
        "weight": (4, 4),
        "bias": (4,),
    }
    assert tree.model_class == "LlamaForCausalLM" and not tree.tied


def test_layer_numbers_sort_as_numbers():
    tensors = {f"model.layers.{i}.mlp.down_proj.weight": (4, 6) for i in range(11)}
    tree = header_tree({**CONFIG, "num_hidden_layers": 11}, _infos(tensors))
    layers = [n.name for n in tree.nodes if n.name.count(".") == 2]
    assert layers == [f"model.layers.{i}" for i in range(11)]


@pytest.mark.parametrize(
    ("config", "tensors", "why"),
    [
        (
            {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]},
            {},
            "without converting its keys",
        ),
        ({"model_type": "no_such_type", "architectures": ["X"]}, {}, "without converting its keys"),
        ({"architectures": ["LlamaModel"]}, {}, "not ['LlamaForCausalLM']"),
        ({"architectures": None}, {}, "not ['LlamaForCausalLM']"),
        ({"quantization_config": {"quant_method": "fp8"}}, {}, "quantization_config"),
        ({}, {"model.layers.0.LayerNorm.gamma": (4,)}, "renamed by transformers on load"),
        ({}, {"model.layers.0.conv.weight_g": (4, 1, 1)}, "renamed by transformers on load"),
        ({}, {"model.layers.0.mlp.c_fc.weight": (4, 6), "model.layers.0.mlp.c_fc.bias": (6,)}, "Conv1D"),
        (
            {"num_hidden_layers": 2},
            {},
            "stores 1 layers under `model.layers`, config.json says num_hidden_layers 2",
        ),
        ({}, {"model.extra.0.weight": (4, 4)}, "several layer lists"),
        ({"num_hidden_layers": None}, {}, "num_hidden_layers is None"),
    ],
)
def test_what_the_tree_refuses(config, tensors, why):
    with pytest.raises(Unmodeled) as info:
        header_tree({**CONFIG, **config}, _infos({**TENSORS, **tensors}))
    assert why in str(info.value)


def test_a_quantized_or_odd_module_is_no_linear():
    tensors = {
        **TENSORS,
        "model.layers.0.mlp.up_proj.weight": (4, 6),
        "model.layers.0.mlp.up_proj.weight_scale": (1,),
        "model.layers.0.mlp.gate_proj.weight": (4, 6, 1),
    }
    infos = _infos(tensors)
    infos["model.layers.0.mlp.down_proj.weight"] = TensorInfo(
        "model.layers.0.mlp.down_proj.weight", "I8", (4, 6), 0, 0
    )
    kinds = {n.name: n.kind for n in header_tree(CONFIG, infos).nodes}
    assert kinds["model.layers.0.mlp.up_proj"] == OTHER
    assert kinds["model.layers.0.mlp.gate_proj"] == OTHER
    assert kinds["model.layers.0.mlp.down_proj"] == OTHER
    assert kinds["model.layers.0.self_attn.q_proj"] == LINEAR


def test_the_plain_list_is_the_installed_transformers():
    """adapterdoc/layouts/plain_causal_lm.py equals what scripts/plain_causal_lm.py makes from this stack."""
    from adapterdoc.layouts import plain_causal_lm

    path = Path(__file__).resolve().parents[2] / "scripts" / "plain_causal_lm.py"
    spec = importlib.util.spec_from_file_location("plain_causal_lm_script", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.plain() == plain_causal_lm.PLAIN_CAUSAL_LM
    assert script.legacy() == plain_causal_lm.LEGACY_RENAMES
    assert {"llama", "mistral", "qwen2", "gemma", "phi3"} <= set(plain_causal_lm.PLAIN_CAUSAL_LM)
