"""The model as a server runs it (text-only or vision-language), reached from the base's layout through the
registry: shared by the serving profiles."""

from __future__ import annotations

from typing import Any

from adapterdoc.layouts import LAYOUTS, remap_path, tower_segment

SERVED_AS = ("text", "vl")

_VL_SEGMENTS = (
    "visual",
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "embed_vision",
    "embed_audio",
)


def is_vl(layout: str | None) -> bool:
    """Whether the registry layout has a vision or audio tower (a vision-language class)."""
    return bool(layout in LAYOUTS and any(t in _VL_SEGMENTS for t in LAYOUTS[layout].towers))


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


def served_modules(meta: Any, layout: str | None) -> set[str] | None:
    """Module names of the model as served: the base's own, or renamed along the registry move to ``layout``."""
    if layout is None:
        return None
    if layout == meta.layout:
        return set(meta.base_modules)
    path = remap_path(meta.layout, layout) if meta.layout else None
    if path is None:
        return None
    rules = [r for _, rs in path for r in rs]
    out = set()
    for name in meta.base_modules:
        for r in rules:
            name = r.apply(name)
        if is_vl(layout) or tower_segment(name) is None:
            out.add(name)
    return out
