"""The model as a server runs it (text-only or vision-language), reached from the base's layout through the
registry: shared by the serving profiles (and which engines serve an adapter ``remap --for`` refuses)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from adapterdoc.layouts import LAYOUTS, move_rules, rename, tower_segment

if TYPE_CHECKING:
    from adapterdoc.bases import BaseSpec
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


def layout_of_base(spec: object, what: str) -> str | None:
    """The registry layout of a resolved base: its tiny layout, or the layout whose class and model type its
    config.json names (``architectures[0]``, else the model type's registry class)."""
    from adapterdoc.bases import BaseSpec, read_config_json
    from adapterdoc.layouts.trees import Unmodeled, model_class_name

    assert isinstance(spec, BaseSpec)
    if spec.kind == "tiny":
        return spec.tiny_layout
    raw = read_config_json(spec)
    try:
        cls = model_class_name(raw)
    except Unmodeled:
        return None
    hits = [
        n for n, lay in LAYOUTS.items() if lay.model_class == cls and lay.model_type == raw.get("model_type")
    ]
    return hits[0] if hits else None


def serving_elsewhere(
    engine: str, raw: Mapping[str, object], modules: list[str], spec: BaseSpec | None, dropped: str
) -> str:
    """What a refusal of ``remap --for ENGINE`` suggests: the other engines whose own rules take this adapter as
    it is (their profile's :meth:`~adapterdoc.engines.base.Profile.unservable` says nothing, they read
    expert LoRA where it has some, and ``dropped`` (a layer type some layers lack) is no reason for them to drop
    it), else none; a merge always works."""
    from adapterdoc.engines import PROFILES, get_profile

    layout, model_type = _base_type(spec)
    experts = any(".experts." in m or m.endswith(".experts") for m in modules)
    fits = []
    for other in PROFILES:
        if other == engine:
            continue
        profile = get_profile(other)
        needs = profile.needs(layout, None)
        if needs is None or profile.unservable(raw, modules, model_type) is not None:
            continue
        if (experts and not needs.expert_lora) or (dropped and profile.drops_partial_layer_types()):
            continue
        fits.append(profile.summary.split()[0])
    merge = "merge it into the base (adapterdoc merge ADAPTER --base BASE --out DIR)"
    if not fits:
        return f"no other engine adapterdoc knows serves it as it is; {merge}"
    return f"serve the adapter on {' or '.join(fits)}, or {merge}"


def _base_type(spec: BaseSpec | None) -> tuple[str | None, str | None]:
    """(registry layout, ``model_type``) of a resolved base (``None`` each when it does not say)."""
    from adapterdoc.bases import read_config_json
    from adapterdoc.errors import AdapterdocError

    if spec is None:
        return None, None
    try:
        layout = layout_of_base(spec, spec.spec)
        if layout in LAYOUTS:
            return layout, LAYOUTS[layout].model_type
        mt = read_config_json(spec).get("model_type") if spec.kind != "tiny" else None
    except (AdapterdocError, OSError, ValueError):
        return None, None
    return None, mt if isinstance(mt, str) else None
