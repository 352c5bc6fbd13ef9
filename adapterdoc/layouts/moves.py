"""Layout moves: the one rename of keys by a chain of rules (:func:`apply_move`), the renames a ``remap`` command
performs, the candidates for a set of keys, and the search for the one that fits a base best (verify's diagnosis
and merge's unused-module hint both call it)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from adapterdoc.adapter import WRAPPER, LoraKey, parse_key
from adapterdoc.layouts.registry import LAYOUTS, STRIP_LANGUAGE_MODEL, Rule, remap_path, tower_segment


def rename(rules: Sequence[Rule], path: str) -> str:
    """``path`` (a module path or a whole state-dict name) through ``rules`` in order."""
    for rule in rules:
        path = rule.apply(path)
    return path


def apply_move(rules: Sequence[Rule], key: str) -> str:
    """The one rename of an adapter tensor key by a chain of rules: the ``base_model.model.`` wrapper and the LoRA
    suffix (``.lora_A.weight``, ...) stay, the module path goes through :func:`rename`."""
    k = parse_key(key)
    prefix = WRAPPER if k.wrapped else ""
    rest = key[len(prefix) :]
    if not rest.startswith(k.module):
        return prefix + rename(rules, rest)
    return prefix + rename(rules, k.module) + rest[len(k.module) :]


VL_RULES: tuple[Rule, ...] = (STRIP_LANGUAGE_MODEL,)
"""The rules of ``remap --vl``: :func:`apply_move` with these is :func:`strip_language_model` on the module path."""


def strip_infix_in_regex(rx: str) -> str:
    r"""A regex ``target_modules`` with its first ``language_model`` segment (``language_model\.``) removed: the
    literal reading of ``remap --vl`` on a regex, beside the rule-driven one."""
    return re.sub(r"language_model\\?\.", "", rx, count=1)


def move_rules(source: str, target: str) -> tuple[Rule, ...] | None:
    """The rules of the shortest registry move from ``source`` to ``target`` in order (``None``: no move)."""
    steps = remap_path(source, target)
    return None if steps is None else tuple(r for _, rs in steps for r in rs)


def move_words(source: str, target: str) -> str:
    """How the move from ``source`` to ``target`` reads in a finding."""
    src, dst = LAYOUTS.get(source), LAYOUTS.get(target)
    if src and target in src.move_words:
        return src.move_words[target]
    if src and src.text_counterpart == target:
        return "VL adapter on a text-only base"
    if dst and dst.text_counterpart == source:
        return "text-only adapter on a VL base"
    return "layout move"


@dataclass(frozen=True)
class Move:
    """A rename of adapter keys that a ``remap`` command performs."""

    kind: str
    """``layout`` (a registry move), ``wrapper`` (add ``base_model.model.``) or ``adapter-name``."""
    source: str | None = None
    target: str | None = None
    rules: tuple[Rule, ...] = ()
    name: str | None = None
    """The adapter name to remove (``adapter-name`` moves)."""

    def apply(self, key: str) -> str:
        if self.kind == "wrapper":
            return key if key.startswith(WRAPPER) else WRAPPER + key
        if self.kind == "adapter-name":
            assert self.name is not None
            return re.sub(rf"\.({_ROLES})\.{re.escape(self.name)}(\.|$)", r".\1\2", key)
        return apply_move(self.rules, key)

    def command(self, spec: str, detected: str | None = None) -> str:
        """The ``adapterdoc remap`` call that performs this move (``--from`` when detection would pick another
        source layout)."""
        import shlex  # a finding's command only: not every start

        q = shlex.quote(spec)
        if self.kind == "wrapper":
            return f"adapterdoc remap {q} --rule '^(?!base_model\\.model\\.)=>base_model.model.'"
        if self.kind == "adapter-name":
            return (
                f"adapterdoc remap {q} --rule '\\.({_ROLES})\\.{re.escape(self.name or '')}(\\.|$)=>.\\1\\2'"
            )
        if self.rules == VL_RULES:
            return f"adapterdoc remap {q} --vl"
        source = f" --from {self.source}" if detected is not None and detected != self.source else ""
        return f"adapterdoc remap {q} --to {self.target}{source}"

    def describe(self) -> str:
        if self.kind == "wrapper":
            return "keys lack `base_model.model.`"
        if self.kind == "adapter-name":
            return f"keys carry the adapter name {self.name!r}"
        what = move_words(self.source or "", self.target or "")
        return f"{what} (adapter keys use {self.source} names, the base {self.target} names)"

    def to_dict(self, spec: str, detected: str | None = None) -> dict[str, object]:
        return {
            "kind": self.kind,
            "from": self.source,
            "to": self.target,
            "description": self.describe(),
            "command": self.command(spec, detected),
        }


_ROLES = "lora_A|lora_B|lora_embedding_A|lora_embedding_B|lora_magnitude_vector"


def candidate_moves(preferred: Iterable[str], keys: Iterable[LoraKey]) -> list[Move]:
    """Every registry move (shortest chains; ``preferred`` source layouts first) plus the wrapper and adapter-name
    fixes."""
    keys = list(keys)
    moves: list[Move] = []
    if any(not k.wrapped for k in keys):
        moves.append(Move("wrapper"))
    names = Counter(k.adapter_name for k in keys if k.adapter_name)
    if names:
        moves.append(Move("adapter-name", name=names.most_common(1)[0][0]))
    sources = [n for n in preferred if n in LAYOUTS]
    sources += [n for n in LAYOUTS if n not in sources]
    for src in sources:
        for dst in LAYOUTS:
            rules = move_rules(src, dst) if dst != src else None
            if rules:
                moves.append(Move("layout", src, dst, rules))
    return moves


def best_move(
    moves: list[Move],
    keys: list[str],
    score: Callable[[list[str]], tuple[int, int]],
    current: tuple[int, int],
    *,
    target: str | None = None,
    sources: Iterable[str] = (),
) -> Move | None:
    """The move whose renamed keys score best (``(unexpected, missing)``, lower is better); it must leave nothing
    unexpected and do better than ``current``. Ties go to moves onto ``target`` from one of ``sources`` (the
    layouts detection names), then to shorter rule chains. Each distinct rename is scored once."""
    prefer = list(sources)
    # LoRA on towers (vision/audio/talker) never lands on a text model and no rename fixes that: judge the
    # move on the other keys (remap then warns about the tower keys it leaves behind, AD202)

    core = [k for k in keys if tower_segment(parse_key(k).module) is None]
    if core and len(core) < len(keys):
        keys = core
    scores: dict[tuple[str, tuple[Rule, ...], str | None], tuple[int, int] | None] = {}
    best: tuple[tuple[int, ...], Move] | None = None
    for mv in moves:
        sig = (mv.kind, mv.rules, mv.name)
        if sig not in scores:
            renamed = [mv.apply(k) for k in keys]
            scores[sig] = None if renamed == keys else score(renamed)
        s = scores[sig]
        if s is None or s[0] != 0 or s >= current:
            continue
        src_rank = prefer.index(mv.source) if mv.source in prefer else len(prefer)
        rank = (s[0], s[1], int(target is not None and mv.target != target), src_rank, len(mv.rules))
        if best is None or rank < best[0]:
            best = (rank, mv)
    return best[1] if best else None
