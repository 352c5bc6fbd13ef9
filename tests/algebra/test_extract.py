"""extract: a LoRA from a full fine-tune of the tiny model, its reported error equal to numpy's on the full
matrices and to the Eckart–Young optimum, exact modules reloading in PEFT to the tuned logits, and what a LoRA
cannot hold (a changed norm, a grown vocabulary) said plainly."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.peft_helpers import IDS, LAYOUT  # noqa: E402

Q0 = "model.layers.0.self_attn.q_proj"
V1 = "model.layers.1.self_attn.v_proj"
EMB = "model.embed_tokens"


def _tuned(base: Any) -> Any:
    """The base with a rank-3 change of Q0, a full-rank change of V1, a rank-2 change of the embedding and a
    changed final norm."""
    tuned = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(0)
    sd = tuned.state_dict()
    with torch.no_grad():
        q = sd[f"{Q0}.weight"]
        q += 0.05 * torch.randn(q.shape[0], 3, generator=gen) @ torch.randn(3, q.shape[1], generator=gen)
        v = sd[f"{V1}.weight"]
        v += 0.05 * torch.randn(v.shape, generator=gen)
        e = sd[f"{EMB}.weight"]
        e += 0.05 * torch.randn(e.shape[0], 2, generator=gen) @ torch.randn(2, e.shape[1], generator=gen)
        sd["model.norm.weight"] += 0.01
    return tuned


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path, Path]:
    from adapterdoc.ml.tiny import build_tiny

    base = build_tiny(LAYOUT)
    root = tmp_path_factory.mktemp("extract")
    tuned = _tuned(base)
    base.save_pretrained(root / "base")
    tuned.save_pretrained(root / "tuned")
    return base, tuned, root / "base", root / "tuned"


def _delta(base: Any, tuned: Any, module: str) -> np.ndarray:
    return (
        tuned.state_dict()[f"{module}.weight"].double() - base.state_dict()[f"{module}.weight"].double()
    ).numpy()


def _adapter_delta(out: Path, module: str, embedding: bool) -> np.ndarray:
    from safetensors.numpy import load_file

    t = load_file(out / "adapter_model.safetensors")
    if embedding:
        a, b = (
            t[f"base_model.model.{module}.lora_embedding_A"],
            t[f"base_model.model.{module}.lora_embedding_B"],
        )
        return (b.astype(np.float64) @ a.astype(np.float64)).T
    a, b = t[f"base_model.model.{module}.lora_A.weight"], t[f"base_model.model.{module}.lora_B.weight"]
    return b.astype(np.float64) @ a.astype(np.float64)


@pytest.mark.parametrize("how", [{"rank": 3}, {"energy": 0.95}, {"max_error": 0.3}])
def test_extract_error_is_measured_and_optimal(
    pair: tuple[Any, Any, Path, Path], tmp_path: Path, how: dict[str, Any]
):
    from adapterdoc.algebra.extract import extract

    base, tuned, bdir, tdir = pair
    report = extract(str(bdir), str(tdir), str(tmp_path / "out"), **how)
    rows = {m.module: m for m in report.modules}
    assert set(rows) == {Q0, V1, EMB}
    for module, row in rows.items():
        full = _delta(base, tuned, module)
        got = _adapter_delta(tmp_path / "out", module, module == EMB)
        measured = np.linalg.norm(full - got) / np.linalg.norm(full)
        assert abs(row.rel_error - measured) <= 1e-6, row
        s = np.linalg.svd(full, compute_uv=False)
        assert abs(row.rel_error - math.sqrt((s[row.rank_out :] ** 2).sum()) / np.linalg.norm(full)) <= 1e-6
    if "rank" in how:
        assert rows[Q0].rel_error <= 1e-6 and rows[EMB].rel_error <= 1e-6 and rows[V1].rel_error > 0.1
    assert [f.code for f in report.findings if f.code.startswith("AD96")] == ["AD960"]
    assert not [f for f in report.findings if f.severity == "error"]  # verify against the base passes


def test_extract_at_full_rank_reloads_to_the_tuned_logits(pair: tuple[Any, Any, Path, Path], tmp_path: Path):
    from peft import PeftModel

    from adapterdoc.algebra.extract import extract

    base, tuned, bdir, tdir = pair
    extract(str(bdir), str(tdir), str(tmp_path / "out"), max_error=0.0)
    pm = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "out")  # the head tied to the embedding
    want = copy.deepcopy(tuned)
    with (
        torch.no_grad()
    ):  # the norm is no LoRA (AD960): compare with the tuned model whose norm is the base's
        want.model.norm.weight.copy_(base.model.norm.weight)
        diff = (pm(IDS).logits - want(IDS).logits).abs().max().item()
    assert diff <= 1e-4


def test_extract_says_a_grown_vocabulary(pair: tuple[Any, Any, Path, Path], tmp_path: Path, cli: Any):
    import json

    base, _, bdir, _ = pair
    grown = copy.deepcopy(base)
    grown.resize_token_embeddings(1008)
    grown.save_pretrained(tmp_path / "grown")
    args = ["extract", "--base", str(bdir), "--tuned", str(tmp_path / "grown"), "--rank", "2", "--json"]
    res = cli(*args, "--out", str(tmp_path / "o"))
    assert res.exit_code == 3 and "AD961" in res.stderr and "[1008, 64]" in res.stderr
    with torch.no_grad():
        grown.model.layers[0].self_attn.q_proj.weight.add_(0.01)
    grown.save_pretrained(tmp_path / "grown")
    res = cli(*args, "--out", str(tmp_path / "o"))
    assert res.exit_code == 0, res.stderr
    body = json.loads(res.stdout)
    assert [m["module"] for m in body["modules"]] == [Q0]
    assert "AD961" in {f["code"] for f in body["findings"]}


def _low_rank_plus_noise(rows: int, cols: int, noise: float, seed: int) -> np.ndarray:
    """Singular values 10, 8, 6, 5, 2, 1 plus Gaussian noise."""
    gen = np.random.default_rng(seed)
    u = np.linalg.qr(gen.standard_normal((rows, 6)))[0]
    v = np.linalg.qr(gen.standard_normal((cols, 6)))[0]
    return (u * np.array([10.0, 8, 6, 5, 2, 1])) @ v.T + noise * gen.standard_normal((rows, cols))


@pytest.mark.parametrize("ask", [{"rank": 3}, pytest.param({"energy": 0.999}, marks=pytest.mark.slow)])
def test_extract_bf16_large_module_and_skips_equal_tensors(tmp_path: Path, ask: dict[str, Any]):
    """A bfloat16 Llama pair whose only change is one projection large enough (1280 × 1280) to skip numpy's full
    SVD: under --rank the iteration (no effective rank in its row), under --energy the Gram route (numpy's rank
    for the same energy, every singular value counted); either way the error is the one measured on the exact
    float64 delta and the optimum, and no other tensor (equal bytes) makes a row or a finding."""
    from adapterdoc.algebra.extract import extract
    from adapterdoc.algebra.factors import rank_for_energy
    from tests.algebra.llama_helpers import tiny_llama

    model = tiny_llama(torch.bfloat16, hidden=1280, vocab=300, layers=1, heads=10, intermediate=512)
    model.save_pretrained(tmp_path / "base")
    weight = model.model.layers[0].self_attn.q_proj.weight
    before = weight.detach().double().clone()
    change = _low_rank_plus_noise(1280, 1280, 0.01, 2) * 0.01
    with torch.no_grad():
        weight.copy_((weight.double() + torch.from_numpy(change)).to(torch.bfloat16))
    model.save_pretrained(tmp_path / "tuned")
    full = (weight.detach().double() - before).numpy()
    report = extract(str(tmp_path / "base"), str(tmp_path / "tuned"), str(tmp_path / "out"), **ask)
    (row,) = report.modules
    s = np.linalg.svd(full, compute_uv=False)
    want = ask.get("rank") or rank_for_energy(s, ask["energy"])
    assert row.module == Q0 and row.rank_out == want
    assert row.effective_rank == (None if "rank" in ask else int((s > s[0] * 1e-6).sum()))
    got = _adapter_delta(tmp_path / "out", Q0, False)
    measured = np.linalg.norm(full - got) / np.linalg.norm(full)
    assert abs(row.rel_error - measured) <= 1e-6
    assert abs(row.rel_error - math.sqrt((s[want:] ** 2).sum()) / np.linalg.norm(full)) <= 1e-6
    assert not [f for f in report.findings if f.code in ("AD960", "AD961")]


@pytest.mark.slow
@pytest.mark.parametrize("ask", [{"rank": 4}, {"energy": 0.99}])
def test_extract_holds_one_copy_of_the_largest_delta(tmp_path: Path, ask: dict[str, Any]):
    """Memory: the largest changed tensor (a bf16 embedding and an untied head, 8M values each) is held once, as its
    float32 delta (the base read into a buffer, the tuned values subtracted window by window), and its float64 work
    goes a few rows at a time, under ``--rank`` (subspace iteration) and ``--energy`` (the Gram route; numpy's full
    SVD held a float64 copy, U and its workspace: 5 copies and more). numpy reports its buffers to ``tracemalloc``: the peak traced during a second extract
    (the first warms the imports and the meta model) stays under two float32 copies of the embedding
    (one, plus the iteration's few (rows × (rank + 16)) float64 arrays); two copies
    (base and tuned decoded whole), 8 MiB compare chunks and float64 column blocks of the head went well above it."""
    import tracemalloc

    from adapterdoc.algebra.extract import extract
    from tests.algebra.llama_helpers import tiny_llama

    model = tiny_llama(torch.bfloat16, hidden=256, vocab=32768, layers=1, intermediate=512)
    model.save_pretrained(tmp_path / "base")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in (model.model.embed_tokens.weight, model.lm_head.weight):
            w += (0.05 * torch.randn(w.shape[0], 2, generator=gen) @ torch.randn(2, 256, generator=gen)).to(
                w.dtype
            )
    model.save_pretrained(tmp_path / "tuned")
    extract(str(tmp_path / "base"), str(tmp_path / "tuned"), str(tmp_path / "warm"), **ask)
    tracemalloc.start()
    try:
        report = extract(str(tmp_path / "base"), str(tmp_path / "tuned"), str(tmp_path / "out"), **ask)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert {m.module for m in report.modules} == {EMB, "lm_head"}
    assert max(m.rel_error for m in report.modules) < 0.02
    one_copy = 32768 * 256 * 4
    assert peak < 2 * one_copy, f"peak {peak / 2**20:.1f} MiB against {one_copy / 2**20:.1f} MiB for one copy"


@pytest.mark.slow
def test_the_cli_reads_every_tensor_before_it_imports_torch(
    pair: tuple[Any, Any, Path, Path], tmp_path: Path
):
    """``adapterdoc extract`` factorises with numpy alone and imports torch (the base's class on the meta device,
    then verify) only once the tensors are released, so the largest delta and torch's memory are never held at
    once: a child process running the CLI observes ``sys.modules`` when the reads end."""
    import subprocess
    import sys

    _, _, base_dir, tuned_dir = pair
    child = (
        "import sys\n"
        "import adapterdoc.algebra.extract as X\n"
        "reads = X._factorised_changes\n"
        "def observed(*a, **k):\n"
        "    out = reads(*a, **k)\n"
        "    print('torch during the reads:', 'torch' in sys.modules, file=sys.stderr)\n"
        "    return out\n"
        "X._factorised_changes = observed\n"
        "from adapterdoc.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    out = tmp_path / "out"
    args = ["extract", "--base", str(base_dir), "--tuned", str(tuned_dir), "--rank", "2", "--out", str(out)]
    r = subprocess.run([sys.executable, "-c", child, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert "torch during the reads: False" in r.stderr, r.stderr[-2000:]
    assert (out / "adapter_model.safetensors").is_file()
