"""Rewrites the adapter_config.json fields that carry module paths (``target_modules``, ``exclude_modules``,
``modules_to_save``, the rank and alpha patterns, ``target_parameters``) so that they select, after the remap, exactly
the modules they selected before: the move's own rules on the text first, an explicit list when no rewrite does."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from adapterdoc.layouts import exclusion_regex, strip_infix_in_regex, tower_probes
from adapterdoc.remap.moves import RemapMove
from adapterdoc.report.remap_report import ConfigChange

_WILD = "\x00"


class ConfigRewriter:
    """Rewrites every adapter_config.json field that carries module paths, verified against the file's modules."""

    def __init__(
        self,
        move: RemapMove,
        module_map: dict[str, str],
        lora_pairs: list[tuple[str, str]],
        full_pairs: list[tuple[str, str]],
    ) -> None:
        self.move = move
        self.module_map = module_map
        self.lora_pairs = lora_pairs
        self.full_pairs = full_pairs

    def rewrite(self, raw: dict[str, object]) -> list[ConfigChange]:
        changes: list[ConfigChange] = []
        for name, fn in (
            ("target_modules", self._target_modules),
            ("exclude_modules", self._exclude_modules),
            ("modules_to_save", self._modules_to_save),
            ("rank_pattern", self._patterns),
            ("alpha_pattern", self._patterns),
            ("target_parameters", self._target_parameters),
        ):
            if name not in raw or raw[name] in (None, "", [], {}):
                continue
            new, how = fn(raw[name])
            if new != raw[name]:
                changes.append(ConfigChange(name, raw[name], new, how))
                raw[name] = new
        tower = self._tower_exclusion(raw.get("exclude_modules"))
        if tower is not None:
            changes.append(ConfigChange("exclude_modules", raw.get("exclude_modules"), tower, "towers"))
            raw["exclude_modules"] = tower
        return changes

    # text transforms -------------------------------------------------------------------------------------

    def _regex_candidates(self, rx: str) -> list[tuple[str, str]]:
        cands = [(rx, "unchanged"), (from_view(self.move.path_fn(to_view(rx))), "rules")]
        if self.move.strips_infix:
            cands.append((strip_infix_in_regex(rx), "literal"))
        return cands

    def _path_entry(self, entry: str) -> str:
        if entry in self.module_map:
            return self.module_map[entry]
        return self.move.path_fn(entry)

    # fields ----------------------------------------------------------------------------------------------

    def _target_modules(self, value: object) -> tuple[object, str]:
        pairs = self.lora_pairs
        if isinstance(value, str):
            if value == "all-linear":
                return value, "unchanged"

            def ok(rx: str) -> bool:
                return all(fullmatch(value, m) == fullmatch(rx, n) for m, n in pairs)

            for cand, how in self._regex_candidates(value):
                if ok(cand):
                    return cand, how
            hit = [n for m, n in pairs if fullmatch(value, m)]
            return (
                ("(?:" + "|".join(re.escape(n) for n in hit) + ")", "explicit")
                if hit
                else (value, "unchanged")
            )
        if not isinstance(value, list):
            return value, "unchanged"
        return self._list_field(value, pairs, _list_match)

    def _list_field(
        self, value: list[object], pairs: list[tuple[str, str]], match: Callable[[Sequence[str], str], bool]
    ) -> tuple[object, str]:
        entries = [e for e in value if isinstance(e, str)]
        if len(entries) != len(value):
            return value, "unchanged"

        def ok(cand: list[str]) -> bool:
            return all(match(entries, m) == match(cand, n) for m, n in pairs)

        moved = [e if "." not in e else self._path_entry(e) for e in entries]
        for cand, how in ((entries, "unchanged"), (moved, "rules")):
            if ok(cand):
                return cand, how
        leaves = [e for e in entries if "." not in e]
        explicit = list(leaves)
        for m, n in pairs:
            if match(entries, m) and not match(leaves, n) and n not in explicit:
                explicit.append(n)
        return explicit, "explicit"

    def _exclude_modules(self, value: object) -> tuple[object, str]:
        pairs = self.lora_pairs
        if isinstance(value, str):

            def ok(rx: str) -> bool:
                return all(fullmatch(value, m) == fullmatch(rx, n) for m, n in pairs)

            for cand, how in self._regex_candidates(value):
                if ok(cand):
                    return cand, how
            cand = self._regex_candidates(value)[1][0]
            keep = [re.escape(n) for m, n in pairs if not fullmatch(value, m)]
            return f"(?!(?:{'|'.join(keep)})$)(?:{cand})", "explicit"
        if not isinstance(value, list):
            return value, "unchanged"
        return self._list_field(value, pairs, _list_match)

    def _modules_to_save(self, value: object) -> tuple[object, str]:
        if not isinstance(value, list):
            return value, "unchanged"
        return self._list_field(value, self.full_pairs, _mts_match)

    def _patterns(self, value: object) -> tuple[object, str]:
        if not isinstance(value, dict):
            return value, "unchanged"
        pairs = self.lora_pairs

        def ok(cand: dict[str, object]) -> bool:
            return all(_pattern_value(value, m) == _pattern_value(cand, n) for m, n in pairs)

        moved: dict[str, object] = {}
        for key, v in value.items():
            new_key = self.module_map.get(key) or from_view(self.move.path_fn(to_view(key)))
            if new_key in moved:
                break
            moved[new_key] = v
        for cand, how in ((value, "unchanged"), (moved, "rules")):
            if len(cand) == len(value) and ok(cand):
                return cand, how
        explicit: dict[str, object] = {}
        for m, n in pairs:
            found, v = _pattern_value(value, m)
            if found:
                explicit[n] = v
        return explicit, "explicit"

    def _target_parameters(self, value: object) -> tuple[object, str]:
        if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
            return value, "unchanged"
        out = []
        for e in value:
            owner, _, param = e.rpartition(".")
            if owner and owner in self.module_map:
                out.append(f"{self.module_map[owner]}.{param}")
            else:
                out.append(e)
        return out, "rules"

    def _tower_exclusion(self, current: object) -> str | None:
        """When moving onto a layout with towers, exclude the towers the adapter has no LoRA on."""
        towers = self.move.target_towers
        if not towers:
            return None
        hit = {seg for _, n in self.lora_pairs for seg in n.split(".")}
        segments = tuple(t for t in towers if t not in hit)
        if not segments:
            return None
        tower_rx = exclusion_regex(segments)
        if current in (None, "", []):
            return tower_rx
        if isinstance(current, str):
            if all(any(fullmatch(current, p) for p in tower_probes(seg)) for seg in segments):
                return None
            return f"(?:{current})|{tower_rx}"
        if isinstance(current, list) and all(isinstance(e, str) for e in current):
            listed = "|".join(re.escape(e) for e in current)
            return f"(?:(?:.*\\.)?(?:{listed}))|{tower_rx}"
        return None


def to_view(rx: str) -> str:
    """A regex seen as a module path: ``\\.`` becomes ``.``, a bare ``.`` (any char) a placeholder."""
    out: list[str] = []
    i = 0
    while i < len(rx):
        c = rx[i]
        if c == "\\" and i + 1 < len(rx):
            out.append("." if rx[i + 1] == "." else rx[i : i + 2])
            i += 2
            continue
        out.append(_WILD if c == "." else c)
        i += 1
    return "".join(out)


def from_view(view: str) -> str:
    return view.replace(".", "\\.").replace(_WILD, ".")


def fullmatch(rx: str, s: str) -> bool:
    try:
        return re.fullmatch(rx, s) is not None
    except re.error:
        return False


def _list_match(entries: Sequence[str], module: str) -> bool:
    return module in entries or any(module.endswith(f".{e}") for e in entries)


def _mts_match(entries: Sequence[str], module: str) -> bool:
    """PEFT's modules_to_save rule."""
    for m in entries:
        try:
            if re.match(rf"(^|.*\.){m}($|\..*)", module):
                return True
        except re.error:
            continue
    return False


def _pattern_value(patterns: dict[str, object], module: str) -> tuple[bool, object]:
    """PEFT's rank/alpha pattern lookup: the first key matching ``(.*\\.)?(KEY)$`` wins."""
    for key, value in patterns.items():
        try:
            if re.match(rf"(.*\.)?({key})$", module):
                return True, value
        except re.error:
            continue
    return False, None
