"""Tiny random reference models for every layout in the registry, deterministic per seed.

The configs are plain data in the family modules (:attr:`adapterdoc.layouts.Layout.tiny`); this module only turns
them into transformers configs and torch models.

The same (layout, seed) always gives the same base weights, so a base rebuilt later (``verify --base tiny:LAYOUT``)
is identical to the one an adapter was trained on. Each builds in well under a second on CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.layouts import LAYOUTS, get_layout, move_rules, rename, tiny_layouts

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel


def tiny_config(layout: str) -> PretrainedConfig:
    """The tiny transformers config of ``layout`` (a name from :data:`adapterdoc.layouts.LAYOUTS`), built from the
    registry's plain-data reference config."""
    import transformers as tf

    lay = LAYOUTS.get(layout)
    if lay is None or lay.tiny is None:
        raise KeyError(f"no tiny reference config for layout {layout!r}; have: {', '.join(TINY_LAYOUTS)}")
    config: PretrainedConfig = getattr(tf, lay.tiny.config_class)(**lay.tiny.kwargs())
    return config


TINY_LAYOUTS = tiny_layouts()
"""Layouts with a tiny reference model (:func:`adapterdoc.layouts.tiny_layouts`)."""


def model_class(layout: str) -> type[PreTrainedModel]:
    import transformers as tf

    cls: type[PreTrainedModel] = getattr(tf, get_layout(layout).model_class)
    return cls


def build_tiny(layout: str, seed: int = 0, *, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A tiny random model of ``layout`` in eval mode; identical weights for identical (layout, seed)."""
    import torch

    cfg = tiny_config(layout)
    cls = model_class(layout)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model: PreTrainedModel = cls._from_config(cfg, dtype=dtype or torch.float32)  # type: ignore[no-untyped-call]  # unannotated in transformers
    model.eval()  # type: ignore[no-untyped-call]  # unannotated in transformers
    return model


def counterpart_state(
    src_model: torch.nn.Module, src_layout: str, dst_layout: str
) -> dict[str, torch.Tensor]:
    """``src_model``'s weights renamed into ``dst_layout``'s module names with the registry's remap rules."""
    rules = move_rules(src_layout, dst_layout)
    if rules is None:
        raise KeyError(f"the registry has no move from {src_layout} to {dst_layout}")
    return {rename(rules, name): tensor for name, tensor in src_model.state_dict().items()}


def build_counterpart(
    src_model: torch.nn.Module, src_layout: str, dst_layout: str, dst: PreTrainedModel | None = None
) -> PreTrainedModel:
    """A ``dst_layout`` model holding ``src_model``'s base weights (towers dropped); every dst weight is filled.
    ``dst``: the (empty) model to fill, for a base that is not a tiny one; default the tiny ``dst_layout``."""
    dst = dst if dst is not None else build_tiny(dst_layout, seed=12345)
    state = counterpart_state(src_model, src_layout, dst_layout)
    own = dst.state_dict()
    usable = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    missing = [k for k in own if k not in usable]
    tied = getattr(dst.config, "tie_word_embeddings", False) or getattr(
        getattr(dst.config, "get_text_config", lambda: dst.config)(), "tie_word_embeddings", False
    )
    missing = [k for k in missing if not (tied and k.endswith("lm_head.weight"))]
    if missing:
        raise RuntimeError(f"{dst_layout} weights not provided by {src_layout}: {missing[:5]}")
    dst.load_state_dict(usable, strict=False)
    dst.eval()  # type: ignore[no-untyped-call]  # unannotated in transformers
    return dst
