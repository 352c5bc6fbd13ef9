"""``remap --for ENGINE`` against real PEFT on tiny float32 models: for every rewrite (rsLoRA fold, rank padding with
``rank_pattern``, scaling, regex → list, key layout, expert layout) the rewritten adapter loaded by
``PeftModel.from_pretrained`` gives the original's outputs to 1e-6 relative; the output verifies clean under the
engine's profile; DoRA and ``modules_to_save`` are refused with exit 3 and the input unchanged byte for byte."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.engines import PROFILES, get_profile
from adapterdoc.engines.base import EngineNeeds
from adapterdoc.remap import remap

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from adapterdoc.ml.tiny import build_counterpart, build_tiny  # noqa: E402

pytestmark = pytest.mark.ml

ROOT = Path(__file__).resolve().parents[2]
IDS = torch.randint(3, 200, (2, 9), generator=torch.Generator().manual_seed(0))
REL = 1e-6
TEXT = "qwen3_5_text"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in this process (click's runner: the exit code, stdout and stderr as a user's shell sees them),
    which saves each call a fresh interpreter importing torch; the subprocess form is kept for the no-torch
    tests (test_remap_for.py)."""
    from click.testing import CliRunner

    from adapterdoc.cli import main

    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def outputs(model: Any) -> Any:
    with torch.no_grad():
        m = model.get_base_model() if hasattr(model, "get_base_model") else model
        return m(input_ids=IDS).logits.float()


def rel(got: Any, want: Any) -> float:
    return float((got - want).abs().max() / want.abs().max())


def trained(model: Any, **kw: Any) -> Any:
    """A PEFT model with random LoRA factors (a trained adapter, not the zero-B start)."""
    pm = peft.get_peft_model(model, peft.LoraConfig(**kw))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return pm.eval()


def save(pm: Any, folder: Path) -> Path:
    pm.save_pretrained(str(folder))
    return folder


def loaded(model: Any, folder: Path) -> Any:
    return peft.PeftModel.from_pretrained(model, str(folder)).eval()


def digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


def adapter(tmp_path: Path, layout: str = TEXT, **kw: Any) -> tuple[Path, Any]:
    pm = trained(build_tiny(layout), **kw)
    want = outputs(pm)
    assert rel(want, outputs(build_tiny(layout))) > 1e-3  # the adapter does something
    return save(pm, tmp_path / "in"), want


# --------------------------------------------------------------------------------- each rewrite, exact under PEFT


def test_rslora_fold_is_config_only_and_exact(tmp_path: Path) -> None:
    folder, want = adapter(
        tmp_path,
        r=4,
        lora_alpha=8,
        use_rslora=True,
        target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"],
        rank_pattern={"v_proj": 2, "down_proj": 9},
        alpha_pattern={"q_proj": 3, "down_proj": 5},
    )
    weights = (folder / "adapter_model.safetensors").read_bytes()
    report = remap(folder, engine="sglang", needs=EngineNeeds(rslora=False))
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert cfg["use_rslora"] is False and cfg["lora_alpha"] == 16  # 8 · sqrt(4)
    assert cfg["alpha_pattern"]["down_proj"] == 15  # 5 · sqrt(9)
    assert [r["rewrite"] for r in report.rewrites] == ["rslora"] and report.strategy == "in-place"
    assert (folder / "adapter_model.safetensors").read_bytes() == weights  # header-only: not even that
    assert rel(outputs(loaded(build_tiny(TEXT), folder)), want) <= REL
    again = remap(folder, engine="sglang", needs=EngineNeeds(rslora=False))
    assert again.strategy == "none" and again.rewrites == []


def test_rank_padding_with_rank_pattern_is_exact_and_counts_its_bytes(tmp_path: Path) -> None:
    folder, want = adapter(
        tmp_path,
        r=2,
        lora_alpha=4,
        target_modules=["q_proj", "v_proj", "up_proj"],
        rank_pattern={"q_proj": 6},
        alpha_pattern={"q_proj": 12},  # same scaling 2 everywhere: padding alone is exact
    )
    size = (folder / "adapter_model.safetensors").stat().st_size
    out = tmp_path / "out"
    report = remap(folder, engine="tgi", needs=EngineNeeds(keys="text", patterns=False), out=out)
    ranks = next(r for r in report.rewrites if r["rewrite"] == "ranks")
    assert ranks["to"] == 6 and ranks["exact"] is True
    assert not any(r["rewrite"] == "scaling" for r in report.rewrites)
    grown = (out / "adapter_model.safetensors").stat().st_size - size
    assert 0 < ranks["bytes_added"] <= grown <= ranks["bytes_added"] + 4096  # header growth aside
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["rank_pattern"], cfg["alpha_pattern"]) == (6, 12, {}, {})
    assert rel(outputs(loaded(build_tiny(TEXT), out)), want) <= REL
    assert remap(out, engine="tgi", needs=EngineNeeds(keys="text", patterns=False)).strategy == "none"


def test_differing_scalings_scale_lora_b_and_report_the_rounding(tmp_path: Path) -> None:
    folder, want = adapter(
        tmp_path,
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "down_proj"],
        rank_pattern={"v_proj": 2},
        alpha_pattern={"v_proj": 3, "down_proj": 12},  # scalings 2, 1.5, 3
    )
    out = tmp_path / "out"
    report = remap(folder, engine="lorax", needs=EngineNeeds(keys="text", patterns=False), out=out)
    scaling = next(r for r in report.rewrites if r["rewrite"] == "scaling")
    assert scaling["tensors"] > 0 and 0 < scaling["max_rel_rounding"] <= 2**-24
    assert scaling["bit_exact"] is False and "AD263" in {f.code for f in report.findings}
    assert rel(outputs(loaded(build_tiny(TEXT), out)), want) <= REL


def test_regex_targets_become_the_module_list(tmp_path: Path) -> None:
    folder, want = adapter(tmp_path, r=2, lora_alpha=4, target_modules=r".*\.(q_proj|down_proj)")
    report = remap(folder, engine="sglang", needs=EngineNeeds(regex_targets=False), out=tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert isinstance(cfg["target_modules"], list) and all(
        t.endswith(("q_proj", "down_proj")) for t in cfg["target_modules"]
    )
    assert report.rewrites[0]["entries"] == len(cfg["target_modules"]) and report.strategy == "copy"
    assert rel(outputs(loaded(build_tiny(TEXT), tmp_path / "out")), want) <= REL


def test_text_keys_for_a_vl_adapter(tmp_path: Path) -> None:
    vl = "qwen3_5_vl"
    src = build_tiny(vl)
    pm = trained(
        src,
        r=2,
        lora_alpha=4,
        target_modules=["q_proj", "v_proj", "down_proj"],
        exclude_modules=r".*visual.*",
    )
    want = outputs(pm)
    folder = save(pm, tmp_path / "in")
    out = tmp_path / "out"
    report = remap(folder, engine="tgi", needs=EngineNeeds(keys="text"), out=out)
    assert report.rewrites[0]["rewrite"] == "keys" and report.target_layout == TEXT
    text = build_counterpart(build_tiny(vl), vl, TEXT)
    assert rel(outputs(loaded(text, out)), want) <= REL


def test_vllm_served_class_from_base(tmp_path: Path) -> None:
    """A text-class adapter for a server that loads the VL base: the VL class's keys; verifies clean."""
    vl = "qwen3_5_vl"
    text = build_counterpart(build_tiny(vl), vl, TEXT)
    pm = trained(text, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    want = outputs(pm)
    folder = save(pm, tmp_path / "in")
    out = tmp_path / "out"
    r = run("remap", str(folder), "--for", "vllm", "--base", f"tiny:{vl}", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["ok"] and body["strategy"] == "copy" and body["renamed"] > 0
    assert [x["rewrite"] for x in body["rewrites"]] == ["keys"] and body["engine"]["base_layout"] == vl
    assert all(".language_model." in new for new in body["mapping"].values())
    assert rel(outputs(loaded(build_tiny(vl), out)), want) <= REL
    v = run("verify", str(out), "--profile", "vllm", "--base", f"tiny:{vl}")
    assert v.returncode == 0, v.stdout + v.stderr
    again = run("remap", str(out), "--for", "vllm", "--base", f"tiny:{vl}", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["strategy"] == "none"


def test_expert_layout_for_vllm(tmp_path: Path) -> None:
    """vLLM 0.33.0 reads fused expert LoRA for the 3-D MoE class Qwen3_5MoeForConditionalGeneration (and
    per-expert for the text class Qwen3_5MoeForCausalLM): a per-expert adapter is fused, outputs unchanged."""
    moe = "qwen3_5_moe_vl"
    assert get_profile("vllm").needs(moe).experts == "fused"
    assert get_profile("vllm").needs("qwen3_5_moe_text").experts == "per-expert"
    pm = trained(
        build_tiny(moe),
        r=2,
        lora_alpha=4,
        target_modules=["q_proj", "v_proj"],
        target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    )
    want = outputs(pm)
    fused = save(pm, tmp_path / "fused")
    per = tmp_path / "per"
    remap(fused, experts="per-expert", out=per)
    out = tmp_path / "out"
    report = remap(per, engine="vllm", base=f"tiny:{moe}", out=out)
    assert "experts" in [r["rewrite"] for r in report.rewrites]
    assert rel(outputs(loaded(build_tiny(moe), out)), want) <= 1e-5
    v = run("verify", str(out), "--profile", "vllm", "--base", f"tiny:{moe}")
    assert v.returncode == 0, v.stdout + v.stderr


# --------------------------------------------------------------------------------------------- refusals, contract


@pytest.mark.parametrize(
    "kw", [{"use_dora": True}, {"modules_to_save": ["lm_head"]}], ids=["dora", "modules_to_save"]
)
def test_inexact_features_are_refused_and_nothing_changes(tmp_path: Path, kw: dict[str, Any]) -> None:
    folder, _ = adapter(tmp_path, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], **kw)
    before = digest(folder)
    r = run("remap", str(folder), "--for", "vllm")
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "merge" in r.stderr
    assert ("AD260" if "use_dora" in kw else "AD261") in r.stderr
    assert digest(folder) == before and sorted(p.name for p in folder.iterdir()) == sorted(before)


def test_dry_run_writes_nothing_and_in_place_replaces_atomically(tmp_path: Path) -> None:
    folder, want = adapter(
        tmp_path, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], rank_pattern={"q_proj": 4}
    )
    needs = EngineNeeds(keys="text", patterns=False)
    before = digest(folder)
    report = remap(folder, engine="tgi", needs=needs, dry_run=True)
    assert report.dry_run and report.strategy == "copy" and digest(folder) == before
    ino = (folder / "adapter_model.safetensors").stat().st_ino
    report = remap(folder, engine="tgi", needs=needs)
    assert report.strategy == "copy" and (folder / "adapter_model.safetensors").stat().st_ino != ino
    assert sorted(p.name for p in folder.iterdir()) == sorted(before)  # no temp file left
    assert rel(outputs(loaded(build_tiny(TEXT), folder)), want) <= REL


# ------------------------------------------------------------------------------ the engines' own needs (profiles)


def _llama() -> Any:
    """A tiny llama: a model type TGI and LoRAX serve with LoRA (neither serves the registry's families)."""
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=256,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "lorax"])
def test_each_engine_output_verifies_clean(tmp_path: Path, engine: str) -> None:
    """rsLoRA, a rank_pattern and a regex target_modules: the engine's output keeps PEFT's outputs, verifies
    clean under the engine's profile, and a second --for is a no-op. TGI and LoRAX also get a rank they do not
    pad themselves (LoRAX scales later layer types with an earlier type's padded rank)."""
    if engine not in PROFILES:
        pytest.skip("profile not merged yet")
    if engine in ("tgi", "lorax"):
        build, base = _llama, str(tmp_path / "base")
        _llama().save_pretrained(base)
    else:
        build, base = (lambda: build_tiny(TEXT)), f"tiny:{TEXT}"
    pm = trained(
        build(),
        r=4,
        lora_alpha=8,
        use_rslora=True,
        target_modules=r".*\.(q_proj|v_proj|down_proj)",
        rank_pattern={"v_proj": 2},
    )
    want = outputs(pm)
    folder = save(pm, tmp_path / "in")
    assert get_profile(engine).needs(TEXT) is not None
    out = tmp_path / "out"
    r = run("remap", str(folder), "--for", engine, "--base", base, "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert rel(outputs(loaded(build(), out)), want) <= REL
    if engine in ("tgi", "lorax"):
        cfg = json.loads((out / "adapter_config.json").read_text())
        assert cfg["r"] == 8 and not cfg.get(
            "rank_pattern"
        )  # 4 and 2 -> 8: the SGMV minimum, not padded again
        assert any(w["rewrite"] == "ranks" and w["to"] == 8 for w in json.loads(r.stdout)["rewrites"])
    v = run("verify", str(out), "--profile", engine, "--base", base)
    assert v.returncode == 0, v.stdout + v.stderr
    again = run("remap", str(out), "--for", engine, "--base", base, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["strategy"] == "none"


@pytest.mark.parametrize(
    ("engine", "targets", "needle"),
    [
        ("sglang", ["q_proj", "v_proj", "in_proj_qkv"], "in_proj_qkv"),  # SGLang has no LoRA for it
        ("tgi", ["gate_proj", "up_proj", "down_proj"], "qwen3_5_text"),  # TGI: no LoRA class for the type
    ],
)
def test_what_no_rewrite_makes_the_engine_apply_is_refused(
    tmp_path: Path, engine: str, targets: list[str], needle: str
) -> None:
    """The train-smoke adapter of qwen3_5_text, remapped --for sglang, used to say "already fits" while verify
    --profile sglang failed it (AD436): the command must refuse (exit 3, AD270) and change nothing."""
    folder, _ = adapter(tmp_path, r=2, lora_alpha=4, target_modules=targets)
    before = digest(folder)
    out = tmp_path / "out"
    r = run("remap", str(folder), "--for", engine, "--base", f"tiny:{TEXT}", "--out", str(out))
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert "AD270" in r.stderr and needle in r.stderr and "merge" in r.stderr
    assert digest(folder) == before and not out.exists()
    v = run("verify", str(folder), "--profile", engine, "--base", f"tiny:{TEXT}")
    assert v.returncode == 1  # verify under the engine's profile agrees
