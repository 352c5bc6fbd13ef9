"""The weights audit: what each LoRA module changes (``‖scaling · B A‖_F``), its effective rank, and which
modules are inert, from the factors alone (``B A`` is never formed).

Reads only the LoRA factors (``lora_A``/``lora_B``, ``lora_embedding_A``/``B``), one module at a time through
:func:`adapterdoc.st.tensors.tensor_windows`, decoded exactly to float64 with numpy (BF16 and the FP8 formats by
bit manipulation), so memory is a small multiple of the largest tensor and torch is never imported for
safetensors inputs. numpy is the ``weights`` extra (torch installs it too).

Numerics. ``B A`` and a small ``r × r`` core ``R_B R_Aᵀ`` have the same singular values and Frobenius norm
whenever ``B = Q_B R_B`` and ``Aᵀ = Q_A R_A`` with orthonormal ``Q``s (``‖BA‖_F² = tr((BᵀB)(AAᵀ))``). The ``R``s
come from the symmetric eigendecompositions of the Gram matrices ``BᵀB`` and ``AAᵀ`` (BLAS-3 products, 10-30×
faster than Householder QR of the tall factors on this machine: 0.011 s against 0.29 s for an 11008 × 128 factor),
not from the nonsymmetric product ``(BᵀB)(AAᵀ)``, whose eigenvalues can come out negative or complex. The Gram
route squares the condition number: its error in ``σ_i²`` is about ``r · eps · σ_max²``, which leaves norms, the
energy rank and the inert test untouched but blurs singular values below ~1e-8 of the largest. So a module with
any singular value under 1e-4 of its largest (:data:`GRAM_SAFE`) is recomputed from Householder QR of ``B`` and
``Aᵀ`` (TSQR over row blocks), accurate to ``eps · σ_max``: exact rank deficiency is always seen as such.

Definitions (the constants below are the documented thresholds):

- ``delta_norm``: ``|scaling| · ‖B A‖_F``; ``scaling`` is PEFT's: ``alpha / r`` or ``alpha / sqrt(r)`` with rsLoRA,
  with ``rank_pattern``/``alpha_pattern`` per module. For DoRA it is the LoRA part only (a note says so).
- ``effective_rank``: the smallest ``k`` whose top-``k`` singular values hold :data:`ENERGY` of ``‖ΔW‖_F²``, i.e.
  the rank a truncated SVD needs to stay within ``sqrt(1 - ENERGY)`` = 10 % relative Frobenius error (Eckart-Young).
  An energy count rather than Roy & Vetterli's entropy rank, because it is an integer with an operational meaning,
  "the rank that would do", which is what the rank finding recommends. ``numerical_rank`` is the count of singular
  values above ``σ_max · max(out, in) · eps`` (``torch.linalg.matrix_rank``'s default tolerance).
- ``share``: ``delta_norm² / Σ delta_norm²``, the module's part of the whole adapter's squared change (modules are
  disjoint blocks, so the shares add up to 1).
- ``inert``: ``delta_norm ≤`` :data:`INERT_RELATIVE` × the root-mean-square delta norm of all modules (zero
  deltas always are). Fused mixture-of-experts LoRA (PEFT's ``target_parameters``) is audited per expert: each
  expert is its own entry.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.adapter import AdapterConfig, fused_expert_owner, parse_key
from adapterdoc.checkpoint import Checkpoint, load_bin, open_checkpoint
from adapterdoc.errors import UnsupportedInputError
from adapterdoc.report.findings import Finding, make, sort_findings

ENERGY = 0.99
"""Share of a module's ``‖ΔW‖_F²`` its effective rank keeps."""
INERT_RELATIVE = 1e-3
"""A module is inert when its delta norm is at most this fraction of the RMS delta norm over all modules."""
INERT_WARN_SHARE = 0.25
"""AD311 (warning) when at least this share of the modules is inert (and not all of them: that is AD310)."""
RANK_WASTE_FACTOR = 4
"""AD312 (info) when every live module of a rank needs at most ``rank / RANK_WASTE_FACTOR`` for :data:`ENERGY`."""
DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
"""dtypes the audit decodes (others are reported as not read, AD304)."""
DORA_NOTE = (
    "DoRA adapter: delta norms are the LoRA part ‖scaling·B A‖ only; lora_magnitude_vector rescales each "
    "output column of W + ΔW on top of it"
)


@dataclass
class ModuleDelta:
    """One LoRA module's (or one expert's) change, as the audit measured it."""

    module: str
    """The module path without ``base_model.model.`` (fused experts keep ``.base_layer``)."""
    kind: str
    """``linear``, ``embedding`` or ``experts`` (one entry per expert)."""
    rank: int
    """The factors' rank (per expert for fused experts)."""
    scaling: float | None
    delta_norm: float | None
    """``|scaling| · ‖B A‖_F``; ``None`` when a factor holds NaN/Inf."""
    effective_rank: int | None
    numerical_rank: int | None
    share: float | None = None
    inert: bool = False
    expert: int | None = None
    parameter: str | None = None
    """For fused experts: the expert parameter (``gate_up_proj``, ``down_proj``), from the wrapper nesting."""
    layer: int | None = None
    group: str = ""
    """The path before the layer index (``model.layers``), or ``""`` for modules outside any layer stack."""
    leaf: str = ""
    """The path after the layer index, expert index removed (``self_attn.q_proj``, ``mlp.experts.gate_proj``)."""
    dtype: str = ""
    nonfinite: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "rank": self.rank,
            "delta_norm": self.delta_norm,
            "effective_rank": self.effective_rank,
            "inert": self.inert,
            "share": self.share,
            "numerical_rank": self.numerical_rank,
            "scaling": self.scaling,
            "kind": self.kind,
            "expert": self.expert,
            "parameter": self.parameter,
            "layer": self.layer,
            "leaf": self.leaf,
            "dtype": self.dtype,
        }


@dataclass
class TensorRead:
    """What decoding one factor found (verify's lora_B zero scan reads these)."""

    scanned: bool
    nonzero: bool = False
    nonfinite: int = 0


@dataclass
class Audit:
    """The weights audit of one adapter."""

    path: str
    modules: list[ModuleDelta] = field(default_factory=list)
    tensors: dict[str, TensorRead] = field(default_factory=dict)
    """Every factor read (tensor name → result), including those of incomplete modules."""
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bytes_read: int = 0

    @property
    def measured(self) -> list[ModuleDelta]:
        return [m for m in self.modules if m.delta_norm is not None]

    @property
    def total_norm(self) -> float:
        """‖ΔW‖_F of the whole adapter (modules as disjoint blocks)."""
        return math.sqrt(sum(m.delta_norm**2 for m in self.measured))  # type: ignore[operator]

    @property
    def inert_count(self) -> int:
        return sum(1 for m in self.modules if m.inert)

    @property
    def inert_share(self) -> float:
        n = len(self.measured)
        return self.inert_count / n if n else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "modules": len(self.modules),
            "inert": self.inert_count,
            "inert_share": self.inert_share,
            "total_delta_norm": self.total_norm,
            "bytes_read": self.bytes_read,
            "energy": ENERGY,
            "inert_relative": INERT_RELATIVE,
            "notes": list(self.notes),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"weights": self.summary(), "modules": [m.to_dict() for m in self.modules]}


# --------------------------------------------------------------------------------------------- the public API


def audit_adapter(spec: str | os.PathLike[str]) -> Audit:
    """Audit the adapter at ``spec`` (any input :func:`~adapterdoc.checkpoint.open_checkpoint` takes)."""
    return audit_checkpoint(open_checkpoint(spec))


def audit_checkpoint(ckpt: Checkpoint) -> Audit:
    """Audit an opened checkpoint; raises :class:`~adapterdoc.errors.UnsupportedInputError` when its tensor data
    cannot be read here (``hf://`` inputs are header-only; numpy missing)."""
    np = require_numpy(ckpt.spec)
    if ckpt.spec.startswith("hf://"):
        raise UnsupportedInputError(
            ckpt.spec, "--weights reads tensor data, and hf:// inputs are read header-only; download it first"
        )
    path = ckpt.weights_path or ckpt.root
    audit = Audit(path=path)
    cfg = ckpt.adapter_config
    reader = _Reader(ckpt, np)
    groups = _groups(ckpt)
    if any(g.magnitude for g in groups.values()) or (cfg is not None and cfg.use_dora):
        audit.notes.append(DORA_NOTE)
    for g in groups.values():
        audit.modules += _measure(g, cfg, reader, audit, np)
    audit.bytes_read = reader.bytes_read
    _classify(audit.modules)
    audit.findings = sort_findings(_findings(audit, ckpt.spec))
    return audit


def render_heatmap(audit: Audit, path: str | os.PathLike[str]) -> str:
    """Write ``audit``'s heat map to ``path`` (``.png``, or ``.html`` with the table); needs the ``plot`` extra."""
    from adapterdoc.report.heatmap import render_heatmap as render

    return render(audit, path)


HEATMAP_FILE = "delta_heatmap.png"


def report_section(adapter: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> str:
    """Markdown for a run report: the audit's totals and findings, and the heat map (written to
    ``out_dir/delta_heatmap.png``) when matplotlib is installed. Never raises for a missing extra."""
    lines = ["## What the adapter changes (weights audit)", ""]
    try:
        audit = audit_adapter(adapter)
    except UnsupportedInputError as e:
        return "\n".join([*lines, f"Not audited: {e.reason}", ""])
    n = len(audit.measured)
    lines.append(
        f"{n} LoRA module(s), {audit.inert_count} inert ({audit.inert_share:.0%}), "
        f"total delta norm {audit.total_norm:.4g} (`adapterdoc inspect ADAPTER --weights`)."
    )
    lines += [f"- {f.code} ({f.severity}): {f.message}" for f in audit.findings]
    lines.append("")
    try:
        render_heatmap(audit, os.path.join(os.fspath(out_dir), HEATMAP_FILE))
    except UnsupportedInputError as e:
        lines += [f"No heat map: {e.reason}", ""]
    else:
        lines += [f"![LoRA delta norm per layer and module]({HEATMAP_FILE})", ""]
    return "\n".join(lines)


def require_numpy(what: str | None) -> Any:
    """numpy, or a one-line error naming the extra. When this imports it first, OpenBLAS gets one thread (unless
    ``OPENBLAS_NUM_THREADS`` is set): the audit's products are ``r``-sized, and spinning BLAS threads made it
    3× slower on a loaded 2-core machine (1.46 s against 4.1 s for 0.1 GiB)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        import numpy
    except ImportError:
        raise UnsupportedInputError(
            what, "--weights needs numpy, which is not installed: pip install 'adapterdoc[weights]'"
        ) from None
    return numpy


# --------------------------------------------------------------------------------------------- reading


@dataclass
class _Group:
    module: str
    a: str | None = None
    b: str | None = None
    embedding: bool = False
    magnitude: bool = False
    order: tuple[int, int] = (0, 0)


def _groups(ckpt: Checkpoint) -> dict[str, _Group]:
    """LoRA modules in file order, so the reads stream through each file once."""
    out: dict[str, _Group] = {}
    for name in ckpt.tensors:
        k = parse_key(name)
        if k.role == "magnitude":
            out.setdefault(k.module, _Group(k.module)).magnitude = True
            continue
        if not k.is_lora:
            continue
        g = out.setdefault(k.module, _Group(k.module))
        if k.is_a:
            g.a = name
        else:
            g.b = name
        g.embedding = g.embedding or k.role.startswith("lora_embedding")
    files = {p: i for i, p in enumerate(dict.fromkeys(ckpt.tensor_file.values()))}

    def position(name: str) -> tuple[int, int]:
        return files.get(ckpt.tensor_file.get(name, ""), 0), ckpt.tensors[name].begin

    for g in out.values():
        g.order = min((position(n) for n in (g.a, g.b) if n), default=(0, 0))
    return dict(sorted(out.items(), key=lambda kv: kv[1].order))


class _Reader:
    """Decode one tensor at a time to a float64 numpy array (exact for every dtype in :data:`DTYPES`)."""

    def __init__(self, ckpt: Checkpoint, np: Any) -> None:
        self.ckpt = ckpt
        self.np = np
        self.headers = {h.path: h for h in ckpt.headers}
        self.bytes_read = 0
        self._bin: dict[str, Any] | None = None

    def read(self, name: str) -> Any | None:
        """The tensor as float64 (its own shape), or ``None`` when its dtype is not one the audit decodes."""
        info = self.ckpt.tensors[name]
        if self.ckpt.weights_format == "bin":
            return self._read_bin(name)
        if info.dtype not in DTYPES:
            return None
        from adapterdoc.st.tensors import tensor_windows

        np = self.np
        header = self.headers[self.ckpt.tensor_file[name]]
        out = np.empty(info.numel, dtype=np.float64)
        width = _WIDTH[info.dtype]
        for offset, buf in tensor_windows(header, name):
            start = offset // width
            raw = np.frombuffer(buf, dtype=_RAW[info.dtype])
            out[start : start + raw.size] = _decode(np, raw, info.dtype)
            n = raw.size
            del raw  # the window's mmap closes when the generator resumes; no view may outlive it
            self.bytes_read += n * width
        return out.reshape(info.shape)

    def _read_bin(self, name: str) -> Any:
        if self._bin is None:
            self._bin = load_bin(self.ckpt.weights_path or self.ckpt.root)
        t = self._bin[name].detach()
        self.bytes_read += t.numel() * t.element_size()
        return t.double().numpy() if t.is_floating_point() else None


_WIDTH = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_RAW = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
for _d in DTYPES:
    _WIDTH.setdefault(_d, 1)
    _RAW.setdefault(_d, "u1")
_FP8_TABLES: dict[str, Any] = {}


def _decode(np: Any, raw: Any, dtype: str) -> Any:
    if dtype in ("F64", "F32", "F16"):
        return raw  # numpy's IEEE types are exact; the assignment widens to float64 exactly
    if dtype == "BF16":  # bfloat16 is the top half of a float32
        return (raw.astype(np.uint32) << 16).view(np.float32)
    table = _FP8_TABLES.get(dtype)
    if table is None:
        table = _FP8_TABLES[dtype] = np.array([fp8_value(dtype, b) for b in range(256)], dtype=np.float64)
    return table[raw]


_FP8 = {  # exponent bits, mantissa bits, bias, NaN/Inf convention
    "F8_E4M3": (4, 3, 7, "fn"),
    "F8_E5M2": (5, 2, 15, "ieee"),
    "F8_E4M3FNUZ": (4, 3, 8, "fnuz"),
    "F8_E5M2FNUZ": (5, 2, 16, "fnuz"),
}


def fp8_value(dtype: str, byte: int) -> float:
    """The exact value of one FP8 byte (OCP E4M3FN / E5M2, and the FNUZ variants: no -0, 0x80 is NaN)."""
    e_bits, m_bits, bias, style = _FP8[dtype]
    sign = -1.0 if byte & 0x80 else 1.0
    exp = (byte >> m_bits) & ((1 << e_bits) - 1)
    man = byte & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    if style == "fnuz" and byte == 0x80:
        return math.nan
    if style == "fn" and exp == top and man == (1 << m_bits) - 1:
        return math.nan
    if style == "ieee" and exp == top:
        return sign * math.inf if man == 0 else math.nan
    if exp == 0:
        return sign * math.ldexp(man, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) + man, exp - bias - m_bits)


# --------------------------------------------------------------------------------------------- measuring


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


def _measure(
    g: _Group, cfg: AdapterConfig | None, reader: _Reader, audit: Audit, np: Any
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


def _read(name: str | None, reader: _Reader, audit: Audit, np: Any) -> Any | None:
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
    """PEFT wraps the listed ``target_parameters`` of one module in order, the first innermost: the saved module
    with ``j`` ``.base_layer`` suffixes is the ``j``-th from the last."""
    if cfg is None:
        return None
    owner = fused_expert_owner(module)
    params = [
        p.rpartition(".")[2]
        for p in cfg.target_parameters
        if (o := p.rpartition(".")[0]) and (owner == o or owner.endswith("." + o))
    ]
    depth = (len(module) - len(owner)) // len(".base_layer")
    idx = len(params) - 1 - depth
    return params[idx] if 0 <= idx < len(params) else None


def _classify(modules: list[ModuleDelta]) -> None:
    measured = [m for m in modules if m.delta_norm is not None]
    sq = sum(m.delta_norm**2 for m in measured)  # type: ignore[operator]
    rms = math.sqrt(sq / len(measured)) if measured else 0.0
    for m in measured:
        assert m.delta_norm is not None
        m.share = m.delta_norm**2 / sq if sq else 0.0
        m.inert = m.delta_norm == 0 or m.delta_norm <= INERT_RELATIVE * rms


# --------------------------------------------------------------------------------------------- findings


def _findings(audit: Audit, spec: str) -> list[Finding]:
    out: list[Finding] = []
    measured = audit.measured
    n = len(measured)
    inert = audit.inert_count
    if n and inert == n:
        out.append(
            make(
                "AD310",
                f"all {n} LoRA module(s) have a zero delta ‖scaling·B A‖: the adapter changes nothing",
                path=spec,
            )
        )
    elif n and inert / n >= INERT_WARN_SHARE:
        first = next(m for m in measured if m.inert)
        out.append(
            make(
                "AD311",
                f"{inert} of {n} LoRA module(s) ({inert / n:.0%}) are inert "
                f"(delta ≤ {INERT_RELATIVE:g} × the RMS module delta)",
                path=spec,
                key=first.module if first.expert is None else f"{first.module} (expert {first.expert})",
            )
        )
    out += _rank_findings(measured, spec)
    for name, t in audit.tensors.items():
        if t.nonfinite:
            out.append(
                make(
                    "AD303",
                    f"{t.nonfinite} NaN/Inf value(s); its module's delta is not measured",
                    path=spec,
                    key=name,
                )
            )
    unread = [name for name, t in audit.tensors.items() if not t.scanned]
    if unread:
        out.append(
            make(
                "AD304",
                f"{len(unread)} LoRA tensor(s) not read by the weights audit",
                path=spec,
                key=unread[0],
            )
        )
    return out


def _rank_findings(measured: list[ModuleDelta], spec: str) -> list[Finding]:
    by_rank: dict[int, list[ModuleDelta]] = {}
    for m in measured:
        if not m.inert:
            by_rank.setdefault(m.rank, []).append(m)
    out = []
    for rank, mods in sorted(by_rank.items()):
        need = max(m.effective_rank or 0 for m in mods)
        if rank >= RANK_WASTE_FACTOR and need * RANK_WASTE_FACTOR <= rank:
            would = 1 << max(0, (need - 1).bit_length())
            out.append(
                make(
                    "AD312",
                    f"rank {rank}, but no module of that rank needs more than {need} for {ENERGY:.0%} of its "
                    f"delta ({len(mods)} module(s)): r={would} would do",
                    path=spec,
                    key=max(mods, key=lambda m: m.effective_rank or 0).module,
                )
            )
    return out


def leaves(audit: Audit) -> Iterator[tuple[str, list[ModuleDelta]]]:
    """Entries grouped by (group, leaf) in first-seen order (for the text summary)."""
    seen: dict[str, list[ModuleDelta]] = {}
    for m in audit.modules:
        seen.setdefault(f"{m.group}.*.{m.leaf}" if m.group else m.leaf, []).append(m)
    yield from seen.items()
