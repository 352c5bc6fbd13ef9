"""How mlx-lm names a model's parameters: the model-family facts the MLX adapter format (:mod:`adapterdoc.formats.mlx`)
needs, read from mlx-lm's model files (``mlx_lm/models/*.py``, mlx-lm 0.32) and kept here because they are
family facts.

A PEFT module path (without ``base_model.model.``) becomes an mlx-lm parameter path by the first prefix rule of its
layout that matches (``module + "."`` starts with the left side), else by its mlx-lm model's rules
(:data:`FAMILY_PREFIXES`); a path that matches neither keeps its name (mlx-lm's ``llama``, ``qwen2``, ``qwen3``,
``granite``, ``olmo2``, ``stablelm``, ``phi3`` ... models are ``model.layers.N...`` + ``lm_head``, as in
transformers). Which model types mlx-lm has a model for is :mod:`adapterdoc.layouts.mlx_models`, generated from
mlx-lm's package.
"""

from __future__ import annotations

_VL = (("model.language_model.", "language_model.model."), ("lm_head.", "language_model.lm_head."))
"""The VL classes: mlx-lm's ``qwen3_5`` / ``qwen3_5_moe`` / ``mistral3`` ``Model`` holds the text model as
``language_model`` (a ``TextModel`` / ``ministral3.Model``: ``.model`` + ``.lm_head``) and drops the vision tower
(``sanitize`` renames ``model.language_model`` → ``language_model.model``)."""

_WRAPPED_TEXT = (("model.", "language_model.model."), ("lm_head.", "language_model.lm_head."))
"""Qwen3.5's text-only checkpoints: mlx-lm's ``qwen3_5`` ``ModelArgs.from_dict`` wraps a config without
``text_config`` as the text config, and ``sanitize`` prefixes ``language_model.`` to every key: the same
``language_model.model.layers`` paths as the VL class. (mlx-lm has no ``qwen3_5_text`` model type: an adapter of the
text class runs in mlx-lm on the ``qwen3_5`` model of the VL checkpoint, under these paths.)"""

MLX_PREFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "qwen3_5_vl": _VL,
    "qwen3_5_moe_vl": _VL,
    "mistral3_vl": _VL,
    "qwen3_5_text": _WRAPPED_TEXT,
    "qwen3_5_moe_text": _WRAPPED_TEXT,
}
"""Registry layout → (PEFT module prefix, mlx-lm parameter prefix) rules, in order."""

MLX_DEFAULT_FROM = "qwen3_5_vl"
"""Which layout's rules turn an mlx-lm ``language_model.model.`` path back into a PEFT one when neither ``--base``
nor the adapter says the class: the VL class's (``model.language_model.``), which is how the published Qwen3.5 and
Mistral 3 checkpoints are built; the text class is one ``adapterdoc remap --vl`` away."""

FAMILY_PREFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "gpt_neox": (
        ("gpt_neox.layers.", "model.h."),
        ("gpt_neox.", "model."),
        ("embed_out.", "model.embed_out."),
    ),
    "gptj": (("transformer.", "model."),),
}
"""mlx-lm model (``mlx_lm/models/<name>.py``) → (PEFT module prefix, mlx-lm parameter prefix) rules, for the
families whose mlx-lm ``sanitize`` renames transformers' weights (the same module under another path):
``gpt_neox`` (``model.`` + ``.gpt_neox.layers.`` → ``.h.``, ``.gpt_neox.`` → ``.``; ``embed_out`` inside
``model``), ``gptj`` (``transformer.`` → ``model.``). A family not listed keeps transformers' paths; a path whose
first segment is not one of the model's own (:data:`adapterdoc.layouts.mlx_models.MLX_MODELS`: ``gpt2``'s
``transformer.h``, which its ``sanitize`` reads only without the ``transformer.`` prefix) is refused."""

PREFIX_FAMILY = {"gpt_neox.": "gpt_neox"}
"""A PEFT module prefix only one transformers family has (its ``base_model_prefix``) → the mlx-lm model that
family runs on: the family of an adapter converted without ``--base``."""


def mlx_model(model_type: str | None, architectures: tuple[str, ...] = ()) -> str | None:
    """The mlx-lm model module that loads a config of ``model_type`` (mlx-lm's ``_get_classes``: the architecture
    remapping, else ``MODEL_REMAPPING``), or ``None`` when mlx-lm has no model file for it."""
    from adapterdoc.layouts.mlx_models import MLX_ARCHITECTURE_REMAPPING, MLX_MODELS, MLX_REMAPPING

    if not model_type:
        return None
    name = next(
        (
            MLX_ARCHITECTURE_REMAPPING[(model_type, a)]
            for a in architectures
            if (model_type, a) in MLX_ARCHITECTURE_REMAPPING
        ),
        MLX_REMAPPING.get(model_type, model_type),
    )
    return name if name in MLX_MODELS else None


SWITCH_SEGMENT = "switch_mlp"
"""mlx-lm's stacked experts (``SwitchGLU``: ``mlp.switch_mlp.{gate,up,down}_proj``, ``SwitchLinear`` of
``[E, out, in]``) stand where transformers has ``mlp.experts.{e}.{gate,up,down}_proj``; the per-expert PEFT
module ``X.experts.E.P`` is the mlx-lm module ``X.switch_mlp.P`` (``qwen3_moe``, ``qwen3_5_moe``/``qwen3_next``)."""

SWITCH_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
"""The projections of one ``SwitchGLU``."""

MLX_WRAPPER = "language_model."
"""The attribute mlx-lm wraps a VL class's (and Qwen3.5's) language model in: its parameter paths start with it."""
