"""The PEFT adapter config model and the LoRA key grammar (module path, A/B, magnitude, embedding, experts).

Torch-free. Matching helpers mirror PEFT's own rules (``check_target_module_exists``, ``get_pattern_key``);
tests compare them with PEFT's functions so they cannot drift silently.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from adapterdoc.errors import ConfigError

WRAPPER = "base_model.model."
"""The prefix PEFT puts in front of every module path in a saved LoRA adapter."""

ADAPTER_CONFIG = "adapter_config.json"

PEFT_CONFIG_FIELDS = frozenset(
    {
        "auto_mapping",
        "base_model_name_or_path",
        "inference_mode",
        "peft_type",
        "peft_version",
        "revision",
        "task_type",
    }
)
"""The fields of PEFT's ``PeftConfig`` (every adapter type's base); a test keeps it equal to the installed PEFT's."""
LORA_CONFIG_FIELDS = PEFT_CONFIG_FIELDS | {
    "alora_invocation_tokens",
    "alpha_pattern",
    "arrow_config",
    "bias",
    "corda_config",
    "ensure_weight_tying",
    "eva_config",
    "exclude_modules",
    "fan_in_fan_out",
    "init_lora_weights",
    "kasa_config",
    "layer_replication",
    "layers_pattern",
    "layers_to_transform",
    "loftq_config",
    "lora_alpha",
    "lora_bias",
    "lora_dropout",
    "lora_ga_config",
    "megatron_config",
    "megatron_core",
    "modules_to_save",
    "monteclora_config",
    "qalora_group_size",
    "r",
    "rank_pattern",
    "runtime_config",
    "target_modules",
    "target_parameters",
    "trainable_token_indices",
    "use_bdlora",
    "use_dora",
    "use_qalora",
    "use_rslora",
    "velora_config",
}
"""Every field of PEFT's ``LoraConfig`` (peft 0.21): what ``LoraConfig.from_pretrained`` accepts. Any other key it
drops with an "Unexpected keyword arguments ... these are ignored" warning and uses the default. Kept as data so
that inspect stays torch- and PEFT-free; a test keeps it equal to the installed PEFT's dataclass fields."""
LOADING_FIELDS = (
    "peft_type",
    "task_type",
    "r",
    "lora_alpha",
    "target_modules",
    "exclude_modules",
    "target_parameters",
    "rank_pattern",
    "alpha_pattern",
    "use_rslora",
    "use_dora",
    "layers_to_transform",
    "layers_pattern",
    "modules_to_save",
    "bias",
    "lora_bias",
    "trainable_token_indices",
    "layer_replication",
    "alora_invocation_tokens",
    "use_qalora",
    "use_bdlora",
)
"""Fields that change which modules get LoRA, which tensors are read, or the delta's scale: a typo of one of them
silently loads a different adapter."""
_FLAG_FIELDS = ("use_dora", "use_rslora", "lora_bias", "use_qalora", "use_bdlora")
"""Boolean fields PEFT tests only for truthiness (``if config.use_dora:``): it never parses a string.
(``fan_in_fan_out`` is not one: PEFT sets it from the layer type, Linear or Conv1D, with a warning.)"""


@dataclass(frozen=True)
class ConfigProblem:
    """A field of ``adapter_config.json`` that PEFT would drop or misread (reported by inspect and verify)."""

    code: str
    field: str
    message: str
    hint: str | None = None


_AB = re.compile(r"^(?P<module>.+?)\.(?P<role>lora_A|lora_B)(?:\.(?P<name>[^.]+))?\.(?P<param>weight|bias)$")
_VEC = re.compile(
    r"^(?P<module>.+?)\.(?P<role>lora_embedding_A|lora_embedding_B|lora_magnitude_vector)"
    r"(?:\.(?P<name>[^.]+))?(?:\.(?P<param>weight))?$"
)
_TOKENS = re.compile(
    r"^(?P<module>.+?)\.token_adapter\.trainable_tokens_(?P<what>delta|original)(?:\.(?P<name>[^.]+))?$"
)


@dataclass(frozen=True)
class LoraKey:
    """One tensor name of an adapter, split into its parts."""

    key: str
    wrapped: bool
    """Whether the key starts with ``base_model.model.``."""
    module: str
    """Module path without the wrapper, e.g. ``model.layers.0.self_attn.q_proj``."""
    role: str
    """``lora_A``, ``lora_B``, ``lora_B.bias``, ``lora_embedding_A``, ``lora_embedding_B``, ``magnitude``,
    ``tokens`` (trainable-token deltas) or ``full`` (a whole weight: ``modules_to_save`` or a saved embedding)."""
    adapter_name: str | None = None
    """An adapter name left inside the key (``lora_A.default.weight``); saved adapters have none."""

    @property
    def is_lora(self) -> bool:
        return self.role in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")

    @property
    def is_a(self) -> bool:
        return self.role in ("lora_A", "lora_embedding_A")

    @property
    def is_b(self) -> bool:
        return self.role in ("lora_B", "lora_embedding_B")

    @property
    def target(self) -> str:
        """The module PEFT matched: fused-expert wrappers (``experts.base_layer``) collapse to ``experts``."""
        return fused_expert_owner(self.module)


def parse_key(key: str) -> LoraKey:
    """Split a tensor name into wrapper, module path, role and optional adapter name."""
    wrapped = key.startswith(WRAPPER)
    rest = key[len(WRAPPER) :] if wrapped else key
    m = _AB.match(rest)
    if m:
        role = m["role"] if m["param"] == "weight" else f"{m['role']}.bias"
        return LoraKey(key, wrapped, m["module"], role, m["name"])
    m = _VEC.match(rest)
    if m:
        name = m["name"] if m["name"] != "weight" else None
        role = "magnitude" if m["role"] == "lora_magnitude_vector" else m["role"]
        return LoraKey(key, wrapped, m["module"], role, name)
    m = _TOKENS.match(rest)
    if m:
        return LoraKey(key, wrapped, m["module"], "tokens", m["name"])
    module, _, _param = rest.rpartition(".")
    return LoraKey(key, wrapped, module or rest, "full")


def peft_load_name(key: str) -> str:
    """The name PEFT's loader reads ``key`` as with the default adapter: the ``base_model.model.`` wrapper added
    when missing, and a ``default`` adapter name left in the key removed (``lora_A.default.weight``)."""
    k = parse_key(key)
    out = key
    if k.adapter_name == "default":
        out = re.sub(r"\.lora_magnitude_vector\.default\.weight$", ".lora_magnitude_vector", out)
        out = re.sub(r"\.(lora_[AB])\.default\.(weight|bias)$", r".\1.\2", out)
        out = re.sub(r"\.(lora_embedding_[AB])\.default$", r".\1", out)
    return out if k.wrapped else WRAPPER + out


def fused_expert_owner(module: str) -> str:
    """``...mlp.experts.base_layer`` (PEFT's nested ParamWrapper) → ``...mlp.experts``."""
    while module.endswith(".base_layer"):
        module = module[: -len(".base_layer")]
    return module


def module_name_matches(pattern_key: str, module: str) -> bool:
    """PEFT's ``rank_pattern``/``alpha_pattern`` key rule: ``(.*\\.)?(KEY)$`` matches the module name."""
    try:
        return re.match(rf"(.*\.)?({pattern_key})$", module) is not None
    except re.error:
        return False


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
            raise ConfigError(
                self.path,
                f"`r` must be a positive integer, got {r!r}: PEFT does not convert it and raises TypeError "
                "when it builds the LoRA layers",
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
        return self.raw.get("lora_alpha", 8)

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


def _is_rank(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return "null"


def _str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(e, str) for e in v)


def _int_or_ints(v: Any) -> bool:
    return (type(v) is int and v >= 0) or (isinstance(v, list) and all(type(e) is int for e in v))


_DEFAULTS = {"lora_alpha": 8, "r": 8, "use_rslora": "false", "use_dora": "false", "bias": '"none"'}
"""PEFT's defaults for the fields a typo most often hides (shown in the message)."""
_FLAG_EFFECT = {
    "use_dora": "builds DoRA layers, which expect lora_magnitude_vector tensors",
    "use_rslora": "scales by lora_alpha / sqrt(r) instead of lora_alpha / r",
    "lora_bias": "adds a bias to lora_B",
}
_TYPED_FIELDS: tuple[tuple[str, Any, str, str], ...] = (
    (
        "bias",
        lambda v: v in ("none", "all", "lora_only"),
        '"none", "all" or "lora_only"',
        "PEFT raises NotImplementedError when it builds the model",
    ),
    (
        "modules_to_save",
        _str_list,
        "a list of module names",
        "PEFT iterates a string letter by letter, so every module whose name ends in one of its letters (the "
        "whole `model`, say) becomes a module to save, or it raises TypeError",
    ),
    ("target_parameters", _str_list, "a list of parameter names", "PEFT raises TypeError"),
    (
        "layers_to_transform",
        _int_or_ints,
        "a layer index or a list of them",
        "PEFT raises TypeError when it matches layer indices against it",
    ),
    ("lora_dropout", _is_number, "a number", "PEFT raises TypeError when it builds the LoRA layers"),
)


def peft_selects(
    module: str,
    target_modules: Any,
    exclude_modules: Any = None,
    modules_to_save: Any = None,
    layers_to_transform: Any = None,
    layers_pattern: Any = None,
) -> bool:
    """PEFT's ``check_target_module_exists`` (peft.tuners.tuners_utils, 0.21) on one module name, torch-free.

    ``target_modules`` is a regex (full match) or a collection of names (exact or ``.name`` suffix);
    ``exclude_modules`` likewise; a ``modules_to_save`` entry keeps LoRA off every module under it; with a list of
    targets, ``layers_to_transform`` (an int or a list) keeps only modules in those layers, the layer index being
    the first number after ``layers_pattern`` (or after the second path segment when no pattern is given).
    """
    if exclude_modules:
        if isinstance(exclude_modules, str):
            if re.fullmatch(exclude_modules, module):
                return False
        elif module in exclude_modules or any(module.endswith(f".{e}") for e in exclude_modules):
            return False
    if modules_to_save and any(re.match(rf"(^|.*\.){m}($|\..*)", module) for m in modules_to_save):
        return False
    if target_modules is None:
        return False
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, module) is not None
    if module in target_modules:
        return True
    found = any(module.endswith(f".{t}") for t in target_modules)
    using_layers = layers_to_transform is not None and (
        len(layers_to_transform) != 0 if isinstance(layers_to_transform, list) else True
    )
    if not (using_layers and found):
        return found
    match = None
    if not layers_pattern:
        match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", module)
    else:
        for pattern in [layers_pattern] if isinstance(layers_pattern, str) else layers_pattern:
            match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", module)
            if match is not None:
                break
    if match is None:
        return False
    index = int(match["idx"])
    return (
        index == layers_to_transform if isinstance(layers_to_transform, int) else index in layers_to_transform
    )


def pattern_key(keys: Iterable[str], name: str) -> str | None:
    """PEFT's ``get_pattern_key``: the first ``rank_pattern``/``alpha_pattern`` key matching ``name``."""
    for key in keys:
        if module_name_matches(key, name):
            return key
    return None


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def module_counts(modules: Iterable[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Count modules per prefix (path up to the layer index) and per leaf name."""
    per_prefix: dict[str, int] = {}
    per_leaf: dict[str, int] = {}
    for m in modules:
        prefix = (
            re.split(r"\.\d+\.", m, maxsplit=1)[0] if re.search(r"\.\d+\.", m) else m.rpartition(".")[0] or m
        )
        per_prefix[prefix] = per_prefix.get(prefix, 0) + 1
        leaf = m.rpartition(".")[2]
        if m.endswith(".experts") or ".experts.base_layer" in m:
            leaf = "experts"
        per_leaf[leaf] = per_leaf.get(leaf, 0) + 1
    return dict(sorted(per_prefix.items())), dict(sorted(per_leaf.items()))
