"""The weights audit (`inspect --weights`, `--plot`, verify's reuse): delta norms against PEFT's own
``get_delta_weight`` in float64 on adapters PEFT writes, effective ranks against dense SVDs, inert modules,
findings, the heat map files, and the exit codes of missing extras."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from adapterdoc.audit import ENERGY, audit_adapter, core_singular_values, fp8_value, place, render_heatmap
from adapterdoc.report.heatmap import panels

pytestmark = pytest.mark.ml

LEAVES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FP8 = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _peft(model: Any, **lora: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(model, LoraConfig(**lora))


def _randomize(pm: Any, *, seed: int = 1, only: str | None = None, b_only: bool = False) -> None:
    """Random LoRA factors (magnitudes near 1); ``only`` limits lora_B to modules whose name contains it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" not in name:
                continue
            is_b = "lora_B" in name or "lora_embedding_B" in name
            if b_only and not is_b:
                continue
            if is_b and only is not None and only not in name:
                continue
            noise = torch.randn(p.shape, generator=g) * 0.1
            if "magnitude" in name:
                noise += 1.0
            p.copy_(noise.to(p.dtype))


def _save(pm: Any, folder: Path, *, fp8: torch.dtype | None = None) -> str:
    """``save_pretrained``; with ``fp8`` the factors are rounded to that format in the model first and the saved
    tensors rewritten in it (PEFT itself saves in the parameters' dtype)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fp8 is not None:
            with torch.no_grad():
                for name, p in pm.named_parameters():
                    if "lora_" in name:
                        p.copy_(p.to(fp8).to(p.dtype))
        pm.save_pretrained(str(folder))
    if fp8 is not None:
        from safetensors.torch import load_file, save_file

        f = folder / "adapter_model.safetensors"
        state = {k: v.to(fp8) if "lora_" in k else v for k, v in load_file(str(f)).items()}
        save_file(state, str(f), metadata={"format": "pt"})
    return str(folder)


def _peft_norms(pm: Any) -> dict[tuple[str, int | None], float]:
    """(module, expert) → ‖get_delta_weight‖_F, PEFT's own delta computed in float64."""
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import ParamWrapper

    pm = pm.double()
    out: dict[tuple[str, int | None], float] = {}
    with torch.no_grad():
        for name, mod in pm.named_modules():
            if not isinstance(mod, LoraLayer) or (
                "default" not in mod.lora_A and "default" not in getattr(mod, "lora_embedding_A", {})
            ):
                continue
            module = name.removeprefix("base_model.model.")
            if isinstance(mod, ParamWrapper) and mod.num_experts > 1:
                a = mod.lora_A["default"].weight
                b = mod.lora_B["default"].weight
                e = mod.num_experts
                a3, b3 = a.reshape(e, -1, a.shape[-1]), b.reshape(b.shape[0], -1, e)
                for i in range(e):  # MOE.md: A rows expert-major, B columns rank-major
                    out[(module, i)] = float(torch.linalg.norm(mod.scaling["default"] * b3[:, :, i] @ a3[i]))
                full = mod.get_delta_weight("default")
                assert math.isclose(
                    float(torch.linalg.norm(full)),
                    math.sqrt(sum(out[(module, i)] ** 2 for i in range(e))),
                    rel_tol=1e-12,
                )
            else:
                out[(module, None)] = float(torch.linalg.norm(mod.get_delta_weight("default")))
    return out


def _audit_norms(path: str) -> dict[tuple[str, int | None], float]:
    return {(m.module, m.expert): m.delta_norm for m in audit_adapter(path).modules}


CASES = {
    "plain": ("ministral3_text", dict(target_modules=LEAVES, r=4, lora_alpha=8)),
    "rslora": ("ministral3_text", dict(target_modules=LEAVES, r=8, lora_alpha=5, use_rslora=True)),
    "patterns": (
        "ministral3_text",
        dict(
            target_modules=LEAVES,
            r=4,
            lora_alpha=8,
            rank_pattern={"q_proj": 2, r"layers\.1\.mlp\.down_proj": 6},
            alpha_pattern={"v_proj": 3, "down_proj": 7},
        ),
    ),
    "dora": (
        "ministral3_text",
        dict(target_modules=["q_proj", "down_proj"], r=4, lora_alpha=8, use_dora=True),
    ),
    "embedding": ("ministral3_text", dict(target_modules=["embed_tokens", "q_proj"], r=4, lora_alpha=6)),
    "moe-fused": (
        "qwen3_5_moe_text",
        dict(
            target_modules=["q_proj"],
            target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
            r=2,
            lora_alpha=5,
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "F8_E4M3", "F8_E5M2"])
def test_delta_norms_equal_peft_float64(tmp_path: Path, tiny_model: Any, case: str, dtype: str) -> None:
    layout, lora = CASES[case]
    if case != "plain" and dtype.startswith("F8") and dtype != "F8_E4M3":
        pytest.skip("one FP8 format across the cases is enough; E5M2 runs on the plain case")
    model = tiny_model(layout)
    fp8 = FP8.get(dtype)
    pm = _peft(model.to(getattr(torch, dtype)) if fp8 is None else model, **lora)
    if fp8 is None:
        pm = pm.to(getattr(torch, dtype))  # PEFT keeps the factors in float32 on a half base (see below)
    _randomize(pm)
    folder = _save(pm, tmp_path / case, fp8=fp8)
    expected = _peft_norms(pm)
    got = _audit_norms(folder)
    assert set(got) == set(expected) and len(got) > 0
    for key, ref in expected.items():
        assert got[key] == pytest.approx(ref, rel=1e-10, abs=1e-300), key
    audit = audit_adapter(folder)
    saved = {m.dtype for m in audit.modules}
    assert saved == {
        dtype if dtype.startswith("F8") else {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[dtype]
    }
    if case == "dora":
        assert any("DoRA" in n for n in audit.notes)
    if case == "moe-fused":
        params = {(m.parameter, m.expert) for m in audit.modules if m.kind == "experts"}
        assert params == {(p, e) for p in ("gate_up_proj", "down_proj") for e in range(4)}
        wrappers = {m.module: m.parameter for m in audit.modules if m.kind == "experts"}
        assert all(
            p == ("gate_up_proj" if k.endswith(".base_layer") else "down_proj") for k, p in wrappers.items()
        )
    if case == "embedding":
        assert any(m.kind == "embedding" for m in audit.modules)


def test_peft_upcasts_lora_factors_on_a_bf16_base(tiny_model: Any) -> None:
    """Pinned: ``get_peft_model`` (autocast_adapter_dtype=True) makes float32 LoRA factors on a bf16 base, so a
    bf16 adapter on disk needs an explicit cast (trainers do it when they save in the training dtype)."""
    pm = _peft(tiny_model("ministral3_text").to(torch.bfloat16), target_modules=["q_proj"], r=2)
    dtypes = {p.dtype for n, p in pm.named_parameters() if "lora_" in n}
    assert dtypes == {torch.float32}


def test_plain_delta_is_scaling_times_b_at_a(tmp_path: Path, tiny_model: Any) -> None:
    """The definition itself, ‖(alpha/r)·B@A‖_F from the saved tensors, for one module."""
    from safetensors.torch import load_file

    pm = _peft(tiny_model("ministral3_text"), target_modules=["q_proj"], r=4, lora_alpha=12)
    _randomize(pm)
    folder = _save(pm, tmp_path / "a")
    sd = {k: v.double() for k, v in load_file(f"{folder}/adapter_model.safetensors").items()}
    key = "base_model.model.model.layers.1.self_attn.q_proj"
    want = float(torch.linalg.norm(3.0 * sd[f"{key}.lora_B.weight"] @ sd[f"{key}.lora_A.weight"]))
    got = {m.module: m for m in audit_adapter(folder).modules}["model.layers.1.self_attn.q_proj"]
    assert got.delta_norm == pytest.approx(want, rel=1e-12) and got.scaling == 3.0 and got.rank == 4


@pytest.mark.parametrize("name", list(FP8))
def test_fp8_decoding_is_exact(name: str) -> None:
    values = torch.arange(256, dtype=torch.uint8).view(FP8[name]).double().tolist()
    mine = [fp8_value(name, b) for b in range(256)]
    for b, (x, y) in enumerate(zip(mine, values)):
        assert (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y)), b


@pytest.mark.parametrize("spread", [1e-1, 1e-3, 1e-6, 1e-12, 0.0])
def test_core_singular_values_match_dense_svd(spread: float) -> None:
    """Both routes (Gram for well-conditioned deltas, QR once a singular value falls under 1e-4 of the largest)
    agree with the dense float64 SVD of B @ A to eps·σ_max, however the spectrum decays."""
    import numpy as np

    g = torch.Generator().manual_seed(7)
    r, out, fan_in = 8, 300, 200
    u = torch.linalg.qr(torch.randn(out, r, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(fan_in, r, generator=g, dtype=torch.float64))[0]
    s = torch.tensor(
        [spread ** (i / (r - 1)) if spread else float(i < 3) for i in range(r)], dtype=torch.float64
    )
    mix = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=torch.float64))[0]
    b, a = (u * s) @ mix, mix.T @ v.T  # B A = U diag(s) Vᵀ, with B and A individually unstructured
    mine = core_singular_values(np, a.numpy(), b.numpy())
    full = torch.linalg.svdvals(b @ a)
    dense = full[:r].numpy()
    assert np.allclose(mine, dense, rtol=0, atol=1e-13 * dense[0])
    assert int((mine > mine[0] * fan_in * 2.220446049250313e-16).sum()) == int(
        torch.linalg.matrix_rank(b @ a)
    )


def _energy_rank(sv: torch.Tensor) -> int:
    sq = (sv.double() ** 2).tolist()
    total, acc = sum(sq), 0.0
    for k, v in enumerate(sq, 1):
        acc += v
        if acc >= ENERGY * total * (1 - 1e-12):
            return k
    return len(sq)


def test_effective_and_numerical_rank_match_dense_svd(tmp_path: Path, tiny_model: Any) -> None:
    """B with k live columns (decaying scales) and r - k zero ones: ranks from the r×r core equal those of the
    dense float64 B@A (``torch.linalg.matrix_rank``, ``svdvals``)."""
    from safetensors.torch import load_file

    pm = _peft(tiny_model("ministral3_text"), target_modules=["q_proj", "down_proj"], r=8, lora_alpha=8)
    _randomize(pm)
    scales = {0: [1.0, 0.5, 0.05, 0.01, 0, 0, 0, 0], 1: [1.0] * 8, 2: [1.0, 1.0, 1.0, 0, 0, 0, 0, 0]}
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                layer = int(re.search(r"layers\.(\d+)\.", name)[1])
                p.mul_(torch.tensor(scales.get(layer, [1.0] * 8)))
    folder = _save(pm, tmp_path / "ranks")
    sd = {k: v.double() for k, v in load_file(f"{folder}/adapter_model.safetensors").items()}
    audit = audit_adapter(folder)
    seen = set()
    for m in audit.modules:
        key = f"base_model.model.{m.module}"
        dense = sd[f"{key}.lora_B.weight"] @ sd[f"{key}.lora_A.weight"]
        assert m.numerical_rank == int(torch.linalg.matrix_rank(dense)), m.module
        assert m.effective_rank == _energy_rank(torch.linalg.svdvals(dense)), m.module
        seen.add((m.layer, m.numerical_rank, m.effective_rank))
    assert (0, 4, 2) in seen and (2, 3, 3) in seen  # the constructed spectra: not just "full rank everywhere"


def test_rank_far_above_effective_rank_is_reported_with_the_rank_that_would_do(
    tmp_path: Path, tiny_model: Any, cli: Any
) -> None:
    pm = _peft(tiny_model("ministral3_text"), target_modules=["q_proj", "v_proj"], r=16, lora_alpha=16)
    _randomize(pm)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p[:, 3:] = 0  # every module's B A has rank 3
    folder = _save(pm, tmp_path / "wasteful")
    r = cli("inspect", folder, "--weights", "--json")
    data = json.loads(r.stdout)
    info = [f for f in data["findings"] if f["code"] == "AD312"]
    assert r.exit_code == 0 and len(info) == 1 and info[0]["severity"] == "info"
    assert "r=4 would do" in info[0]["message"] and "rank 16" in info[0]["message"]
    assert {m["effective_rank"] for m in data["modules"]} <= {1, 2, 3}
    assert {m["rank"] for m in data["modules"]} == {16}


def test_zero_adapter_is_all_inert_and_fails(tmp_path: Path, tiny_model: Any, cli: Any) -> None:
    """PEFT's initial state (lora_B = 0): every module inert, AD310, exit 1; verify says AD301 instead."""
    pm = _peft(tiny_model("ministral3_text"), target_modules=LEAVES, r=4, lora_alpha=8)
    folder = _save(pm, tmp_path / "dead")
    r = cli("inspect", folder, "--weights", "--json")
    data = json.loads(r.stdout)
    assert r.exit_code == 1 and data["ok"] is False
    assert [f["code"] for f in data["findings"] if f["severity"] == "error"] == ["AD310"]
    assert len(data["modules"]) == 28 and all(m["inert"] and m["delta_norm"] == 0 for m in data["modules"])
    assert data["weights"]["inert_share"] == 1.0 and data["weights"]["total_delta_norm"] == 0
    v = json.loads(cli("verify", folder, "--base", "tiny:ministral3_text", "--json").stdout)
    codes = [f["code"] for f in v["adapters"][0]["findings"]]
    assert "AD301" in codes and "AD310" not in codes
    assert v["adapters"][0]["lora_b"] == {"nonzero": 0, "total": 28}
    assert v["adapters"][0]["weights"]["inert"] == 28


def test_zero_lora_a_is_caught_by_the_audit_not_the_lora_b_scan(
    tmp_path: Path, tiny_model: Any, cli: Any
) -> None:
    pm = _peft(tiny_model("ministral3_text"), target_modules=["q_proj"], r=4, lora_alpha=8)
    _randomize(pm, b_only=True)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_A" in name:
                p.zero_()
    folder = _save(pm, tmp_path / "a-zero")
    v = json.loads(cli("verify", folder, "--base", "tiny:ministral3_text", "--json").stdout)
    rep = v["adapters"][0]
    assert rep["lora_b"] == {"nonzero": 4, "total": 4}
    assert "AD310" in [f["code"] for f in rep["findings"]] and v["ok"] is False


def _one_layer(tmp_path: Path, tiny_model: Any) -> str:
    pm = _peft(tiny_model("ministral3_text"), target_modules=LEAVES, r=4, lora_alpha=8)
    _randomize(pm, only="layers.2.", b_only=True)  # lora_A keeps PEFT's kaiming init, as after training
    return _save(pm, tmp_path / "one-layer")


def test_one_layer_trained_shows_that_layer_alone(tmp_path: Path, tiny_model: Any, cli: Any) -> None:
    folder = _one_layer(tmp_path, tiny_model)
    png, page = tmp_path / "map.png", tmp_path / "map.html"
    r = cli("inspect", folder, "--weights", "--plot", png, "--json")
    data = json.loads(r.stdout)
    assert r.exit_code == 0
    live = {m["module"] for m in data["modules"] if not m["inert"]}
    assert live == {
        f"model.layers.2.{leaf}"
        for leaf in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    }
    assert sum(m["share"] for m in data["modules"] if m["module"] in live) == pytest.approx(1.0)
    warn = [f for f in data["findings"] if f["code"] == "AD311"]
    assert warn and warn[0]["severity"] == "warning" and "21 of 28" in warn[0]["message"]
    # the picture: one panel, rows 0-3, only row 2 coloured
    audit = audit_adapter(folder)
    (panel,) = panels(audit)
    assert panel.rows == ["0", "1", "2", "3"] and len(panel.cols) == 7
    assert {r for (r, _), m in panel.cells.items() if not m.inert} == {2}
    _check_png(png.read_bytes(), min_bytes=10_000)
    pixels = _row_colours(png)
    assert pixels["live"] != pixels["inert"]
    assert cli("inspect", folder, "--plot", page).exit_code == 0
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.count("<tr") == 28 + 1
    (b64,) = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    _check_png(base64.b64decode(b64), min_bytes=10_000)
    assert html.count('class="inert"') == 21


def _check_png(data: bytes, *, min_bytes: int) -> None:
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR" and len(data) > min_bytes
    width, height = struct.unpack(">II", data[16:24])
    assert 500 < width < 5000 and 300 < height < 5000


def _row_colours(png: Path) -> dict[str, tuple[float, ...]]:
    """Colours at the centre of the heat map's row 2 (live) and row 0 (inert), read back from the PNG."""
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png))
    h, w = img.shape[:2]
    # the panel spans most of the figure; sample the middle column at the rows' approximate heights
    col = w // 3
    column = [tuple(round(float(c), 2) for c in img[y, col][:3]) for y in range(h)]
    grey = (0.78, 0.78, 0.78)
    inert_rows = [y for y, c in enumerate(column) if c == grey]
    live_rows = [
        y for y, c in enumerate(column) if c not in (grey, (1.0, 1.0, 1.0)) and max(c) - min(c) > 0.2
    ]
    assert inert_rows and live_rows
    return {"inert": column[inert_rows[0]], "live": column[live_rows[len(live_rows) // 2]]}


def test_dead_adapter_heat_map_is_all_grey(tmp_path: Path, tiny_model: Any) -> None:
    pm = _peft(tiny_model("ministral3_text"), target_modules=LEAVES, r=4, lora_alpha=8)
    audit = audit_adapter(_save(pm, tmp_path / "dead"))
    (panel,) = panels(audit)
    assert all(m.inert for m in panel.cells.values()) and len(panel.cells) == 28
    out = render_heatmap(audit, tmp_path / "dead.png")
    _check_png(Path(out).read_bytes(), min_bytes=5_000)


def test_verify_gates_on_the_inert_share(tmp_path: Path, tiny_model: Any, cli: Any, monkeypatch: Any) -> None:
    folder = _one_layer(tmp_path, tiny_model)
    base = ("--base", "tiny:ministral3_text", "--json")
    strict = json.loads(cli("verify", folder, *base, "--max-inert-share", "0.5").stdout)
    gate = [f for f in strict["adapters"][0]["findings"] if f["code"] == "AD313"]
    assert strict["ok"] is False and gate and "21 of 28" in gate[0]["message"]
    assert strict["adapters"][0]["lora_b"] == {"nonzero": 7, "total": 28}
    loose = json.loads(cli("verify", folder, *base, "--max-inert-share", "0.8").stdout)
    assert "AD313" not in [f["code"] for f in loose["adapters"][0]["findings"]]
    (tmp_path / "pyproject.toml").write_text("[tool.adapterdoc]\nmax-inert-share = 0.5\n")
    monkeypatch.chdir(tmp_path)
    from_table = json.loads(cli("verify", folder, *base).stdout)
    assert "AD313" in [f["code"] for f in from_table["adapters"][0]["findings"]]
    r = cli("verify", folder, *base[:2], "--max-inert-share", "1.5")
    assert r.exit_code == 2
    (tmp_path / "pyproject.toml").write_text('[tool.adapterdoc]\nmax-inert-share = "half"\n')
    r = cli("verify", folder, *base[:2])
    assert r.exit_code == 3 and "max-inert-share must be a number from 0 to 1" in r.stderr


def test_nan_factor_is_reported_and_not_measured(tmp_path: Path, tiny_model: Any, cli: Any) -> None:
    pm = _peft(tiny_model("ministral3_text"), target_modules=["q_proj"], r=4, lora_alpha=8)
    _randomize(pm)
    with torch.no_grad():
        pm.base_model.model.model.layers[1].self_attn.q_proj.lora_B["default"].weight[0, 0] = float("nan")
    folder = _save(pm, tmp_path / "nan")
    data = json.loads(cli("inspect", folder, "--weights", "--json").stdout)
    bad = [m for m in data["modules"] if m["delta_norm"] is None]
    assert [m["module"] for m in bad] == ["model.layers.1.self_attn.q_proj"]
    assert any(
        f["code"] == "AD303" and "layers.1.self_attn.q_proj.lora_B" in f["key"] for f in data["findings"]
    )


def test_text_output_and_place() -> None:
    assert place("model.layers.3.mlp.experts.2.gate_proj") == ("model.layers", 3, "mlp.experts.gate_proj", 2)
    assert place("model.layers.0.mlp.experts.base_layer") == ("model.layers", 0, "mlp.experts", None)
    assert place("lm_head") == ("", None, "lm_head", None)


def test_text_report(tmp_path: Path, tiny_model: Any, cli: Any) -> None:
    folder = _one_layer(tmp_path, tiny_model)
    out = cli("inspect", folder, "--weights").stdout
    assert "28 LoRA modules measured, 21 inert (75%)" in out
    assert re.search(r"^  2 +7 +0 +100\.0% ", out, re.M)  # the per-layer table: layer 2 holds all the change
    assert re.search(r"^  0 +7 +7 +0\.0% ", out, re.M)
    assert "AD311" in out and max(len(line) for line in out.splitlines()) <= 80


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)


def test_inspect_weights_reads_safetensors_without_torch(tmp_path: Path, tiny_model: Any) -> None:
    folder = _one_layer(tmp_path, tiny_model)
    p = _run(
        "import sys, json\nfrom click.testing import CliRunner\nfrom adapterdoc.cli import main\n"
        f"r = CliRunner().invoke(main, ['inspect', {folder!r}, '--weights', '--json'])\n"
        "assert json.loads(r.stdout)['weights']['inert'] == 21, r.output\n"
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))\n"
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        ("matplotlib", ["--plot", "x.png"], "adapterdoc[plot]"),
        ("numpy", ["--weights"], "adapterdoc[weights]"),
    ],
)
def test_missing_extra_is_one_line_exit_3(
    tmp_path: Path, tiny_model: Any, blocked: str, args: list[str], extra: str
) -> None:
    folder = _one_layer(tmp_path, tiny_model)
    out = tmp_path / "x.png"
    args = [str(out) if a == "x.png" else a for a in args]
    p = _run(
        f"import sys\nsys.modules[{blocked!r}] = None\nfrom adapterdoc.cli import main\n"
        f"main([ 'inspect', {folder!r}, *{args!r}])\n"
    )
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 3 and len(lines) == 1, p.stderr
    assert lines[0].startswith("adapterdoc: error: ") and extra in lines[0]
    assert not out.exists()


def test_plot_suffix_is_a_usage_error(tmp_path: Path, cli: Any) -> None:
    r = cli("inspect", tmp_path, "--plot", tmp_path / "map.svg")
    assert r.exit_code == 2 and "must end in .png or .html" in r.output


def test_per_expert_keys_get_an_expert_panel(tmp_path: Path) -> None:
    """Per-expert LoRA (``experts.E.gate_proj``, the transformers 4.x layout): one entry per expert, its own
    panel (layers × experts), norms equal to the direct float64 ``scaling · B @ A``."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    state, want = {}, {}
    for layer in range(2):
        for e in range(3):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                key = f"base_model.model.model.layers.{layer}.mlp.experts.{e}.{proj}"
                a = torch.randn(4, 16, generator=g).to(torch.bfloat16)
                b = (torch.randn(24, 4, generator=g) * (0 if (layer, e) == (1, 2) else 1)).to(torch.bfloat16)
                state[f"{key}.lora_A.weight"], state[f"{key}.lora_B.weight"] = a, b
                want[key.removeprefix("base_model.model.")] = float(
                    torch.linalg.norm(2.5 * b.double() @ a.double())
                )
    folder = tmp_path / "per-expert"
    folder.mkdir()
    save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 10,
        "target_modules": ["gate_proj", "up_proj", "down_proj"],
    }
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    audit = audit_adapter(folder)
    assert {m.module: m.delta_norm for m in audit.modules} == pytest.approx(want, rel=1e-12)
    assert {(m.layer, m.expert) for m in audit.modules if m.inert} == {(1, 2)}
    ps = panels(audit)
    assert [p.xlabel for p in ps] == ["expert"] * 3 and all(p.cols == ["0", "1", "2"] for p in ps)
    assert {p.title for p in ps} == {
        f"model.layers.N.mlp.experts.{x}, per expert" for x in ("gate_proj", "up_proj", "down_proj")
    }
    _check_png(Path(render_heatmap(audit, tmp_path / "experts.png")).read_bytes(), min_bytes=10_000)
