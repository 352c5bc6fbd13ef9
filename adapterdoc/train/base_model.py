"""A user's ``--base`` for `adapterdoc train` and `adapterdoc eval`: a model folder (weights + tokenizer), a cached
repo id (offline) or ``tiny:LAYOUT`` (a tokenizer is trained on the rows). The layout comes from the base's config
through the registry; the weights are loaded forward routed (through the layout's ``forward_via``). A causal LM the
registry does not know is trained too (``layout`` is empty: PEFT's own target rules, no tower exclusions)."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.train.models import route_forward

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Base:
    """A resolved ``--base``: its layout, how to build it, and its tokenizer."""

    spec: str
    name: str
    """What the adapter config records as ``base_model_name_or_path`` (and verify reads back)."""
    layout: str
    """The registry layout; ``""`` for a causal LM outside the registry."""
    kind: str
    root: str | None
    model_class: type[PreTrainedModel]
    tokenizer: PreTrainedTokenizerBase

    @property
    def known(self) -> bool:
        """Whether the registry knows this base's layout (its targets, towers and routing)."""
        return bool(self.layout)


def open_base(spec: str, train_texts: list[str] | None = None, tokenizer_dir: str | None = None) -> Base:
    """Resolve ``spec``; the tokenizer is ``tokenizer_dir``'s when given (an adapter saved with one), else the
    base's own, else (``tiny:``) one trained on ``train_texts``."""
    from adapterdoc.bases import resolve_base
    from adapterdoc.ml import meta as M

    M.require_ml(spec)
    bs = resolve_base(spec)
    config = M.load_config(bs)
    cls = M.model_class_for(config, bs)
    if bs.kind == "tiny":
        layout = bs.tiny_layout or ""
        name = spec
    else:
        if not bs.has_weights:
            raise UnsupportedInputError(
                spec, "training needs the base's weights; this folder has only config.json"
            )
        layout = M.base_layout(M.build_meta_model(bs, config)) or ""
        name = spec if bs.kind == "repo" else os.path.abspath(bs.root or spec)
    from adapterdoc.layouts import LAYOUTS

    if layout not in LAYOUTS:
        layout = ""
        _check_causal(spec, cls)
    tok_root = tokenizer_dir or bs.root
    if tok_root and has_tokenizer(tok_root):
        tok = _load_tokenizer(tok_root)
    elif bs.kind == "tiny":
        from adapterdoc.train.tokenizer import chat_tokenizer

        tok = chat_tokenizer(train_texts or ["a"])
    else:
        raise UnsupportedInputError(
            spec, "has no tokenizer (tokenizer.json / tokenizer_config.json) to encode rows"
        )
    return Base(spec, name, layout, bs.kind, bs.root, cls, tok)


def _check_causal(spec: str, cls: type[PreTrainedModel]) -> None:
    """A base outside the registry is trained as a causal LM: its class must be one transformers' causal-LM
    auto class builds (the encoder heads need the registry's knowledge of their pooling and masking)."""
    from transformers import AutoModelForCausalLM

    mapping = getattr(AutoModelForCausalLM, "_model_mapping", None)
    causal = {c.__name__ for c in (mapping.values() if mapping is not None else ())}
    if cls.__name__ not in causal and not cls.__name__.endswith("ForCausalLM"):
        raise UnsupportedInputError(
            spec,
            f"{cls.__name__} is not a layout of the registry and not a causal LM: outside the registry only "
            "causal LMs (a ...ForCausalLM class) are trained",
        )


def has_tokenizer(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json"))


def _load_tokenizer(folder: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UnsupportedInputError(
            folder, f"transformers cannot load its tokenizer: {_first_line(e)}"
        ) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def torch_dtype(name: str) -> torch.dtype | str:
    import torch

    if name == "auto":
        return "auto"
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_model(base: Base, dtype: str = "float32", seed: int = 0) -> PreTrainedModel:
    """The base's weights (a tiny base from its fixed seed), forward routed (:func:`~adapterdoc.train.models.route_forward`)."""
    if base.kind == "tiny":
        from adapterdoc.ml.tiny import build_tiny

        dt = torch_dtype(dtype)
        model = build_tiny(base.layout, seed, dtype=None if isinstance(dt, str) else dt)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = base.model_class.from_pretrained(
                base.root, dtype=torch_dtype(dtype), local_files_only=True
            )
    return route_forward(model, base.layout)
