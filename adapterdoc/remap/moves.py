"""How a remap renames: the three kinds of move (``--vl``, ``--to LAYOUT``, ``--rule``), each acting on whole keys
and on module paths alike, and the choice of source layout when detection is ambiguous."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adapterdoc.adapter import WRAPPER, LoraKey
from adapterdoc.errors import RefusedError, UnsupportedInputError
from adapterdoc.layouts import (
    LAYOUTS,
    STRIP_LANGUAGE_MODEL,
    VL_INFIX,
    Detection,
    Rule,
    apply_move,
    detect_layout,
    get_layout,
    move_rules,
    remap_path,
    rename,
    strip_language_model,
)

INFIX = VL_INFIX
"""What ``--vl`` removes (once) from every key that has it."""
_INDEX = re.compile(r"\.\d+(?=\.)")


def parse_rule(text: str) -> Rule:
    """``'REGEX=>REPLACEMENT'`` → a :class:`Rule` (``re.sub`` syntax, first match only); ``ValueError`` if bad."""
    pattern, sep, replacement = text.partition("=>")
    if not sep:
        raise ValueError(f"{text!r} is not REGEX=>REPLACEMENT")
    if not pattern:
        raise ValueError(f"{text!r} has an empty REGEX")
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{text!r}: bad REGEX: {e}") from None
    try:
        compiled.sub(replacement, "", count=1)  # parses the template and its group references
    except (re.error, IndexError) as e:
        raise ValueError(f"{text!r}: bad REPLACEMENT: {e}") from None
    return Rule(pattern, replacement)


@dataclass(frozen=True)
class RemapMove:
    """How one remap renames keys and module paths."""

    mode: str
    key_fn: Callable[[str, LoraKey], str]
    path_fn: Callable[[str], str]
    """The same move on a module path without the wrapper (used for config entries)."""
    strips_infix: bool
    source: str | None = None
    target: str | None = None
    target_towers: tuple[str, ...] = ()


def vl_move() -> RemapMove:
    return RemapMove("vl", lambda k, _: strip_language_model(k), strip_language_model, strips_infix=True)


def _layout_move(rules: Sequence[Rule], source: str, target: str) -> RemapMove:
    strips = any(r == STRIP_LANGUAGE_MODEL for r in rules)
    towers = get_layout(target).towers
    return RemapMove(
        "to", lambda k, _: apply_move(rules, k), lambda p: rename(rules, p), strips, source, target, towers
    )


def user_move(rules: Sequence[Rule]) -> RemapMove:
    def path_fn(path: str) -> str:
        new = rename(rules, WRAPPER + path)
        return new[len(WRAPPER) :] if new.startswith(WRAPPER) else path

    return RemapMove("rule", lambda k, _: rename(rules, k), path_fn, strips_infix=False)


def detect(modules: list[str], hint: str | list[str] | None) -> Detection:
    """Layout detection on the distinct module shapes (layer numbers folded to 0): same verdict, O(shapes)."""
    shapes = sorted({_INDEX.sub(".0", m) for m in modules})
    return detect_layout(shapes, hint)


def resolve_layout_move(
    weights: str,
    modules: list[str],
    hint: str | list[str] | None,
    to: str,
    source: str | None,
    notes: list[str],
) -> RemapMove:
    if to not in LAYOUTS:
        raise UnsupportedInputError(to, f"unknown layout; known: {', '.join(LAYOUTS)}")
    detection = detect(modules, hint)
    if source is None:
        if detection.name == "ambiguous":
            source = settle_ambiguity(weights, modules, detection.candidates, to, notes)
        elif detection.name == "unknown":
            raise RefusedError(
                weights,
                f"the keys match no registry layout ({'; '.join(detection.evidence)}); "
                "pass --from LAYOUT or use --rule",
            )
        else:
            source = detection.name
    elif source not in LAYOUTS:
        raise UnsupportedInputError(source, f"unknown layout; known: {', '.join(LAYOUTS)}")
    elif detection.name != source:
        notes.append(f"--from {source} given; detection says {detection.name}")
    steps = remap_path(source, to)
    if steps is None:
        raise RefusedError(
            weights, f"the registry has no move from {source} to {to}; use --rule 'REGEX=>REPLACEMENT'"
        )
    if steps:
        notes.append("moves: " + " → ".join([source, *(s[0] for s in steps)]))
    return _layout_move([r for _, rs in steps for r in rs], source, to)


def settle_ambiguity(
    weights: str, modules: list[str], candidates: Sequence[str], to: str, notes: list[str]
) -> str:
    """Several layouts fit the keys: fine when only one of them moves to ``to``, or all move the same way."""
    moves: dict[str, list[str]] = {}
    for cand in candidates:
        rules = move_rules(cand, to)
        if rules is not None:
            moves[cand] = [rename(rules, m) for m in modules]
    distinct = {tuple(v) for v in moves.values()}
    if len(distinct) == 1:
        chosen = next(iter(moves))
        notes.append(
            f"the keys fit {', '.join(candidates)} equally; {chosen} is used "
            + (
                "(the only one with a move to " + to + ")"
                if len(moves) == 1
                else "(all of them move the same way)"
            )
        )
        return chosen
    raise RefusedError(
        weights,
        f"cannot tell the source layout: {', '.join(candidates)} fit equally"
        + (f" and move to {to} differently" if moves else "")
        + "; pass --from LAYOUT",
    )
