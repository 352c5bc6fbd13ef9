"""The TGI profile (``verify --profile tgi``): text-generation-inference's adapter rules as its own source states
them (``server/text_generation_server/utils/adapter.py``, ``adapters/lora.py``, ``models/__init__.py``, the flash
model files), AD440-AD453. Every rule describes :data:`TGI_VERSION`; the explanations are in
:mod:`adapterdoc.codes.tgi`. The rules themselves are the exact-text-key reading TGI shares with LoRAX
(:mod:`~adapterdoc.engines.text_keys`)."""

from __future__ import annotations

from typing import ClassVar

from adapterdoc.engines.text_keys import TextKeyProfile, numbered

TGI_VERSION = "db931fcf (v3.3.7+1)"
"""The huggingface/text-generation-inference commit (v3.3.7 plus one commit, 2026-01-08) the rules were read from."""


class TgiProfile(TextKeyProfile):
    name = "tgi"
    summary = "TGI serving"
    engine = "TGI"
    version = TGI_VERSION
    codes: ClassVar[dict[str, str]] = numbered(440, without=("kernels", "not_modelled"))

    def layer_types(self, model_type: str | None) -> tuple[str, ...]:
        from adapterdoc.layouts.engines import TGI_ADAPTER_LAYERS

        return TGI_ADAPTER_LAYERS

    def model_type_problem(self, model_type: str | None) -> tuple[str, str] | None:
        from adapterdoc.layouts.engines import TGI_LORA_BROKEN, TGI_LORA_MODEL_TYPES

        if model_type in TGI_LORA_MODEL_TYPES:
            return None
        if model_type in TGI_LORA_BROKEN:
            return "model_type", (
                f"model_type {model_type!r}: TGI's adapter loader reads text_model.model, which its "
                f"{TGI_LORA_BROKEN[model_type]} text model lacks (an AttributeError at start-up, TGI issue #3335): "
                "no adapter can be served on this base"
            )
        return "model_type", (
            f"model_type {model_type!r} has no adapter-aware flash class (build_layer_weight_lookup needs "
            "self_attn.query_key_value): no adapter can be served on this base"
        )


PROFILE = TgiProfile()
