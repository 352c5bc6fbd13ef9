"""Measuring one LoRA module: where it sits (group, layer, leaf, expert), its delta norm and ranks from an
``r × r`` core (``B A`` is never formed), per expert for fused experts, and which modules are inert."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, TypedDict

from adapterdoc.adapter import AdapterConfig, fused_expert_owner
from adapterdoc.audit.read import FactorPair, Reader
from adapterdoc.audit.stacked import (
    GRAM_SAFE,
    core_singular_values,
    narrow_ok,
    stacked_grams,
    stacked_measure,
)
from adapterdoc.layouts import EXPERT_SPELLINGS
from adapterdoc.report.audit_report import ENERGY, INERT_RELATIVE, ModuleDelta, TensorRead

if TYPE_CHECKING:
    from numpy import ndarray as NDArray

__all__ = [
    "GRAM_SAFE",
    "Measured",
    "classify",
    "core_singular_values",
    "effective_rank",
    "measure",
    "numerical_rank",
    "place",
]

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


class SharedFields(TypedDict, total=False):
    """The :class:`ModuleDelta` fields one module's entries share (empty for a pair not measured)."""

    module: str
    kind: str
    rank: int
    scaling: float | None
    parameter: str | None
    layer: int | None
    group: str
    leaf: str
    dtype: str
    nonfinite: int


@dataclass(frozen=True)
class Measured:
    """One module's audit before the adapter's total is known: each entry's delta norm and ranks (one entry per
    expert for fused experts; a norm is ``None`` when a factor holds NaN/Inf), the fields its entries share, and
    what reading each factor found, in the order the factors were read. :func:`classify` builds the entries,
    once, with their shares and inert flags."""

    reads: tuple[tuple[str, TensorRead], ...]
    norms: tuple[float | None, ...] = ()
    effective: tuple[int | None, ...] = ()
    numerical: tuple[int | None, ...] = ()
    experts: tuple[int | None, ...] = ()
    """Each entry's ``expert``."""
    rank: int = 0
    common: SharedFields = field(default_factory=SharedFields)
    """The :class:`ModuleDelta` fields the module's entries share (all but the per-entry ones above, the share and
    the inert flag)."""


def measure(
    g: FactorPair, cfg: AdapterConfig | None, reader: Reader, np: ModuleType, *, ranks: bool = True
) -> Measured:
    """The module's entries (one per expert for fused experts), measured together from stacked ``r × r`` Gram
    matrices (:mod:`adapterdoc.audit.stacked`); ``ranks=False`` leaves the effective and numerical ranks ``None``
    (the delta norms, hence the inert test and the shares, do not need them)."""
    owner = fused_expert_owner(g.module)
    fused = owner.endswith(".experts") and (cfg is None or cfg.targets_parameter(owner) or owner != g.module)
    shape = reader.ckpt.tensors[g.a].shape if g.a is not None else ()
    experts = _expert_count(cfg, owner, shape[0]) if fused and len(shape) == 2 else 1
    narrow = narrow_ok(experts, shape[0] // experts) if shape else False
    a = _read(g.a, reader, 0, narrow)
    b = _read(g.b, reader, 1, narrow)
    reads: dict[str, TensorRead] = {}
    for name, arr in ((g.a, a), (g.b, b)):
        if name is not None and arr is None:
            reads[name] = TensorRead(scanned=False)
    if a is None or b is None or a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
        # incomplete or inconsistent pairs are inspect's findings (AD206, AD210); their reads still count
        for name, arr in ((g.a, a), (g.b, b)):
            if name is not None and arr is not None:
                reads[name] = _scan(np, arr, None)[0]
        return Measured(_in_order(g, reads))
    info = reader.ckpt.tensors[g.a or ""]
    group, layer, leaf, expert = place(g.module)
    rows = a.shape[0]
    scaling = cfg.scaling_for(owner) if cfg is not None else None
    kind = "embedding" if experts == 1 and g.embedding else ("experts" if fused else "linear")
    r = rows // experts
    ga, gb = stacked_grams(np, a, b, experts)
    read_a, a = _scan(np, a, ga)
    read_b, b = _scan(np, b, gb)
    reads[g.a or ""], reads[g.b or ""] = read_a, read_b
    bad = read_a.nonfinite + read_b.nonfinite
    param = _fused_parameter(cfg, g.module) if fused else None
    common: SharedFields = {
        "module": g.module,
        "kind": kind,
        "rank": r,
        "scaling": scaling,
        "parameter": param,
        "layer": layer,
        "group": group,
        "leaf": f"{leaf}.{param}" if param else leaf,
        "dtype": info.dtype,
        "nonfinite": bad,
    }
    labels = (expert,) * experts if expert is not None or experts == 1 else tuple(range(experts))
    none: tuple[None, ...] = (None,) * experts
    if bad:
        return Measured(_in_order(g, reads), none, none, none, labels, r, common)
    s = abs(scaling) if scaling is not None else 1.0
    norms, svs = stacked_measure(np, a, b, experts, ranks=ranks, grams=(ga, gb))
    dim = max(b.shape[0], a.shape[1])
    return Measured(
        _in_order(g, reads),
        tuple([s * n for n in norms]),
        tuple([None if sv is None else effective_rank(sv) for sv in svs]),
        tuple([None if sv is None else numerical_rank(sv, dim) for sv in svs]),
        labels,
        r,
        common,
    )


def _expert_count(cfg: AdapterConfig | None, owner: str, rows: int) -> int:
    """Experts in a fused module whose ``lora_A`` has ``rows`` rows (1 unless the config's rank divides them)."""
    if cfg is None:
        return 1
    r = cfg.rank_for(owner)
    return rows // r if r and rows % r == 0 and rows > r else 1


def _in_order(g: FactorPair, reads: dict[str, TensorRead]) -> tuple[tuple[str, TensorRead], ...]:
    return tuple((name, reads[name]) for name in (g.a, g.b) if name is not None and name in reads)


def _read(name: str | None, reader: Reader, slot: int, narrow: bool) -> NDArray | None:
    return None if name is None else reader.read(name, slot, narrow=narrow)


def _scan(np: ModuleType, arr: NDArray, gram: NDArray | None) -> tuple[TensorRead, NDArray]:
    """What reading the factor found, and the factor with NaN/Inf zeroed. The sum of squares comes from the
    Gram matrices' traces when the caller has them (they hold every squared element), else one BLAS pass:
    finite and > 0 settles both counts; otherwise (zero, underflowing, overflowing or NaN/Inf) they are
    counted exactly."""
    if gram is not None:
        ss = float(np.einsum("ejj->", gram))
    else:
        flat = arr.reshape(-1)
        ss = float(np.dot(flat, flat)) if flat.size else 0.0
    if ss > 0 and math.isfinite(ss):
        return TensorRead(scanned=True, nonzero=True, nonfinite=0), arr
    finite = np.isfinite(arr)
    bad = int(arr.size - np.count_nonzero(finite))
    nonzero = bool(np.any(arr != 0))  # NaN counts as non-zero, as in the bit scanner; -0.0 does not
    if bad:
        arr = np.where(finite, arr, 0.0)
    return TensorRead(scanned=True, nonzero=nonzero, nonfinite=bad), arr


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


def inert_limit(results: Sequence[Measured]) -> tuple[float, float]:
    """``Σ delta_norm²`` over every measured entry of ``results`` (in order) and the delta norm at or under which
    an entry is inert (:data:`INERT_RELATIVE` × the root-mean-square delta norm)."""
    sq = sum(n**2 for res in results for n in res.norms if n is not None)
    count = sum(1 for res in results for n in res.norms if n is not None)
    return sq, INERT_RELATIVE * (math.sqrt(sq / count) if count else 0.0)


def classify(results: Sequence[Measured]) -> list[ModuleDelta]:
    """Every entry of ``results``, in order, each built once with its share of ``‖ΔW‖_F²`` and its inert flag
    (the entries are frozen)."""
    sq, limit = inert_limit(results)
    out: list[ModuleDelta] = []
    add = out.append
    for res in results:
        common = res.common
        for n, eff, num, expert in zip(res.norms, res.effective, res.numerical, res.experts):
            m = ModuleDelta(
                **common,
                delta_norm=n,
                effective_rank=eff,
                numerical_rank=num,
                share=None if n is None else (n**2 / sq if sq else 0.0),
                inert=n is not None and (n == 0 or n <= limit),
                expert=expert,
            )
            add(m)
    return out
