"""`adapterdoc merge` of MoE expert LoRA in both layouts on bases saved either way, against PEFT.

Real adapters from an older stack (fixtures/old_stack: transformers 4.57 + PEFT 0.17, one LoRA per expert) and the
fused adapter PEFT 0.21 writes for the same model (``target_parameters``), on three bases: the 4.57 file (experts one
tensor each on disk), the same model resaved by transformers 5 (``save_pretrained`` writes per-expert again) and a
fused file (``mlp.experts.gate_up_proj`` [E, 2I, H] on disk, as the model's state dict holds it). The oracles: the old
stack's ``merge_and_unload`` logits (reference.safetensors), and a live PEFT 0.21 ``merge_and_unload`` of the original
adapter on the same base, logits and state dict.
"""
# ruff: noqa: F811  (the saved_base fixture imported from test_merge_helpers is shadowed by parameters)

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_merge_helpers import saved_base  # noqa: F401  (a fixture)

from adapterdoc.merge import merge

ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "old_stack"
QWEN = ROOT / "qwen3_moe"
MIXTRAL = ROOT / "mixtral"
REL = 1e-5
"""max |ours - reference| / max |reference|, float32."""

pytestmark = pytest.mark.ml


def _skip_old_transformers() -> None:
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("about transformers 5 (fused experts)")
    pytest.importorskip("peft.utils.transformers_weight_conversion")


def load_model(folder: Path | str) -> Any:
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def logits(model: Any, ids: Any) -> Any:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def rel(got: Any, want: Any) -> float:
    return float((got - want).abs().max() / want.abs().max())


def peft_merged(base: Path | str, adapter: Path | str) -> Any:
    """PEFT 0.21's own merge: the base loaded by transformers 5, the adapter by ``PeftModel`` (which converts a
    per-expert adapter at load), ``merge_and_unload``."""
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(load_model(base), str(adapter)).eval().merge_and_unload()


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Qwen3-MoE base three ways: the 4.57 file, a transformers-5 resave, a fused file."""
    _skip_old_transformers()
    root = tmp_path_factory.mktemp("bases")
    model = load_model(QWEN / "base")
    resaved = root / "resaved"
    model.save_pretrained(str(resaved))
    fused = root / "fused"
    fused.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(fused / "model.safetensors"))
    for name in ("config.json", "generation_config.json"):
        shutil.copy(QWEN / "base" / name, fused / name)
    return {"4.57": QWEN / "base", "resaved": resaved, "fused": fused}


def disk_keys(folder: Path) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_the_three_bases_are_what_they_claim(bases: dict[str, Path]) -> None:
    """Resaved by transformers 5: per-expert again, byte-equal tensors. Fused: 3-D experts, and transformers 5 loads
    it into the same model (the fused layout is a base merge must take too)."""
    old = load_file(str(bases["4.57"] / "model.safetensors"))
    new = load_file(str(bases["resaved"] / "model.safetensors"))
    assert set(old) == set(new) and "model.layers.0.mlp.experts.3.up_proj.weight" in old
    assert all(torch.equal(old[k], new[k]) for k in old)
    fused = disk_keys(bases["fused"])
    assert "model.layers.0.mlp.experts.gate_up_proj" in fused
    assert not any(".experts.0." in k for k in fused)
    ref = load_file(str(QWEN / "reference.safetensors"))
    assert rel(logits(load_model(bases["fused"]), ref["input_ids"]), ref["logits.base"]) <= REL


def _check_against_peft(
    out: Path, base: Path, adapter: Path, ref: dict[str, Any], ref_key: str | None
) -> None:
    ids = ref["input_ids"]
    mine = load_model(out)
    theirs = peft_merged(base, adapter)
    if ref_key is not None:  # the old stack's merge_and_unload
        assert rel(logits(mine, ids), ref[ref_key]) <= REL
    assert rel(logits(mine, ids), logits(theirs, ids)) <= REL
    ms, ts = mine.state_dict(), theirs.state_dict()
    assert set(ms) == set(ts)
    for k in ts:
        torch.testing.assert_close(ms[k], ts[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("base_kind", ["4.57", "resaved", "fused"])
def test_per_expert_adapter_merges_like_peft(tmp_path: Path, bases: dict[str, Path], base_kind: str) -> None:
    """The outside report: 24 AD501 on this pair. Now: every per-expert module applied, converted as PEFT
    converts it (AD508), and the merged model is PEFT's and the old stack's merge."""
    base = bases[base_kind]
    adapter = QWEN / "adapter_experts"
    report = merge(adapter, base, tmp_path / "out")
    assert report.ok, [f.message for f in report.findings]
    assert report.unused == []
    assert [f.code for f in report.findings] == ["AD508"]
    assert "24 per-expert LoRA modules" in report.findings[0].message
    from adapterdoc.adapter import parse_key
    from adapterdoc.checkpoint import open_checkpoint

    modules = {parse_key(k).module for k in open_checkpoint(str(adapter)).tensors}
    assert set(report.applied) == modules and len(modules) == 2 * (4 + 12)
    out = tmp_path / "out"
    assert disk_keys(out) == disk_keys(base)  # the base's own on-disk layout, per-expert or fused
    ref = load_file(str(QWEN / "reference.safetensors"))
    _check_against_peft(out, base, adapter, ref, "logits.merged_adapter_experts")
    if (
        base_kind != "fused"
    ):  # tensor for tensor against PEFT's merged model saved by transformers 5 (per-expert)
        theirs = tmp_path / "peft"
        peft_merged(base, adapter).save_pretrained(str(theirs))
        a, b = load_file(str(out / "model.safetensors")), load_file(str(theirs / "model.safetensors"))
        assert set(a) == set(b)
        changed = [k for k in a if not torch.equal(a[k], load_file(str(base / "model.safetensors"))[k])]
        assert any(".experts.2.up_proj" in k for k in changed) and any(
            ".experts.0.down_proj" in k for k in changed
        )
        for k in b:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


def test_mixtral_per_expert_adapter(tmp_path: Path) -> None:
    """Mixtral: ``block_sparse_moe.experts.{e}.w1/w3/w2`` on disk and in the adapter; transformers 5 renames the
    block to ``mlp`` and fuses w1, w3 into gate_up_proj, and so does PEFT for the adapter."""
    _skip_old_transformers()
    report = merge(MIXTRAL / "adapter_experts", MIXTRAL / "base", tmp_path / "out")
    assert report.ok, [f.message for f in report.findings]
    assert report.unused == [] and [f.code for f in report.findings] == ["AD508"]
    assert disk_keys(tmp_path / "out") == disk_keys(MIXTRAL / "base")
    ref = load_file(str(MIXTRAL / "reference.safetensors"))
    _check_against_peft(
        tmp_path / "out", MIXTRAL / "base", MIXTRAL / "adapter_experts", ref, "logits.merged_adapter_experts"
    )


@pytest.fixture(scope="module")
def fused_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fused adapter PEFT 0.21 writes: the per-expert adapter loaded on transformers 5 and saved back."""
    _skip_old_transformers()
    from peft import PeftModel

    folder = tmp_path_factory.mktemp("fused_adapter")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = PeftModel.from_pretrained(load_model(QWEN / "base"), str(QWEN / "adapter_experts"))
    pm.save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("base_kind", ["4.57", "fused"])
def test_fused_adapter_merges_on_either_base(
    tmp_path: Path, bases: dict[str, Path], fused_adapter: Path, base_kind: str
) -> None:
    """PEFT-written fused LoRA (``target_parameters``, ``experts.base_layer.lora_A`` [E·2r, H]) on the per-expert
    4.57 file (each on-disk expert tensor gets its slice) and on the fused file; no conversion involved."""
    keys = set(load_file(str(fused_adapter / "adapter_model.safetensors")))
    assert "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight" in keys
    assert json.loads((fused_adapter / "adapter_config.json").read_text())["target_parameters"]
    base = bases[base_kind]
    report = merge(fused_adapter, base, tmp_path / "out")
    assert report.ok, [f.message for f in report.findings]
    assert report.findings == [] and report.unused == []
    ref = load_file(str(QWEN / "reference.safetensors"))
    _check_against_peft(tmp_path / "out", base, fused_adapter, ref, "logits.merged_adapter_experts")


def test_attention_only_adapter_untouched_experts(tmp_path: Path) -> None:
    _skip_old_transformers()
    report = merge(QWEN / "adapter_attention", QWEN / "base", tmp_path / "out")
    assert report.ok and report.findings == []
    a = load_file(str(tmp_path / "out" / "model.safetensors"))
    b = load_file(str(QWEN / "base" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a if ".experts." in k)
    ref = load_file(str(QWEN / "reference.safetensors"))
    assert (
        rel(logits(load_model(tmp_path / "out"), ref["input_ids"]), ref["logits.merged_adapter_attention"])
        <= REL
    )


def test_one_sided_adapter_is_one_clear_refusal(tmp_path: Path, cli: Any) -> None:
    """gate_proj without up_proj: PEFT raises at injection (they are fused into gate_up_proj). One AD507 with
    PEFT's reason, exit 1, nothing written; no AD501 per module."""
    _skip_old_transformers()
    res = cli(
        "merge", QWEN / "adapter_one_sided", "--base", QWEN / "base", "--out", tmp_path / "out", "--json"
    )
    assert res.exit_code == 1, res.stderr
    data = json.loads(res.stdout)
    assert [f["code"] for f in data["findings"]] == ["AD507"]
    msg = data["findings"][0]["message"]
    assert "gate_proj without also targeting up_proj" in msg and "gate_up_proj" in msg
    assert "both halves" in data["findings"][0]["hint"]
    assert data["out"] is None and not (tmp_path / "out").exists()


def _partial_adapter(tmp_path: Path, drop: str) -> Path:
    """adapter_experts without the tensors whose names contain ``drop``."""
    folder = tmp_path / "partial"
    shutil.copytree(QWEN / "adapter_experts", folder)
    sd = load_file(str(folder / "adapter_model.safetensors"))
    save_file({k: v for k, v in sd.items() if drop not in k}, str(folder / "adapter_model.safetensors"))
    return folder


def test_missing_expert_is_a_shape_error_like_peft(tmp_path: Path) -> None:
    """One expert of layer 0 without LoRA: PEFT's conversion stacks three experts where its layer has four, and
    PEFT's load fails on the size; merge says so (AD502, after the conversion) and writes nothing."""
    _skip_old_transformers()
    adapter = _partial_adapter(tmp_path, "layers.0.mlp.experts.3.")
    report = merge(adapter, QWEN / "base", tmp_path / "out")
    assert not report.ok and report.out is None
    bad = [f for f in report.findings if f.code == "AD502"]
    assert len(bad) == 2, [f.message for f in report.findings]
    by_key = {f.key: f.message for f in bad}
    assert set(by_key) == {"model.layers.0.mlp.experts", "model.layers.0.mlp.experts.base_layer"}
    assert "lora_A is [6, 16], PEFT builds [8, 16]" in by_key["model.layers.0.mlp.experts"]
    assert "after PEFT's conversion of its 3 per-expert modules" in by_key["model.layers.0.mlp.experts"]
    assert (
        "after PEFT's conversion of its 6 per-expert modules"
        in by_key["model.layers.0.mlp.experts.base_layer"]
    )
    assert not any(f.code == "AD501" for f in report.findings)
    from peft import PeftModel

    with pytest.raises(RuntimeError, match="size mismatch"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        PeftModel.from_pretrained(load_model(QWEN / "base"), str(adapter))


def test_fused_and_per_expert_tensors_for_one_parameter(tmp_path: Path, fused_adapter: Path) -> None:
    """Both layouts for the same expert parameter in one file: AD509, nothing written."""
    folder = tmp_path / "mixed"
    shutil.copytree(fused_adapter, folder)
    fused = load_file(str(folder / "adapter_model.safetensors"))
    per_expert = load_file(str(QWEN / "adapter_experts" / "adapter_model.safetensors"))
    extra = {k: v for k, v in per_expert.items() if "layers.1.mlp.experts.0.down_proj" in k}
    save_file({**fused, **extra}, str(folder / "adapter_model.safetensors"))
    report = merge(folder, QWEN / "base", tmp_path / "out")
    assert not report.ok and report.out is None
    assert [f.code for f in report.findings if f.severity == "error"] == ["AD509"]
    assert "both fused LoRA tensors and per-expert ones" in report.findings[0].message


def test_per_expert_adapter_peft_does_not_convert(tmp_path: Path, tiny_model: Any, saved_base: Any) -> None:
    """Qwen3.5-MoE (text): PEFT's MoE tables do not cover it, so ``gate_proj``/``up_proj``/``down_proj`` reach only
    the shared expert's Linears and PEFT loads no per-expert tensor. Merge follows: AD501 for each per-expert module,
    naming the fused parameter and ``remap --experts fused``; the shared expert's modules would merge."""
    _skip_old_transformers()
    from peft import PeftModel

    from adapterdoc.ml.tiny import tiny_config

    layout = "qwen3_5_moe_text"
    base = Path(saved_base(layout))
    cfg = tiny_config(layout)
    hidden, inter = cfg.hidden_size, cfg.moe_intermediate_size
    g = torch.Generator().manual_seed(0)
    sd = {}
    for e in range(cfg.num_experts):
        p = f"base_model.model.model.layers.0.mlp.experts.{e}"
        for proj, (i, o) in {
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }.items():
            sd[f"{p}.{proj}.lora_A.weight"] = torch.randn(2, i, generator=g)
            sd[f"{p}.{proj}.lora_B.weight"] = torch.randn(o, 2, generator=g)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    save_file(sd, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 2,
                "lora_alpha": 4,
                "target_modules": ["gate_proj", "up_proj", "down_proj"],
                "task_type": "CAUSAL_LM",
            }
        )
    )
    with warnings.catch_warnings(record=True) as caught:  # PEFT: nothing of it loads
        warnings.simplefilter("always")
        PeftModel.from_pretrained(load_model(base), str(adapter))
    assert any(
        "missing adapter keys" in str(w.message).lower() or "unexpected" in str(w.message).lower()
        for w in caught
    )
    report = merge(adapter, base, tmp_path / "out")
    assert not report.ok and report.out is None
    bad = [f for f in report.findings if f.code == "AD501"]
    assert len(bad) == 3 * cfg.num_experts
    assert "is a per-expert LoRA module of `model.layers.0.mlp.experts.gate_up_proj`" in "\n".join(
        f.message for f in bad
    )
    assert all(f.hint and "--experts fused" in f.hint for f in bad)
