"""The PEFT adapter config model and the LoRA key grammar (module path, A/B, magnitude, embedding, experts).

Torch-free. Matching helpers mirror PEFT's own rules (``check_target_module_exists``, ``get_pattern_key``);
tests compare them with PEFT's functions so they cannot drift silently.
"""

from __future__ import annotations

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
            raise ConfigError(self.path, f"`r` must be a positive integer, got {r!r}")
        alpha = self.raw.get("lora_alpha", 8)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
            raise ConfigError(self.path, f"`lora_alpha` must be a number, got {alpha!r}")
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
        return bool(self.raw.get("use_rslora", False))

    @property
    def use_dora(self) -> bool:
        return bool(self.raw.get("use_dora", False))

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
        """The rank PEFT gives ``module`` (first matching ``rank_pattern`` key wins)."""
        for key, value in self.rank_pattern.items():
            if module_name_matches(key, module):
                return int(value)
        return self.r

    def alpha_for(self, module: str) -> float:
        for key, value in self.alpha_pattern.items():
            if module_name_matches(key, module):
                return value
        return self.lora_alpha

    def scaling_for(self, module: str) -> float:
        """``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA."""
        r = self.rank_for(module)
        alpha = self.alpha_for(module)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r

    def targets(self, module: str) -> bool:
        """Whether PEFT's ``target_modules``/``exclude_modules`` rules select ``module`` (header-only mirror)."""
        excl = self.exclude_modules
        if excl:
            if isinstance(excl, str):
                if re.fullmatch(excl, module):
                    return False
            elif module in excl or any(module.endswith(f".{e}") for e in excl):
                return False
        tm = self.target_modules
        if tm is None:
            return False
        if isinstance(tm, str):
            if tm == "all-linear":
                return True
            return re.fullmatch(tm, module) is not None
        return module in tm or any(module.endswith(f".{t}") for t in tm)

    def targets_parameter(self, module: str) -> bool:
        """Whether a fused-expert module (``...mlp.experts``) is reached through ``target_parameters``."""
        for p in self.target_parameters:
            owner = p.rpartition(".")[0]
            if not owner or module == owner or module.endswith("." + owner):
                return True
        return False


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
