"""``remap --for``: which model the engine serves (the base's registry layout) and the key move that gives the
adapter that model's keys, from the registry's moves (the ones ``--vl`` / ``--to`` use)."""

from __future__ import annotations

from adapterdoc.checkpoint import Checkpoint
from adapterdoc.engines.served import is_vl, layout_of_base, served_layout
from adapterdoc.errors import AdapterdocError, RefusedError
from adapterdoc.layouts import LAYOUTS, move_rules, remap_path, rename
from adapterdoc.remap.moves import RemapMove, detect, resolve_layout_move, vl_move


def base_layout(
    ckpt: Checkpoint, base: str | None, modules: list[str], notes: list[str]
) -> tuple[str | None, str]:
    """(the registry layout of the model the engine serves, where that came from): ``--base`` when given, else
    ``base_model_name_or_path`` when it resolves locally (a folder or the Hugging Face cache), else the layout the
    adapter's own keys show; ``None`` when none says."""
    from adapterdoc.bases import resolve_base

    if base is not None:
        return layout_of_base(resolve_base(base), base), f"--base {base}"
    cfg = ckpt.adapter_config
    name = cfg.base_model if cfg is not None else None
    if name:
        try:
            layout = layout_of_base(resolve_base(name), name)
        except AdapterdocError as e:
            notes.append(
                f"base_model_name_or_path {name!r} is not available locally ({e.reason}); pass --base"
            )
        else:
            if layout is not None:
                return layout, f"base_model_name_or_path {name}"
    found = detect(modules, cfg.layout_hints if cfg else None)
    if found.name in LAYOUTS:
        return found.name, "the adapter's keys"
    return None, "unknown"


def _settle_text(weights: str, modules: list[str], candidates: tuple[str, ...], served: str | None) -> str:
    """Several layouts fit the keys: the served one if among them, else any when all of them give the same text
    keys (e.g. several text layouts, none of which moves); refused otherwise."""
    if served in candidates:
        return served
    renamed = set()
    for c in candidates:
        target = served_layout(c, "text")
        rules = move_rules(c, target) if target not in (None, c) else ()
        renamed.add(tuple(rename(rules, m) for m in modules) if rules is not None else None)
    if len(renamed) == 1 and None not in renamed:
        return candidates[0]
    raise RefusedError(
        weights,
        f"cannot tell the adapter's layout ({', '.join(candidates)} fit its keys and have different text keys); "
        "pass --base",
    )


def key_move(
    keys: str,
    weights: str,
    modules: list[str],
    hint: list[str] | None,
    served: str | None,
    notes: list[str],
) -> RemapMove | None:
    """The registry move to the keys the engine reads (``None``: the keys stay): ``text``, the language model's own
    text-style keys (the adapter's layout followed to its text counterpart: VL and Omni wrappers removed);
    ``served``, the layout of the class the engine serves (``served``, the base's layout)."""
    if keys == "as-is":
        return None
    found = detect(modules, hint)
    if keys == "text":
        source = found.name if found.name in LAYOUTS else None
        if found.name == "ambiguous":
            source = _settle_text(weights, modules, found.candidates, served)
        if source is None:
            notes.append("the keys match no registry layout: kept as they are (taken as text-style keys)")
            return None
        target = served_layout(source, "text")
        if target is None and is_vl(source):
            notes.append(
                f"the registry has no text layout for {source}: the language model's keys with "
                "`language_model.` removed, as `remap --vl` writes them"
            )
            return vl_move()
    else:
        target = served_layout(served, "vl" if is_vl(served) else "text") if served else None
        if target is None:
            notes.append(
                "the served model is unknown: keys kept as they are (pass --base for the served class)"
            )
            return None
        source = None if found.name == "ambiguous" else found.name
        if source not in LAYOUTS and found.name != "ambiguous":
            notes.append("the keys match no registry layout: kept as they are")
            return None
    if target is None or target == source or target in found.candidates:
        return None
    if source is not None and remap_path(source, target) is None:
        notes.append(
            f"the keys read as {source}, which the registry does not move to {target}: kept as they are "
            "(a model of another family with the same key layout)"
        )
        return None
    return resolve_layout_move(weights, modules, hint, target, source, notes)
