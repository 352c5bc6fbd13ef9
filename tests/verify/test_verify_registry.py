"""`verify` with the base install only: the registry's expected keys give the ML path's verdicts, codes and key
lists on a config-only base, with torch made un-importable; what the registry cannot decide exits 3 naming the
ML extra."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.ml import meta as M
from adapterdoc.verify import VerifyOptions, verify

CHILD = """
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "peft", "accelerate"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NotInstalled())
import adapterdoc.cli
try:
    adapterdoc.cli.main(sys.argv[1:])
except SystemExit as e:
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "peft"))
    assert not heavy, heavy
    raise
"""
LORA = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]}
CASES = {
    "qwen3_5_moe_vl": {**LORA, "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]},
    "qwen3_5_vl": {**LORA, "target_modules": "all-linear"},
    "qwen3_5_text": LORA,
    "mistral3_vl": {**LORA, "exclude_modules": r"(^|.*\.)(vision_tower|multi_modal_projector)(\..*|$)"},
    "ministral3_text": {**LORA, "rank_pattern": {"layers.0.self_attn.q_proj": 3}},
    "qwen3_moe_text": {**LORA, "target_modules": ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]},
    "qwen3_omni_thinker": {
        **LORA,
        "target_modules": ["q_proj", "o_proj"],
        "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
        "exclude_modules": r"(^|.*\.)(visual|audio_tower)(\..*|$)",
    },
    "qwen3_omni": {**LORA, "target_modules": ["k_proj", "gate_proj", "up_proj"]},
    "modernbert": {**LORA, "target_modules": ["Wqkv", "Wo", "Wi"], "task_type": "FEATURE_EXTRACTION"},
    "modernbert_mlm": {**LORA, "target_modules": "all-linear"},
    "embeddinggemma2": {**LORA, "target_modules": "all-linear", "exclude_modules": r".*\.ple_block\..*"},
    "embeddinggemma2_text": {**LORA, "rank_pattern": {"layers.1.self_attn.q_proj": 3}},
    "qwen_vl": {**LORA, "target_modules": "all-linear", "exclude_modules": r"(^|.*\.)visual(\..*|$)"},
    # the released Omni Instruct config (talker and code2wav built): these leaves reach the talker too
    "qwen3_omni:audio": {**LORA, "target_modules": ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]},
    "qwen_vl:flat": {**LORA, "rank_pattern": {"layers.1.self_attn.q_proj": 3}},
}
PER_EXPERT = ("qwen3_moe_text", "qwen3_omni", "qwen3_omni:audio")
"""Layouts whose CASES config PEFT rewrites to fused experts: they also get a per-expert adapter (transformers-4
names) that PEFT converts at load (AD243), which the registry must judge as the meta device does."""


def _flat_qwen_vl() -> dict[str, Any]:
    """The tiny Qwen2.5-VL config in the flat hub form (pre-transformers-5): text fields at the top, rope as
    ``rope_scaling`` ``mrope`` + ``rope_theta``, the old vision ``model_type``."""
    from adapterdoc.ml.tiny import tiny_config

    raw = tiny_config("qwen_vl").to_dict()
    text = raw.pop("text_config")
    rope = text.pop("rope_parameters")
    raw.update({k: v for k, v in text.items() if k not in ("model_type", "tie_word_embeddings", "dtype")})
    raw.update(
        architectures=["Qwen2_5_VLForConditionalGeneration"],
        rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]},
        rope_theta=rope["rope_theta"],
        vision_token_id=151654,
    )
    raw["vision_config"].update(model_type="qwen2_5_vl", in_chans=3)
    return raw


def _base(root: Path, layout: str) -> Path:
    from adapterdoc.ml.tiny import model_class, tiny_config
    from tests.verify.test_expected_keys import released_omni_config

    folder = root / f"base-{layout.replace(':', '-')}"
    raw = {"qwen3_omni:audio": released_omni_config, "qwen_vl:flat": _flat_qwen_vl}.get(layout)
    if raw is not None:  # a config.json as the hub has it
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(raw()))
        return folder
    cfg = tiny_config(layout)
    cfg.architectures = [model_class(layout).__name__]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg.save_pretrained(folder)
    return folder


def _adapter(folder: Path, lora: dict[str, Any], keys: dict[str, tuple[int, ...]]) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps(lora))
    save_file({k: torch.full(s, 0.01) for k, s in keys.items()}, str(folder / "adapter_model.safetensors"))
    return folder


def _adapters(root: Path, layout: str, base: Path) -> list[Path]:
    """A clean adapter, one with keys left out and one reshaped, and (where the base is a VL class) one saved
    with the text class's names: the move verify names."""
    lora = CASES[layout]
    spec = M.resolve_base(str(base))
    meta = M.build_meta_adapter(spec, M.lora_config_from_raw(lora), config=M.load_config(spec))
    keys = dict(meta.expected)
    name = layout.replace(":", "-")
    out = [_adapter(root / f"{name}-clean", lora, keys)]
    partial = dict(list(keys.items())[3:])
    first = next(iter(partial))
    partial[first] = (partial[first][0] + 1, *partial[first][1:])
    out.append(_adapter(root / f"{name}-partial", lora, partial))
    if layout.endswith("_vl"):
        text = {k.replace(".language_model.", ".", 1): s for k, s in keys.items() if ".language_model." in k}
        out.append(_adapter(root / f"{name}-textnames", lora, text))
    if layout in PER_EXPERT:
        from adapterdoc.layouts.trees import build_tree
        from tests.verify.test_expected_keys import _per_expert

        tree = build_tree(json.loads((base / "config.json").read_text()))
        per = _per_expert(keys, tree, seed=-1)
        assert any(".experts.0." in k for k in per) and not any(".experts.base_layer" in k for k in per)
        out.append(_adapter(root / f"{name}-perexpert", lora, per))
    return out


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    drop = {"expected_keys_from", "expected_keys_note"}
    return {k: v for k, v in report.items() if k not in drop}


@pytest.mark.parametrize("layout", sorted(CASES))
def test_no_torch_verify_equals_the_ml_path(tmp_path: Path, layout: str) -> None:
    base = _base(tmp_path, layout)
    runs = [(a, "peft") for a in _adapters(tmp_path, layout, base)]
    runs.append((runs[-1][0], "vllm"))  # the vLLM profile reads the module tree too (served names, leaves)
    for adapter, profile in runs:
        options = VerifyOptions(expected_keys="meta-device", profile=profile)
        ml = verify([str(adapter)], str(base), options).to_dict()
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                "verify",
                str(adapter),
                "--base",
                str(base),
                "--json",
                "--profile",
                profile,
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode in (0, 1), proc.stderr
        fast = json.loads(proc.stdout)
        assert fast["adapters"][0]["expected_keys_from"] == "registry"
        assert ml["adapters"][0]["expected_keys_from"] == "meta-device"
        assert _comparable(fast["adapters"][0]) == _comparable(ml["adapters"][0])
        assert fast["findings"] == ml["findings"]
        assert proc.returncode == (0 if ml["ok"] else 1)
        if adapter.name.endswith("partial"):
            assert fast["adapters"][0]["missing"] and fast["adapters"][0]["shape_mismatch"]
        if layout == "qwen3_omni:audio" and adapter.name.endswith("clean"):  # PEFT puts LoRA on the talker
            assert any(f["code"] == "AD227" and "`talker`" in f["message"] for f in fast["findings"])
        if adapter.name.endswith("perexpert"):
            assert [f["code"] for f in fast["findings"] if f["code"] == "AD243"] == ["AD243"]
            unexpected = fast["adapters"][0]["unexpected"]
            if "down_proj" in CASES[layout]["target_modules"]:
                assert not unexpected and not fast["adapters"][0]["missing"]
            else:  # pinned PEFT fact: gate/up alone convert to experts.base_layer.*, PEFT builds experts.lora_*
                assert unexpected and all(".experts.base_layer.lora_" in k for k in unexpected)


def test_no_torch_fallback_names_the_ml_extra(tmp_path: Path) -> None:
    """A model type outside the registry: the one line names the base (not the adapter) and the ML extra."""
    base = tmp_path / "llama"
    base.mkdir()
    (base / "config.json").write_text(
        json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    )
    adapter = _adapter(tmp_path / "a", LORA, {"base_model.model.x.q_proj.lora_A.weight": (2, 4)})
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "verify", str(adapter), "--base", str(base), "--json"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"adapterdoc: error: {base} (the registry cannot decide: ")
    assert "adapterdoc[ml]" in lines[0]
    assert "no module tree" in json.loads(proc.stdout)["expected_keys_note"]


def test_load_still_needs_the_ml_extra(tmp_path: Path) -> None:
    base = _base(tmp_path, "qwen3_5_text")
    (adapter,) = _adapters(tmp_path, "qwen3_5_text", base)[:1]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, "verify", str(adapter), "--base", str(base), "--load"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 3
    assert "--load" in proc.stderr and "adapterdoc[ml]" in proc.stderr
