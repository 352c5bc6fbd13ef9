"""The LoRAX profile (``verify --profile lorax``): LoRAX's adapter rules as its own source states them
(``server/lorax_server/adapters/lora.py``, ``utils/adapter.py``, ``models/flash_*.py`` ``ADAPTER_LAYERS``,
``utils/punica.py``), AD460-AD475. Every rule describes :data:`LORAX_VERSION`; the explanations are in
:mod:`adapterdoc.codes.lorax`; the rules are the exact-text-key reading of
:mod:`~adapterdoc.engines.text_keys`."""

from __future__ import annotations

from typing import ClassVar

from adapterdoc.engines.text_keys import TextKeyProfile, numbered

LORAX_VERSION = "a7394ba3 (v0.4.0+23)"
"""The predibase/lorax commit (v0.4.0 plus 23 commits, 2026-05-28) the rules were read from."""

_DEFAULT = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


class LoraxProfile(TextKeyProfile):
    name = "lorax"
    summary = "LoRAX serving"
    engine = "LoRAX"
    version = LORAX_VERSION
    codes: ClassVar[dict[str, str]] = numbered(460)

    def layer_types(self, model_type: str | None) -> tuple[str, ...]:
        from adapterdoc.layouts.engines import LORAX_ADAPTER_LAYERS

        return LORAX_ADAPTER_LAYERS.get(model_type or "", _DEFAULT)

    def model_type_problem(self, model_type: str | None) -> tuple[str, str] | None:
        from adapterdoc.layouts.engines import LORAX_ADAPTER_LAYERS, LORAX_OTHER_NAMING

        if model_type in LORAX_ADAPTER_LAYERS:
            return None
        if model_type in LORAX_OTHER_NAMING:
            return (
                "not_modelled",
                f"model_type {model_type!r} uses other LoRA weight names; not modelled here",
            )
        return "model_type", f"model_type {model_type!r}: Unsupported model type (models/__init__.py)"


PROFILE = LoraxProfile()
