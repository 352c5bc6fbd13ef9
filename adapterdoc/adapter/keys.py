"""The LoRA key grammar: a saved tensor name split into wrapper, module path, role (A/B, magnitude, embedding,
trainable tokens, whole weight) and adapter name; PEFT's load name; per-prefix and per-leaf module counts. Torch-free."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

WRAPPER = "base_model.model."
"""The prefix PEFT puts in front of every module path in a saved LoRA adapter."""


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


_PLAIN_AB = (".lora_A", ".lora_B")


@lru_cache(maxsize=1 << 16)  # inspect parses every name in several places; a LoraKey is immutable
def parse_key(key: str) -> LoraKey:
    """Split a tensor name into wrapper, module path, role and optional adapter name.

    ``<module>.lora_A.weight`` / ``.lora_B.weight`` (nearly every saved name) is split without a regex: ``_AB``'s
    lazy ``module`` reads such a name the same way unless ``module`` itself ends in ``.lora_A``/``.lora_B`` (then
    the shorter module with an adapter name matches first) or holds a newline (which ``.`` does not match); those
    take the regexes (``tests/adapter/test_adapter.py::test_parse_key_fast_path_equals_the_regexes``)."""
    wrapped = key.startswith(WRAPPER)
    rest = key[len(WRAPPER) :] if wrapped else key
    if rest.endswith(".weight") and rest[-14:-7] in _PLAIN_AB:
        module = rest[:-14]
        if module and not module.endswith(_PLAIN_AB) and "\n" not in module:
            return LoraKey(key, wrapped, module, rest[-13:-7])
    return _parse_key_rx(key, wrapped, rest)


def _parse_key_rx(key: str, wrapped: bool, rest: str) -> LoraKey:
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


_INDEX = re.compile(r"\.\d+\.")


def module_counts(modules: Iterable[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Count modules per prefix (path up to the layer index) and per leaf name."""
    per_prefix: dict[str, int] = {}
    per_leaf: dict[str, int] = {}
    for m in modules:
        at = _INDEX.search(
            m
        )  # one regex pass per name: the prefix is what comes before the first layer index
        prefix = m[: at.start()] if at else m.rpartition(".")[0] or m
        per_prefix[prefix] = per_prefix.get(prefix, 0) + 1
        leaf = m.rpartition(".")[2]
        if m.endswith(".experts") or ".experts.base_layer" in m:
            leaf = "experts"
        per_leaf[leaf] = per_leaf.get(leaf, 0) + 1
    return dict(sorted(per_prefix.items())), dict(sorted(per_leaf.items()))
