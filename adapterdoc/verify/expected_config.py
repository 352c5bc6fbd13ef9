"""What PEFT 0.21 makes of an adapter_config.json before and during injection, torch-free: the registry's side of
``LoraConfig.from_pretrained`` (unknown fields dropped, ``__post_init__``'s refusals) and of ``update_layer``
(the type errors an ill-typed ``r``, ``lora_alpha``, ``lora_dropout`` or pattern value raises when PEFT builds a
layer it matches, and ``bias``' refusal).

Nothing here coerces a value: PEFT does not (``"use_dora": "false"`` is truthy, so DoRA layers are built; a
string rank raises ``TypeError``). The AD110-AD114 findings that name these fields come from the header facts;
this module only decides what PEFT builds, so that the registry reaches the meta device's verdict.
"""

from __future__ import annotations

from collections.abc import Mapping

from adapterdoc.adapter.fields import LORA_CONFIG_FIELDS
from adapterdoc.errors import ConfigError, UnsupportedInputError
from adapterdoc.layouts.trees import Unmodeled

MODELLED = frozenset(
    {
        "r",
        "lora_alpha",
        "target_modules",
        "exclude_modules",
        "layers_to_transform",
        "layers_pattern",
        "target_parameters",
        "rank_pattern",
        "alpha_pattern",
        "modules_to_save",
        "use_rslora",
        "use_dora",
        "lora_bias",
        "lora_dropout",
        "init_lora_weights",
        "task_type",
        "bias",
        "fan_in_fan_out",
    }
)
"""The LoraConfig fields whose effect on the created keys the registry models."""
METADATA = frozenset(
    {
        "peft_type",
        "peft_version",
        "base_model_name_or_path",
        "revision",
        "auto_mapping",
        "inference_mode",
        "megatron_core",
        "qalora_group_size",
        "loftq_config",
        "runtime_config",
        "ensure_weight_tying",
    }
)
"""Fields that change nothing PEFT creates (``megatron_core``/``qalora_group_size`` only matter when their
feature is switched on, which is refused below; ``loftq_config`` only with ``init_lora_weights`` "loftq", which
the meta path replaces; ``ensure_weight_tying`` only where modules are tied, which is refused below)."""
TASK_TYPES = (None, "CAUSAL_LM", "FEATURE_EXTRACTION")
"""Task types whose PeftModel class adds no modules of its own (sequence classification adds its head)."""
INIT_STRINGS = ("gaussian", "pissa", "olora", "orthogonal")
"""``init_lora_weights`` strings that change initial values only (the meta path builds them as ``True``)."""


class AdapterUnmodeled(Unmodeled):
    """What the registry does not model is in the adapter's config, not the base's: the message names the field,
    and a "needs torch" refusal names the adapter config, never the base."""


class PeftRefuses(Exception):
    """PEFT raises while it injects the config into this base (the meta path's ``inject_error``)."""


class KeysUnmodeled(Unmodeled):
    """What the registry does not model is how PEFT's loader reads some of the adapter's keys: a "needs torch"
    refusal names the adapter."""


def check_peft_type(raw: Mapping[str, object], path: str | None) -> None:
    """Exit 3 for another ``peft_type``, with :func:`adapterdoc.ml.inject.lora_config_from_raw`'s words."""
    peft_type = str(raw.get("peft_type") or "LORA").upper()
    if peft_type != "LORA":
        raise UnsupportedInputError(path, f"peft_type {peft_type} is not LoRA; verify checks LoRA adapters")


def _post_init_refusal(raw: Mapping[str, object]) -> str | None:
    """``LoraConfig.__post_init__``'s ValueError/TypeError messages (peft 0.21), for the fields modelled here."""
    tm, ltt, lp = raw.get("target_modules"), raw.get("layers_to_transform"), raw.get("layers_pattern")
    if isinstance(raw.get("target_parameters"), str):
        return "`target_parameters` must be a list of strings or None."
    if isinstance(tm, str) and ltt is not None:
        return "`layers_to_transform` cannot be used when `target_modules` is a str."
    if isinstance(tm, str) and lp is not None:
        return "`layers_pattern` cannot be used when `target_modules` is a str."
    if lp and ltt is None:
        return "When `layers_pattern` is specified, `layers_to_transform` must also be specified."
    if raw.get("lora_bias"):
        init = raw.get("init_lora_weights", True)
        if init not in (True, False):
            return (
                "The argument lora_bias=True is only supported with init_lora_weights=True or False, got "
                f"init_lora_weights={init} instead."
            )
        if raw.get("use_dora"):
            return "The argument lora_bias=True is not supported for DoRA, please pass use_dora=False"
    return None


def check_config(raw: Mapping[str, object], path: str | None) -> None:
    """The config as ``LoraConfig.from_pretrained`` takes it: exit 3 where PEFT refuses it (as the meta path's
    :class:`ConfigError`), :class:`AdapterUnmodeled` for a set field the registry does not model. Unknown
    fields are fine: PEFT drops them (AD110/AD111 say so)."""
    check_peft_type(raw, path)
    refusal = _post_init_refusal(raw)
    if refusal:
        raise ConfigError(path, f"PEFT refuses this LoRA config: {refusal}")
    for key, value in raw.items():
        if key not in LORA_CONFIG_FIELDS or key in MODELLED or key in METADATA:
            continue
        if value in (None, False, {}, [], 0, "", ()):
            continue
        raise AdapterUnmodeled(f"adapter config field `{key}` = {value!r} is not modelled by the registry")
    if raw.get("task_type") not in TASK_TYPES:
        raise AdapterUnmodeled(f"adapter config task_type {raw.get('task_type')!r} adds modules of its own")
    if raw.get("bias", "none") in ("all", "lora_only"):
        raise AdapterUnmodeled(f"adapter config bias {raw.get('bias')!r} saves base biases")
    if raw.get("fan_in_fan_out"):
        raise AdapterUnmodeled("adapter config fan_in_fan_out is set")
    init = raw.get("init_lora_weights", True)
    if init not in (True, False) and init not in INIT_STRINGS:
        raise AdapterUnmodeled(f"adapter config init_lora_weights {init!r} is validated by PEFT")


def rank_error(value: object) -> str | None:
    """What ``LoraLayer.update_layer`` raises for this rank (``None``: it builds the layer)."""
    if isinstance(value, int):  # bool too: PEFT compares and builds with it as it is
        if value <= 0:
            return f"`r` should be a positive integer value but the value passed is {value}"
        return None
    if isinstance(value, float):
        return "empty() received an invalid combination of arguments (a float rank)"
    return f"'<=' not supported between instances of '{type(value).__name__}' and 'int'"


def alpha_error(value: object) -> str | None:
    """What the scaling (``lora_alpha / r``) raises for this alpha (``None``: a number)."""
    if isinstance(value, (int, float)):
        return None
    return f"unsupported operand type(s) for /: '{type(value).__name__}' and 'int'"


def layer_errors(raw: Mapping[str, object]) -> str | None:
    """The errors PEFT raises for every layer it builds (dropout, the global rank and alpha, bias); checked only
    when some module is selected (else PEFT's "targets nothing" comes first)."""
    dropout = raw.get("lora_dropout", 0.0)
    if not isinstance(dropout, (int, float)):
        return f"'>' not supported between instances of '{type(dropout).__name__}' and 'float'"
    bias = raw.get("bias", "none")
    if bias not in ("none", "all", "lora_only"):
        return f"Requested bias: {bias}, is not implemented."
    return None


__all__ = [
    "INIT_STRINGS",
    "METADATA",
    "MODELLED",
    "TASK_TYPES",
    "AdapterUnmodeled",
    "KeysUnmodeled",
    "PeftRefuses",
    "alpha_error",
    "check_config",
    "check_peft_type",
    "layer_errors",
    "rank_error",
]
