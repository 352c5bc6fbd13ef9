"""``remap --for`` fills (``EngineNeeds.fill``) against real PEFT adapters on tiny float32 models: zero LoRA added where
TGI / LoRAX drop a layer type (AD443 / AD463) and where SGLang lacks a q/k/v or gate/up partner (AD435, AD427). The
rewritten adapter gives PEFT's outputs of the original (<= 1e-6 relative), verifies clean under the engine's profile
where the original failed, a second ``--for`` does nothing, and an impossible fill exits 3 with the input unchanged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_remap_for_peft import REL, _llama, digest, loaded, outputs, rel, run, save, trained

from adapterdoc.engines import PROFILES

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from adapterdoc.ml.tiny import build_tiny  # noqa: E402

pytestmark = pytest.mark.ml

HYBRID = "qwen3_5_text"
"""A hybrid stack: linear-attention layers 0-2 (no ``self_attn``), full attention on layer 3 (tiny config)."""
ROOT = Path(__file__).resolve().parents[2]


def _need(engine: str) -> None:
    if engine not in PROFILES:
        pytest.skip(f"profile {engine} not merged")


def _codes(stdout: str) -> set[str]:
    return {part[:5] for part in stdout.split('"code": "')[1:]}


def _remap(
    folder: Path, engine: str, base: str, out: Path | None
) -> tuple[subprocess.CompletedProcess[str], Any]:
    args = ["remap", str(folder), "--for", engine, "--base", base, "--json"]
    r = run(*args, *(["--out", str(out)] if out else []))
    return r, json.loads(r.stdout) if r.returncode == 0 else None


@pytest.fixture(scope="module")
def llama_base(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("llama")
    _llama().save_pretrained(str(folder))
    return str(folder)


@pytest.mark.parametrize("engine", ["tgi", "lorax"])
@pytest.mark.parametrize(
    "kw",
    [
        {"target_modules": ["q_proj", "v_proj", "down_proj"], "layers_to_transform": [0, 1]},
        {"target_modules": r"model\.layers\.[13]\.self_attn\.q_proj|.*\.v_proj"},
    ],
    ids=["layers_to_transform", "q-on-some-layers"],
)
def test_layer_types_filled_for_text_key_engines(
    tmp_path: Path, llama_base: str, engine: str, kw: dict[str, Any]
) -> None:
    _need(engine)
    pm = trained(_llama(), r=8, lora_alpha=16, **kw)
    want = outputs(pm)
    folder = save(pm, tmp_path / "in")
    v = run("verify", str(folder), "--profile", engine, "--base", llama_base, "--json")
    dropped = "AD443" if engine == "tgi" else "AD463"
    assert v.returncode == 1 and dropped in _codes(v.stdout)
    assert f"--for {engine} --out DIR" in v.stdout  # the finding's fix command
    out = tmp_path / "out"
    r, body = _remap(folder, engine, llama_base, out)
    assert r.returncode == 0, r.stderr
    fill = next(w for w in body["rewrites"] if w["rewrite"] == "fill")
    assert fill["fill"] == "layer-types" and fill["exact"] is True and fill["bytes_added"] > 0
    if "layers_to_transform" in kw:
        assert fill["added"] == {"down_proj": [2, 3], "q_proj": [2, 3], "v_proj": [2, 3]}
    else:
        assert fill["added"] == {"q_proj": [0, 2]}
    assert "AD268" in {f["code"] for f in body["findings"]}
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert not cfg.get("layers_to_transform") and not cfg.get("layers_pattern")
    got = loaded(_llama(), out)
    assert rel(outputs(got), want) <= REL
    added = [p for n, p in got.named_parameters() if "lora_" in n and ".layers.2." in n]
    if "layers_to_transform" in kw:  # PEFT built the filled modules from the file: all zeros
        assert len(added) == 6 and all(bool((p == 0).all()) for p in added)
    v = run("verify", str(out), "--profile", engine, "--base", llama_base)
    assert v.returncode == 0, v.stdout + v.stderr
    r, again = _remap(out, engine, llama_base, None)
    assert r.returncode == 0 and again["strategy"] == "none" and again["rewrites"] == []


def test_layer_type_the_base_lacks_is_refused(tmp_path: Path) -> None:
    """On a hybrid stack q_proj exists on the full-attention layer only: TGI drops it whatever is added."""
    _need("tgi")
    pm = trained(build_tiny(HYBRID), r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    folder = save(pm, tmp_path / "in")
    before = digest(folder)
    r = run("remap", str(folder), "--for", "tgi", "--base", f"tiny:{HYBRID}", "--out", str(tmp_path / "out"))
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "AD269" in r.stderr
    assert "the base has no q_proj in layer(s) 0-2" in r.stderr, r.stderr
    assert digest(folder) == before and not (tmp_path / "out").exists()


def test_layers_to_transform_without_a_base_is_refused(tmp_path: Path) -> None:
    _need("tgi")
    pm = trained(
        _llama(), r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], layers_to_transform=[0, 1]
    )
    folder = save(pm, tmp_path / "in")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = None
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    before = digest(folder)
    r = run("remap", str(folder), "--for", "tgi")
    assert r.returncode == 3 and "AD269" in r.stderr and "--base" in r.stderr, r.stderr
    assert digest(folder) == before


@pytest.mark.parametrize(
    ("targets", "added", "failing"),
    [
        (["q_proj", "o_proj"], {"v_proj": [3]}, "AD435"),
        (["k_proj", "v_proj", "up_proj"], {"gate_proj": [0, 1, 2, 3], "q_proj": [3]}, "AD427"),
        (["q_proj", "k_proj"], {"v_proj": [3]}, "AD435"),
    ],
    ids=["q-without-v", "kv-without-q-up-without-gate", "qk-without-v"],
)
def test_sglang_partners_filled(
    tmp_path: Path, targets: list[str], added: dict[str, list[int]], failing: str
) -> None:
    _need("sglang")
    base = f"tiny:{HYBRID}"
    pm = trained(build_tiny(HYBRID), r=4, lora_alpha=8, target_modules=targets)
    want = outputs(pm)
    folder = save(pm, tmp_path / "in")
    v = run("verify", str(folder), "--profile", "sglang", "--base", base, "--json")
    assert v.returncode == 1 and failing in _codes(v.stdout)
    if failing == "AD435":
        assert "--for sglang --out DIR" in v.stdout
    out = tmp_path / "out"
    r, body = _remap(folder, "sglang", base, out)
    assert r.returncode == 0, r.stderr
    fill = next(w for w in body["rewrites"] if w["rewrite"] == "fill")
    assert fill["fill"] == "sglang-pairs" and fill["added"] == added
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert set(added) <= set(cfg["target_modules"])
    assert rel(outputs(loaded(build_tiny(HYBRID), out)), want) <= REL
    v = run("verify", str(out), "--profile", "sglang", "--base", base)
    assert v.returncode == 0, v.stdout + v.stderr
    r, again = _remap(out, "sglang", base, None)
    assert r.returncode == 0 and again["strategy"] == "none"
    # SGLang's own code serving these fills: tests/verify/test_sglang_oracle.py (-m oracle)


def test_sglang_fill_without_a_base_is_refused(tmp_path: Path) -> None:
    _need("sglang")
    pm = trained(build_tiny(HYBRID), r=4, lora_alpha=8, target_modules=["q_proj"])
    folder = save(pm, tmp_path / "in")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = None
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    before = digest(folder)
    r = run("remap", str(folder), "--for", "sglang", "--out", str(tmp_path / "out"))
    assert r.returncode == 3 and "AD269" in r.stderr and "pass --base" in r.stderr, r.stderr
    assert digest(folder) == before and not (tmp_path / "out").exists()
