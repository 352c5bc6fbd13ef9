"""The adapter_config.json rewrites of ``remap --for``, each checked by resolving the new config the way PEFT does
(:class:`~adapterdoc.adapter.AdapterConfig`: the first matching pattern key wins) for every LoRA module:

- :func:`fold_rslora`: ``use_rslora`` off, ``alpha' = alpha · sqrt(r)`` at the top level and per
  ``alpha_pattern`` entry, so that ``alpha' / r`` is the rsLoRA scaling ``alpha / sqrt(r)`` of every module;
- :func:`uniform`: one ``r`` and one ``lora_alpha``, no patterns (for an engine that reads neither);
- :func:`explicit_targets`: a regex ``target_modules`` replaced by the list of the module paths it selected.
"""

from __future__ import annotations

import json
import math
import re
from typing import cast

from adapterdoc.adapter import AdapterConfig
from adapterdoc.adapter.targets import pattern_key
from adapterdoc.errors import RefusedError
from adapterdoc.report.remap_report import ConfigChange

REL = 1e-12
"""How close a resolved scaling must be to the wanted one (float64 rounding of ``alpha · sqrt(r) / r``)."""


def parse(raw: dict[str, object]) -> AdapterConfig:
    return AdapterConfig.parse(json.dumps(raw).encode("utf-8"))


def number(x: float, like: object = 1) -> float | int:
    """``x`` as an int when it is one (PEFT writes ints where it can), else the float."""
    return round(x) if isinstance(like, (int, float)) and abs(x - round(x)) < 1e-9 * max(1.0, abs(x)) else x


def changes(before: dict[str, object], after: dict[str, object], how: str) -> list[ConfigChange]:
    return [
        ConfigChange(k, before.get(k), after.get(k), how)
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    ]


def fold_rslora(raw: dict[str, object], modules: list[str], path: str) -> None:
    """Fold rsLoRA into ``lora_alpha`` / ``alpha_pattern`` (``raw`` rewritten in place); ``modules`` are the names
    PEFT resolves the patterns on. Refused when no config gives every module its scaling."""
    cfg = parse(raw)
    want = {m: cfg.scaling_for(m) for m in modules}
    raw["use_rslora"] = False
    raw["lora_alpha"] = number(cfg.lora_alpha * math.sqrt(cfg.r), cfg.lora_alpha)
    pattern: dict[str, object] = {}
    for key, alpha in cfg.alpha_pattern.items():
        ranks = {cfg.rank_for(m) for m in modules if pattern_key(cfg.alpha_pattern, m) == key}
        r = ranks.pop() if len(ranks) == 1 else cfg.rank_pattern.get(key, cfg.r)
        pattern[key] = number(alpha * math.sqrt(r), alpha)
    for (
        key,
        r,
    ) in cfg.rank_pattern.items():  # a module ranked by a pattern and aliased by none: alpha · sqrt(r_m)
        if key not in pattern:
            pattern[key] = number(cfg.lora_alpha * math.sqrt(r), cfg.lora_alpha)
    raw["alpha_pattern"] = pattern
    _settle(raw, modules, want, path, "fold use_rslora into lora_alpha")


def _settle(raw: dict[str, object], modules: list[str], want: dict[str, float], path: str, what: str) -> None:
    """Prepend exact ``alpha_pattern`` entries for modules whose scaling the new config does not resolve to."""
    new = parse(raw)
    wrong = [m for m in modules if not _close(new.scaling_for(m), want[m])]
    if wrong:
        exact = {re.escape(m): number(want[m] * _divisor(new, m)) for m in wrong}
        raw["alpha_pattern"] = {**exact, **cast("dict[str, object]", raw.get("alpha_pattern", {}))}
        new = parse(raw)
    bad = next((m for m in modules if not _close(new.scaling_for(m), want[m])), None)
    if bad is not None:
        raise RefusedError(
            path,
            f"cannot {what} exactly: `{bad}` would get scaling {new.scaling_for(bad):g}, not {want[bad]:g}",
        )


def _divisor(cfg: AdapterConfig, module: str) -> float:
    r = cfg.rank_for(module)
    return math.sqrt(r) if cfg.use_rslora else float(r)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL)


def uniform(raw: dict[str, object], rank: int, scaling: float) -> None:
    """One rank and one scaling for every module, no patterns (``raw`` rewritten in place)."""
    raw["r"] = rank
    raw["lora_alpha"] = number(scaling * (math.sqrt(rank) if raw.get("use_rslora") is True else rank))
    raw["rank_pattern"] = {}
    raw["alpha_pattern"] = {}


def explicit_targets(raw: dict[str, object], modules: list[str], path: str) -> list[str]:
    """A regex ``target_modules`` replaced by the module paths it selects among ``modules`` (PEFT matches a list
    entry as the exact name or a ``.``-suffix, so a full path selects that module only); the list."""
    regex = raw.get("target_modules")
    assert isinstance(regex, str)
    try:
        chosen = sorted({m for m in modules if re.fullmatch(regex, m)})
    except re.error as e:
        raise RefusedError(path, f"target_modules {regex!r} is not a valid regex: {e}") from None
    if not chosen:
        raise RefusedError(
            path, f"target_modules {regex!r} selects none of the adapter's LoRA modules; cannot list them"
        )
    raw["target_modules"] = chosen
    return chosen


def is_regex(target_modules: object) -> bool:
    """A string ``target_modules`` other than PEFT's ``all-linear`` shorthand."""
    return isinstance(target_modules, str) and target_modules != "all-linear"
