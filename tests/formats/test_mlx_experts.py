"""PEFT's fused expert LoRA (``target_parameters``) through MLX and back, on a real PEFT adapter of the tiny
Qwen3.5-MoE text model: mlx-lm's stacked ``switch_mlp`` tensors, the fused form given back at its own rank byte for
byte, both sides loaded by PEFT, and ``roundtrip``'s convert trip judging fused experts expert by expert."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

LAYOUT = "qwen3_5_moe_text"
BASE = f"tiny:{LAYOUT}"
W = "base_model.model."


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fused-experts adapter as PEFT writes it (random, non-zero lora_B)."""
    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.ml.tiny import build_tiny

    torch.manual_seed(3)
    cfg = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj", "in_proj_qkv"],
        target_parameters=list(LAYOUTS[LAYOUT].target_parameters),
        init_lora_weights=False,
    )
    model = peft.get_peft_model(build_tiny(LAYOUT), cfg)
    folder = tmp_path_factory.mktemp("fused") / "peft"
    model.save_pretrained(folder)
    return folder


def _logits(adapter: Path | None) -> Any:
    import warnings

    from adapterdoc.ml.tiny import build_tiny

    model = build_tiny(LAYOUT)
    if adapter is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = peft.PeftModel.from_pretrained(model, str(adapter)).eval()
    ids = torch.tensor([[1, 5, 9, 30, 77, 3, 12, 40]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_fused_experts_go_to_mlx_stacked_and_come_back_byte_for_byte(
    fused: Path, tmp_path: Path, cli: Any
) -> None:
    """Before: `convert --to mlx` recursed on its own per-expert step (remap keeps target_parameters on this class)
    and stopped with "invalid JSON in header: nested too deeply"; the way back gave gate_up at twice the rank."""
    res = cli("convert", fused, "--to", "mlx", "--base", BASE, "--out", tmp_path / "mlx", "--json")
    assert res.exit_code == 0, res.output
    mlx = load_file(str(tmp_path / "mlx" / "adapters.safetensors"))
    gate = mlx["language_model.model.layers.0.mlp.switch_mlp.gate_proj.lora_a"]
    assert gate.shape == (4, 4, 64)  # [E, r, in]
    assert np.array_equal(gate, mlx["language_model.model.layers.0.mlp.switch_mlp.up_proj.lora_a"])
    res = cli(
        "convert", tmp_path / "mlx", "--to", "peft", "--base", BASE, "--out", tmp_path / "back", "--json"
    )
    assert res.exit_code == 0, res.output
    assert any("at their own rank, byte for byte" in n for n in json.loads(res.stdout)["notes"])
    want = load_file(str(fused / "adapter_model.safetensors"))
    got = load_file(str(tmp_path / "back" / "adapter_model.safetensors"))
    assert sorted(got) == sorted(want)
    assert all(got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes() for k in want)
    cfg = json.loads((tmp_path / "back" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8 and "rank_pattern" not in cfg
    assert cfg["target_parameters"] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    # PEFT loads both sides with LoRA on the experts, and they give the same logits (the adapter moves them)
    original, back = _logits(fused), _logits(tmp_path / "back")
    assert float((original - _logits(None)).abs().max()) > 1e-3
    assert torch.equal(original, back)


def test_gate_and_up_apart_come_back_fused_at_twice_the_rank(fused: Path, tmp_path: Path, cli: Any) -> None:
    """An MLX adapter whose gate and up have their own lora_a (mlx-lm's trainer makes them so) has no fused form
    at its rank: PEFT's construction puts both ranks side by side; each expert's delta is kept."""
    assert cli("convert", fused, "--to", "mlx", "--base", BASE, "--out", tmp_path / "mlx").exit_code == 0
    path = tmp_path / "mlx" / "adapters.safetensors"
    t = load_file(str(path))
    up = "language_model.model.layers.0.mlp.switch_mlp.up_proj.lora_a"
    t[up] = t[up] * 2
    save_file(t, str(path))
    assert (
        cli("convert", tmp_path / "mlx", "--to", "peft", "--base", BASE, "--out", tmp_path / "back").exit_code
        == 0
    )
    got = load_file(str(tmp_path / "back" / "adapter_model.safetensors"))
    assert got[f"{W}model.layers.0.mlp.experts.base_layer.lora_A.weight"].shape == (4 * 8, 64)
    a = t["language_model.model.layers.0.mlp.switch_mlp.gate_proj.lora_a"].astype(np.float64)
    b = t["language_model.model.layers.0.mlp.switch_mlp.gate_proj.lora_b"].astype(np.float64)
    fa = got[f"{W}model.layers.0.mlp.experts.base_layer.lora_A.weight"].astype(np.float64).reshape(4, 8, 64)
    fb = got[f"{W}model.layers.0.mlp.experts.base_layer.lora_B.weight"].astype(np.float64).reshape(64, 8, 4)
    for e in range(4):  # gate's rows of expert e's fused delta are gate's own B_e A_e
        assert np.allclose(fb[:32, :, e] @ fa[e], b[e] @ a[e], rtol=0, atol=1e-12)


def test_roundtrip_compares_fused_experts_expert_by_expert(fused: Path, tmp_path: Path) -> None:
    """`roundtrip`'s PEFT → MLX → PEFT trip on fused experts passes bit for bit (it said "skipped: not
    comparable" before), also against the fused form at another rank layout, and fails when one expert's factor
    changes."""
    from adapterdoc import formats
    from adapterdoc.remap import remap
    from adapterdoc.roundtrip.common import Fail
    from adapterdoc.roundtrip.convert import _compare, _trip

    detail = _trip(formats.module("mlx"), "mlx", str(fused), str(tmp_path / "trip"), BASE)
    assert "bit for bit" in detail and "8 fused expert projections compared expert by expert" in detail
    back = tmp_path / "trip" / "peft"
    # gate_up at twice the rank (gate and up side by side, remap's fused form): the same deltas, expert by expert
    remap(str(fused), experts="per-expert", out=str(tmp_path / "per"))
    remap(str(tmp_path / "per"), experts="fused", out=str(tmp_path / "twice"))
    wide = load_file(str(tmp_path / "twice" / "adapter_model.safetensors"))
    assert wide[f"{W}model.layers.0.mlp.experts.base_layer.lora_A.weight"].shape == (32, 64)
    assert "bit for bit" in _compare(fused, tmp_path / "twice", rounded=False)
    # one expert's factor changed, in either rank layout: the trip fails naming that expert
    for folder, rows in ((back, slice(8, 12)), (tmp_path / "twice", slice(16, 24))):
        bad = tmp_path / f"bad-{folder.name}"
        shutil.copytree(folder, bad)
        t = load_file(str(bad / "adapter_model.safetensors"))
        k = f"{W}model.layers.0.mlp.experts.base_layer.lora_A.weight"
        t[k][rows] += 0.5  # expert 2's rows
        save_file(t, str(bad / "adapter_model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(Fail, match=r"layers\.0\.mlp\.experts\.gate_up` expert 2"):
            _compare(fused, bad, rounded=False)
