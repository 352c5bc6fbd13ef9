"""The base's transformers config and its model on the meta device, built once for every PEFT-on-meta use:
verify's expected keys, merge's name map and PEFT inventory, training's layout check.

Everything imports torch / transformers inside the function that needs it; nothing here reads a weight.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.bases import BaseSpec, folder_base, read_config_json
from adapterdoc.errors import MissingExtraError, UnsupportedInputError
from adapterdoc.layouts import LAYOUTS, detect_layout, loadable_as
from adapterdoc.ml.quiet import no_warnings

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    ModelClass = type[PreTrainedModel]


def first_line(e: BaseException | None) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    text = str(e).strip() if e is not None else ""
    return text.splitlines()[0] if text else type(e).__name__


def require_ml(what: str | None = None, *, load: bool = True) -> None:
    """Raise :class:`MissingExtraError` (exit 3) unless torch, transformers and peft import (``load`` False: are
    installed, found without importing them, for a command that imports them later and should not hold their
    memory before)."""
    import importlib.util

    for pkg in ("torch", "transformers", "peft"):
        if not load:
            if importlib.util.find_spec(pkg) is None:
                raise MissingExtraError(what, pkg)
            continue
        try:
            __import__(pkg)
        except ImportError as e:
            raise MissingExtraError(what, pkg) from e


def _config_validation_error() -> type[Exception]:
    """What transformers' config classes raise on values that contradict each other (``hidden_size`` not a
    multiple of the head count): huggingface_hub's strict-dataclass error, which is no ``ValueError``."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: its configs raise ValueError
        return ValueError
    return StrictDataclassError


def load_config(base: BaseSpec, what: str | None = None) -> PretrainedConfig:
    """The transformers config of ``base``; never runs repository code, never touches the network."""
    if base.kind != "tiny":
        read_config_json(base)
    require_ml(what or base.spec)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if base.kind == "tiny":
        from adapterdoc.ml.tiny import tiny_config

        return tiny_config(base.tiny_layout or "")
    from transformers import AutoConfig

    assert base.config_path is not None  # read_config_json above found it
    try:
        with no_warnings():
            config: PretrainedConfig = AutoConfig.from_pretrained(base.config_path, local_files_only=True)
            return config
    except (ValueError, KeyError, TypeError, OSError, _config_validation_error()) as e:
        why = e.__cause__ if isinstance(e.__cause__, ValueError) else e  # the strict dataclass's own reason
        raise UnsupportedInputError(
            base.config_path, f"transformers cannot build this config: {first_line(why)}"
        ) from e


def folder_config(folder: str, missing: str) -> PretrainedConfig:
    """The transformers config of an opened checkpoint folder (merge's base), as :func:`load_config` reads it;
    ``missing`` says what needs its config.json when there is none."""
    require_ml(folder)
    return load_config(folder_base(folder, missing))


def model_class_for(config: PretrainedConfig, base: BaseSpec) -> ModelClass:
    """The transformers model class to build: ``architectures[0]``, else the registry, else the Auto mappings."""
    import transformers as tf

    if base.kind == "tiny":
        from adapterdoc.ml.tiny import model_class

        return model_class(base.tiny_layout or "")
    for name in getattr(config, "architectures", None) or []:
        cls: ModelClass | None = getattr(tf, name, None)
        if cls is not None:
            return cls
    for layout in LAYOUTS.values():
        if layout.model_type == config.model_type and hasattr(tf, layout.model_class):
            registered: ModelClass = getattr(tf, layout.model_class)
            return registered
    for auto in ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel"):
        mapping = getattr(getattr(tf, auto, None), "_model_mapping", None)
        try:
            mapped: ModelClass = mapping[type(config)]  # type: ignore[index]
            return mapped
        except (KeyError, TypeError, ValueError):
            continue
    raise UnsupportedInputError(
        base.config_path or base.spec, f"no transformers model class for model_type {config.model_type!r}"
    )


@dataclass(frozen=True)
class BuiltAs:
    """A base built as another class than its config's own: the registry counterpart an adapter names."""

    model_class: str
    layout: str
    default_class: str
    default_layout: str
    config_path: tuple[str, ...]
    """Attributes leading from the base's config to the one the class is built from (``("text_config",)``)."""


def counterpart_class(
    config: PretrainedConfig, base: BaseSpec, class_name: str | None
) -> tuple[ModelClass, PretrainedConfig, BuiltAs] | None:
    """When the base can be built as more than one class and ``class_name`` (an adapter's
    ``auto_mapping.base_model_class``) is one of the others: (class, the config to build it from, what was
    chosen). ``None`` when the class is the base's own, or not one the registry can build from this config."""
    import transformers as tf

    if not class_name:
        return None
    own = model_class_for(config, base)
    if own.__name__ == class_name:
        return None
    mt = getattr(config, "model_type", None)
    if base.kind == "tiny":
        homes = [base.tiny_layout or ""]
    else:
        homes = [n for n, lay in LAYOUTS.items() if lay.model_class == own.__name__ and lay.model_type == mt]
    for home in homes:
        for name, attrs in loadable_as(home)[1:]:
            if LAYOUTS[name].model_class != class_name or not hasattr(tf, class_name):
                continue
            sub: PretrainedConfig | None = config
            for attr in attrs:
                sub = getattr(sub, attr, None)
            if sub is None or getattr(sub, "model_type", None) is None:
                continue
            return getattr(tf, class_name), sub, BuiltAs(class_name, name, own.__name__, home, attrs)
    return None


def build_meta_model(
    base: BaseSpec,
    config: PretrainedConfig | None = None,
    *,
    as_class: tuple[ModelClass, PretrainedConfig] | None = None,
) -> PreTrainedModel:
    """The base model's module tree on the meta device (no memory for weights); ``as_class`` = (class,
    config) from :func:`counterpart_class` builds that class instead of the config's own."""
    import torch

    config = config if config is not None else load_config(base)
    cls = model_class_for(config, base)
    if as_class is not None:
        cls, config = as_class
    try:
        with no_warnings(), torch.device("meta"):
            model: PreTrainedModel = cls._from_config(config)  # type: ignore[no-untyped-call]  # unannotated in transformers
            return model
    except Exception as e:  # model constructors raise anything on odd configs
        raise UnsupportedInputError(
            base.config_path or base.spec, f"cannot build {cls.__name__} from this config: {first_line(e)}"
        ) from e


def base_layout(model: PreTrainedModel, injected: list[str] | None = None) -> str | None:
    """The registry layout of a built base: by class and model_type, then by its module names."""
    cls = type(model).__name__
    mt = getattr(model.config, "model_type", None)
    hits = [n for n, lay in LAYOUTS.items() if lay.model_class == cls and lay.model_type == mt]
    if len(hits) == 1:
        return hits[0]
    names = [n for n, _ in model.named_modules() if n]
    fitting = [h for h in hits if all(any(re.search(rx, n) for n in names) for rx in LAYOUTS[h].requires)]
    if len(fitting) == 1:
        return fitting[0]
    det = detect_layout(injected or names)
    if det.name in (fitting or hits):
        return det.name
    if fitting or hits:
        return (fitting or hits)[0]
    return det.name if det.name in LAYOUTS else None


__all__ = [
    "BuiltAs",
    "base_layout",
    "build_meta_model",
    "counterpart_class",
    "first_line",
    "folder_config",
    "load_config",
    "model_class_for",
    "require_ml",
]
