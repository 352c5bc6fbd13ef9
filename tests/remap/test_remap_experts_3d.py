"""The 3-D expert form (the fused parameter's name in the key, ``[E, r, in]`` / ``[E, out, r]`` factors, as engines
write fused-MoE LoRA): classified by adapterdoc.adapter.expert_picture and inspect, refused by ``remap --experts`` with one line and
exit 3, inputs unchanged. No torch."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

from adapterdoc.adapter import parse_key
from adapterdoc.adapter.expert_picture import classify, expert_picture
from adapterdoc.inspection import inspect

ROOT = Path(__file__).resolve().parents[2]
E, R, H, INTER = 4, 2, 8, 6
P = "base_model.model.model.layers.{}.mlp.experts"


def shapes(layers: int = 2) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for layer in range(layers):
        p = P.format(layer)
        out[f"{p}.gate_up_proj.lora_A.weight"] = (E, R, H)
        out[f"{p}.gate_up_proj.lora_B.weight"] = (E, 2 * INTER, R)
        out[f"{p}.down_proj.lora_A.weight"] = (E, R, INTER)
        out[f"{p}.down_proj.lora_B.weight"] = (E, H, R)
    return out


def write_adapter(folder: Path) -> Path:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for k, s in shapes().items():
        n = 4
        for d in s:
            n *= d
        header[k] = {"dtype": "F32", "shape": list(s), "data_offsets": [pos, pos + n]}
        pos += n
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(
        struct.pack("<Q", len(text)) + text + bytes(range(256)) * (pos // 256) + bytes(pos % 256)
    )
    cfg = {"peft_type": "LORA", "r": R, "lora_alpha": 2 * R, "target_modules": None, "lora_dropout": 0.0,
           "target_parameters": ["gate_up_proj", "down_proj"], "rank_pattern": {}, "alpha_pattern": {}}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def test_classify_and_picture() -> None:
    k = classify(parse_key(f"{P.format(0)}.gate_up_proj.lora_A.weight"), (E, R, H))
    assert k is not None and (k.form, k.projection, k.leaf, k.expert) == (
        "3d",
        "gate_up",
        "gate_up_proj",
        None,
    )
    k = classify(parse_key(f"{P.format(1)}.down_proj.lora_B.weight"), (E, H, R))
    assert k is not None and (k.form, k.projection, k.block) == ("3d", "down", "model.layers.1.mlp.experts")
    pic = expert_picture(shapes())
    assert (pic.layout, pic.experts, pic.experts_from, len(pic.routed)) == ("3d", E, "rank", 2)
    assert set(pic.coverage()) == {"gate_up", "down"}
    assert pic.coverage()["down"] == {"blocks": 2, "experts": 2 * E, "of": 2 * E}
    # a per-expert key in the same adapter makes it mixed
    mixed = {**shapes(1), f"{P.format(0)}.0.gate_proj.lora_A.weight": (R, H)}
    assert expert_picture(mixed).layout == "mixed"


def test_inspect_names_the_3d_form(tmp_path: Path) -> None:
    ex = inspect(write_adapter(tmp_path / "a")).to_dict()["experts"]
    assert (ex["layout"], ex["experts"], ex["blocks"]) == ("3d", E, 2)


def test_remap_refuses_3d_with_one_line(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "a")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    for direction in ("fused", "per-expert"):
        r = subprocess.run([sys.executable, "-m", "adapterdoc", "remap", str(folder), "--experts", direction,
                            "--out", str(tmp_path / direction)], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        assert r.returncode == 3, r.stderr
        assert r.stderr.startswith("adapterdoc: error: ") and r.stderr.count("\n") == 1
        assert "3-D expert LoRA" in r.stderr and "per expert" in r.stderr
        assert not (tmp_path / direction).exists()
    assert before == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}
