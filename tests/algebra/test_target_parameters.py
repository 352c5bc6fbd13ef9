"""LoRA on parameters (``target_parameters``) on the tiny MoE model: on a 2-D parameter (the router's
``gate.weight``) the algebra is the plain one (cat equals the weighted PEFT deltas, per-module ranks reload, their
patterns under PEFT's ``module.PARAM`` name); on fused expert parameters (one block per expert) it is refused
(exit 3), naming the per-expert remap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.peft_helpers import logits_of, make_adapter, peft_logits, weighted_reference

MOE = "qwen3_moe_text"
ROUTER = {"target_modules": ["q_proj"], "target_parameters": ["mlp.gate.weight"]}


@pytest.fixture(scope="module")
def base() -> Any:
    from adapterdoc.ml.tiny import build_tiny

    return build_tiny(MOE)


def test_cat_on_a_parameter(base: Any, tmp_path: Path):
    from adapterdoc.algebra import combine

    a = make_adapter(base, tmp_path / "a", 1, **ROUTER)
    b = make_adapter(base, tmp_path / "b", 2, **ROUTER, r=2, use_rslora=True)
    report = combine([a, b], str(tmp_path / "out"), method="cat", weights=[0.5, -1.0])
    want = logits_of(base, weighted_reference(base, [a, b], [0.5, -1.0]))
    assert (peft_logits(base, tmp_path / "out") - want).abs().max().item() <= 1e-5
    assert {m.module.rpartition(".")[2] for m in report.modules} == {"q_proj", "gate"}


def test_resize_per_module_ranks_on_a_parameter_reload(base: Any, tmp_path: Path):
    from adapterdoc.algebra import resize

    src = make_adapter(base, tmp_path / "src", 3, **ROUTER, r=8)
    report = resize(src, str(tmp_path / "out"), energy=0.8)
    ranks = {m.module: m.rank_out for m in report.modules}
    assert len(set(ranks.values())) > 1
    cfg = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    gates = [m for m in ranks if m.endswith(".gate") and ranks[m] != cfg["r"]]
    assert gates and all(f"{m}.weight" in cfg["rank_pattern"] for m in gates)
    assert peft_logits(base, tmp_path / "out").shape[-1] == base.config.vocab_size  # PEFT builds every rank


def test_fused_expert_parameters_are_refused(base: Any, tmp_path: Path, cli: Any):
    src = make_adapter(
        base, tmp_path / "f", 1, target_modules=["q_proj"], target_parameters=["mlp.experts.down_proj"]
    )
    res = cli("resize", str(src), "--rank", "2", "--out", str(tmp_path / "out"))
    assert res.exit_code == 3 and "AD953" in res.stderr and "--experts per-expert" in res.stderr


def test_a_parameters_rank_pattern_is_applied_by_peft(base: Any, tmp_path: Path):
    """PEFT (0.21) warns that `module.PARAM` rank/alpha pattern keys "did not match any targeted module and were
    ignored", for its own adapters too, yet applies them: an exact resize (--max-error 0) of a source with a
    per-parameter rank_pattern reloads to the source's logits (so the written patterns are read as meant)."""
    from adapterdoc.algebra import resize

    pattern = {"model.layers.0.mlp.gate.weight": 4, "model.layers.1.mlp.gate.weight": 4}
    src = make_adapter(base, tmp_path / "src", 3, **ROUTER, r=8, rank_pattern=pattern)
    resize(src, str(tmp_path / "out"), max_error=0.0)
    cfg = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert all(cfg["rank_pattern"][k] == v and cfg["alpha_pattern"][k] == v for k, v in pattern.items())
    got, want = peft_logits(base, tmp_path / "out"), peft_logits(base, src)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
