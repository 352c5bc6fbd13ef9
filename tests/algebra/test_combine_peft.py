"""combine --method cat against PEFT: merged logits equal the base plus the weighted sum of each source's merged delta
within 1e-5 (float32), on plain, rsLoRA, rank_pattern / alpha_pattern, embedding and negative-weight sources; equal
to PEFT's own add_weighted_adapter where that is right, and right where it is not (the defects of issue 43)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.peft_helpers import (  # noqa: E402
    LAYOUT,
    logits_of,
    make_adapter,
    peft_logits,
    weighted_reference,
)

VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "plain": ({}, {"r": 8, "lora_alpha": 16}),
    "rslora": ({"use_rslora": True}, {"use_rslora": True, "r": 2, "lora_alpha": 3}),
    "patterns": (
        {"rank_pattern": {"model.layers.1.self_attn.q_proj": 6}, "alpha_pattern": {"v_proj": 2}},
        {"rank_pattern": {"v_proj": 3}},
    ),
    "embedding": (
        {"target_modules": ["q_proj", "embed_tokens"]},
        {"target_modules": ["embed_tokens", "v_proj"]},
    ),
}


@pytest.fixture(scope="module")
def base() -> Any:
    from adapterdoc.ml.tiny import build_tiny

    return build_tiny(LAYOUT)


def _pair(base: Any, tmp: Path, variant: str) -> list[Path]:
    one, two = VARIANTS[variant]
    return [make_adapter(base, tmp / "a", 1, **one), make_adapter(base, tmp / "b", 2, **two)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("weights", [[1.0, 1.0], [0.7, -1.3]])
def test_cat_equals_the_weighted_sum_of_peft_deltas(
    base: Any, tmp_path: Path, variant: str, weights: list[float]
):
    from adapterdoc.algebra import combine

    sources = _pair(base, tmp_path, variant)
    report = combine(sources, str(tmp_path / "out"), method="cat", weights=weights, base=f"tiny:{LAYOUT}")
    want = logits_of(base, weighted_reference(base, sources, weights))
    got = peft_logits(base, tmp_path / "out")
    assert (got - want).abs().max().item() <= 1e-5
    assert report.exact and report.total_rel_error == 0
    assert not [f for f in report.findings if f.severity == "error"]  # verify against the base passes


def test_cat_reloads_in_peft_with_every_rank(base: Any, tmp_path: Path):
    """Different ranks per module are written as rank_pattern, and PEFT builds each module with its own rank."""
    from peft import PeftModel

    from adapterdoc.algebra import combine

    sources = _pair(base, tmp_path, "patterns")
    report = combine(sources, str(tmp_path / "out"), method="cat")
    pm = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "out")
    ranks = {}
    for name, module in pm.base_model.model.named_modules():
        if hasattr(module, "lora_A") and "default" in getattr(module, "lora_A", {}):
            ranks[name] = module.lora_A["default"].weight.shape[0]
    assert ranks == {m.module: m.rank_out for m in report.modules}
    assert len(set(ranks.values())) > 1
    cfg = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert cfg["use_rslora"] is False and cfg["r"] == cfg["lora_alpha"]


def _peft_weighted(base: Any, sources: list[Path], weights: list[float], how: str) -> Any:
    from peft import PeftModel

    pm = PeftModel.from_pretrained(copy.deepcopy(base), sources[0], adapter_name="s0")
    for i, p in enumerate(sources[1:], start=1):
        pm.load_adapter(p, adapter_name=f"s{i}")
    pm.add_weighted_adapter([f"s{i}" for i in range(len(sources))], weights, "mix", combination_type=how)
    pm.set_adapter("mix")
    return pm


def test_cat_equals_peft_add_weighted_adapter_where_it_is_right(base: Any, tmp_path: Path):
    """Plain LoRA, cat, positive weights: the same factors as PEFT's, in the same order."""
    from safetensors.torch import load_file

    from adapterdoc.algebra import combine

    sources = _pair(base, tmp_path, "plain")
    weights = [0.5, 2.0]
    combine(sources, str(tmp_path / "out"), method="cat", weights=weights)
    ours = load_file(tmp_path / "out" / "adapter_model.safetensors")
    pm = _peft_weighted(base, sources, weights, "cat")
    pm.save_pretrained(tmp_path / "peft", selected_adapters=["mix"])
    theirs = load_file(tmp_path / "peft" / "mix" / "adapter_model.safetensors")
    assert set(ours) == set(theirs)
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-6, atol=1e-7)


def test_rslora_sources_peft_over_scales_adapterdoc_does_not(base: Any, tmp_path: Path):
    """peft#3449: the combined config keeps use_rslora with lora_alpha = r, so PEFT scales the cat by sqrt(r)."""
    from adapterdoc.algebra import combine

    sources = _pair(base, tmp_path, "rslora")
    weights = [1.0, 1.0]
    want = logits_of(base, weighted_reference(base, sources, weights))
    pm = _peft_weighted(base, sources, weights, "cat")
    merged = {k: v.detach().clone() for k, v in pm.merge_and_unload().state_dict().items()}
    peft_error = (logits_of(base, merged) - want).abs().max().item()
    combine(sources, str(tmp_path / "out"), method="cat", weights=weights)
    ours = (peft_logits(base, tmp_path / "out") - want).abs().max().item()
    assert ours <= 1e-5
    assert peft_error > 1e-3, "PEFT's rsLoRA cat is right now (peft#3449 fixed): assert equality instead"


def test_negative_weights_exact_where_peft_linear_has_cross_terms(base: Any, tmp_path: Path):
    """peft#3004: negative weights. PEFT's `linear` sums A's and B's apart (cross terms); `cat` is exact in this
    PEFT, and so is adapterdoc's."""
    from adapterdoc.algebra import combine

    sources = _pair(base, tmp_path, "plain")
    sources[1] = make_adapter(base, tmp_path / "b4", 2, r=4, lora_alpha=16)  # linear needs equal ranks
    weights = [1.0, -1.0]
    want = logits_of(base, weighted_reference(base, sources, weights))
    combine(sources, str(tmp_path / "out"), method="cat", weights=weights)
    assert (peft_logits(base, tmp_path / "out") - want).abs().max().item() <= 1e-5
    errors = {}
    for how in ("linear", "cat"):
        pm = _peft_weighted(base, sources, weights, how)
        merged = {k: v.detach().clone() for k, v in pm.merge_and_unload().state_dict().items()}
        errors[how] = (logits_of(base, merged) - want).abs().max().item()
    assert errors["linear"] > 1e-3
    assert errors["cat"] <= 1e-5  # fixed in the installed PEFT: its cat agrees with adapterdoc


def test_rank_pattern_sources_each_module_keeps_its_rank(base: Any, tmp_path: Path):
    """#3737/#3744: sources with rank_pattern. adapterdoc writes each module at its own summed rank (rank_pattern)
    and equals the reference; the installed PEFT's `cat` is right too (fixed: it pads every module with zeros to
    the sum of the sources' largest ranks and writes no rank_pattern), so that is asserted."""
    from adapterdoc.algebra import combine

    sources = _pair(base, tmp_path, "patterns")
    weights = [1.0, 1.0]
    want = logits_of(base, weighted_reference(base, sources, weights))
    report = combine(sources, str(tmp_path / "out"), method="cat", weights=weights)
    assert (peft_logits(base, tmp_path / "out") - want).abs().max().item() <= 1e-5
    ours = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert ours["rank_pattern"] and {m.rank_out for m in report.modules} == {8, 10, 7}
    pm = _peft_weighted(base, sources, weights, "cat")
    pm.save_pretrained(tmp_path / "peft", selected_adapters=["mix"])
    saved = json.loads((tmp_path / "peft" / "mix" / "adapter_config.json").read_text())
    assert saved["rank_pattern"] == {} and saved["r"] == 10
    assert (peft_logits(base, tmp_path / "peft" / "mix") - want).abs().max().item() <= 1e-5


def _merged_delta(pm: Any, base: Any) -> dict[str, Any]:
    start = base.state_dict()
    merged = pm.merge_and_unload().state_dict()
    return {k: (merged[k].double() - start[k].double()) for k in start}


def test_ties_equals_peft_ties_svd(base: Any, tmp_path: Path):
    """ties at density 0.5, factorised at rank 4: the same delta as PEFT's add_weighted_adapter("ties_svd"), up to
    float32 (PEFT's SVD runs in float32)."""
    from adapterdoc.algebra import combine

    sources = [
        make_adapter(base, tmp_path / "a", 1, r=4),
        make_adapter(base, tmp_path / "b", 2, r=4, lora_alpha=4),
    ]
    weights = [1.0, 0.6]
    report = combine(sources, str(tmp_path / "out"), method="ties", weights=weights, rank=4, density=0.5)
    from peft import PeftModel

    ours = _merged_delta(PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "out"), base)
    pm = _peft_weighted_kw(base, sources, weights, "ties_svd", svd_rank=4, density=0.5)
    theirs = _merged_delta(pm, base)
    for k in ours:
        scale = max(theirs[k].abs().max().item(), 1e-12)
        assert (ours[k] - theirs[k]).abs().max().item() <= 1e-5 * scale + 1e-7, k
    assert all(m.rank_out == 4 and m.rel_error > 0 for m in report.modules)


def test_dare_is_seeded_and_at_density_1_is_svd(base: Any, tmp_path: Path):
    from safetensors.torch import load_file

    from adapterdoc.algebra import combine

    sources = [make_adapter(base, tmp_path / "a", 1, r=4), make_adapter(base, tmp_path / "b", 2, r=4)]
    runs = {}
    for name, kw in {
        "d1": {"method": "dare", "density": 0.5, "seed": 3},
        "d2": {"method": "dare", "density": 0.5, "seed": 3},
        "d3": {"method": "dare", "density": 0.5, "seed": 4},
        "full": {"method": "dare", "density": 1.0},
        "svd": {"method": "svd"},
    }.items():
        combine(sources, str(tmp_path / name), rank=4, **kw)
        runs[name] = load_file(tmp_path / name / "adapter_model.safetensors")
    key = next(iter(runs["d1"]))
    assert torch.equal(runs["d1"][key], runs["d2"][key]) and not torch.equal(runs["d1"][key], runs["d3"][key])
    for k in runs["svd"]:
        a, b = runs["full"][k], runs["svd"][k]  # the same subspace, signs of singular vectors aside
        assert torch.allclose(a.abs(), b.abs(), atol=1e-5), k


def _peft_weighted_kw(base: Any, sources: list[Path], weights: list[float], how: str, **kw: Any) -> Any:
    from peft import PeftModel

    pm = PeftModel.from_pretrained(copy.deepcopy(base), sources[0], adapter_name="s0")
    for i, p in enumerate(sources[1:], start=1):
        pm.load_adapter(p, adapter_name=f"s{i}")
    pm.add_weighted_adapter(
        [f"s{i}" for i in range(len(sources))], weights, "mix", combination_type=how, **kw
    )
    pm.set_adapter("mix")
    return pm
