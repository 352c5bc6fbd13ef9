"""``verify`` against a quantized base: the adapter's targeted modules matched to the modules the base stores
quantized (by module path: the base renames the tensors, ``q_proj.qweight``, and LoRA targets ``q_proj``), the
summary (AD280), the logical shapes against the LoRA factors (AD281) and what the profile's engine does with LoRA
on that quantization (:meth:`adapterdoc.engines.base.Profile.quantized_base`). Torch-free."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.quant.text import scheme_text
from adapterdoc.report.findings import Finding, make

if TYPE_CHECKING:
    from adapterdoc.adapter import LoraKey
    from adapterdoc.engines.base import Profile
    from adapterdoc.quant import Quantization, QuantizedModule

EXAMPLES = 3
"""How many module paths a summary names."""


@dataclass(frozen=True)
class QuantMatch:
    """The adapter's LoRA modules (``targeted``, as the adapter names them) and, for each one the base stores
    quantized, that module."""

    targeted: tuple[str, ...]
    quantized: dict[str, tuple[QuantizedModule, ...]]
    """Adapter module → the quantized module(s) it targets (several for a fused-expert module whose parameters
    are stored one by one)."""

    def modules(self) -> list[QuantizedModule]:
        """The quantized modules targeted, each once, in the adapter's order."""
        seen: dict[str, QuantizedModule] = {}
        for found in self.quantized.values():
            for m in found:
                seen.setdefault(m.path, m)
        return list(seen.values())


def check_quantization(
    spec: str,
    q: Quantization | None,
    keys: Sequence[LoraKey],
    shapes: Mapping[str, tuple[int, ...]],
    profile: Profile,
    flagged: Collection[str] = (),
) -> list[Finding]:
    """The findings of adapter ``spec`` (its ``keys`` and tensor ``shapes``) on a base quantized as ``q``; none
    when the base is not quantized (``q`` None or scheme ``none``). ``flagged``: keys whose shape verify's key
    check already reports (AD222), not reported again."""
    if q is None or q.scheme == "none":
        return []
    match = match_modules(q, keys)
    return [
        summary(spec, q, match),
        *shape_mismatches(spec, match, [k for k in keys if k.key not in flagged], shapes),
        *profile.quantized_base(spec, q, match.modules()),
    ]


def match_modules(q: Quantization, keys: Sequence[LoraKey]) -> QuantMatch:
    """Each LoRA module of ``keys`` matched to the base's quantized modules: the same path; else one path ending
    with the other (a wrapper prefix on either side), when only one module matches; else, for a fused-expert
    module, the parameters stored under it (``experts.gate_up_proj``)."""
    targeted = list(dict.fromkeys(k.target for k in keys if k.is_lora))
    by_path = {m.path: m for m in q.modules}
    quantized: dict[str, tuple[QuantizedModule, ...]] = {}
    for module in targeted:
        found = _match(module, by_path)
        if found:
            quantized[module] = found
    return QuantMatch(tuple(targeted), quantized)


def _match(module: str, by_path: Mapping[str, QuantizedModule]) -> tuple[QuantizedModule, ...]:
    if module in by_path:
        return (by_path[module],)
    ends = [m for p, m in by_path.items() if p.endswith("." + module) or module.endswith("." + p)]
    if len(ends) == 1:
        return (ends[0],)
    return tuple(m for p, m in by_path.items() if p.startswith(module + ".") and m.experts is not None)


def summary(spec: str, q: Quantization, match: QuantMatch) -> Finding:
    """AD280: the scheme and geometry, and how many of the adapter's targeted modules are quantized."""
    what = f"the base is quantized: {scheme_text(q)}"
    if not q.modules:
        msg = f"{what}, by its config ({q.method}); no weights were read, so which modules are quantized is not known"
        return make("AD280", msg, path=spec)
    n, total = len(match.quantized), len(match.targeted)
    msg = f"{what}, {len(q.modules)} modules; {n} of the adapter's {total} targeted modules are quantized"
    if n:
        msg += f" (e.g. {_examples(list(match.quantized))})"
    plain = [t for t in match.targeted if t not in match.quantized]
    if plain and n:
        msg += f"; stored unquantized: {_examples(plain)}"
    return make("AD280", msg, path=spec)


def shape_mismatches(
    spec: str, match: QuantMatch, keys: Sequence[LoraKey], shapes: Mapping[str, tuple[int, ...]]
) -> list[Finding]:
    """AD281 per LoRA factor whose size disagrees with the logical ``(out, in)`` of the quantized module it
    targets (``lora_A`` ``[r, in]``, ``lora_B`` ``[out, r]``; stacked expert parameters are not compared)."""
    out: list[Finding] = []
    for k in keys:
        if k.role not in ("lora_A", "lora_B"):
            continue
        found = match.quantized.get(k.target, ())
        if len(found) != 1 or found[0].experts is not None:
            continue
        m, shape, logical = found[0], shapes.get(k.key, ()), found[0].shape
        if len(shape) != 2 or logical is None:
            continue
        side, have, want = (
            ("in", shape[1], logical[1]) if k.role == "lora_A" else ("out", shape[0], logical[0])
        )
        if have != want:
            out.append(
                make(
                    "AD281",
                    f"{m.path} is stored {m.scheme} with logical shape (out, in) {logical}, but {k.role} "
                    f"{list(shape)} has {side} {have}",
                    path=spec,
                    key=k.key,
                )
            )
    return out


def _examples(paths: Sequence[str]) -> str:
    shown = ", ".join(paths[:EXAMPLES])
    return shown if len(paths) <= EXAMPLES else f"{shown} and {len(paths) - EXAMPLES} more"
