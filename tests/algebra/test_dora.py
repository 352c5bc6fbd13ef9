"""resize --to-lora: a DoRA adapter made by PEFT (float64 tiny model) as plain LoRA. At full rank PEFT's outputs of
the two agree; at a lower rank the distance between PEFT's merged weights of the two, relative to the DoRA delta, is
the reported error (within 1e-6), the Eckart–Young optimum of the effective delta."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.peft_helpers import IDS, LAYOUT, make_dora, merged_state  # noqa: E402


@pytest.fixture(scope="module")
def dora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    from adapterdoc.ml.tiny import build_tiny

    root = tmp_path_factory.mktemp("dora")
    base = build_tiny(LAYOUT, dtype=torch.float64)
    base.save_pretrained(root / "base")
    make_dora(base, root / "dora", ["q_proj", "down_proj"])
    return base, root / "base", root / "dora"


def test_full_rank_lora_equals_the_dora_adapter(dora: tuple[Any, Path, Path], tmp_path: Path):
    from peft import PeftModel

    from adapterdoc.algebra import resize

    base, bdir, adir = dora
    report = resize(adir, str(tmp_path / "out"), max_error=0.0, base=str(bdir), to_lora=True)
    assert report.total_rel_error <= 1e-7
    with torch.no_grad():
        want = PeftModel.from_pretrained(copy.deepcopy(base), adir)(IDS).logits
        got = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "out")(IDS).logits
    assert (got - want).abs().max().item() <= 1e-5  # the LoRA is written in float32


@pytest.mark.parametrize("how", [{"rank": 2}, {"energy": 0.9}])
def test_reported_error_is_the_distance_of_peft_merges(
    dora: tuple[Any, Path, Path], tmp_path: Path, how: dict[str, Any]
):
    from adapterdoc.algebra import resize

    base, bdir, adir = dora
    report = resize(adir, str(tmp_path / "out"), base=str(bdir), to_lora=True, **how)
    start = base.state_dict()
    want, got = merged_state(base, adir), merged_state(base, tmp_path / "out")
    for row in report.modules:
        key = f"{row.module}.weight"
        delta = (want[key] - start[key]).numpy()
        measured = np.linalg.norm((got[key] - want[key]).numpy()) / np.linalg.norm(delta)
        assert abs(row.rel_error - measured) <= 1e-6, row
        s = np.linalg.svd(delta, compute_uv=False)
        assert abs(row.rel_error - np.sqrt((s[row.rank_out :] ** 2).sum()) / np.linalg.norm(delta)) <= 1e-6


def test_to_lora_needs_a_dora_adapter_and_a_base(dora: tuple[Any, Path, Path], tmp_path: Path, cli: Any):
    _, bdir, adir = dora
    res = cli("resize", str(adir), "--rank", "2", "--to-lora", "--out", str(tmp_path / "o"))
    assert res.exit_code == 3 and "--base" in res.stderr
    res = cli(
        "resize",
        str(adir),
        "--rank",
        "2",
        "--to-lora",
        "--base",
        str(bdir),
        "--out",
        str(tmp_path / "o"),
        "--json",
    )
    assert res.exit_code == 0, res.stderr
