"""resize and combine --method svd end to end: the written adapter's delta (read back, multiplied out with numpy)
is as far from the exact delta as the report says, within 1e-6, and that is the Eckart–Young optimum; refusals
exit 3 with the fix."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.peft_helpers import LAYOUT, make_adapter


@pytest.fixture(scope="module")
def base() -> Any:
    from adapterdoc.ml.tiny import build_tiny

    return build_tiny(LAYOUT)


def _deltas(folder: Path) -> dict[str, np.ndarray]:
    """module → scaling · B A, from the saved files with numpy (PEFT's scaling from the config)."""
    from safetensors.numpy import load_file

    from adapterdoc.adapter import AdapterConfig, parse_key

    cfg = AdapterConfig.load(folder / "adapter_config.json")
    tensors = load_file(folder / "adapter_model.safetensors")
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for k, v in tensors.items():
        lk = parse_key(k)
        if not lk.is_lora:
            continue
        pairs.setdefault(lk.module, {})["a" if lk.is_a else "b"] = v.astype(np.float64)
    return {m: cfg.scaling_for(m) * p["b"] @ p["a"] for m, p in pairs.items()}


def _check(report: Any, exact: dict[str, np.ndarray], out: Path) -> None:
    got = _deltas(out)
    assert set(got) == set(exact)
    for row in report.modules:
        full = exact[row.module]
        measured = np.linalg.norm(full - got[row.module]) / np.linalg.norm(full)
        assert abs(row.rel_error - measured) <= 1e-6, row
        s = np.linalg.svd(full, compute_uv=False)
        optimum = math.sqrt((s[row.rank_out :] ** 2).sum()) / np.linalg.norm(full)
        assert abs(row.rel_error - optimum) <= 1e-6, row


@pytest.mark.parametrize(
    "lora",
    [
        {"r": 8, "lora_alpha": 16},
        {"r": 8, "lora_alpha": 4, "use_rslora": True},
        {"r": 6, "rank_pattern": {"q_proj": 8}, "alpha_pattern": {"v_proj": 3}},
        {"r": 8, "target_modules": ["q_proj", "embed_tokens"]},
    ],
)
@pytest.mark.parametrize("how", [{"rank": 3}, {"energy": 0.9}, {"max_error": 0.25}, {"rank": 8}])
def test_resize_error_is_measured_and_optimal(
    base: Any, tmp_path: Path, lora: dict[str, Any], how: dict[str, Any]
):
    from adapterdoc.algebra import resize

    src = make_adapter(base, tmp_path / "src", 3, **lora)
    report = resize(src, str(tmp_path / "out"), base=f"tiny:{LAYOUT}", **how)
    _check(report, _deltas(src), tmp_path / "out")
    assert not [f for f in report.findings if f.severity == "error"]  # verify against the base passes
    if "rank" in how:
        assert all(m.rank_out == min(how["rank"], m.rank_in) for m in report.modules)
    if how.get("rank") == 8:  # at or above every module's rank: exact
        assert report.total_rel_error <= 1e-7
    if "energy" in how:
        assert all(m.kept_energy >= 0.9 - 1e-12 for m in report.modules)
    if "max_error" in how:
        assert all(m.rel_error <= 0.25 for m in report.modules)


def test_resize_per_module_ranks_reload_in_peft(base: Any, tmp_path: Path):
    import copy

    from peft import PeftModel

    from adapterdoc.algebra import resize

    src = make_adapter(base, tmp_path / "src", 4, r=8, target_modules=["q_proj", "v_proj", "down_proj"])
    report = resize(src, str(tmp_path / "out"), energy=0.8)
    pm = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "out")
    ranks = {
        name: module.lora_A["default"].weight.shape[0]
        for name, module in pm.base_model.model.named_modules()
        if hasattr(module, "lora_A") and "default" in module.lora_A
    }
    assert ranks == {m.module: m.rank_out for m in report.modules}
    assert len(set(ranks.values())) > 1


@pytest.mark.parametrize("weights", [[1.0, 1.0], [0.5, -2.0]])
def test_combine_svd_error_is_measured_and_optimal(base: Any, tmp_path: Path, weights: list[float]):
    from adapterdoc.algebra import combine

    a = make_adapter(base, tmp_path / "a", 5, r=4, use_rslora=True)
    b = make_adapter(base, tmp_path / "b", 6, r=6, rank_pattern={"v_proj": 2})
    da, db = _deltas(a), _deltas(b)
    exact = {m: weights[0] * da[m] + weights[1] * db[m] for m in da}
    report = combine([a, b], str(tmp_path / "out"), method="svd", rank=5, weights=weights)
    _check(report, exact, tmp_path / "out")
    assert any(f.code == "AD959" for f in report.findings)


def _cli_json(cli: Any, *args: str) -> tuple[int, dict[str, Any]]:
    res = cli(*args, "--json")
    return res.exit_code, json.loads(res.stdout) if res.stdout.strip() else {}


def test_cli_resize_and_combine_json(base: Any, tmp_path: Path, cli: Any):
    a = make_adapter(base, tmp_path / "a", 7, r=4)
    b = make_adapter(base, tmp_path / "b", 8, r=4)
    code, body = _cli_json(cli, "resize", str(a), "--rank", "2", "--out", str(tmp_path / "r"))
    assert code == 0, body
    assert {"module", "rank_in", "rank_out", "kept_energy", "rel_error"} <= set(body["modules"][0])
    assert body["total"]["rank_out"] == 2 * len(body["modules"]) and 0 < body["total"]["rel_error"] < 1
    code, body = _cli_json(
        cli,
        "combine",
        str(a),
        str(b),
        "--weights",
        "1,-1",
        "--method",
        "cat",
        "--base",
        "tiny:ministral3_text",
        "--out",
        str(tmp_path / "c"),
    )
    assert code == 0, body
    assert body["total"]["rel_error"] == 0 and body["weights"] == [1.0, -1.0]
    assert "AD229" in {f["code"] for f in body["findings"]}  # verify ran against the base: scaling 1
    text = cli("resize", str(a), "--max-error", "0.5", "--out", str(tmp_path / "t"))
    assert text.exit_code == 0 and "kept energy" in text.stdout
    again = cli("resize", str(a), "--rank", "2", "--out", str(tmp_path / "r"))
    assert again.exit_code == 3  # a non-empty output folder without --force


@pytest.mark.parametrize(
    ("lora", "code"),
    [
        ({"use_dora": True}, "AD951"),
        ({"lora_bias": True}, "AD952"),
    ],
)
def test_refusals_exit_3_with_the_fix(base: Any, tmp_path: Path, cli: Any, lora: dict[str, Any], code: str):
    src = make_adapter(base, tmp_path / "src", 9, **lora)
    res = cli("resize", str(src), "--rank", "2", "--out", str(tmp_path / "out"))
    assert res.exit_code == 3 and code in res.stderr and "adapterdoc merge" in res.stderr
    assert not (tmp_path / "out").exists()


def test_combine_refuses_different_bases(base: Any, tmp_path: Path, cli: Any):
    from adapterdoc.ml.tiny import build_tiny

    a = make_adapter(base, tmp_path / "a", 1)
    other = build_tiny(LAYOUT)
    other.model.layers[0].self_attn.q_proj = type(other.model.layers[0].self_attn.q_proj)(64, 32, bias=False)
    b = make_adapter(other, tmp_path / "b", 2)
    res = cli("combine", str(a), str(b), "--method", "cat", "--out", str(tmp_path / "out"))
    assert res.exit_code == 3 and "AD956" in res.stderr


def test_combine_refuses_conflicting_modules_to_save(base: Any, tmp_path: Path, cli: Any):
    a = make_adapter(base, tmp_path / "a", 1, modules_to_save=["lm_head"])
    b = make_adapter(base, tmp_path / "b", 2, modules_to_save=["lm_head"])
    res = cli("combine", str(a), str(b), "--method", "cat", "--out", str(tmp_path / "out"))
    assert res.exit_code == 3 and "AD957" in res.stderr


def test_combine_refuses_other_layouts_naming_the_remap(base: Any, tmp_path: Path, cli: Any):
    a = make_adapter(base, tmp_path / "a", 1)
    b = make_adapter(base, tmp_path / "b", 2)
    moved = cli("remap", str(b), "--to", "mistral3_vl", "--out", str(tmp_path / "b_vl"))
    assert moved.exit_code == 0, moved.stderr
    res = cli("combine", str(a), str(tmp_path / "b_vl"), "--method", "cat", "--out", str(tmp_path / "out"))
    assert res.exit_code == 3 and "AD955" in res.stderr
    assert f"adapterdoc remap {tmp_path / 'b_vl'} --to ministral3_text" in res.stderr
    assert not (tmp_path / "out").exists()


def test_cli_refuses_bad_options(base: Any, tmp_path: Path, cli: Any):
    a = make_adapter(base, tmp_path / "a", 1)
    out = str(tmp_path / "out")
    res = cli("combine", str(a), str(a), "--weights", "1", "--method", "cat", "--out", out)
    assert res.exit_code == 3 and "1 weights for 2 adapters" in res.stderr
    assert cli("combine", str(a), "--method", "ties", "--out", out).exit_code == 2  # ties needs --density
    assert cli("combine", str(a), "--method", "cat", "--rank", "2", "--out", out).exit_code == 2
    assert cli("resize", str(a), "--rank", "2", "--energy", "0.9", "--out", out).exit_code == 2
    assert not (tmp_path / "out").exists()
