"""``remap --experts`` moves bytes, so its output is pinned byte for byte: generated adapters (seeded random
bytes, BF16 and F32, both per-expert spellings, one and two fused wrappers) remapped both ways must give the files
whose sha256 the implementation before the streaming rewrite gave (recorded in DIGESTS), and the numpy fast path
and the standard-library path must agree byte for byte. No torch, no numpy needed for the pinned digests."""

from __future__ import annotations

import hashlib
import json
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.remap import remap

CASES: dict[str, dict[str, Any]] = {
    # mlp.experts.N.{gate,up,down}_proj + attention, BF16: two fused wrappers (gate_up inner, down outer)
    "mlp_bf16": {"dtype": "BF16", "width": 2, "container": "mlp", "leaves": ("gate_proj", "up_proj", "down_proj"),
                 "layers": 3, "experts": 5, "r": 3, "attn": True},
    # Mixtral's block_sparse_moe.experts.N.w1/w3 only, F32: one fused wrapper (gate_up_proj)
    "mixtral_f32_gate_up": {"dtype": "F32", "width": 4, "container": "block_sparse_moe", "leaves": ("w1", "w3"),
                            "layers": 2, "experts": 4, "r": 2, "attn": False},
    # down only, F16, more experts than rows
    "mlp_f16_down": {"dtype": "F16", "width": 2, "container": "mlp", "leaves": ("down_proj",),
                     "layers": 2, "experts": 9, "r": 4, "attn": True},
}  # fmt: skip
H, INTER = 12, 5

DIGESTS = {
    "mixtral_f32_gate_up": ("82d58f5410714e259d4921dc93bc8e55fa02d94abc46304cf95d3644d711a2ac",
                            "ad65022c70fd9440abeda5abd0eeb0d8a1d19cfc0efb0e7b5f6f08811df8a7cc"),
    "mlp_bf16": ("f843d208786d1ba83ce247cedd710ef0c3967677f55252c033d5e156396d1e6a",
                 "5cc481bebcf8fc427dac85d5bf588c4be6e6bb476ab5e0d2cd6c2a9fbf97e906"),
    "mlp_f16_down": ("0c811a9cd75eeeb3c937fffa4afd3890d6064bc2300455dc3210f68ecc1550f7",
                     "53c071497a44fd6074a6a79ab377a78b2367a3b1e79534d03115da9011f611c7"),
}  # fmt: skip
"""case → (sha256 of the fused adapter_model.safetensors, of the per-expert one made back from it), as the
implementation before the streaming rewrite (commit eda1b49) wrote them."""


def make_adapter(folder: Path, case: dict[str, Any], seed: int = 0) -> None:
    rng = random.Random(seed)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    pos = 0

    def add(name: str, shape: tuple[int, int]) -> None:
        nonlocal pos
        n = shape[0] * shape[1] * case["width"]
        header[name] = {"dtype": case["dtype"], "shape": list(shape), "data_offsets": [pos, pos + n]}
        blobs.append(rng.randbytes(n))
        pos += n

    r = case["r"]
    for layer in range(case["layers"]):
        p = f"base_model.model.model.layers.{layer}"
        if case["attn"]:
            add(f"{p}.self_attn.q_proj.lora_A.weight", (r, H))
            add(f"{p}.self_attn.q_proj.lora_B.weight", (H, r))
        for e in range(case["experts"]):
            for leaf in case["leaves"]:
                fin, fout = (INTER, H) if leaf in ("down_proj", "w2") else (H, INTER)
                add(f"{p}.{case['container']}.experts.{e}.{leaf}.lora_A.weight", (r, fin))
                add(f"{p}.{case['container']}.experts.{e}.{leaf}.lora_B.weight", (fout, r))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.0, "rank_pattern": {},
           "alpha_pattern": {}, "target_modules": [*(["q_proj"] if case["attn"] else []), *case["leaves"]],
           "target_parameters": None, "use_rslora": False, "use_dora": False,
           "base_model_name_or_path": "tiny/mixtral" if case["container"] != "mlp" else "tiny/qwen3-moe"}  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def both_ways(tmp_path: Path, name: str) -> tuple[str, str]:
    src, fused, back = tmp_path / name / "per", tmp_path / name / "fused", tmp_path / name / "back"
    make_adapter(src, CASES[name])
    remap(str(src), experts="fused", out=str(fused))
    remap(str(fused), experts="per-expert", out=str(back))
    return sha(fused / "adapter_model.safetensors"), sha(back / "adapter_model.safetensors")


@pytest.mark.parametrize("name", sorted(CASES))
def test_bytes_both_ways_are_pinned(name: str, tmp_path: Path) -> None:
    assert both_ways(tmp_path, name) == DIGESTS[name]


@pytest.mark.parametrize("path", ["numpy", "stdlib"])
def test_numpy_and_standard_library_paths_give_the_pinned_bytes(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every transpose through numpy (threshold 0), or none (threshold out of reach): the same pinned files."""
    import adapterdoc.st.compose as compose

    if path == "numpy":
        pytest.importorskip("numpy")
    monkeypatch.setattr(compose, "NUMPY_FROM", 0 if path == "numpy" else 1 << 62)
    for name in sorted(CASES):
        assert both_ways(tmp_path / path, name) == DIGESTS[name], name


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 7), (7, 3), (5, 5), (1, 9), (9, 1)])
def test_transpose_is_the_matrix_transpose(
    width: int, rows: int, cols: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import adapterdoc.st.compose as compose

    rng = random.Random(rows * 100 + cols * 10 + width)
    buf = rng.randbytes(rows * cols * width)
    el = [buf[i * width : (i + 1) * width] for i in range(rows * cols)]
    want = b"".join(el[r * cols + c] for c in range(cols) for r in range(rows))
    for threshold in (0, 1 << 62):
        monkeypatch.setattr(compose, "NUMPY_FROM", threshold)
        assert bytes(compose.transpose(buf, width, rows, cols)) == want
    with pytest.raises(ValueError):
        compose.transpose(buf + b"x", width, rows, cols)
