"""What ``adapter_config.json`` may hold: PEFT's field names, the fields that change loading, the typed fields and
their checks, and :class:`ConfigProblem` (a field PEFT would drop or misread)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

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


def _is_rank(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _json_type(v: object) -> str:
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


def _str_list(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(e, str) for e in v)


def _int_or_ints(v: object) -> bool:
    return (type(v) is int and v >= 0) or (isinstance(v, list) and all(type(e) is int for e in v))


_DEFAULTS = {"lora_alpha": 8, "r": 8, "use_rslora": "false", "use_dora": "false", "bias": '"none"'}
"""PEFT's defaults for the fields a typo most often hides (shown in the message)."""
_FLAG_EFFECT = {
    "use_dora": "builds DoRA layers, which expect lora_magnitude_vector tensors",
    "use_rslora": "scales by lora_alpha / sqrt(r) instead of lora_alpha / r",
    "lora_bias": "adds a bias to lora_B",
}
_TYPED_FIELDS: tuple[tuple[str, Callable[[object], bool], str, str], ...] = (
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


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON constant {name}")
