"""What makes several adapters combinable: one layout, one shape per shared module, one value per saved whole
module. Each check refuses with exit 3 naming the fix, or returns the warning findings of what it noticed."""

from __future__ import annotations

from collections.abc import Sequence

from adapterdoc.algebra.read import Source
from adapterdoc.errors import RefusedError
from adapterdoc.report.findings import Finding, make


def check_layouts(sources: Sequence[Source]) -> None:
    """AD955: every adapter's module paths belong to one layout (detected from its keys, as ``inspect`` does)."""
    from adapterdoc.layouts.registry import detect_layout

    names = {s.spec: detect_layout(s.factors, s.config.layout_hints).name for s in sources}
    known = {n for n in names.values() if n not in ("unknown", "ambiguous")}
    if len(known) > 1:
        first = sources[0]
        for s in sources[1:]:
            if names[s.spec] != names[first.spec]:
                raise RefusedError(
                    s.spec,
                    f"AD955: its modules are named for layout {names[s.spec]}, {first.spec}'s for "
                    f"{names[first.spec]}; move its keys first: `adapterdoc remap {s.spec} --to "
                    f"{names[first.spec]}`, then combine",
                )


def check_shapes(sources: Sequence[Source]) -> None:
    """AD956: a module held by several adapters has one ``(out, in)`` shape and one kind in all of them."""
    seen: dict[str, tuple[tuple[int, int], bool, str]] = {}
    for s in sources:
        for name, m in s.factors.items():
            have = seen.setdefault(name, (m.shape, m.embedding, s.spec))
            if have[:2] != (m.shape, m.embedding):
                raise RefusedError(
                    s.spec,
                    f"AD956: module `{name}` is {list(m.shape)} here and {list(have[0])} in {have[2]}: the "
                    "adapters were trained on different bases; combine adapters of one base model",
                )


def check_modules_to_save(sources: Sequence[Source]) -> None:
    """AD957: a whole saved module (``modules_to_save``) held by several adapters has the same value in each."""
    import numpy as np

    seen: dict[str, tuple[object, str]] = {}
    for s in sources:
        for name, arr in s.full.items():
            if name not in seen:
                seen[name] = (arr, s.spec)
                continue
            other, where = seen[name]
            if not (
                isinstance(other, np.ndarray) and other.shape == arr.shape and np.array_equal(other, arr)
            ):
                raise RefusedError(
                    s.spec,
                    f"AD957: it saves `{name}` whole, as {where} does, with another value; no one value is their "
                    "combination: combine adapters where at most one saves that module",
                )


def base_findings(sources: Sequence[Source]) -> list[Finding]:
    """AD958: the configs name different base models (a warning: the shapes already fit)."""
    bases = {s.config.base_model for s in sources if s.config.base_model}
    if len(bases) < 2:
        return []
    return [
        make(
            "AD958",
            f"the adapters name different base models: {', '.join(sorted(bases))}",
            key="base_model_name_or_path",
            hint="check that they were trained on the same weights",
        )
    ]


__all__ = ["base_findings", "check_layouts", "check_modules_to_save", "check_shapes"]
