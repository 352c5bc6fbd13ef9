"""`remap` against real PEFT on tiny real models: every registry move, `--vl`, config rewrites, the pre-4.52
Qwen-VL layout and `.bin` adapters. An adapter saved by PEFT on one class, remapped, and loaded onto the other
class holding the same base weights must load with zero missing and zero unexpected LoRA keys and give outputs
identical to the original class with the original adapter."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.layouts import LAYOUTS
from adapterdoc.remap import remap
from adapterdoc.st.header import read_header

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from adapterdoc.ml.tiny import TINY_LAYOUTS, build_counterpart  # noqa: E402

pytestmark = pytest.mark.ml

MOVES = [(a, b) for a in TINY_LAYOUTS for b in LAYOUTS[a].remaps if b in TINY_LAYOUTS]
IDS = torch.randint(3, 1000, (2, 10), generator=torch.Generator().manual_seed(0))


def lora_config(layout: str, **kw: Any) -> Any:
    from adapterdoc.train.lora import lora_config as registry_config

    exclude = kw.pop("exclude_modules", True)
    r, alpha = kw.pop("r", 2), kw.pop("lora_alpha", None)
    return registry_config(layout, r=r, alpha=alpha, exclude=exclude if exclude is not None else False, **kw)


def same_base_pair(tiny_model: Any, a: str, b: str) -> tuple[Any, Any]:
    """Models of layouts ``a`` and ``b`` holding the same base weights (built from whichever has more)."""
    try:
        src = tiny_model(a)
        return src, build_counterpart(src, a, b)
    except RuntimeError:  # b has towers a lacks: build b, derive a
        dst = tiny_model(b)
        return build_counterpart(dst, b, a), dst


def core(model: Any, layout: str) -> Any:
    m = model.get_base_model() if hasattr(model, "get_base_model") else model
    if layout == "qwen3_omni":
        m = m.thinker  # the wrapper's own forward is not implemented
    if layout == "modernbert_mlm":
        m = m.model  # compare the encoder's hidden states with ModernBertModel's
    return m


def outputs(model: Any, layout: str) -> Any:
    with torch.no_grad():
        out = core(model, layout)(input_ids=IDS)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def train_like(model: Any, cfg: Any) -> Any:
    """A PEFT model whose LoRA factors are random (a trained adapter, not the zero-B initialisation)."""
    pm = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return pm


def load_onto(model: Any, folder: Path) -> tuple[Any, list[str], list[str]]:
    """Load the adapter the way PeftModel.from_pretrained does, keeping the load result."""
    pm = peft.PeftModel(model, peft.LoraConfig.from_pretrained(str(folder)), "default")
    res = pm.load_adapter(str(folder), "default")
    missing = [k for k in res.missing_keys if "lora_" in k]
    unexpected = [k for k in res.unexpected_keys if "lora_" in k]
    return pm.eval(), missing, unexpected


def data_hash(path: Path) -> str:
    h = read_header(path)
    with open(path, "rb") as f:
        f.seek(h.data_start)
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize(("a", "b"), MOVES, ids=[f"{a}-to-{b}" for a, b in MOVES])
def test_every_registry_move_loads_cleanly_with_identical_outputs(
    a: str, b: str, tiny_model: Any, tmp_path: Path
) -> None:
    src, dst = same_base_pair(tiny_model, a, b)
    base = outputs(src, a)
    pm = train_like(src, lora_config(a))
    want = outputs(pm, a)
    assert (want - base).abs().max() > 1e-3  # the adapter does something
    folder = tmp_path / "adapter"
    pm.save_pretrained(str(folder))
    weights = folder / "adapter_model.safetensors"
    original, digest = weights.read_bytes(), data_hash(weights)

    report = remap(folder, to=b, source=a)  # the rules are under test here; detection has its own tests

    assert report.renamed > 0 and data_hash(weights) == digest
    loaded, missing, unexpected = load_onto(dst, folder)
    assert missing == [] and unexpected == []
    assert torch.equal(outputs(loaded, b), want)
    # and back: byte-identical when the first move rewrote in place
    back = remap(folder, to=a, source=b)
    assert back.renamed == report.renamed and data_hash(weights) == digest
    if report.strategy == "in-place":
        assert weights.read_bytes() == original
    else:
        assert read_header(weights).tensors.keys() == set(read_header_bytes(original).tensors)


def read_header_bytes(data: bytes) -> Any:
    from adapterdoc.st.header import parse_header

    n = int.from_bytes(data[:8], "little")
    return parse_header("<bytes>", data[8 : 8 + n], len(data))


@pytest.mark.parametrize("vl", ["qwen3_5_vl", "qwen3_5_moe_vl", "mistral3_vl"])
def test_vl_flag_makes_a_vl_adapter_load_on_the_text_class(
    vl: str, tiny_model: Any, tmp_path: Path, cli: Any
) -> None:
    text = LAYOUTS[vl].text_counterpart
    assert text is not None
    src = tiny_model(vl)
    pm = train_like(src, lora_config(vl))
    want = outputs(pm, vl)
    folder = tmp_path / "adapter"
    pm.save_pretrained(str(folder))
    # unmapped, PEFT loads nothing and only warns: the text model stays the base model
    before, missing, _ = load_onto(build_counterpart(tiny_model(vl), vl, text), folder)
    assert missing and torch.equal(
        outputs(before, text), outputs(build_counterpart(tiny_model(vl), vl, text), text)
    )

    res = cli("remap", folder, "--vl", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["strategy"] == "in-place"

    loaded, missing, unexpected = load_onto(build_counterpart(tiny_model(vl), vl, text), folder)
    assert missing == [] and unexpected == []
    assert torch.equal(outputs(loaded, text), want)


def test_regex_targets_and_patterns_stay_consistent_for_peft(tiny_model: Any, tmp_path: Path) -> None:
    vl, text = "qwen3_5_vl", "qwen3_5_text"
    cfg = lora_config(
        vl,
        target_modules=r".*\.language_model\..*\.(q_proj|v_proj|in_proj_qkv|down_proj)",
        rank_pattern={"model.language_model.layers.3.self_attn.q_proj": 4, "down_proj": 3},
        alpha_pattern={"model.language_model.layers.0.linear_attn.in_proj_qkv": 16},
    )
    src = tiny_model(vl)
    pm = train_like(src, cfg)
    want = outputs(pm, vl)
    folder = tmp_path / "adapter"
    pm.save_pretrained(str(folder))

    report = remap(folder, vl=True)

    changed = {c.field: c for c in report.config_changes}
    assert set(changed) == {"target_modules", "rank_pattern", "alpha_pattern", "auto_mapping"}
    assert changed["auto_mapping"].new["base_model_class"] == LAYOUTS[text].model_class
    loaded, missing, unexpected = load_onto(build_counterpart(tiny_model(vl), vl, text), folder)
    assert missing == [] and unexpected == []
    ranks = {n: m.r["default"] for n, m in loaded.named_modules() if hasattr(m, "r") and "default" in m.r}
    assert ranks["base_model.model.model.layers.3.self_attn.q_proj"] == 4
    assert ranks["base_model.model.model.layers.0.mlp.down_proj"] == 3
    assert torch.equal(outputs(loaded, text), want)


def test_full_path_target_list_moves_to_a_vl_class_with_its_towers_excluded(
    tiny_model: Any, tmp_path: Path
) -> None:
    # a text adapter listing full module paths, moved onto Mistral3 (whose Pixtral tower also has q_proj)
    text, vl = "ministral3_text", "mistral3_vl"
    dst = tiny_model(vl)
    src = build_counterpart(dst, vl, text)
    targets = [f"model.layers.{i}.self_attn.q_proj" for i in range(4)] + ["v_proj"]
    pm = train_like(src, peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets))
    want = outputs(pm, text)
    folder = tmp_path / "adapter"
    pm.save_pretrained(str(folder))

    report = remap(folder, to=vl)

    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == sorted(
        [f"model.language_model.layers.{i}.self_attn.q_proj" for i in range(4)] + ["v_proj"]
    )
    assert cfg["exclude_modules"] == LAYOUTS[vl].exclude_regex
    assert {c.how for c in report.config_changes} == {"rules", "towers", "class"}
    assert cfg["auto_mapping"]["base_model_class"] == LAYOUTS[vl].model_class
    loaded, missing, unexpected = load_onto(dst, folder)
    assert missing == [] and unexpected == []
    assert torch.equal(outputs(loaded, vl), want)


# ---------------------------------------------------------------------------- pre-4.52 Qwen-VL layout


def tiny_qwen2_5_vl() -> Any:
    from adapterdoc.ml.tiny import build_tiny

    return build_tiny("qwen_vl", seed=0)  # Qwen2_5_VLForConditionalGeneration, same weights every call


def test_pre_4_52_qwen_vl_adapter_moves_to_the_current_layout(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    pm = train_like(tiny_qwen2_5_vl(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj", "qkv"]))
    want = outputs(pm, "qwen_vl")
    current = tmp_path / "current"
    pm.save_pretrained(str(current))
    # what transformers < 4.52 saved: model.layers.* and a top-level visual.* (renamed here independently)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    state = peft.get_peft_model_state_dict(pm)
    old_names = {
        k.replace("base_model.model.model.language_model.", "base_model.model.model.").replace(
            "base_model.model.model.visual.", "base_model.model.visual."
        ): v.contiguous()
        for k, v in state.items()
    }
    save_file(old_names, str(legacy / "adapter_model.safetensors"), metadata={"format": "pt"})
    (legacy / "adapter_config.json").write_bytes((current / "adapter_config.json").read_bytes())

    # today's transformers + PEFT do not convert these names: nothing loads
    _, missing, unexpected = load_onto(tiny_qwen2_5_vl(), legacy)
    assert len(missing) == len(old_names) and len(unexpected) == len(old_names)

    report = remap(legacy, to="qwen_vl")
    assert report.source_layout == "qwen_vl_legacy" and report.renamed == len(old_names)
    loaded, missing, unexpected = load_onto(tiny_qwen2_5_vl(), legacy)
    assert missing == [] and unexpected == []
    assert torch.equal(outputs(loaded, "qwen_vl"), want)

    # current → legacy → current is byte-identical
    original = (current / "adapter_model.safetensors").read_bytes()
    assert remap(current, to="qwen_vl_legacy").strategy == "in-place"
    assert remap(current, to="qwen_vl").strategy == "in-place"
    assert (current / "adapter_model.safetensors").read_bytes() == original


# ----------------------------------------------------------------------------------------------- .bin


def test_bin_adapter_becomes_safetensors_and_the_pickle_is_kept_aside(
    tiny_model: Any, tmp_path: Path
) -> None:
    vl, text = "qwen3_5_vl", "qwen3_5_text"
    pm = train_like(tiny_model(vl), lora_config(vl))
    want = outputs(pm, vl)
    folder = tmp_path / "adapter"
    pm.save_pretrained(str(folder), safe_serialization=False)
    assert (folder / "adapter_model.bin").exists()
    pickled = torch.load(folder / "adapter_model.bin", weights_only=True)
    os.chmod(folder / "adapter_model.bin", 0o640)

    report = remap(folder, vl=True)

    assert report.strategy == "copy" and [f.code for f in report.findings] == ["AD103"]
    assert sorted(os.listdir(folder)) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.bin.bak",
        "adapter_model.safetensors",
    ]
    h = read_header(folder / "adapter_model.safetensors")
    assert h.metadata == {"format": "pt"}
    assert oct(os.stat(folder / "adapter_model.safetensors").st_mode & 0o777) == oct(0o640)
    from safetensors.torch import load_file

    new = load_file(str(folder / "adapter_model.safetensors"))
    assert all(torch.equal(new[k.replace(".language_model.", ".", 1)], v) for k, v in pickled.items())
    loaded, missing, unexpected = load_onto(build_counterpart(tiny_model(vl), vl, text), folder)
    assert missing == [] and unexpected == []
    assert torch.equal(outputs(loaded, text), want)
    # a second run finds the safetensors file in text form: nothing to do
    assert remap(folder, vl=True).strategy == "none"
