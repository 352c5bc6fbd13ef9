"""resize --to-lora on a DoRA adapter whose targets include the embedding (PEFT's ``DoraEmbeddingLayer``: one
magnitude per embedding dimension, the norm of each column of the ``(num, dim)`` weight over the vocabulary). On a
float64 plain Llama: at full rank PEFT's outputs of the DoRA adapter and of the LoRA one agree; at a lower rank the
distance between PEFT's merged embeddings, relative to the DoRA delta, is the reported error (within 1e-6), the
Eckart–Young optimum of the effective delta."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.llama_helpers import tiny_llama  # noqa: E402
from tests.algebra.peft_helpers import IDS, make_dora, merged_state  # noqa: E402

EMBED = "model.embed_tokens"


@pytest.fixture(scope="module")
def dora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    root = tmp_path_factory.mktemp("dora_embedding")
    base = tiny_llama(torch.float64)
    base.save_pretrained(root / "base")
    make_dora(base, root / "dora", ["embed_tokens", "q_proj"])
    return base, root / "base", root / "dora"


def test_the_adapter_has_dora_on_the_embedding(dora: tuple[Any, Path, Path]):
    """The magnitude PEFT saves for the embedding is one per embedding dimension (32), not per token (256)."""
    from safetensors.torch import load_file

    saved = load_file(dora[2] / "adapter_model.safetensors")
    assert saved[f"base_model.model.{EMBED}.lora_magnitude_vector"].shape == (32,)
    assert saved[f"base_model.model.{EMBED}.lora_embedding_A"].shape == (4, 256)


def test_full_rank_lora_equals_the_dora_adapter(dora: tuple[Any, Path, Path], tmp_path: Path):
    from peft import PeftModel

    from adapterdoc.algebra import resize

    base, bdir, adir = dora
    report = resize(adir, str(tmp_path / "out"), max_error=0.0, base=str(bdir), to_lora=True)
    assert EMBED in {m.module for m in report.modules}
    assert report.total_rel_error <= 1e-7
    with torch.no_grad():
        want = PeftModel.from_pretrained(copy.deepcopy(base), adir)(IDS).logits
        got = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "out")(IDS).logits
    assert (got - want).abs().max().item() <= 1e-5  # the LoRA is written in float32
    start, merged = base.state_dict(), merged_state(base, tmp_path / "out")
    want_w = merged_state(base, adir)[f"{EMBED}.weight"]
    delta = (want_w - start[f"{EMBED}.weight"]).numpy()
    assert np.linalg.norm((merged[f"{EMBED}.weight"] - want_w).numpy()) <= 1e-6 * np.linalg.norm(delta)
    assert not [f for f in report.findings if f.severity == "error"]


@pytest.mark.parametrize("how", [{"rank": 2}, {"energy": 0.9}])
def test_reported_error_is_the_distance_of_peft_merges(
    dora: tuple[Any, Path, Path], tmp_path: Path, how: dict[str, Any]
):
    from adapterdoc.algebra import resize

    base, bdir, adir = dora
    report = resize(adir, str(tmp_path / "out"), base=str(bdir), to_lora=True, **how)
    start = base.state_dict()
    want, got = merged_state(base, adir), merged_state(base, tmp_path / "out")
    rows = {row.module: row for row in report.modules}
    assert rows[EMBED].rel_error > 0
    for row in rows.values():
        key = f"{row.module}.weight"
        delta = (want[key] - start[key]).numpy()
        measured = np.linalg.norm((got[key] - want[key]).numpy()) / np.linalg.norm(delta)
        assert abs(row.rel_error - measured) <= 1e-6, row
        s = np.linalg.svd(delta, compute_uv=False)
        assert abs(row.rel_error - np.sqrt((s[row.rank_out :] ** 2).sum()) / np.linalg.norm(delta)) <= 1e-6


def test_cli_converts_the_embedding(dora: tuple[Any, Path, Path], tmp_path: Path, cli: Any):
    import json

    _, bdir, adir = dora
    out = tmp_path / "o"
    res = cli("resize", adir, "--max-error", "0", "--to-lora", "--base", bdir, "--out", out, "--json")
    assert res.exit_code == 0, res.stderr
    body = json.loads(res.stdout)
    assert EMBED in {m["module"] for m in body["modules"]}
    check = cli("verify", out, "--base", bdir, "--json")
    assert check.exit_code == 0, check.stdout
