"""The LoRA key grammar and the header-only config matchers, checked against PEFT's own functions."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapterdoc.adapter import AdapterConfig, module_name_matches, parse_key
from adapterdoc.errors import ConfigError

W = "base_model.model."


@pytest.mark.parametrize(
    ("key", "module", "role", "name"),
    [
        (
            W + "model.layers.0.self_attn.q_proj.lora_A.weight",
            "model.layers.0.self_attn.q_proj",
            "lora_A",
            None,
        ),
        (
            W + "model.layers.0.self_attn.q_proj.lora_B.weight",
            "model.layers.0.self_attn.q_proj",
            "lora_B",
            None,
        ),
        (
            W + "model.layers.0.self_attn.q_proj.lora_B.bias",
            "model.layers.0.self_attn.q_proj",
            "lora_B.bias",
            None,
        ),
        (W + "m.q_proj.lora_A.default.weight", "m.q_proj", "lora_A", "default"),
        (W + "model.embed_tokens.lora_embedding_A", "model.embed_tokens", "lora_embedding_A", None),
        (
            W + "model.embed_tokens.lora_embedding_B.default",
            "model.embed_tokens",
            "lora_embedding_B",
            "default",
        ),
        (W + "m.q_proj.lora_magnitude_vector", "m.q_proj", "magnitude", None),
        (W + "m.q_proj.lora_magnitude_vector.default.weight", "m.q_proj", "magnitude", "default"),
        (W + "model.embed_tokens.token_adapter.trainable_tokens_delta", "model.embed_tokens", "tokens", None),
        (W + "lm_head.weight", "lm_head", "full", None),
        (W + "model.embed_tokens.base_layer.weight", "model.embed_tokens.base_layer", "full", None),
        (
            W + "model.layers.0.mlp.experts.base_layer.lora_A.weight",
            "model.layers.0.mlp.experts.base_layer",
            "lora_A",
            None,
        ),
        ("model.layers.0.q_proj.lora_A.weight", "model.layers.0.q_proj", "lora_A", None),
    ],
)
def test_parse_key(key: str, module: str, role: str, name: str | None) -> None:
    k = parse_key(key)
    assert (k.module, k.role, k.adapter_name) == (module, role, name)
    assert k.wrapped == key.startswith(W)


_SEGMENTS = [
    "lora_A",
    "lora_B",
    "q_proj",
    "0",
    "default",
    "weight",
    "bias",
    "",
    "x\ny",
    "lora_A\n",
    "experts",
]


@settings(max_examples=600, deadline=None)
@given(
    st.lists(st.sampled_from(_SEGMENTS), min_size=0, max_size=6),
    st.sampled_from(["lora_A", "lora_B", "lora_Ab", "lora_a"]),
    st.sampled_from(["weight", "bias", "weight\n", "weights"]),
    st.booleans(),
)
def test_parse_key_fast_path_equals_the_regexes(
    parts: list[str], role: str, param: str, wrapped: bool
) -> None:
    """The split without a regex of ``<module>.lora_A.weight`` gives what the regexes give, on names built to
    trip it: modules ending in ``.lora_A``/``.lora_B`` (an adapter name then matches first), empty modules and
    segments, newlines (``.`` does not match them), near-miss roles and params."""
    from adapterdoc.adapter import keys

    key = (W if wrapped else "") + ".".join([*parts, role, param])
    rest = key[len(W) :] if wrapped else key
    fast = keys.parse_key.__wrapped__(key)
    assert fast == keys._parse_key_rx(key, wrapped, rest)


def test_parse_key_fast_path_edge_cases() -> None:
    assert (parse_key(W + "m.lora_A.lora_B.weight").module, parse_key(W + "m.lora_A.lora_B.weight").role) == (
        "m",
        "lora_A",
    )
    assert parse_key(W + "m.lora_A.lora_B.weight").adapter_name == "lora_B"
    assert parse_key(W + ".lora_A.weight").role == "full"  # no module before the role: not a LoRA factor
    assert parse_key("a\nb.lora_A.weight").role == "full"


def test_fused_expert_target_collapses_base_layer() -> None:
    assert (
        parse_key(W + "model.layers.0.mlp.experts.base_layer.lora_A.weight").target
        == "model.layers.0.mlp.experts"
    )


def test_real_peft_saved_keys_all_parse() -> None:
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=100,
        head_dim=16,
    )
    variants = [
        dict(use_dora=True, target_modules=["q_proj"]),
        dict(target_modules=["q_proj", "embed_tokens"], modules_to_save=["lm_head"]),
        dict(target_modules=["q_proj"], lora_bias=True),
        dict(target_modules=["q_proj"], trainable_token_indices=[1, 2]),
    ]
    expected_roles = [
        {"lora_A", "lora_B", "magnitude"},
        {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "full"},
        {"lora_A", "lora_B", "lora_B.bias"},
        {"lora_A", "lora_B", "tokens"},
    ]
    for kw, roles in zip(variants, expected_roles):
        torch.manual_seed(0)
        model = peft.get_peft_model(Qwen3ForCausalLM._from_config(cfg), peft.LoraConfig(r=2, **kw))
        keys = peft.get_peft_model_state_dict(model)
        assert {parse_key(k).role for k in keys} == roles, kw


_SEGMENT = st.sampled_from(
    [
        "model",
        "layers",
        "0",
        "1",
        "self_attn",
        "q_proj",
        "k_proj",
        "mlp",
        "down_proj",
        "visual",
        "language_model",
        "experts",
        "lm_head",
    ]
)
_MODULE = st.lists(_SEGMENT, min_size=1, max_size=6).map(".".join)
_LEAVES = st.lists(
    st.sampled_from(["q_proj", "k_proj", "down_proj", "self_attn.q_proj", "lm_head", "layers.0.q_proj"]),
    min_size=1,
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(
    module=_MODULE,
    targets=st.one_of(
        _LEAVES, st.sampled_from([r".*q_proj", r"model\..*\.(q|k)_proj", r".*language_model.*proj"])
    ),
    exclude=st.one_of(st.none(), _LEAVES, st.just(r"(^|.*\.)(visual)(\..*|$)")),
)
def test_targets_agrees_with_peft(module: str, targets: object, exclude: object) -> None:
    peft = pytest.importorskip("peft")
    from peft.tuners.tuners_utils import check_target_module_exists

    raw = {"r": 4, "target_modules": targets, "exclude_modules": exclude}
    ours = AdapterConfig(raw).targets(module)
    cfg = peft.LoraConfig(r=4, target_modules=targets, exclude_modules=exclude)
    theirs = check_target_module_exists(cfg, module)
    assert ours == (bool(theirs) and type(theirs).__name__ != "_ExcludedModule")


@settings(max_examples=200, deadline=None)
@given(
    module=_MODULE,
    keys=st.lists(
        st.sampled_from(["q_proj", "layers.0.q_proj", "mlp.*", "k_proj|q_proj", "0"]),
        min_size=1,
        max_size=3,
        unique=True,
    ),
)
def test_pattern_matching_agrees_with_peft(module: str, keys: list[str]) -> None:
    pytest.importorskip("peft")
    from peft.utils.other import get_pattern_key

    theirs = get_pattern_key(keys, module)
    ours = next((k for k in keys if module_name_matches(k, module)), module)
    assert ours == theirs


def test_scaling_rank_alpha_patterns_and_rslora() -> None:
    cfg = AdapterConfig(
        {"r": 8, "lora_alpha": 16, "rank_pattern": {"q_proj": 4}, "alpha_pattern": {"q_proj": 32}}
    )
    assert cfg.rank_for("model.layers.0.self_attn.q_proj") == 4
    assert cfg.scaling_for("model.layers.0.self_attn.q_proj") == 8.0
    assert cfg.scaling_for("model.layers.0.self_attn.k_proj") == 2.0
    rs = AdapterConfig({"r": 16, "lora_alpha": 16, "use_rslora": True})
    assert rs.scaling_for("x") == 4.0


@pytest.mark.parametrize(
    "text",
    [
        b"{",
        b"[]",
        b'{"r": 0}',
        b'{"r": "8"}',
        b'{"r": 8, "target_modules": 3}',
        b'{"r": 8, "target_modules": "("}',
        b'{"r": NaN}',
        b"{}",
        b'{"peft_type": "LORA", "r": 0}',
        b"\xff\xfe",
    ],
)
def test_bad_configs_raise_config_error(text: bytes) -> None:
    with pytest.raises(ConfigError):
        AdapterConfig.parse(text, "adapter_config.json")


def test_unknown_fields_and_order_are_kept() -> None:
    raw = {"zzz": 1, "peft_type": "LORA", "r": 4, "aaa": {"x": 2}}
    assert list(AdapterConfig.parse(json.dumps(raw).encode()).raw) == ["zzz", "peft_type", "r", "aaa"]
