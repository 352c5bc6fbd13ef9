"""PEFT's ``add_weighted_adapter`` defects of issue 43 that test_combine_peft.py does not cover, peft#3111 (the SVD
path applied each source's scaling twice) and peft#3761 (silently wrong for rsLoRA, lora_bias and DoRA), each
against the truth "base + Σ wᵢ · (PEFT's own merged delta of source i)" (float32) on a plain tiny Llama with
attention biases (``lora_bias`` needs a base bias to merge into): adapterdoc equals the truth, or refuses with exit 3
and the fix, where PEFT silently returns something else. The relative differences are of the logits' change:
``‖got − truth‖ / ‖truth − base‖``."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.llama_helpers import tiny_llama  # noqa: E402
from tests.algebra.peft_helpers import (  # noqa: E402
    logits_of,
    make_adapter,
    merged_state,
    peft_logits,
    weighted_reference,
)

WEIGHTS = [0.7, -0.5]
EXACT = 1e-5
"""Logits of adapterdoc's result against the truth: float32 rounding."""
WRONG = 0.1
"""A relative difference of the logits' change above this is a wrong result, not rounding."""


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The base model and its saved folder."""
    folder = tmp_path_factory.mktemp("llama") / "base"
    base = tiny_llama(bias=True)
    base.save_pretrained(folder)
    return base, folder


def _rel(base: Any, got: Any, want: Any) -> float:
    start = logits_of(base, base.state_dict())
    return float((got - want).norm() / (want - start).norm())


def _peft_combined(base: Any, sources: list[Path], weights: list[float], how: str, **kw: Any) -> Any:
    """Logits of ``base`` with PEFT's ``add_weighted_adapter`` result merged."""
    from peft import PeftModel

    pm = PeftModel.from_pretrained(copy.deepcopy(base), sources[0], adapter_name="s0")
    for i, p in enumerate(sources[1:], start=1):
        pm.load_adapter(p, adapter_name=f"s{i}")
    pm.add_weighted_adapter(
        [f"s{i}" for i in range(len(sources))], weights, "mix", combination_type=how, **kw
    )
    pm.set_adapter("mix")
    return logits_of(base, {k: v.detach().clone() for k, v in pm.merge_and_unload().state_dict().items()})


def _dora(base: Any, folder: Path, seed: int) -> Path:
    """A PEFT DoRA adapter with random factors and magnitudes near the base's row norms."""
    from peft import LoraConfig, get_peft_model

    pm = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=True)
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_magnitude_vector" in name:
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    pm.save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------------ peft#3111


def test_svd_applies_each_scaling_once_peft_3111(llama: tuple[Any, Path], tmp_path: Path):
    """peft#3111: the SVD path weighted each source by ``wᵢ · scalingᵢ`` though ``get_delta_weight`` already applies
    the scaling, giving ``Σ wᵢ sᵢ² Bᵢ Aᵢ``. Fixed in the installed PEFT (0.21.2 weights by ``wᵢ`` alone): here PEFT's
    svd and adapterdoc's both equal the truth (at rank 8 the sum is exact). PEFT 0.18.1 still has it: the oracle test
    below."""
    from adapterdoc.algebra import combine

    base, _ = llama
    sources = [
        make_adapter(base, tmp_path / "a", 1, r=4, lora_alpha=16),  # scaling 4
        make_adapter(base, tmp_path / "b", 2, r=4, lora_alpha=8),  # scaling 2
    ]
    want = logits_of(base, weighted_reference(base, sources, WEIGHTS))
    report = combine(sources, str(tmp_path / "out"), method="svd", weights=WEIGHTS, rank=8)
    assert report.total_rel_error <= 1e-6
    assert (peft_logits(base, tmp_path / "out") - want).abs().max().item() <= EXACT
    theirs = _peft_combined(base, sources, WEIGHTS, "svd", svd_rank=8)
    assert (theirs - want).abs().max().item() <= EXACT, "PEFT's svd path scales twice again (peft#3111)"


_PEFT018 = r"""
import json, sys
from pathlib import Path

import torch
import transformers as tf
from peft import LoraConfig, PeftModel, get_peft_model

base_dir, root, spec = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])


def load():
    return tf.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()


names = []
for i, lora in enumerate(spec["sources"]):
    pm = get_peft_model(load(), LoraConfig(target_modules=["q_proj", "v_proj"], **lora))
    gen = torch.Generator().manual_seed(i + 1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    pm.save_pretrained(root / f"s{i}")
    names.append(f"s{i}")
pm = PeftModel.from_pretrained(load(), root / "s0", adapter_name="s0")
for n in names[1:]:
    pm.load_adapter(root / n, adapter_name=n)
pm.add_weighted_adapter(names, spec["weights"], "mix", combination_type="svd", svd_rank=spec["rank"])
with torch.no_grad():
    for n, p in pm.named_parameters():
        if ".mix." in n:
            p.data = p.data.contiguous()  # the SVD's factors are views; safetensors saves packed tensors
pm.save_pretrained(root / "peft", selected_adapters=["mix"])
"""


@pytest.mark.oracle
def test_peft_0_18_svd_applies_the_scaling_twice(llama: tuple[Any, Path], tmp_path: Path, oracle_env: Any):
    """peft#3111 in PEFT 0.18.1 (the ``peft018`` oracle environment): two plain sources (scalings 4 and 2) made and
    combined by ``add_weighted_adapter(..., "svd", svd_rank=8)`` there. Its result is ``Σ wᵢ sᵢ · ΔWᵢ`` (each
    scaling twice), far from the truth; adapterdoc's svd of the same sources equals the truth."""
    from adapterdoc.algebra import combine

    base, folder = llama
    spec = {"sources": [{"r": 4, "lora_alpha": 16}, {"r": 4, "lora_alpha": 8}], "weights": WEIGHTS, "rank": 8}
    run = subprocess.run(
        [str(oracle_env("peft018")), "-c", _PEFT018, str(folder), str(tmp_path), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    sources = [tmp_path / "s0", tmp_path / "s1"]
    assert (
        json.loads((tmp_path / "peft" / "mix" / "adapter_config.json").read_text())["peft_version"]
        == "0.18.1"
    )
    want = logits_of(base, weighted_reference(base, sources, WEIGHTS))
    theirs = peft_logits(base, tmp_path / "peft" / "mix")
    twice = logits_of(base, weighted_reference(base, sources, [WEIGHTS[0] * 4, WEIGHTS[1] * 2]))
    assert (theirs - twice).abs().max().item() <= EXACT  # the defect, exactly: each scaling applied twice
    assert _rel(base, theirs, want) > WRONG
    combine(sources, str(tmp_path / "ours"), method="svd", weights=WEIGHTS, rank=8)
    assert (peft_logits(base, tmp_path / "ours") - want).abs().max().item() <= EXACT


# ------------------------------------------------------------------------------------------ peft#3761: rsLoRA


def test_rslora_identity_peft_3761(llama: tuple[Any, Path], tmp_path: Path):
    """peft#3761, rsLoRA: one adapter combined with weight 1 must give it back. The installed PEFT keeps
    ``use_rslora`` with ``r = lora_alpha`` = the new rank, so its result is ``sqrt(r)`` times the adapter (r=4: 2×);
    adapterdoc's cat and svd give the adapter back."""
    from adapterdoc.algebra import combine

    base, _ = llama
    src = make_adapter(base, tmp_path / "a", 1, r=4, lora_alpha=3, use_rslora=True)
    want = logits_of(base, weighted_reference(base, [src], [1.0]))
    for method in ("cat", "svd"):
        combine([src], str(tmp_path / method), method=method)
        assert (peft_logits(base, tmp_path / method) - want).abs().max().item() <= EXACT, method
    theirs = _peft_combined(base, [src], [1.0], "linear")  # what PEFT does with one adapter, whatever asked
    doubled = logits_of(base, weighted_reference(base, [src], [2.0]))
    assert _rel(base, theirs, want) > WRONG, "PEFT fixed peft#3761 (rsLoRA): switch this to an equality"
    assert (theirs - doubled).abs().max().item() <= EXACT  # sqrt(4) times the adapter


def test_rslora_svd_peft_3761(llama: tuple[Any, Path], tmp_path: Path):
    """peft#3761, rsLoRA on the SVD path (test_combine_peft.py has the cat path, peft#3449): two rsLoRA sources at
    svd rank 8 (exact); PEFT's result is ``sqrt(8)`` times the truth, adapterdoc's is the truth."""
    from adapterdoc.algebra import combine

    base, _ = llama
    sources = [
        make_adapter(base, tmp_path / "a", 1, r=4, lora_alpha=3, use_rslora=True),
        make_adapter(base, tmp_path / "b", 2, r=4, lora_alpha=5, use_rslora=True),
    ]
    want = logits_of(base, weighted_reference(base, sources, WEIGHTS))
    combine(sources, str(tmp_path / "out"), method="svd", weights=WEIGHTS, rank=8)
    assert (peft_logits(base, tmp_path / "out") - want).abs().max().item() <= EXACT
    theirs = _peft_combined(base, sources, WEIGHTS, "svd", svd_rank=8)
    assert _rel(base, theirs, want) > WRONG, "PEFT fixed peft#3761 (rsLoRA, svd): switch this to an equality"
    scaled = logits_of(base, weighted_reference(base, sources, [w * 8**0.5 for w in WEIGHTS]))
    assert (theirs - scaled).abs().max().item() <= EXACT


# ------------------------------------------------------------------------------------------ peft#3761: lora_bias


def test_lora_bias_peft_3761(llama: tuple[Any, Path], tmp_path: Path, cli: Any):
    """peft#3761, lora_bias: PEFT combines the factors and drops the sources' ``lora_B`` biases without a word
    (one adapter with weight 1, and two with ``cat``); adapterdoc refuses with exit 3 (AD952), naming the fix,
    and writes nothing."""
    base, _ = llama
    sources = [
        make_adapter(base, tmp_path / "a", 1, lora_bias=True),
        make_adapter(base, tmp_path / "b", 2, lora_bias=True),
    ]
    want = logits_of(base, weighted_reference(base, sources[:1], [1.0]))
    one = _peft_combined(base, sources[:1], [1.0], "linear")
    assert _rel(base, one, want) > WRONG, "PEFT fixed peft#3761 (lora_bias): switch this to an equality"
    want = logits_of(base, weighted_reference(base, sources, WEIGHTS))
    two = _peft_combined(base, sources, WEIGHTS, "cat")
    assert _rel(base, two, want) > WRONG, "PEFT fixed peft#3761 (lora_bias, cat): switch this to an equality"
    out = tmp_path / "out"
    res = cli("combine", *sources, "--weights", "0.7,-0.5", "--method", "cat", "--out", out)
    assert res.exit_code == 3 and "AD952" in res.stderr
    assert "adapterdoc merge" in res.stderr and "train without lora_bias" in res.stderr
    assert not out.exists()


# ------------------------------------------------------------------------------------------ peft#3761: DoRA


def test_dora_peft_3761_and_the_fix(llama: tuple[Any, Path], tmp_path: Path, cli: Any):
    """peft#3761, DoRA: PEFT's cat of two DoRA adapters keeps ``use_dora`` and gives the combined adapter fresh
    magnitudes (the base's norms), silently wrong; adapterdoc refuses with exit 3 (AD951) naming
    ``resize --to-lora``. Doing that (``--max-error 0``), then ``combine --method cat``, gives the truth."""
    base, folder = llama
    sources = [_dora(base, tmp_path / "a", 1), _dora(base, tmp_path / "b", 2)]
    want = logits_of(base, weighted_reference(base, sources, WEIGHTS))
    theirs = _peft_combined(base, sources, WEIGHTS, "cat")
    assert _rel(base, theirs, want) > WRONG, "PEFT fixed peft#3761 (DoRA): switch this to an equality"
    res = cli("combine", *sources, "--weights", "0.7,-0.5", "--method", "cat", "--out", tmp_path / "out")
    assert res.exit_code == 3 and "AD951" in res.stderr
    assert "--to-lora --base BASE --max-error 0" in res.stderr and not (tmp_path / "out").exists()
    loras = []
    for i, src in enumerate(sources):
        loras.append(tmp_path / f"lora{i}")
        res = cli("resize", src, "--to-lora", "--base", folder, "--max-error", "0", "--out", loras[-1])
        assert res.exit_code == 0, res.stderr
    res = cli(
        "combine",
        *loras,
        "--weights",
        "0.7,-0.5",
        "--method",
        "cat",
        "--base",
        folder,
        "--out",
        tmp_path / "c",
    )
    assert res.exit_code == 0, res.stderr
    assert (peft_logits(base, tmp_path / "c") - want).abs().max().item() <= EXACT


def test_dora_fix_at_a_lower_rank_is_within_the_reported_error(llama: tuple[Any, Path], tmp_path: Path):
    """The fix at rank 2 (truncated): per module, the combined LoRA's merged weight is no farther from the truth
    than the reported errors allow, ``Σ |wᵢ| · rel_errorᵢ · ‖ΔWᵢ‖`` (each ``ΔWᵢ`` PEFT's merged DoRA delta)."""
    from adapterdoc.algebra import combine, resize

    base, folder = llama
    sources = [_dora(base, tmp_path / "a", 1), _dora(base, tmp_path / "b", 2)]
    start = {k: v.double() for k, v in base.state_dict().items()}
    merged = [merged_state(base, s) for s in sources]
    deltas = [{k: m[k].double() - start[k] for k in start} for m in merged]
    bound: dict[str, float] = {}
    for i, src in enumerate(sources):
        report = resize(src, str(tmp_path / f"lora{i}"), rank=2, base=str(folder), to_lora=True)
        assert all(row.rel_error > 0.01 for row in report.modules)  # truncated
        for row in report.modules:
            key = f"{row.module}.weight"
            size = float(np.linalg.norm(deltas[i][key].numpy()))
            bound[key] = bound.get(key, 0.0) + abs(WEIGHTS[i]) * row.rel_error * size
    combine([tmp_path / "lora0", tmp_path / "lora1"], str(tmp_path / "c"), method="cat", weights=WEIGHTS)
    got = merged_state(base, tmp_path / "c")
    for key, limit in bound.items():
        truth = start[key] + WEIGHTS[0] * deltas[0][key] + WEIGHTS[1] * deltas[1][key]
        distance = float(np.linalg.norm((got[key].double() - truth).numpy()))
        assert distance <= limit * (1 + 1e-6) + 1e-6, key


# ------------------------------------------------------------------------------------------ peft#3761: KaSA


def test_kasa_is_refused(llama: tuple[Any, Path], tmp_path: Path, cli: Any):
    """peft#3761 lists KaSA too (``kasa_config``: ``ΔW = s·B diag(lora_diag) A`` on a base whose ``r`` smallest
    singular values KaSA drops): no sum of factors holds it. adapterdoc refuses it with exit 3 (AD962), like DoRA;
    before, it read ``lora_diag`` as a whole saved weight, kept ``kasa_config`` and dropped the diagonal from the
    product, so ``resize --rank 4`` (full rank) of a KaSA adapter gave logits a relative 1.5 away from PEFT's
    (measured on this model), without a word."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.config import KasaConfig

    base, _ = llama
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], kasa_config=KasaConfig())
    pm = get_peft_model(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    pm.save_pretrained(tmp_path / "kasa")
    for args in (
        ("resize", tmp_path / "kasa", "--rank", "4"),
        ("combine", tmp_path / "kasa", tmp_path / "kasa", "--method", "cat"),
    ):
        res = cli(*args, "--out", tmp_path / "out")
        assert res.exit_code == 3 and "AD962" in res.stderr and not (tmp_path / "out").exists(), res.output
