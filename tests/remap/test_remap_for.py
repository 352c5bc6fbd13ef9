"""``remap --for ENGINE`` without torch: the padding and scaling on raw bytes (by hand, with numpy), the CLI's
text and JSON, and that the whole command imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adapterdoc.remap.for_engine.tensors import Change, apply
from adapterdoc.st.compose import Spec
from adapterdoc.st.tensor_edits import is_power_of_two, pad, scale_bytes

np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.remap.test_remap_experts import read_st, write_st  # noqa: E402

H = 6
P = "base_model.model.model.layers.{i}.self_attn.{m}_proj"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapterdoc", *args], capture_output=True, text=True, cwd=ROOT, timeout=1800
    )


def test_padding_keeps_the_product_exactly() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, H)).astype("<f4"), rng.normal(size=(5, 2)).astype("<f4")
    a4 = np.frombuffer(pad(a.tobytes(), Spec("a", "F32", (2, H)), 0, 4), "<f4").reshape(4, H)
    b4 = np.frombuffer(pad(b.tobytes(), Spec("b", "F32", (5, 2)), 1, 4), "<f4").reshape(5, 4)
    assert (a4[:2] == a).all() and not a4[2:].any() and (b4[:, :2] == b).all() and not b4[:, 2:].any()
    assert (b4 @ a4 == b @ a).all()


def test_scaling_rounds_once_and_says_how_much() -> None:
    x = np.random.default_rng(1).normal(size=1000).astype("<f4")
    data, err = scale_bytes(x.tobytes(), "F32", 1.5)
    assert np.allclose(np.frombuffer(data, "<f4"), x * 1.5, rtol=2**-24) and 0 < err <= 2**-24
    data, err = scale_bytes(x.tobytes(), "F32", 2.0)
    assert err == 0.0 and (np.frombuffer(data, "<f4") == x * 2).all() and is_power_of_two(0.25)
    bf = (x.view("<u4") >> 16).astype("<u2").tobytes()  # truncated to bfloat16
    data, err = scale_bytes(bf, "BF16", 1.5)
    assert 0 < err <= 2**-8
    padded, _ = apply(x[:12].tobytes(), Spec("b", "F32", (6, 2)), Change(3, 1, 2.0))
    got = np.frombuffer(padded, "<f4").reshape(6, 3)
    assert (got[:, :2] == x[:12].reshape(6, 2) * 2).all() and not got[:, 2].any()


@pytest.fixture()
def text_adapter(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    t = {}
    for i in range(2):
        for m, r in (("q", 4), ("v", 2)):
            t[P.format(i=i, m=m) + ".lora_A.weight"] = rng.normal(size=(r, H))
            t[P.format(i=i, m=m) + ".lora_B.weight"] = rng.normal(size=(H, r))
    folder = tmp_path / "a"
    folder.mkdir()
    write_st(folder / "adapter_model.safetensors", t)
    cfg = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "rank_pattern": {"q_proj": 4}, "alpha_pattern": {},
           "target_modules": r".*\.(q_proj|v_proj)", "use_rslora": True, "use_dora": False}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def test_remap_for_imports_no_torch(text_adapter: Path, tmp_path: Path) -> None:
    code = (
        "import sys\nfrom adapterdoc.remap import remap\nfrom adapterdoc.engines.base import EngineNeeds\n"
        f"remap({str(text_adapter)!r}, engine='tgi', out={str(tmp_path / 'o')!r}, "
        "needs=EngineNeeds(keys='text', rslora=False, patterns=False, regex_targets=False))\n"
        f"remap({str(text_adapter)!r}, engine='vllm', out={str(tmp_path / 'v')!r})\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'safetensors.torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "o" / "adapter_config.json").read_text())
    assert cfg["use_rslora"] is False and cfg["r"] == 4 and cfg["rank_pattern"] == {}
    assert cfg["target_modules"] == sorted(cfg["target_modules"]) and len(cfg["target_modules"]) == 4
    got = read_st(tmp_path / "o" / "adapter_model.safetensors")
    assert all(v.shape[0 if "lora_A" in k else 1] == 4 for k, v in got.items())


def test_cli_json_and_text(text_adapter: Path, tmp_path: Path) -> None:
    r = run("remap", str(text_adapter), "--for", "vllm", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    for k in ("ok", "findings", "renamed", "strategy", "mapping", "rewrites", "engine"):
        assert k in body
    assert body["strategy"] == "none" and body["rewrites"] == [] and body["engine"]["name"] == "vllm"
    assert body["engine"]["needs"]["keys"] == "served"
    r = run("remap", str(text_adapter), "--for", "vllm")
    assert r.returncode == 0 and "remap --for" in r.stdout
    r = run("remap", str(text_adapter), "--base", "tiny:qwen3_5_text", "--vl")
    assert r.returncode == 2 and "--base BASE only goes with --for" in r.stderr


def test_engine_rank_is_one_the_sgmv_path_leaves_alone() -> None:
    from adapterdoc.engines.text_keys import padded_rank
    from adapterdoc.remap.for_engine.ranks import engine_rank

    assert [engine_rank(r, (8, 16)) for r in (1, 7, 8, 9, 16, 17, 33)] == [8, 8, 8, 16, 16, 32, 48]
    assert all(padded_rank(engine_rank(r, (8, 16))) == engine_rank(r, (8, 16)) for r in range(1, 300))
    assert engine_rank(5, None) == 5
