"""The parsed ``adapter_config.json`` (:class:`AdapterConfig`): validation, typed accessors, per-module rank, alpha
and scaling, the problems PEFT would hit, and which modules the config targets. Torch-free."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from adapterdoc.adapter.fields import (
    _DEFAULTS,
    _FLAG_EFFECT,
    _FLAG_FIELDS,
    _TYPED_FIELDS,
    LOADING_FIELDS,
    LORA_CONFIG_FIELDS,
    ConfigProblem,
    _is_number,
    _is_rank,
    _json_type,
    _no_constants,
)
from adapterdoc.adapter.targets import module_name_matches, peft_selects
from adapterdoc.errors import ConfigError


@dataclass
class AdapterConfig:
    """A parsed ``adapter_config.json``; ``raw`` keeps every field, unknown ones included, in file order."""

    raw: dict[str, Any]
    path: str | None = None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AdapterConfig:
        spath = os.fspath(path)
        try:
            with open(spath, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ConfigError(spath, f"cannot read: {e.strerror or e}") from e
        return cls.parse(data, spath)

    @classmethod
    def parse(cls, data: bytes, path: str | None = None) -> AdapterConfig:
        try:
            raw = json.loads(data.decode("utf-8"), parse_constant=_no_constants)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ConfigError(path, f"invalid JSON: {e}") from e
        if not isinstance(raw, dict):
            raise ConfigError(path, "adapter config must be a JSON object")
        cfg = cls(raw, path)
        cfg._check()
        return cfg

    def _check(self) -> None:
        if not isinstance(self.raw.get("peft_type"), str):
            raise ConfigError(
                self.path, 'has no `peft_type` (e.g. "LORA"): not a PEFT adapter config, PEFT cannot load it'
            )
        r = self.raw.get("r", 8)
        if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
            peft_says = (  # peft 0.21.2 LoraLayer.update_layer: `r <= 0` is its own ValueError
                "PEFT raises ValueError (`r` should be a positive integer value)"
                if isinstance(r, int) and not isinstance(r, bool)
                else "PEFT does not convert it and raises TypeError"
            )
            raise ConfigError(
                self.path,
                f"`r` must be a positive integer, got {r!r}: {peft_says} when it builds the LoRA layers",
            )
        alpha = self.raw.get("lora_alpha", 8)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
            raise ConfigError(
                self.path,
                f"`lora_alpha` must be a number, got {alpha!r}: "
                + (
                    f"PEFT would compute the scaling with it as {int(alpha)}"
                    if isinstance(alpha, bool)
                    else "PEFT does not convert it and raises TypeError when it computes the scaling"
                ),
            )
        for fld in ("rank_pattern", "alpha_pattern"):
            v = self.raw.get(fld)
            if v is not None and not isinstance(v, dict):
                raise ConfigError(self.path, f"`{fld}` must be an object, got {type(v).__name__}")
        for fld in ("target_modules", "exclude_modules"):
            v = self.raw.get(fld)
            if v is not None and not isinstance(v, (str, list)):
                raise ConfigError(self.path, f"`{fld}` must be a string or a list, got {type(v).__name__}")
            if isinstance(v, str):
                try:
                    re.compile(v)
                except re.error as e:
                    raise ConfigError(self.path, f"`{fld}` is not a valid regex: {e}") from e

    @property
    def peft_type(self) -> str:
        return str(self.raw.get("peft_type") or "LORA")

    @property
    def r(self) -> int:
        return int(self.raw.get("r", 8))

    @property
    def lora_alpha(self) -> float:
        # a number (int or float, kept as written): checked when the config is read
        alpha: float = self.raw.get("lora_alpha", 8)
        return alpha

    @property
    def use_rslora(self) -> bool:
        """True only for JSON ``true``; a string such as ``"false"`` is a :meth:`problems` entry, not rsLoRA."""
        return self.raw.get("use_rslora") is True

    @property
    def use_dora(self) -> bool:
        """True only for JSON ``true``; a string such as ``"false"`` is a :meth:`problems` entry, not DoRA."""
        return self.raw.get("use_dora") is True

    @property
    def target_modules(self) -> str | list[str] | None:
        return self.raw.get("target_modules")

    @property
    def exclude_modules(self) -> str | list[str] | None:
        return self.raw.get("exclude_modules")

    @property
    def target_parameters(self) -> list[str]:
        return list(self.raw.get("target_parameters") or [])

    @property
    def modules_to_save(self) -> list[str]:
        return list(self.raw.get("modules_to_save") or [])

    @property
    def rank_pattern(self) -> dict[str, int]:
        return dict(self.raw.get("rank_pattern") or {})

    @property
    def alpha_pattern(self) -> dict[str, float]:
        return dict(self.raw.get("alpha_pattern") or {})

    @property
    def base_model(self) -> str | None:
        v = self.raw.get("base_model_name_or_path")
        return v if isinstance(v, str) else None

    @property
    def layout_hints(self) -> list[str]:
        """Corroborating names for layout detection: PEFT's ``auto_mapping.base_model_class`` (the class the
        adapter was trained on) and ``base_model_name_or_path``. Keys decide; these only break ties."""
        hints: list[str] = []
        mapping = self.raw.get("auto_mapping")
        if isinstance(mapping, dict) and isinstance(mapping.get("base_model_class"), str):
            hints.append(mapping["base_model_class"])
        if self.base_model:
            hints.append(self.base_model)
        return hints

    def rank_for(self, module: str) -> int:
        """The rank PEFT gives ``module`` (first matching ``rank_pattern`` key wins). Values that are not a
        positive integer are skipped here, never coerced (PEFT crashes on them; :meth:`problems` reports them)."""
        for key, value in self.rank_pattern.items():
            if _is_rank(value) and module_name_matches(key, module):
                return value
        return self.r

    def alpha_for(self, module: str) -> float:
        """Like :meth:`rank_for`, for ``alpha_pattern`` (values that are not numbers are skipped)."""
        for key, value in self.alpha_pattern.items():
            if _is_number(value) and module_name_matches(key, module):
                return value
        return self.lora_alpha

    def bad_pattern_for(self, module: str) -> str | None:
        """The ``rank_pattern``/``alpha_pattern`` key whose unusable value PEFT would apply to ``module``."""
        for fld, valid in (("rank_pattern", _is_rank), ("alpha_pattern", _is_number)):
            for key, value in (self.raw.get(fld) or {}).items():
                if module_name_matches(key, module):
                    if not valid(value):
                        return f"{fld}[{key!r}]"
                    break
        return None

    def problems(self) -> list[ConfigProblem]:
        """Fields PEFT would drop (unknown keys: typos) or misread (wrong JSON types), in file order. Only for
        LoRA configs: other adapter types have other fields."""
        out: list[ConfigProblem] = []
        if self.peft_type.upper() != "LORA":
            return out
        for name in self.raw:
            if name not in LORA_CONFIG_FIELDS:
                out.append(self._unknown(name))
        for name in _FLAG_FIELDS:
            v = self.raw.get(name)
            if v is not None and not isinstance(v, bool):
                truthy = "true" if v else "false"
                meant = str(v).strip().lower() in ("true", "1", "yes") if isinstance(v, str) else bool(v)
                effect = f" ({_FLAG_EFFECT[name]})" if v and name in _FLAG_EFFECT else ""
                out.append(
                    ConfigProblem(
                        "AD112",
                        name,
                        f"`{name}` is {json.dumps(v)} ({_json_type(v)}), not true/false: PEFT tests only its "
                        f"truthiness and treats it as {truthy}{effect}",
                        hint=f'write `"{name}": {"true" if meant else "false"}` (a JSON boolean, no quotes)',
                    )
                )
        for fld, valid, want in (
            ("rank_pattern", _is_rank, "a positive integer"),
            ("alpha_pattern", _is_number, "a number"),
        ):
            for key, value in (self.raw.get(fld) or {}).items():
                if valid(value):
                    continue
                if fld == "alpha_pattern" and isinstance(value, bool):
                    what = f"PEFT computes the scaling with it as {int(value)}"
                else:
                    what = (
                        "PEFT does not convert it and raises TypeError when it builds the LoRA layer of a "
                        "module the key matches"
                    )
                out.append(
                    ConfigProblem(
                        "AD113",
                        fld,
                        f"`{fld}[{key!r}]` is {json.dumps(value)} ({_json_type(value)}), not {want}: {what}",
                        hint=f"write the value as {want} without quotes",
                    )
                )
        out += self._typed()
        return out

    def _unknown(self, name: str) -> ConfigProblem:
        import difflib  # only for a typo's suggestion: kept out of every start

        close = difflib.get_close_matches(name, sorted(LORA_CONFIG_FIELDS), n=1, cutoff=0.75)
        guess = close[0] if close else None
        dropped = f'`{name}` is not a LoraConfig field: PEFT drops it with an "Unexpected keyword arguments" warning'
        if guess is None:
            return ConfigProblem(
                "AD111", name, dropped, hint="remove it, or check the PEFT version that wrote it"
            )
        if guess in self.raw:
            return ConfigProblem(
                "AD111",
                name,
                f"{dropped}; did you mean {guess}? (`{guess}` is also set; PEFT uses that one)",
                hint=f"remove `{name}`",
            )
        default = _DEFAULTS.get(guess)
        uses = f" and loads with the default {guess} ({default})" if default is not None else ""
        code = "AD110" if guess in LOADING_FIELDS else "AD111"
        return ConfigProblem(
            code, name, f"{dropped}{uses}; did you mean {guess}?", hint=f"rename `{name}` to `{guess}`"
        )

    def _typed(self) -> list[ConfigProblem]:
        out: list[ConfigProblem] = []
        for name, ok, want, effect in _TYPED_FIELDS:
            if name in self.raw and self.raw[name] is not None and not ok(self.raw[name]):
                v = self.raw[name]
                out.append(
                    ConfigProblem(
                        "AD114", name, f"`{name}` is {json.dumps(v)} ({_json_type(v)}), not {want}: {effect}"
                    )
                )
        return out

    def scaling_for(self, module: str) -> float:
        """``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA."""
        r = self.rank_for(module)
        alpha = self.alpha_for(module)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    def targets(self, module: str) -> bool:
        """Whether PEFT's ``target_modules``/``exclude_modules``/``modules_to_save``/``layers_to_transform`` rules
        select ``module`` (header-only mirror; ``all-linear`` counts as a match here, the registry resolves it)."""
        tm = self.target_modules
        if isinstance(tm, str) and tm.lower() == "all-linear":
            tm = None if self.excludes(module) else [module]
        try:
            return peft_selects(
                module,
                tm,
                self.exclude_modules,
                self.raw.get("modules_to_save"),
                self.raw.get("layers_to_transform"),
                self.raw.get("layers_pattern"),
            )
        except (re.error, TypeError):  # PEFT itself fails on such a config; inspect reports what it can
            return False

    def excludes(self, module: str) -> bool:
        """Whether ``exclude_modules`` or ``modules_to_save`` keep LoRA off ``module``."""
        try:
            return not peft_selects(module, [module], self.exclude_modules, self.raw.get("modules_to_save"))
        except (re.error, TypeError):
            return False

    def targets_parameter(self, module: str) -> bool:
        """Whether a fused-expert module (``...mlp.experts``) is reached through ``target_parameters``."""
        for p in self.target_parameters:
            owner = p.rpartition(".")[0]
            if not owner or module == owner or module.endswith("." + owner):
                return True
        return False
