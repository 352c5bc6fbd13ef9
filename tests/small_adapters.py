"""A small ministral3_text-shaped adapter written with numpy (no torch), for tests of the CLI's edges."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

BASE = "tiny:ministral3_text"
"""The base the adapter fits."""


def write_small_adapter(folder: Path, hidden: int = 64) -> Path:
    """``folder`` (created) holding one q_proj LoRA, r=2, ones in A and B (``hidden`` 64 fits :data:`BASE`)."""
    folder.mkdir()
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file(
        {
            f"{key}.lora_A.weight": np.ones((2, hidden), np.float32),
            f"{key}.lora_B.weight": np.ones((hidden, 2), np.float32),
        },
        folder / "adapter_model.safetensors",
        metadata={"format": "pt"},
    )
    (folder / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]})
    )
    return folder
