"""Measuring one LoRA module: where it sits (group, layer, leaf, expert), its delta norm and ranks from an
``r × r`` core (``B A`` is never formed), per expert for fused experts, and which modules are inert."""

from __future__ import annotations

import math
import re
from typing import Any

from adapterdoc.adapter import AdapterConfig, fused_expert_owner
from adapterdoc.audit.read import FactorPair, Reader
from adapterdoc.layouts import EXPERT_SPELLINGS
from adapterdoc.report.audit_report import ENERGY, INERT_RELATIVE, Audit, ModuleDelta, TensorRead

_LAYER = re.compile(r"^(?P<group>.*?)\.(?P<idx>\d+)\.(?P<rest>.+)$")
_EXPERT = re.compile(r"(^|\.)experts\.(?P<e>\d+)(?=\.|$)")


def place(module: str) -> tuple[str, int | None, str, int | None]:
    """(group, layer index, leaf, expert index) of a module path, for tables and the heat map."""
    path = fused_expert_owner(module)
    m = _LAYER.match(path)
    if not m:
        return "", None, path, None
    rest = m["rest"]
    e = _EXPERT.search(rest)
    expert = int(e["e"]) if e else None
    if e:
        rest = rest[: e.start()] + e.group(1) + "experts" + rest[e.end() :]
    return m["group"], int(m["idx"]), rest, expert


def measure(
    g: FactorPair, cfg: AdapterConfig | None, reader: Reader, audit: Audit, np: Any
) -> list[ModuleDelta]:
    a = _read(g.a, reader, audit, np)
    b = _read(g.b, reader, audit, np)
    if a is None or b is None or a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        return []  # incomplete or inconsistent pairs are inspect's findings (AD206, AD210); their reads still count
    info = reader.ckpt.tensors[g.a or ""]
    dtype = info.dtype
    group, layer, leaf, expert = place(g.module)
    owner = fused_expert_owner(g.module)
    fused = owner.endswith(".experts") and (cfg is None or cfg.targets_parameter(owner) or owner != g.module)
    rows = a.shape[0]
    scaling = cfg.scaling_for(owner) if cfg is not None else None
    bad = audit.tensors[g.a or ""].nonfinite + audit.tensors[g.b or ""].nonfinite
    experts = 1
    if fused and cfg is not None:
        r = cfg.rank_for(owner)
        experts = rows // r if r and rows % r == 0 and rows > r else 1
    if experts == 1:
        kind = "embedding" if g.embedding else ("experts" if fused else "linear")
        out = [_entry(g.module, kind, a, b, scaling, bad, np)]
    else:
        r = rows // experts
        a3 = a.reshape(experts, r, a.shape[1])
        b3 = b.reshape(b.shape[0], r, experts)
        out = [_entry(g.module, "experts", a3[e], b3[:, :, e], scaling, bad, np) for e in range(experts)]
        for e, m in enumerate(out):
            m.expert = e
    param = _fused_parameter(cfg, g.module) if fused else None
    for m in out:
        m.group, m.layer, m.leaf, m.dtype, m.parameter = group, layer, leaf, dtype, param
        if expert is not None:
            m.expert = expert
        if param:
            m.leaf = f"{leaf}.{param}"
    return out


def _read(name: str | None, reader: Reader, audit: Audit, np: Any) -> Any | None:
    if name is None:
        return None
    arr = reader.read(name)
    if arr is None:
        audit.tensors[name] = TensorRead(scanned=False)
        return None
    finite = np.isfinite(arr)
    bad = int(arr.size - np.count_nonzero(finite))
    nonzero = bool(np.any(arr != 0))  # NaN counts as non-zero, as in the bit scanner; -0.0 does not
    audit.tensors[name] = TensorRead(scanned=True, nonzero=nonzero, nonfinite=bad)
    if bad:
        arr = np.where(finite, arr, 0.0)
    return arr


def _entry(module: str, kind: str, a: Any, b: Any, scaling: float | None, bad: int, np: Any) -> ModuleDelta:
    rank = a.shape[0]
    if bad:
        return ModuleDelta(module, kind, rank, scaling, None, None, None, nonfinite=bad)
    sv = core_singular_values(np, a, b)
    s = abs(scaling) if scaling is not None else 1.0
    norm = s * math.sqrt(float(np.sum(sv * sv)))
    return ModuleDelta(
        module,
        kind,
        rank,
        scaling,
        norm,
        effective_rank(sv.tolist()),
        numerical_rank(sv.tolist(), max(b.shape[0], a.shape[1])),
    )


GRAM_SAFE = 1e-8
"""The Gram route is kept when every singular value of ``B A`` is at least ``sqrt(GRAM_SAFE)`` (1e-4) of the
largest; below that, the module is recomputed through QR."""
_TSQR_ROWS = 1024


def core_singular_values(np: Any, a: Any, b: Any) -> Any:
    """Singular values of ``B A`` (``A`` [r, in], ``B`` [out, r]) from an ``r × r`` core, largest first.

    Fast route: the Gram matrices ``BᵀB = V_B Λ_B V_Bᵀ`` and ``AAᵀ = V_A Λ_A V_Aᵀ`` (BLAS-3, symmetric ``eigh``)
    give ``R_B = Λ_B^½ V_Bᵀ`` and ``R_A = Λ_A^½ V_Aᵀ`` with ``B = Q_B R_B``, ``Aᵀ = Q_A R_A``, so the core
    ``R_B R_Aᵀ`` has the singular values of ``B A``. Its error in ``σ_i²`` is about ``r · eps · σ_max²``,
    harmless unless some ``σ_i`` is tiny; then (see :data:`GRAM_SAFE`) the core is rebuilt from Householder QR
    of ``B`` and ``Aᵀ`` (block-wise, TSQR), accurate to ``eps · σ_max`` whatever the conditioning."""
    rank = a.shape[0]
    if a.size == 0 or b.size == 0 or not a.any() or not b.any():
        return np.zeros(rank)
    lb, vb = np.linalg.eigh(b.T @ b)
    la, va = np.linalg.eigh(a @ a.T)
    core = (np.sqrt(np.clip(lb, 0, None))[:, None] * vb.T) @ (va * np.sqrt(np.clip(la, 0, None))[None, :])
    sv = np.linalg.svd(core, compute_uv=False)
    if sv[0] > 0 and sv[-1] ** 2 >= GRAM_SAFE * sv[0] ** 2:
        return sv
    return np.linalg.svd(_tsqr_r(np, b) @ _tsqr_r(np, a.T).T, compute_uv=False)


def _tsqr_r(np: Any, x: Any) -> Any:
    """The ``R`` of a tall matrix's QR, from the stacked ``R``s of row blocks (same ``R`` up to row signs)."""
    if x.shape[0] <= 2 * _TSQR_ROWS:
        return np.linalg.qr(x, mode="r")
    blocks = [np.linalg.qr(x[i : i + _TSQR_ROWS], mode="r") for i in range(0, x.shape[0], _TSQR_ROWS)]
    return np.linalg.qr(np.vstack(blocks), mode="r")


def effective_rank(sv: list[float], energy: float = ENERGY) -> int:
    """The smallest ``k`` whose top ``k`` singular values hold ``energy`` of the squared Frobenius norm."""
    sq = sorted((s * s for s in sv), reverse=True)
    total = sum(sq)
    if total == 0:
        return 0
    acc = 0.0
    for k, v in enumerate(sq, 1):
        acc += v
        if acc >= energy * total * (1 - 1e-12):
            return k
    return len(sq)


def numerical_rank(sv: list[float], dim: int) -> int:
    """Singular values above ``σ_max · dim · eps`` (float64), ``torch.linalg.matrix_rank``'s default tolerance."""
    if not sv:
        return 0
    top = max(sv)
    return sum(1 for s in sv if s > top * dim * 2.220446049250313e-16)


def _fused_parameter(cfg: AdapterConfig | None, module: str) -> str | None:
    """The fused parameter a saved module's LoRA belongs to. PEFT matches a ``target_parameters`` entry as the
    parameter's full name or a dotted suffix of it (a bare ``gate_up_proj`` too), and wraps one module's matched
    parameters in the module's own parameter order, whatever the config's order (peft 0.21.2), the first
    innermost: the saved module with ``j`` ``.base_layer`` suffixes is the ``j``-th from the last."""
    if cfg is None:
        return None
    owner = fused_expert_owner(module)
    params: list[str] = []
    for p in cfg.target_parameters:
        o, _, name = p.rpartition(".")
        if (not o or owner == o or owner.endswith("." + o)) and name not in params:
            params.append(name)
    params.sort(key=_module_order)
    depth = (len(module) - len(owner)) // len(".base_layer")
    idx = len(params) - 1 - depth
    return params[idx] if 0 <= idx < len(params) else None


def _module_order(name: str) -> int:
    """Where a fused parameter sits in its module's parameter order (the registry's spellings; unknown last)."""
    known = [n for e in EXPERT_SPELLINGS for n in e.fused]
    return known.index(name) if name in known else len(known)


def classify(modules: list[ModuleDelta]) -> None:
    measured = [m for m in modules if m.delta_norm is not None]
    sq = sum(m.delta_norm**2 for m in measured)  # type: ignore[operator]
    rms = math.sqrt(sq / len(measured)) if measured else 0.0
    for m in measured:
        assert m.delta_norm is not None
        m.share = m.delta_norm**2 / sq if sq else 0.0
        m.inert = m.delta_norm == 0 or m.delta_norm <= INERT_RELATIVE * rms
