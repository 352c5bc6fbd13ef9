"""``remap --experts per-expert|fused``: the layout (by hand, on raw numbers), the CLI contract (dry run, JSON, in
place, refusals, no torch), PEFT's own conversion as the oracle tensor for tensor, and logits with real PEFT on the
old-stack Qwen3-MoE and Mixtral fixtures in both directions, plus a natively fused adapter trained-shape on
transformers 5."""

# ruff: noqa: F811  (the `stack` fixture imported from tests.ml.test_old_stack_fixtures is shadowed by parameters)

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ml.test_old_stack_fixtures import load_base as base
from tests.ml.test_old_stack_fixtures import stack  # noqa: F401  (a fixture)

np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]
OLD = ROOT / "fixtures" / "old_stack"
QWEN, MIXTRAL = OLD / "qwen3_moe", OLD / "mixtral"
REL = 1e-5


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapterdoc", *args], capture_output=True, text=True, cwd=ROOT, timeout=1800
    )


def write_st(path: Path, tensors: dict[str, Any]) -> None:
    """float32 numpy arrays as a safetensors file (no torch)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, pos = [], 0
    for k, v in tensors.items():
        b = np.ascontiguousarray(v, dtype="<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_st(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8 : 8 + n])
    head.pop("__metadata__", None)
    out = {}
    for k, v in head.items():
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = np.frombuffer(data[8 + n + a : 8 + n + b], dtype="<f4").reshape(v["shape"])
    return out


E, R, H, INTER = 3, 2, 6, 4
P = "base_model.model.model.layers.0.mlp.experts"


@pytest.fixture()
def per_expert(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    t = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": rng.normal(size=(R, H)),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": rng.normal(size=(H, R)),
    }
    for e in range(E):
        for leaf, (fin, fout) in (
            ("gate_proj", (H, INTER)),
            ("up_proj", (H, INTER)),
            ("down_proj", (INTER, H)),
        ):
            t[f"{P}.{e}.{leaf}.lora_A.weight"] = rng.normal(size=(R, fin))
            t[f"{P}.{e}.{leaf}.lora_B.weight"] = rng.normal(size=(fout, R))
    folder = tmp_path / "per_expert"
    folder.mkdir()
    write_st(folder / "adapter_model.safetensors", t)
    cfg = {"peft_type": "LORA", "r": R, "lora_alpha": 4, "lora_dropout": 0.05, "rank_pattern": {},
           "alpha_pattern": {}, "target_modules": ["q_proj", "gate_proj", "up_proj", "down_proj"],
           "target_parameters": None, "use_rslora": False, "use_dora": False}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def delta(a: Any, b: Any) -> Any:
    return b.astype(np.float64) @ a.astype(np.float64)


def test_fused_layout_by_hand_and_back(per_expert: Path, tmp_path: Path) -> None:
    """PEFT's ParamWrapper layout: lora_A expert-major rows (gate's then up's), lora_B rank-major columns
    (expert e's rank k is column k·E + e), gate_up block-diagonal; back again, every expert's delta is unchanged."""
    src = read_st(per_expert / "adapter_model.safetensors")
    r = run("remap", str(per_expert), "--experts", "fused", "--out", str(tmp_path / "f"), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["ok"] and rep["mode"] == "experts" and rep["strategy"] == "copy"
    ex = rep["experts"]
    assert (ex["direction"], ex["blocks"], ex["experts"]) == ("fused", 2, [E])
    assert ex["rank"]["gate_up_proj"] == {"before": {"gate_proj": R, "up_proj": R}, "after": 2 * R}
    assert (ex["tensors_before"], ex["tensors_after"], ex["tensors_copied"]) == (2 + 6 * E, 6, 2)
    fused = read_st(tmp_path / "f" / "adapter_model.safetensors")
    a_gu, b_gu = fused[f"{P}.base_layer.lora_A.weight"], fused[f"{P}.base_layer.lora_B.weight"]
    a_dn, b_dn = fused[f"{P}.lora_A.weight"], fused[f"{P}.lora_B.weight"]
    assert a_gu.shape == (E * 2 * R, H) and b_gu.shape == (2 * INTER, 2 * R * E)
    for e in range(E):

        def g(leaf: str, ab: str, e: int = e) -> Any:
            return src[f"{P}.{e}.{leaf}.lora_{ab}.weight"]

        assert np.array_equal(
            a_gu[e * 2 * R : (e + 1) * 2 * R], np.concatenate([g("gate_proj", "A"), g("up_proj", "A")])
        )
        bd = np.zeros((2 * INTER, 2 * R), dtype="<f4")
        bd[:INTER, :R], bd[INTER:, R:] = g("gate_proj", "B"), g("up_proj", "B")
        assert np.array_equal(b_gu[:, e::E], bd)
        assert np.array_equal(a_dn[e * R : (e + 1) * R], g("down_proj", "A"))
        assert np.array_equal(b_dn[:, e::E], g("down_proj", "B"))
    cfg = json.loads((tmp_path / "f" / "adapter_config.json").read_text())
    assert cfg["target_modules"] == ["q_proj"] and cfg["target_parameters"] == ["down_proj", "gate_up_proj"]
    assert cfg["rank_pattern"] == {r".*\.gate_up_proj": 2 * R} and cfg["alpha_pattern"] == {
        r".*\.gate_up_proj": 8
    }
    assert cfg["lora_dropout"] == 0.0  # ParamWrapper refuses dropout

    r = run("remap", str(tmp_path / "f"), "--experts", "per-expert", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    back = read_st(tmp_path / "b" / "adapter_model.safetensors")
    back_cfg = json.loads((tmp_path / "b" / "adapter_config.json").read_text())
    assert back_cfg["target_parameters"] is None and set(back_cfg["target_modules"]) == {
        "q_proj", "gate_proj", "up_proj", "down_proj"}  # fmt: skip
    for e in range(E):
        for leaf in ("gate_proj", "up_proj", "down_proj"):
            k = f"{P}.{e}.{leaf}"
            assert np.allclose(delta(back[f"{k}.lora_A.weight"], back[f"{k}.lora_B.weight"]),
                               delta(src[f"{k}.lora_A.weight"], src[f"{k}.lora_B.weight"]), rtol=0, atol=1e-12)  # fmt: skip
    assert back[f"{P}.0.gate_proj.lora_A.weight"].shape == (
        2 * R,
        H,
    )  # the rank is kept (outputs equal, not bytes)
    q = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert np.array_equal(back[q], src[q])


def folder_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_dry_run_in_place_and_refusals(per_expert: Path, tmp_path: Path) -> None:
    before = folder_digest(per_expert)
    r = run("remap", str(per_expert), "--experts", "fused", "--dry-run", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["dry_run"] is True
    assert folder_digest(per_expert) == before
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("mine")
    r = run("remap", str(per_expert), "--experts", "fused", "--out", str(busy))
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and (busy / "x").read_text() == "mine"
    # already per-expert: nothing to do, exit 0 and nothing written (idempotent, as --vl on a text adapter)
    r = run("remap", str(per_expert), "--experts", "per-expert", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["strategy"] == "none", r.stderr
    assert folder_digest(per_expert) == before
    r = run(
        "remap", str(OLD / "qwen3_moe" / "adapter_attention"), "--experts", "fused"
    )  # no expert LoRA at all
    assert r.returncode == 3 and "nothing to fuse" in r.stderr and r.stderr.count("\n") == 1
    r = run("remap", str(per_expert), "--experts", "fused")  # in place
    assert r.returncode == 0, r.stderr
    assert "base_layer" in (per_expert / "adapter_model.safetensors").read_bytes()[:4000].decode("latin-1")
    assert not [p for p in per_expert.iterdir() if p.name.startswith(".adapterdoc")]
    fused = folder_digest(per_expert)
    r = run("remap", str(per_expert), "--experts", "fused", "--json")  # a second time: already fused
    assert r.returncode == 0 and json.loads(r.stdout)["strategy"] == "none", r.stderr
    assert folder_digest(per_expert) == fused
    one_sided = tmp_path / "one_sided"
    shutil.copytree(QWEN / "adapter_one_sided", one_sided)
    before = folder_digest(one_sided)
    r = run("remap", str(one_sided), "--experts", "fused")
    assert r.returncode == 3 and "gate_proj but not on up_proj" in r.stderr and r.stderr.count("\n") == 1
    assert folder_digest(one_sided) == before


def test_remap_experts_imports_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom adapterdoc.remap import remap\n"
        f"remap({str(QWEN / 'adapter_experts')!r}, experts='fused', out={str(tmp_path / 'o')!r})\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'numpy', 'safetensors.torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------- real PEFT (torch needed)

ML = pytest.mark.ml
CASES = [
    (QWEN, "mlp", ("gate_proj", "up_proj", "down_proj")),
    (MIXTRAL, "block_sparse_moe", ("w1", "w3", "w2")),
]


def logits(model: Any, ids: Any) -> Any:
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def rel(got: Any, want: Any) -> float:
    return float((got - want).abs().max() / want.abs().max())


@ML
@pytest.mark.parametrize(("folder", "container", "names"), CASES, ids=["qwen3_moe", "mixtral"])
def test_peft_oracle_and_logits_both_ways(
    stack: Any, folder: Path, container: str, names: Any, tmp_path: Path
) -> None:
    """Ours equals PEFT's own load conversion tensor for tensor and config for config; base + ours reproduces the
    old stack's logits, fused and back to per-expert (which PEFT converts again on load)."""
    from peft import PeftModel
    from peft.utils.transformers_weight_conversion import convert_peft_adapter_state_dict_for_transformers
    from safetensors.torch import load_file

    torch = stack
    fused, back = tmp_path / "fused", tmp_path / "back"
    assert (
        run("remap", str(folder / "adapter_experts"), "--experts", "fused", "--out", str(fused)).returncode
        == 0
    )
    model = PeftModel.from_pretrained(base(folder), str(folder / "adapter_experts")).eval()
    sd = load_file(str(folder / "adapter_experts" / "adapter_model.safetensors"))
    want = convert_peft_adapter_state_dict_for_transformers(
        model, model.peft_config["default"], sd, "default"
    )
    got = load_file(str(fused / "adapter_model.safetensors"))
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    cfg, ours = model.peft_config["default"], json.loads((fused / "adapter_config.json").read_text())
    assert set(ours["target_modules"]) == set(cfg.target_modules)
    assert set(ours["target_parameters"]) == set(cfg.target_parameters)
    assert (ours["rank_pattern"], ours["alpha_pattern"]) == (cfg.rank_pattern, cfg.alpha_pattern)

    ref = load_file(str(folder / "reference.safetensors"))
    ids, target = ref["input_ids"], ref["logits.adapter_experts"]
    assert rel(logits(PeftModel.from_pretrained(base(folder), str(fused)).eval(), ids), target) <= REL
    r = run("remap", str(fused), "--experts", "per-expert", "--out", str(back))
    assert r.returncode == 0, r.stderr
    keys = load_file(str(back / "adapter_model.safetensors"))
    assert f"base_model.model.model.layers.1.{container}.experts.3.{names[1]}.lora_B.weight" in keys
    assert rel(logits(PeftModel.from_pretrained(base(folder), str(back)).eval(), ids), target) <= REL


@ML
def test_native_fused_adapter_to_per_expert_and_back(stack: Any, tmp_path: Path) -> None:
    """A fused adapter as PEFT 0.21 trains it on transformers 5 (target_parameters, rank r for gate_up, not
    block-diagonal): per-expert keeps rank r for gate and up, and PEFT's load conversion of that per-expert adapter
    (rank 2r) gives the same logits; fused again, the same logits."""
    from peft import LoraConfig, PeftModel, get_peft_model

    torch = stack
    torch.manual_seed(0)
    cfg = LoraConfig(r=3, lora_alpha=5, target_modules=["q_proj", "v_proj"],
                     target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])  # fmt: skip
    model = get_peft_model(base(QWEN), cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.3)
    native = tmp_path / "native"
    model.save_pretrained(str(native))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    want = logits(model.eval(), ids)
    per, again = tmp_path / "per", tmp_path / "again"
    r = run("remap", str(native), "--experts", "per-expert", "--out", str(per), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["experts"]["rank"]["gate_up_proj"] == {
        "before": 3, "after": {"gate_proj": 3, "up_proj": 3}}  # fmt: skip
    assert rel(logits(PeftModel.from_pretrained(base(QWEN), str(per)).eval(), ids), want) <= REL
    assert run("remap", str(per), "--experts", "fused", "--out", str(again)).returncode == 0
    assert rel(logits(PeftModel.from_pretrained(base(QWEN), str(again)).eval(), ids), want) <= REL
