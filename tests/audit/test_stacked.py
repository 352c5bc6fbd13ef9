"""The stacked audit (:mod:`adapterdoc.audit.stacked`) against the per-slice route it replaced (one
``core_singular_values`` per module or expert): delta norms within 1e-9 relative and equal ranks on random
non-degenerate factors, near-rank-deficient slices (where the old route fell back to QR), exactly deficient,
zero and cancelling slices, dense and fused-expert layouts; and ``audit_checkpoint(ranks=False)`` (verify's
gate) against the full audit on a written adapter. numpy only."""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")

from adapterdoc.audit import audit_checkpoint  # noqa: E402
from adapterdoc.audit.measure import effective_rank, numerical_rank  # noqa: E402
from adapterdoc.audit.stacked import core_singular_values, stacked_measure  # noqa: E402
from adapterdoc.checkpoint import open_checkpoint  # noqa: E402


def _old(a: Any, b: Any, experts: int) -> list[tuple[float, int, int]]:
    """The per-slice audit as it was: (‖B A‖_F, effective rank, numerical rank) of each expert."""
    r = a.shape[0] // experts
    a3 = a.reshape(experts, r, a.shape[1])
    b3 = b.reshape(b.shape[0], r, experts)
    out = []
    for e in range(experts):
        sv = core_singular_values(np, a3[e], b3[:, :, e])
        dim = max(b.shape[0], a.shape[1])
        out.append(
            (math.sqrt(float(np.sum(sv * sv))), effective_rank(sv.tolist()), numerical_rank(sv.tolist(), dim))
        )
    return out


def _slice(rng: Any, r: int, out: int, fan_in: int, kind: str) -> tuple[Any, Any]:
    """One (A [r, in], B [out, r]) pair of the given conditioning."""
    b = rng.standard_normal((out, r)) * 0.01
    a = rng.standard_normal((r, fan_in)) * 0.02
    if kind == "random":
        return a, b
    if kind.startswith("spread"):  # B A with singular values decaying to `spread` of the largest
        spread = float(kind[6:])
        u = np.linalg.qr(rng.standard_normal((out, r)))[0]
        v = np.linalg.qr(rng.standard_normal((fan_in, r)))[0]
        s = np.array([spread ** (i / max(1, r - 1)) for i in range(r)])
        mix = np.linalg.qr(rng.standard_normal((r, r)))[0]
        return mix.T @ v.T, (u * s) @ mix
    if kind == "deficient":  # one lora_B column repeats another: rank r - 1 exactly
        b[:, -1] = b[:, 0]
        return a, b
    if kind == "zero_b":
        return a, np.zeros_like(b)
    if kind == "zero_a":
        return np.zeros_like(a), b
    if kind == "cancel":  # B = [b, b, ...], A rows a and -a + tiny: B A is tiny beside ‖B‖ ‖A‖
        b[:, 1] = b[:, 0]
        a[1] = -a[0] + 1e-9 * rng.standard_normal(fan_in)
        return a, b
    raise KeyError(kind)


KINDS = ["random", "spread1e-3", "spread3e-5", "spread1e-9", "deficient", "zero_b", "zero_a", "cancel"]


def _fuse(pairs: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """PEFT's fused-expert layout: A rows expert-major, B column ``j * experts + e``."""
    experts = len(pairs)
    r = pairs[0][0].shape[0]
    a = np.concatenate([p[0] for p in pairs])
    b = np.empty((pairs[0][1].shape[0], r * experts))
    for e, (_, be) in enumerate(pairs):
        b[:, e::experts] = be
    return a, b


@pytest.mark.parametrize("r", [2, 8])
@pytest.mark.parametrize("ranks", [True, False])
def test_stacked_experts_match_the_per_slice_route(r: int, ranks: bool) -> None:
    rng = np.random.default_rng(r)
    pairs = [_slice(rng, r, 96, 80, KINDS[i % len(KINDS)]) for i in range(3 * len(KINDS))]
    a, b = _fuse(pairs)
    norms, svs = stacked_measure(np, a, b, len(pairs), ranks=ranks)
    old = _old(a, b, len(pairs))
    for e, ((norm, eff, num), new, sv) in enumerate(zip(old, norms, svs)):
        assert new == pytest.approx(norm, rel=1e-9, abs=0), (e, KINDS[e % len(KINDS)])
        if ranks:
            assert (effective_rank(sv), numerical_rank(sv, 96)) == (eff, num), (e, KINDS[e % len(KINDS)])
        else:
            assert sv is None


@pytest.mark.parametrize("kind", KINDS)
def test_stacked_dense_module_matches_the_per_slice_route(kind: str) -> None:
    rng = np.random.default_rng(3)
    a, b = _slice(rng, 16, 300, 200, kind)
    (norm,), (sv,) = stacked_measure(np, a, b, 1)
    ((want, eff, num),) = _old(a, b, 1)
    assert norm == pytest.approx(want, rel=1e-9, abs=0)
    assert (effective_rank(sv), numerical_rank(sv, 300)) == (eff, num)


def _write_adapter(folder: Path, modules: dict[str, tuple[Any, Any]], r: int) -> None:
    """A BF16 PEFT adapter (values rounded to BF16 by truncation) with plain linear LoRA modules."""
    folder.mkdir()
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, pos = [], 0
    for mod, (a, b) in modules.items():
        for role, x in (("lora_A", a), ("lora_B", b)):
            raw = (x.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
            name = f"base_model.model.{mod}.{role}.weight"
            header[name] = {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [pos, pos + len(raw)]}
            blobs.append(raw)
            pos += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    targets = sorted({m.rpartition(".")[2] for m in modules})
    cfg = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": 2 * r,
        "target_modules": targets,
        "task_type": "CAUSAL_LM",
    }
    (folder / "adapter_config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("low_rank", [False, True])
def test_gate_audit_matches_the_full_audit(tmp_path: Path, low_rank: bool) -> None:
    """verify's audit (``ranks=False``) gives the full audit's norms, shares, inert flags, summary and findings,
    AD312 included when every module's delta is low-rank (then every rank is measured)."""
    rng = np.random.default_rng(5)
    r = 16
    modules = {}
    for i in range(6):
        for leaf in ("q_proj", "v_proj"):
            a, b = rng.standard_normal((r, 64)) * 0.02, rng.standard_normal((48, r)) * 0.01
            if low_rank:
                b[:, 3:] = 0
            if i == 5 and leaf == "v_proj":
                b[:] = 0  # one inert module
            modules[f"model.layers.{i}.self_attn.{leaf}"] = (a, b)
    _write_adapter(tmp_path / "ad", modules, r)
    ckpt = open_checkpoint(str(tmp_path / "ad"))
    full, gate = audit_checkpoint(ckpt), audit_checkpoint(ckpt, ranks=False)
    assert gate.summary() == full.summary()
    assert [f.code for f in gate.findings] == [f.code for f in full.findings]
    assert [f.message for f in gate.findings] == [f.message for f in full.findings]
    assert ("AD312" in [f.code for f in full.findings]) == low_rank
    for g, f in zip(gate.modules, full.modules, strict=True):
        assert (g.module, g.delta_norm, g.share, g.inert) == (f.module, f.delta_norm, f.share, f.inert)
    measured = [g for g in gate.modules if g.effective_rank is not None]
    assert len(measured) == (len(full.modules) - 1 if low_rank else 1)  # only the live modules AD312 needed


def test_threaded_audit_equals_the_one_thread_audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Modules measured on two threads give the one-thread audit exactly: entries in file order, every number
    bitwise, the tensors (and so AD303's order) in read order, the bytes read."""
    import adapterdoc.audit as audit_mod

    rng = np.random.default_rng(11)
    r = 8
    modules = {}
    for i in range(12):
        for leaf in ("q_proj", "v_proj"):
            a, b = rng.standard_normal((r, 40 + i)) * 0.02, rng.standard_normal((24 + i, r)) * 0.01
            if i in (3, 7) and leaf == "v_proj":
                b[0, 0] = np.nan  # AD303 twice: their order is the read order
            modules[f"model.layers.{i}.self_attn.{leaf}"] = (a, b)
    _write_adapter(tmp_path / "ad", modules, r)
    ckpt = open_checkpoint(str(tmp_path / "ad"))
    assert audit_mod._workers(ckpt, 24) == min(2, len(os.sched_getaffinity(0)))
    threaded = audit_checkpoint(ckpt)
    monkeypatch.setattr(audit_mod, "WORKERS", 1)
    single = audit_checkpoint(ckpt)
    assert threaded == single  # dataclass equality: modules, tensors, findings, notes, bytes_read
    assert list(threaded.tensors) == list(single.tensors)
    assert [f.key for f in threaded.findings if f.code == "AD303"] == [
        f"base_model.model.model.layers.{i}.self_attn.v_proj.lora_B.weight" for i in (3, 7)
    ]
    assert threaded.bytes_read == sum(2 * (a.size + b.size) for a, b in modules.values())


def _write_fused_adapter(folder: Path, dtype: str, experts: int = 6) -> None:
    """Three layers of fused experts (PEFT's ``target_parameters``, r=2) in ``dtype``: expert 1 has a zero B,
    expert 2 rows that nearly cancel (B's two columns equal)."""
    rng = np.random.default_rng(3)
    r, fan_in, out = 2, 40, 24
    folder.mkdir()
    header: dict[str, Any] = {}
    blobs, pos = [], 0
    for layer in range(3):
        a = rng.standard_normal((experts * r, fan_in)) * 0.02
        b = rng.standard_normal((out, r * experts)) * 0.01
        b[:, 1::experts] = 0  # expert 1: zero B
        a[2 * r + 1] = -a[2 * r] * (1 + 1e-3)  # expert 2: rows that nearly cancel (B's two columns equal)
        b[:, 2 + experts] = b[:, 2]
        for role, x in (("lora_A", a), ("lora_B", b)):
            if dtype == "BF16":
                raw = (x.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
            else:
                raw = x.astype("<f2" if dtype == "F16" else "<f4").tobytes()
            name = f"base_model.model.model.layers.{layer}.mlp.experts.{role}.weight"
            header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [pos, pos + len(raw)]}
            blobs.append(raw)
            pos += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 4, "target_modules": [], "task_type": "CAUSAL_LM"}
    cfg["target_parameters"] = ["mlp.experts.gate_up_proj"]
    (folder / "adapter_config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_narrow_reads_give_the_float64_audit_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    """Fused experts at r ≤ 4 are read as float32 (exact) and widened inside einsum: every number equals the
    float64 reads' bitwise, zero and cancelling experts (the per-slice fallback) included."""
    import importlib

    measure_mod = importlib.import_module(
        "adapterdoc.audit.measure"
    )  # the package's `measure` is the function
    experts = 6
    folder = tmp_path / "ad"
    _write_fused_adapter(folder, dtype, experts)
    ckpt = open_checkpoint(str(folder))
    narrow = audit_checkpoint(ckpt)
    assert [m.kind for m in narrow.modules] == ["experts"] * 3 * experts
    assert narrow.modules[1].delta_norm == 0 and narrow.modules[2].delta_norm
    monkeypatch.setattr(measure_mod, "narrow_ok", lambda experts, r: False)
    assert audit_checkpoint(ckpt) == narrow
