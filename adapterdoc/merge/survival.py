"""Whether an adapter survives being merged into a quantized base and quantized again, per module, before anything
is written (``merge --dry-run``, ``merge --requantize``, ``inspect --weights --base``).

For each quantized module the adapter changes: ``W`` the decoded base weight, ``Δ`` the update PEFT's merge adds
(in float32), ``Q' = encode(W + Δ)`` as the format's library quantizes it, and ``R = decode(Q') − W`` the update
that is really stored. Reported: the share of codes that change, the share of the intended update kept
``⟨R, Δ⟩ / ⟨Δ, Δ⟩``, the cosine of ``R`` and ``Δ``, and ``RMS(Δ)`` in units of the RMS local quantization step. A
module *survives* when it keeps between :data:`KEPT_MIN` and :data:`KEPT_MAX` of its update at a cosine of at least
:data:`COSINE_MIN`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from adapterdoc.merge.edits import Output, Plan
from adapterdoc.report.findings import Finding, make

if TYPE_CHECKING:
    from adapterdoc.merge.delta import AdapterTensors

KEPT_MIN = 0.9
KEPT_MAX = 1.1
COSINE_MIN = 0.9


@dataclass(frozen=True)
class Survival:
    """One quantized module the adapter changes, re-quantized after the merge."""

    module: str
    scheme: str
    codes_changed: float | None
    """Share of the module's codes that change (None when it cannot be encoded)."""
    delta_kept: float | None
    """⟨R, Δ⟩ / ⟨Δ, Δ⟩."""
    cosine: float | None
    delta_steps: float | None
    """RMS(Δ) / RMS(local quantization step)."""
    survives: bool
    why_not_encoded: str | None = None
    """Why adapterdoc cannot encode this module as its library does (then nothing else is measured)."""
    encoded_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False)
    """Stored tensor name → its shape once encoded again (a bitsandbytes quant_state's JSON can change length)."""

    def to_dict(self) -> dict[str, object]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        return {
            "module": self.module,
            "group": group_of(self.module),
            "scheme": self.scheme,
            "codes_changed": r(self.codes_changed),
            "delta_kept": r(self.delta_kept),
            "cosine": r(self.cosine),
            "delta_rms_steps": r(self.delta_steps),
            "survives": self.survives,
            "not_encodable": self.why_not_encoded,
        }


def survival(plan: Plan, tensors: AdapterTensors) -> list[Survival]:
    """Every quantized module the plan changes, measured (reads and decodes each one; nothing is written)."""
    rows: list[Survival] = []
    seen: set[str] = set()
    for _, _, outs in plan.shards:
        for o in outs:
            if o.quantized is None or not o.edits or o.quantized.path in seen:
                continue
            seen.add(o.quantized.path)
            rows.append(_measure(plan, o, tensors))
    return rows


def _measure(plan: Plan, o: Output, tensors: AdapterTensors) -> Survival:
    import torch

    from adapterdoc.merge.decoded import decode_module, merged_weight
    from adapterdoc.quant.codec import NotWritable, decode, encode

    m = o.quantized
    assert m is not None
    before, stored = decode_module(plan, m)
    merged = merged_weight(plan, o, m, before.values.clone(), tensors)
    try:
        encoded = encode(m, merged, stored)
        after = decode(m, {**stored, **encoded})
    except NotWritable as e:
        return Survival(m.path, m.scheme, None, None, None, None, False, str(e))
    delta = merged.sub_(before.values).reshape(-1)
    realized = after.values.sub_(before.values).reshape(-1)
    # float32 dot products (BLAS): the ratios are reported to three digits; float64 copies cost 25x the time
    dd = float(torch.dot(delta, delta))
    rd = float(torch.dot(realized, delta))
    rr = float(torch.dot(realized, realized))
    kept = rd / dd if dd > 0 else 1.0
    cosine = rd / (dd * rr) ** 0.5 if dd > 0 and rr > 0 else (1.0 if dd == rr == 0 else 0.0)
    step = before.step.reshape(-1)
    step_rms = (float(torch.dot(step, step)) / max(step.numel(), 1)) ** 0.5
    delta_rms = (dd / max(delta.numel(), 1)) ** 0.5
    changed = int((after.codes != before.codes).sum()) / max(before.codes.numel(), 1)
    ok = KEPT_MIN <= kept <= KEPT_MAX and cosine >= COSINE_MIN
    steps = delta_rms / step_rms if step_rms else None
    shapes = {m.tensors[s]: tuple(t.shape) for s, t in encoded.items() if s in m.tensors}
    return Survival(m.path, m.scheme, changed, kept, cosine, steps, ok, encoded_shapes=shapes)


def with_encoded_shapes(plan: Plan, rows: list[Survival]) -> Plan:
    """``plan`` (``--requantize``) with each re-encoded tensor's output shape as the encoding gives it."""
    shapes = {name: shape for r in rows for name, shape in r.encoded_shapes.items()}
    shards = [
        (rel, header, [replace(o, shape=shapes.get(o.name, o.shape)) if o.quantized else o for o in outs])
        for rel, header, outs in plan.shards
    ]
    return replace(plan, shards=shards)


_HINTS = {
    "AD522": "keep the merged model in bf16 (merge without --requantize), serve the adapter unmerged (vLLM and "
    "SGLang apply LoRA beside the quantized kernel, exactly), or quantize to a finer format",
    "AD523": "merge to bf16 (without --requantize) and quantize with the format's own tool, or serve unmerged",
}


def group_of(module: str) -> str:
    """The module's group across layers and experts: ``model.layers.*.self_attn.q_proj``."""
    return re.sub(r"\.\d+(?=\.|$)", ".*", module)


def survival_findings(rows: list[Survival], *, requantize: bool) -> list[Finding]:
    """One finding per module group that would not survive: AD522 (the update is lost or bent) or AD523 (the format
    cannot be encoded here); errors with ``--requantize``, warnings otherwise."""
    groups: dict[tuple[str, str], list[Survival]] = {}
    for row in rows:
        if not row.survives:
            kind = "AD523" if row.why_not_encoded else "AD522"
            groups.setdefault((kind, group_of(row.module)), []).append(row)
    findings: list[Finding] = []
    for (code, group), bad in groups.items():
        total = sum(1 for r in rows if group_of(r.module) == group)
        first = bad[0]
        if code == "AD523":
            text = f"{len(bad)} of {total} module(s) cannot be encoded again as {first.scheme}: {first.why_not_encoded}"
        else:
            kept = sum(r.delta_kept or 0.0 for r in bad) / len(bad)
            cos = sum(r.cosine or 0.0 for r in bad) / len(bad)
            changed = sum(r.codes_changed or 0.0 for r in bad) / len(bad)
            text = (
                f"{len(bad)} of {total} module(s) would not survive requantization to {first.scheme}: "
                f"{changed:.3f} of the codes change and {kept:.1%} of the update is kept (cosine {cos:.2f})"
            )
        findings.append(
            make(code, text, key=group, severity=None if requantize else "warning", hint=_HINTS[code])
        )
    return findings
