"""The PEFT adapter config model and the LoRA key grammar (module path, A/B, magnitude, embedding, experts).

Torch-free. ``keys`` splits tensor names, ``fields`` knows PEFT's config fields, ``config`` parses and checks
``adapter_config.json``, ``targets`` mirrors PEFT's matching rules (tests compare them with PEFT's functions).
"""

from __future__ import annotations

from adapterdoc.adapter.config import AdapterConfig
from adapterdoc.adapter.fields import (
    ADAPTER_CONFIG,
    LOADING_FIELDS,
    LORA_CONFIG_FIELDS,
    PEFT_CONFIG_FIELDS,
    ConfigProblem,
)
from adapterdoc.adapter.keys import (
    WRAPPER,
    LoraKey,
    fused_expert_owner,
    module_counts,
    parse_key,
    peft_load_name,
)
from adapterdoc.adapter.targets import module_name_matches, pattern_key, peft_selects

__all__ = [
    "ADAPTER_CONFIG",
    "LOADING_FIELDS",
    "LORA_CONFIG_FIELDS",
    "PEFT_CONFIG_FIELDS",
    "WRAPPER",
    "AdapterConfig",
    "ConfigProblem",
    "LoraKey",
    "fused_expert_owner",
    "module_counts",
    "module_name_matches",
    "parse_key",
    "pattern_key",
    "peft_load_name",
    "peft_selects",
]
