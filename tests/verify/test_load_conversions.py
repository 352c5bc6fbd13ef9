"""The load-time renamings the registry applies without torch (adapterdoc/layouts/load_conversions.py) are the
installed transformers' and PEFT's (regenerate with scripts/load_conversions.py), and applying them gives the
names PEFT's own ``convert_peft_adapter_state_dict_for_transformers`` gives, key for key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]


def test_the_data_is_the_installed_stacks() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from load_conversions import conversions
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from adapterdoc.layouts.load_conversions import LOAD_RENAMES

    assert conversions() == LOAD_RENAMES


@pytest.mark.parametrize("layout", ["qwen3_5_text", "mistral3_vl", "qwen3_omni_thinker"])
def test_the_renames_are_peft_loaders(layout: str) -> None:
    """Text names, VL names, a double infix and raw keys through both: the same names."""
    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.ml import meta as M
    from adapterdoc.verify.expected_load import load_rename

    lora = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}
    spec = M.resolve_base(f"tiny:{layout}")
    meta = M.build_meta_adapter(spec, M.lora_config_from_raw(lora), config=M.load_config(spec))
    import torch

    keys = dict(meta.expected)
    lay = LAYOUTS[layout]
    rules = [
        (".language_model.", "."),
        (".language_model.", ".language_model.language_model."),
        ("base_model.model.model.", "base_model.model.model.language_model."),
        ("base_model.model.", ""),
        ("base_model.model.", "base_model.model.thinker."),
        ("base_model.model.thinker.", "base_model.model."),
        ("base_model.model.model.", "base_model.model.language_model.model."),
    ]
    tried = 0
    for old, new in [("", ""), *rules]:
        sample = {k.replace(old, new, 1) if old else k: s for k, s in keys.items()}
        if old and sample == keys:
            continue
        state = {k: torch.empty(s, device="meta") for k, s in sample.items()}
        meta._convert(state)
        assert sorted(load_rename(lay.model_type, lay.model_class, sample)) == sorted(state), (
            layout,
            old,
            new,
        )
        tried += 1
    assert tried >= 3
