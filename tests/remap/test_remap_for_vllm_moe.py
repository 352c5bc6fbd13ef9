"""``remap --for vllm`` and ``verify --profile vllm`` on every mixture-of-experts class vLLM 0.33.0 serves, both expert
layouts in: the 2-D classes (Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM: per-expert LoRA packed into ``experts``)
and the 3-D ones (Qwen3_5MoeForConditionalGeneration, the Omni thinker: PEFT's fused pair). Each output loads in PEFT
with the original's outputs (1e-5 relative, float32), passes plain ``verify`` and ``verify --profile vllm``; the
oracle suite (tests/oracles/test_vllm_oracle.py) runs vLLM's own loader on the same folders. Also: a refusal of
``--for tgi|lorax`` suggests only engines whose profile passes the adapter (issue 23, defect 6)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_remap_for_peft import loaded, outputs, rel, run, save, trained

from adapterdoc.remap import remap

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from adapterdoc.ml.tiny import build_tiny  # noqa: E402

pytestmark = pytest.mark.ml

FUSED = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
MOE: dict[str, dict[str, Any]] = {
    # the 2-D classes (is_3d_moe_weight False): vLLM reads per-expert LoRA
    "qwen3_moe_text": dict(target_modules=["q_proj", "v_proj"]),
    "qwen3_5_moe_text": dict(target_modules=["q_proj", "v_proj", "in_proj_qkv", "gate_proj", "down_proj"]),
    # the 3-D classes: vLLM reads PEFT's fused pair
    "qwen3_5_moe_vl": dict(target_modules=["q_proj", "v_proj"], exclude_modules=r".*visual.*"),
    "qwen3_omni_thinker": dict(
        target_modules=["q_proj", "v_proj"], exclude_modules=r".*(visual|audio_tower).*"
    ),
}
TOL = 1e-5


def _fused(layout: str, folder: Path) -> tuple[Path, Any]:
    pm = trained(build_tiny(layout), r=4, lora_alpha=8, target_parameters=FUSED, **MOE[layout])
    return save(pm, folder), outputs(pm)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """For each MoE layout and input layout (``fused``, ``per-expert``): the ``remap --for vllm`` run, its output
    folder and the original's outputs."""
    root = tmp_path_factory.mktemp("vllm-moe")
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for layout in MOE:
        fused, want = _fused(layout, root / layout / "fused")
        per = root / layout / "per-expert"
        remap(fused, experts="per-expert", out=per)
        for form, folder in (("fused", fused), ("per-expert", per)):
            dest = root / layout / f"{form}-for-vllm"
            r = run(
                "remap",
                str(folder),
                "--for",
                "vllm",
                "--base",
                f"tiny:{layout}",
                "--out",
                str(dest),
                "--json",
            )
            out[(layout, form)] = {"run": r, "out": dest, "want": want, "input": folder}
    return out


CASES = [(layout, form) for layout in MOE for form in ("fused", "per-expert")]


@pytest.mark.parametrize(("layout", "form"), CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_remap_for_vllm_output_loads_in_peft_and_passes_both_verifies(
    served: dict[tuple[str, str], dict[str, Any]], layout: str, form: str
) -> None:
    case = served[(layout, form)]
    r = case["run"]
    assert r.returncode == 0, r.stdout + r.stderr
    body = json.loads(r.stdout)
    reads = "per-expert" if layout.endswith("_text") else "fused"
    experts = [x for x in body["rewrites"] if x["rewrite"] == "experts"]
    if form != reads:  # the conversion vLLM needs, with every tensor it rewrote listed
        (x,) = experts
        assert (x["from"], x["to"]) == (form, reads)
        assert len(x["tensors"]) == x["blocks"] > 0 and x["tensors_read"] > 0 and x["tensors_written"] > 0
    else:
        assert experts == []
    out = case["out"]
    assert rel(outputs(loaded(build_tiny(layout), out)), case["want"]) <= TOL
    plain = run("verify", str(out), "--base", f"tiny:{layout}")
    assert plain.returncode == 0, plain.stdout
    v = run("verify", str(out), "--profile", "vllm", "--base", f"tiny:{layout}")
    assert v.returncode == 0, v.stdout
    again = run("remap", str(out), "--for", "vllm", "--base", f"tiny:{layout}", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["rewrites"] == []


def test_qwen3_moe_fused_is_refused_and_per_expert_passes(
    served: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """Defect 1: on Qwen3MoeForCausalLM (2-D) the fused adapter gets AD418 and the per-expert output passes, with
    no AD413 (vLLM compares ``experts.N.down_proj``, not ``down_proj``) and no AD415 (packed into ``experts``)."""
    case = served[("qwen3_moe_text", "fused")]
    before = run("verify", str(case["input"]), "--profile", "vllm", "--base", "tiny:qwen3_moe_text", "--json")
    assert before.returncode == 1 and '"AD418"' in before.stdout
    after = run("verify", str(case["out"]), "--profile", "vllm", "--base", "tiny:qwen3_moe_text", "--json")
    assert after.returncode == 0 and '"AD413"' not in after.stdout and '"AD415"' not in after.stdout


def test_qwen3_moe_on_a_base_folder(tmp_path: Path) -> None:
    """The same through a Qwen3MoeForCausalLM folder (what ``adapterdoc train`` writes beside its adapter)."""
    base = tmp_path / "base"
    build_tiny("qwen3_moe_text").save_pretrained(str(base))
    fused, want = _fused("qwen3_moe_text", tmp_path / "fused")
    out = tmp_path / "out"
    r = run("remap", str(fused), "--for", "vllm", "--base", str(base), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "16 tensors → 96" in r.stdout and "experts.{0..3}.down_proj" in r.stdout  # each rewrite listed
    assert run("verify", str(out), "--profile", "vllm", "--base", str(base)).returncode == 0
    assert rel(outputs(loaded(build_tiny("qwen3_moe_text"), out)), want) <= TOL


def test_qwen3_5_moe_text_per_expert_keeps_what_peft_needs(
    served: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """Defect 2: PEFT fuses Qwen3.5-MoE's per-expert keys at load but does not rewrite the config, so the output
    keeps ``target_parameters`` and gives gate_up the fused rank (2r) and alpha (2·alpha) of the keys it builds."""
    cfg = json.loads((served[("qwen3_5_moe_text", "fused")]["out"] / "adapter_config.json").read_text())
    assert cfg["target_parameters"] == FUSED
    assert cfg["rank_pattern"] == {r".*\.gate_up_proj": 8} and cfg["alpha_pattern"] == {
        r".*\.gate_up_proj": 16
    }


# ------------------------------------------------------------------------------------- defect 6: what is suggested

HYBRID = "qwen3_5_text"


@pytest.mark.parametrize("engine", ["tgi", "lorax"])
def test_refusal_suggests_only_engines_whose_profile_passes(tmp_path: Path, engine: str) -> None:
    pm = trained(build_tiny(HYBRID), r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "in_proj_qkv"])
    folder = save(pm, tmp_path / "in")
    r = run("remap", str(folder), "--for", engine, "--base", f"tiny:{HYBRID}", "--out", str(tmp_path / "o"))
    assert r.returncode == 3 and "AD269" in r.stderr and not (tmp_path / "o").exists()
    m = re.search(r"serve the adapter on ([A-Za-z]+(?: or [A-Za-z]+)*),", r.stderr)
    named = set(m.group(1).split(" or ")) if m else set()
    names = {"vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI", "lorax": "LoRAX"}
    passing = {
        names[e]
        for e in names
        if e != engine
        and run("verify", str(folder), "--profile", e, "--base", f"tiny:{HYBRID}").returncode == 0
    }
    assert named == passing, r.stderr
    assert (
        "SGLang" not in named and "TGI" not in named
    )  # SGLang refuses in_proj_qkv (AD270), TGI the type (AD449)
