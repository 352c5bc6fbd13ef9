"""The model as a server runs it (text-only or vision-language), reached from the base's layout through the
registry: shared by the serving profiles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.layouts import LAYOUTS, move_rules, rename, tower_segment

if TYPE_CHECKING:
    from adapterdoc.ml.meta import ExpectedModel

SERVED_AS = ("text", "vl")


def is_vl(layout: str | None) -> bool:
    """Whether ``layout`` is a registry layout with a vision or audio tower (a vision-language class)."""
    return layout in LAYOUTS and LAYOUTS[layout].is_vl


def served_layout(base_layout: str | None, served_as: str) -> str | None:
    """The registry layout of the model as served (``text`` or ``vl``), reached from the base's layout."""
    if base_layout not in LAYOUTS:
        return None
    if served_as == ("vl" if is_vl(base_layout) else "text"):
        return base_layout
    if served_as == "text":
        here: str | None = base_layout
        for _ in range(len(LAYOUTS)):
            here = LAYOUTS[here].text_counterpart if here else None
            if here is None or not is_vl(here):
                return here
        return None
    for name, lay in LAYOUTS.items():  # served as VL on a text base: the VL layout whose counterpart it is
        if lay.text_counterpart == base_layout and is_vl(name):
            return name
    return None


def served_modules(meta: ExpectedModel, layout: str | None) -> set[str] | None:
    """Module names of the model as served: the base's own, or renamed along the registry move to ``layout``."""
    if layout is None:
        return None
    if layout == meta.layout:
        return set(meta.base_modules)
    rules = move_rules(meta.layout, layout) if meta.layout else None
    if rules is None:
        return None
    names = (rename(rules, name) for name in meta.base_modules)
    return {name for name in names if is_vl(layout) or tower_segment(name) is None}
