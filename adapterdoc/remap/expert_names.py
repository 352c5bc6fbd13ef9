"""The names the expert remap needs: the per-expert leaf names of each MoE style and the fused parameters they fold
into, and how the per-expert style of a fused adapter is chosen.

The spellings come from the registry (:data:`adapterdoc.layouts.EXPERT_SPELLINGS`, the ``experts`` fact of each MoE
layout); this module turns them into what the remap needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from adapterdoc.adapter.expert_picture import split_per_expert
from adapterdoc.layouts import EXPERT_SPELLINGS

GATE_UP = "gate_up_proj"
DOWN = "down_proj"
FUSED_PARAMS = (GATE_UP, DOWN)
"""The fused expert parameters of transformers 5 (``[E, 2I, H]`` and ``[E, H, I]``), in PEFT's nesting order:
with both targeted, ``gate_up_proj`` is the inner ParamWrapper (``experts.base_layer``), ``down_proj`` the outer."""
FUSED_CONTAINER = "mlp"
"""The MoE block's attribute on transformers 5 models (``...mlp.experts``)."""


@dataclass(frozen=True)
class ExpertNames:
    """One per-expert naming style: ``{container}.experts.{e}.{gate|up|down}``."""

    container: str
    gate: str
    up: str
    down: str

    @property
    def leaves(self) -> tuple[str, str, str]:
        return (self.gate, self.up, self.down)

    def leaf_of(self, param: str) -> tuple[str, ...]:
        """The per-expert leaves one fused parameter holds (gate then up for ``gate_up_proj``)."""
        return (self.gate, self.up) if param == GATE_UP else (self.down,)

    def param_of(self, leaf: str) -> str:
        return DOWN if leaf == self.down else GATE_UP


def _styles() -> tuple[ExpertNames, ...]:
    """One style per distinct per-expert spelling in the registry (:data:`adapterdoc.layouts.EXPERT_SPELLINGS`)."""
    out: list[ExpertNames] = []
    for sp in EXPERT_SPELLINGS:
        style = ExpertNames(sp.block, *sp.per_expert)
        if style not in out:
            out.append(style)
    return tuple(out)


STYLES = _styles()
LINEAR = STYLES[0]
"""The common style (the first registered: ``mlp.experts.{e}.gate_proj/up_proj/down_proj``)."""

HINTS: tuple[tuple[str, ExpertNames], ...] = tuple(
    (word, ExpertNames(sp.block, *sp.per_expert)) for sp in EXPERT_SPELLINGS for word in sp.name_hints
)
"""A word in the adapter's ``auto_mapping.base_model_class`` or ``base_model_name_or_path`` (case-insensitive)
that chooses the per-expert style of a fused adapter (the registry's spellings carry no model name); none:
:data:`LINEAR`."""


@dataclass(frozen=True)
class ExpertModule:
    """A per-expert module path split: ``{pre}.{container}.experts.{e}.{leaf}``."""

    pre: str
    container: str
    expert: int
    leaf: str

    @property
    def owner(self) -> str:
        """The fused module path it folds into (``{pre}.mlp.experts``)."""
        return f"{self.pre}.{FUSED_CONTAINER}.experts"


def _split(module: str) -> ExpertModule | None:
    """``module`` split as ``{pre}.{container}.experts.{e}.{leaf}`` (:func:`adapterdoc.adapter.expert_picture.split_per_expert`)."""
    found = split_per_expert(module)
    if found is None:
        return None
    block, e, leaf = found
    pre, _, container = block.removesuffix(".experts").rpartition(".")
    return ExpertModule(pre, container, e, leaf) if pre else None


def per_expert_module(module: str, style: ExpertNames) -> ExpertModule | None:
    """``module`` split when it is one expert's projection in ``style``."""
    em = _split(module)
    if em is None or em.container != style.container or em.leaf not in style.leaves:
        return None
    return em


def per_expert_style(modules: Iterable[str]) -> ExpertNames | None:
    """The style whose per-expert projections ``modules`` carry (the one with most hits), ``None`` for none."""
    counts = {s: 0 for s in STYLES}
    for module in modules:
        em = _split(module)
        if em is None:
            continue
        for s in STYLES:
            if em.container == s.container and em.leaf in s.leaves:
                counts[s] += 1
    best = max(STYLES, key=lambda s: counts[s])
    return best if counts[best] else None


def fused_style(hints: Iterable[str]) -> tuple[ExpertNames, str]:
    """The per-expert style for a fused adapter, and why: from the config's class or base name, else the common
    style."""
    for h in hints:
        for word, style in HINTS:
            if word in h.lower():
                return style, f"`{h}` in adapter_config.json"
    return LINEAR, "the common per-expert names (no hint for another style in adapter_config.json)"


def fused_owner_prefix(owner: str) -> str | None:
    """``{pre}`` of a fused owner ``{pre}.mlp.experts``; ``None`` when ``owner`` is not one."""
    tail = f".{FUSED_CONTAINER}.experts"
    return owner[: -len(tail)] if owner.endswith(tail) else None
