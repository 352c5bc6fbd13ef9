"""How mlx-lm names a model's parameters: the model-family facts the MLX adapter format (:mod:`adapterdoc.formats.mlx`)
needs, read from mlx-lm's model files (``mlx_lm/models/*.py``, mlx-lm 0.32) and kept here because they are
family facts.

A PEFT module path (without ``base_model.model.``) becomes an mlx-lm parameter path by the first prefix rule of its
layout that matches (``module + "."`` starts with the left side); a layout not listed keeps its paths (mlx-lm's
``llama``, ``qwen2``, ``qwen3``, ``qwen3_moe``, ``ministral3`` models are ``model.layers.N...`` + ``lm_head``, as in
transformers).
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

MLX_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "qwen3_5",
        "qwen3_5_moe",
        "mistral3",
        "ministral3",
        "gemma3",
        "gemma3_text",
    }
)
"""``config.model_type``s mlx-lm has a model file for (``mlx_lm/models/<type>.py``), among the ones adapterdoc
meets; verify of an MLX adapter against a base of another type says mlx-lm cannot load it."""

SWITCH_SEGMENT = "switch_mlp"
"""mlx-lm's stacked experts (``SwitchGLU``: ``mlp.switch_mlp.{gate,up,down}_proj``, ``SwitchLinear`` of
``[E, out, in]``) stand where transformers has ``mlp.experts.{e}.{gate,up,down}_proj``; the per-expert PEFT
module ``X.experts.E.P`` is the mlx-lm module ``X.switch_mlp.P`` (``qwen3_moe``, ``qwen3_5_moe``/``qwen3_next``)."""

SWITCH_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
"""The projections of one ``SwitchGLU``."""

MLX_WRAPPER = "language_model."
"""The attribute mlx-lm wraps a VL class's (and Qwen3.5's) language model in: its parameter paths start with it."""
