"""Weight findings: the lora_B zero and NaN/Inf scans (:mod:`adapterdoc.st.tensors`, or torch for a pickle) and
the weights audit's inert-module findings and gate (:mod:`adapterdoc.audit`)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adapterdoc.adapter import LoraKey
from adapterdoc.checkpoint import Checkpoint, load_bin
from adapterdoc.errors import MissingExtraError, UnsupportedInputError
from adapterdoc.report.findings import Finding, make
from adapterdoc.verify.common import MAX_LISTED, at

if TYPE_CHECKING:
    from torch import Tensor

    from adapterdoc.audit import Audit

Scan = tuple[bool, int | None, int]
"""(scanned, the first non-zero index or ``None``, the NaN/Inf count) of one tensor."""


@dataclass(frozen=True)
class WeightCheck:
    """The weight findings and what the report says of the scans: ``lora_b`` (non-zero of total), ``nonfinite``
    (tensor → NaN/Inf count) and the weights audit's summary when it ran."""

    findings: tuple[Finding, ...]
    lora_b: Mapping[str, int]
    nonfinite: Mapping[str, int] = field(default_factory=dict)
    weights: Mapping[str, object] | None = None


def check_weights(
    spec: str, ckpt: Checkpoint, keys: list[LoraKey], mode: str, max_inert_share: float | None = None
) -> WeightCheck:
    b_keys = [k.key for k in keys if k.role in ("lora_B", "lora_embedding_B")]
    audit = _audit(spec, ckpt, mode, max_inert_share)
    results: dict[str, Scan] = {}
    if audit is not None:  # the audit decoded every LoRA factor once: reuse its zero and NaN/Inf counts
        wanted = set(b_keys) if mode == "lora-b" else None
        for name, t in audit.tensors.items():
            if t.scanned and (wanted is None or name in wanted):
                results[name] = (True, 0 if t.nonzero else None, t.nonfinite)
    rest_b = [k for k in b_keys if k not in results]
    other = (
        [k.key for k in keys if k.key not in set(b_keys) and k.key not in results] if mode == "all" else []
    )
    results.update(_scan(ckpt, rest_b, other, mode))
    out: list[Finding] = []
    zero: list[str] = []
    nonzero = 0
    unscanned: list[str] = []
    nonfinite: dict[str, int] = {}
    for name, (scanned, first, bad) in results.items():
        if not scanned:
            unscanned.append(name)
            continue
        if bad:
            nonfinite[name] = bad
        if name in b_keys:
            if first is None:
                zero.append(name)
            else:
                nonzero += 1
    if b_keys and not nonzero and not unscanned:
        out.append(
            make(
                "AD301",
                f"all {len(b_keys)} lora_B tensor(s) are exactly zero: the adapter changes nothing",
                path=spec,
            )
        )
    elif zero:
        for name in zero[:MAX_LISTED]:
            out.append(
                make("AD302", f"lora_B is all zero ({nonzero} of {len(b_keys)} are not)", path=spec, key=name)
            )
    for name, bad in list(nonfinite.items())[:MAX_LISTED]:
        dtype = ckpt.tensors[name].dtype
        out.append(make("AD303", f"{bad} NaN/Inf value(s) ({dtype})", path=spec, key=name))
    if unscanned:
        out.append(make("AD304", f"{len(unscanned)} tensor(s) not scanned", path=spec, key=unscanned[0]))
    lora_b = {"nonzero": nonzero, "total": len(b_keys)}
    if audit is None:
        return WeightCheck(tuple(out), lora_b, nonfinite)
    out += _audit_findings(spec, audit, max_inert_share, all_b_zero=any(f.code == "AD301" for f in out))
    return WeightCheck(tuple(out), lora_b, nonfinite, audit.summary())


def _audit(spec: str, ckpt: Checkpoint, mode: str, max_inert_share: float | None) -> Audit | None:
    """The weights audit of a safetensors adapter, unless the scan is the quick ``nonzero`` one (which stops at
    each lora_B's first non-zero element) and no inert-share gate asks for it; ``None`` without numpy then."""
    if ckpt.weights_format != "safetensors" or (mode == "nonzero" and max_inert_share is None):
        return None
    from adapterdoc.audit import audit_checkpoint

    try:
        return audit_checkpoint(ckpt, ranks=False)
    except UnsupportedInputError:
        if max_inert_share is not None:
            raise
        return None


def _audit_findings(spec: str, audit: Audit, limit: float | None, *, all_b_zero: bool) -> list[Finding]:
    """The audit's delta findings (AD310-AD312; AD310 only when AD301 has not said it already) and the gate."""
    keep = ("AD311", "AD312") if all_b_zero else ("AD310", "AD311", "AD312")
    out = [at(f, spec) for f in audit.findings if f.code in keep]
    n = len(audit.measured)
    if limit is not None and n and audit.inert_share > limit:
        out.append(
            make(
                "AD313",
                f"{audit.inert_count} of {n} LoRA module(s) ({audit.inert_share:.0%}) are inert; "
                f"the limit is {limit:.0%}",
                path=spec,
                hint=f"adapterdoc inspect {shlex.quote(spec)} --weights --plot inert.png",
            )
        )
    return out


def _scan(ckpt: Checkpoint, b_keys: list[str], other: list[str], mode: str) -> dict[str, Scan]:
    """name → (scanned, first non-zero index or None, NaN/Inf count)."""
    if ckpt.weights_format == "bin":
        return _scan_bin(ckpt, b_keys, other, mode)
    from adapterdoc.st.tensors import scan_tensor

    headers = {h.path: h for h in ckpt.headers}
    out: dict[str, Scan] = {}
    finite = mode in ("all", "lora-b")
    for name in b_keys:
        s = scan_tensor(
            headers[ckpt.tensor_file[name]], name, zeros=True, finite=finite, stop_at_nonzero=not finite
        )
        out[name] = (s.scanned, s.first_nonzero, s.nonfinite or 0)
    for name in other:
        s = scan_tensor(headers[ckpt.tensor_file[name]], name, zeros=False, finite=True)
        out[name] = (s.scanned, None, s.nonfinite or 0)
    return out


def _scan_bin(ckpt: Checkpoint, b_keys: list[str], other: list[str], mode: str) -> dict[str, Scan]:
    """The same scan of a ``.bin``'s tensors, read by the restricted unpickler (no torch); a legacy (pre-zip)
    pickle by torch, and not scanned without it."""
    from adapterdoc.st.pickled import LegacyFormatError, read_pickled
    from adapterdoc.st.tensors import scan_bytes

    path = ckpt.weights_path or ckpt.root
    finite = mode != "nonzero"
    legacy = None
    try:
        pickled = read_pickled(path)
    except LegacyFormatError:
        pickled = None
        try:
            legacy = load_bin(path)
        except MissingExtraError:
            return {n: (False, None, 0) for n in [*b_keys, *other]}
    out: dict[str, Scan] = {}
    for name in [*b_keys, *other]:
        if pickled is not None:
            t = pickled[name]
            scanned, first, bad = scan_bytes(t.data, t.dtype, finite=finite)
        else:
            assert legacy is not None  # the legacy pickle, read by torch
            scanned, first, bad = _scan_torch(legacy[name], zeros=name in b_keys, finite=finite)
        out[name] = (scanned, first if name in b_keys else None, bad)
    return out


def _scan_torch(tensor: Tensor, *, zeros: bool, finite: bool) -> Scan:
    import torch

    t = tensor.detach().reshape(-1)
    first = None
    if zeros:
        nz = torch.nonzero(t.ne(0))
        first = int(nz[0]) if len(nz) else None
    bad = int((~torch.isfinite(t)).sum()) if t.is_floating_point() and finite else 0
    return True, first, bad
