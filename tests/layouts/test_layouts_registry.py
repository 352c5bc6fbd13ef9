"""The registry as data, torch-free: every family module registers its layouts, tiny configs and trees, and the one
key rename (:func:`adapterdoc.layouts.apply_move`) is what both ``remap --vl`` and verify's suggested move run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from adapterdoc import layouts as L
from adapterdoc.adapter import parse_key
from adapterdoc.layouts import moves as M
from adapterdoc.layouts.registry import Rule
from adapterdoc.layouts.trees import LOAD_CONVERSIONS, TREES

OLD_TINY = {
    "qwen3_5_vl",
    "qwen3_5_text",
    "qwen3_5_moe_vl",
    "qwen3_5_moe_text",
    "qwen3_omni",
    "qwen3_omni_thinker",
    "qwen3_moe_text",
    "mistral3_vl",
    "ministral3_text",
    "qwen_vl",
    "modernbert_mlm",
    "modernbert",
    "embeddinggemma2",
    "embeddinggemma2_text",
}
"""The layouts ``ml/tiny.py`` built before the split."""
OLD_TREES = {
    "qwen3_5_vl",
    "qwen3_5_text",
    "qwen3_5_moe_vl",
    "qwen3_5_moe_text",
    "ministral3_text",
    "mistral3_vl",
    "qwen3_moe_text",
    "qwen3_omni_thinker",
    "qwen3_omni",
    "modernbert",
    "modernbert_mlm",
    "embeddinggemma2",
    "embeddinggemma2_text",
    "qwen_vl",
    "qwen_vl_legacy",
}
"""The layouts with a torch-free tree builder (issue 17: every registry layout)."""


def test_every_family_module_registers_layouts_with_tiny_configs_and_trees() -> None:
    seen: list[str] = []
    for module in L.FAMILY_MODULES:
        names = [lay.name for lay in module.ENTRIES]
        assert names, f"{module.__name__} registers no layout"
        assert all(L.LAYOUTS[n] is lay for n, lay in zip(names, module.ENTRIES, strict=True))
        assert any(lay.tiny is not None for lay in module.ENTRIES), f"{module.__name__} has no tiny config"
        assert set(module.SMOKE) <= set(names)
        seen += names
    assert seen == list(L.LAYOUTS), "every layout comes from exactly one family module, in registry order"
    assert set(L.tiny_layouts()) == OLD_TINY
    assert {n for n, lay in L.LAYOUTS.items() if lay.tree is not None} == OLD_TREES
    assert {(lay.model_type, lay.model_class) for n, lay in L.LAYOUTS.items() if n in OLD_TREES} == set(TREES)
    assert {
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "mistral3",
        "qwen3_moe",
        "qwen3_omni_moe_thinker",
        "qwen3_omni_moe",
    } == LOAD_CONVERSIONS
    for name in L.LAYOUTS:
        lay = L.LAYOUTS[name]
        if lay.tiny is None:
            assert lay.no_tiny, name
            continue
        kwargs = lay.tiny.kwargs()
        assert json.loads(json.dumps(kwargs)) == kwargs, f"{name}: the tiny config is plain data"
        assert lay.tiny.kwargs() is not kwargs, f"{name}: each call returns a fresh dict"


def test_smoke_and_routing_data() -> None:
    assert L.smoke_layouts() == (
        "qwen3_5_vl",
        "qwen3_5_moe_vl",
        "qwen3_omni_thinker",
        "qwen3_omni",
        "mistral3_vl",
        "modernbert_mlm",
        "embeddinggemma2",
    )
    routed = {n: lay.forward_via for n, lay in L.LAYOUTS.items() if lay.forward_via}
    assert routed == {"qwen3_omni": "thinker"}
    assert L.forward_layout("qwen3_omni") == "qwen3_omni_thinker"
    assert L.forward_layout("qwen3_5_vl") == "qwen3_5_vl"

    class Wrapper:
        thinker = object()

    assert L.forward_module(Wrapper()) is Wrapper.thinker
    plain = object()
    assert L.forward_module(plain) is plain
    assert {"embed_vision", "embed_audio", *L.TOWER_SEGMENTS} == L.all_tower_segments()
    assert L.tower_probes("visual") == ("visual.x", "model.visual.x", "thinker.model.visual.x")
    assert [n for n, lay in L.LAYOUTS.items() if lay.is_vl] == [
        "qwen3_5_vl",
        "qwen3_5_moe_vl",
        "qwen3_omni",
        "qwen3_omni_thinker",
        "mistral3_vl",
        "qwen_vl_legacy",
        "qwen_vl",
        "embeddinggemma2",
    ]


def test_move_words_are_data_in_the_entries() -> None:
    assert L.move_words("qwen3_5_vl", "qwen3_5_text") == "VL adapter on a text-only base"
    assert L.move_words("qwen3_5_text", "qwen3_5_vl") == "text-only adapter on a VL base"
    assert L.move_words("qwen3_omni", "qwen3_omni_thinker") == "Omni full-wrapper adapter on the thinker"
    assert L.move_words("qwen3_omni_thinker", "qwen3_omni") == "thinker adapter on the Omni full wrapper"
    assert L.move_words("qwen3_omni_thinker", "qwen3_moe_text") == "VL adapter on a text-only base"
    assert L.move_words("modernbert_mlm", "modernbert") == "MLM adapter on the bare encoder"
    assert L.move_words("modernbert", "modernbert_mlm") == "bare-encoder adapter on the MLM model"
    assert L.move_words("qwen_vl_legacy", "qwen_vl") == "pre-4.52 VL naming on a current VL base"
    assert L.move_words("qwen_vl", "qwen_vl_legacy") == "current VL naming on a pre-4.52 VL base"
    assert L.move_words("qwen3_5_vl", "modernbert") == "layout move"


def test_apply_move_keeps_the_wrapper_and_the_lora_suffix() -> None:
    rules = L.move_rules("qwen3_omni", "qwen3_moe_text")
    assert rules is not None and len(rules) == 2
    key = "base_model.model.thinker.model.language_model.layers.3.self_attn.q_proj.lora_A.weight"
    assert L.apply_move(rules, key) == "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
    assert (
        L.apply_move(rules, key[len("base_model.model.") :])
        == "model.layers.3.self_attn.q_proj.lora_A.weight"
    )
    # an adapter named like a segment stays: only the module path is renamed
    named = "base_model.model.model.layers.0.mlp.up_proj.lora_B.language_model.weight"
    assert L.apply_move(L.VL_RULES, named) == named
    assert L.rename(rules, "thinker.model.language_model.norm") == "model.norm"
    assert L.move_rules("modernbert", "qwen3_5_vl") is None


VL_MODULES = [
    f"model.language_model.layers.{i}.{leaf}"
    for i in range(2)
    for leaf in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj", "linear_attn.in_proj_qkv")
]


def _vl_adapter(folder: Path) -> list[str]:
    folder.mkdir()
    tensors: dict[str, np.ndarray] = {}
    for m in VL_MODULES:
        tensors[f"base_model.model.{m}.lora_A.weight"] = np.ones((2, 8), np.float32)
        tensors[f"base_model.model.{m}.lora_B.weight"] = np.ones((8, 2), np.float32)
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    leaves = sorted({m.rpartition(".")[2] for m in VL_MODULES})
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": leaves})
    )
    return sorted(tensors)


def test_remap_vl_and_the_move_verify_suggests_are_one_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adapterdoc.remap import remap

    keys = _vl_adapter(tmp_path / "vl")
    applied: list[Rule] = []
    real_apply = Rule.apply

    def spy(self: Rule, path: str) -> str:
        applied.append(self)
        return real_apply(self, path)

    monkeypatch.setattr(Rule, "apply", spy)

    # path 1: `adapterdoc remap --vl`
    remap(tmp_path / "vl", vl=True, out=tmp_path / "text")
    by_remap = sorted(load_file(tmp_path / "text" / "adapter_model.safetensors"))
    assert L.STRIP_LANGUAGE_MODEL in applied
    assert set(applied) == {L.STRIP_LANGUAGE_MODEL}, "remap --vl runs the one strip rule and nothing else"

    # path 2: the move verify suggests for this VL adapter on a text base (expected keys of a text model)
    applied.clear()
    expected = {"base_model.model." + m.replace("language_model.", "") for m in VL_MODULES}
    expected = {f"{m}.{role}.weight" for m in expected for role in ("lora_A", "lora_B")}

    def score(renamed: list[str]) -> tuple[int, int]:
        return len(set(renamed) - expected), len(expected - set(renamed))

    moves = M.candidate_moves(["qwen3_5_vl"], [parse_key(k) for k in keys])
    move = M.best_move(moves, keys, score, score(keys), target="qwen3_5_text", sources=["qwen3_5_vl"])
    assert move is not None and move.rules == L.VL_RULES
    assert move.command("ADAPTER") == "adapterdoc remap ADAPTER --vl"
    applied.clear()
    by_verify = sorted(move.apply(k) for k in keys)
    assert applied and set(applied) == {L.STRIP_LANGUAGE_MODEL}

    # one function: the same keys, and the same as apply_move and strip_language_model on each key
    assert by_verify == by_remap
    assert by_remap == sorted(L.apply_move(L.VL_RULES, k) for k in keys)
    assert by_remap == sorted(L.strip_language_model(k) for k in keys)
    assert set(by_remap) == expected


def test_a_layout_without_a_tiny_config_must_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from adapterdoc.layouts import registry

    monkeypatch.setattr(registry, "LAYOUTS", dict(registry.LAYOUTS))
    bare = replace(L.LAYOUTS["qwen3_5_text"], name="x_text", tiny=None, no_tiny="", tree=None)
    with pytest.raises(ValueError, match="no tiny config"):
        registry.register(bare)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(L.LAYOUTS["qwen3_5_text"])


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(["model", "layers", "0", "12", "x1", "1x", "", "\n", "3\n", "٣", "visual", "mtp"]),
        max_size=7,
    )
)
def test_detection_shapes_and_towers_read_paths_as_before(segments: list[str]) -> None:
    """The shape key (numeric segments as ``0``) and the tower segment of a path are what the earlier readings
    gave: a lookbehind regex, and a loop over the split path."""
    import re

    from adapterdoc.layouts import registry as R

    path = ".".join(segments)
    assert R._INDEX.sub(".0", path) == re.sub(r"(?<=\.)\d+(?=\.|$)", "0", path)
    towers = R.all_tower_segments()
    assert R.tower_segment(path) == next((s for s in path.split(".") if s in towers), None)


def test_every_registry_pattern_compiles() -> None:
    """Every layout's requires, forbids, signals and hint patterns are valid regular expressions."""
    for layout in L.LAYOUTS.values():
        for rx in (*layout.requires, *layout.forbids, *(s[0] for s in layout.signals)):
            re.compile(rx)
        if layout.hint:
            re.compile(layout.hint, re.IGNORECASE)
