"""Expected LoRA keys from a base model's config: the module tree on the meta device, PEFT's own injection.

Nothing here reads a weight. The base is built with ``torch.device("meta")`` from its config, the adapter's
``LoraConfig`` is injected with ``get_peft_model(..., low_cpu_mem_usage=True)`` (so PEFT's own config rewrites,
exclusions and target matching apply), and an adapter's tensor names and shapes are then put through the same
steps ``PeftModel.load_adapter`` takes (transformers' weight conversion, auxiliary-wrapper key maps, the tuner's
key remap) with meta tensors standing in for the data. A 400B-parameter MoE config takes about a second.

``resolve_base`` is torch-free; everything else imports torch, transformers and peft inside its functions.
"""

from __future__ import annotations

import copy
import json
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.errors import ConfigError, InputNotFoundError, MissingExtraError, UnsupportedInputError
from adapterdoc.layouts import LAYOUTS, TOWER_SEGMENTS, detect_layout, loadable_as, tower_segment

ADAPTER = "default"
"""The adapter name used on the meta model: the one ``PeftModel.from_pretrained`` uses."""
WRAPPER = "base_model.model."
TINY_PREFIX = "tiny:"
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


# --------------------------------------------------------------------------------------------- the base, torch-free


@dataclass(frozen=True)
class BaseSpec:
    """A ``--base`` argument, resolved: where its config is and whether weights sit beside it."""

    spec: str
    kind: str
    """``dir``, ``config`` (a config.json file), ``repo`` (local Hugging Face cache) or ``tiny``."""
    root: str | None = None
    """The model directory (``dir``/``repo``/``config``: the folder holding config.json)."""
    config_path: str | None = None
    tiny_layout: str | None = None
    has_weights: bool = False
    """Whether real weights can be loaded (``--load``); the tiny bases always can (fixed seed)."""


def resolve_base(spec: str) -> BaseSpec:
    """Resolve ``--base``: a model directory, a ``config.json``, ``tiny:LAYOUT`` or a cached ``org/name[@rev]``."""
    if spec.startswith(TINY_PREFIX):
        layout = spec[len(TINY_PREFIX) :]
        from adapterdoc.ml.tiny import TINY_LAYOUTS

        if layout not in TINY_LAYOUTS:
            raise UnsupportedInputError(
                spec, f"no tiny reference model for {layout!r}; have: {', '.join(TINY_LAYOUTS)}"
            )
        return BaseSpec(spec, "tiny", tiny_layout=layout, has_weights=True)
    if os.path.isdir(spec):
        cfg = os.path.join(spec, "config.json")
        if not os.path.isfile(cfg):
            raise InputNotFoundError(
                spec, "is a directory without config.json (pass the base model's folder)"
            )
        return BaseSpec(spec, "dir", root=spec, config_path=cfg, has_weights=_has_weights(spec))
    if os.path.isfile(spec):
        if not spec.endswith(".json"):
            raise UnsupportedInputError(
                spec, "a base must be a model directory, a config.json, or tiny:LAYOUT"
            )
        root = os.path.dirname(os.path.abspath(spec))
        return BaseSpec(spec, "config", root=root, config_path=spec, has_weights=False)
    if os.path.lexists(spec):
        raise InputNotFoundError(spec, "is a broken symlink")
    from adapterdoc.checkpoint import _REPO_ID, resolve_cached_repo

    m = _REPO_ID.match(spec)
    if m and not spec.startswith((".", "/")):
        snapshot = resolve_cached_repo(m["repo"], m["rev"])
        cfg = os.path.join(snapshot, "config.json")
        if not os.path.isfile(cfg):
            raise InputNotFoundError(spec, "the cached snapshot has no config.json")
        return BaseSpec(spec, "repo", root=snapshot, config_path=cfg, has_weights=_has_weights(snapshot))
    raise InputNotFoundError(spec, "no such file or directory")


def _has_weights(folder: str) -> bool:
    if any(os.path.exists(os.path.join(folder, f)) for f in _WEIGHT_FILES):
        return True
    try:
        return any(f.endswith(".safetensors") for f in os.listdir(folder))
    except OSError:
        return False


# --------------------------------------------------------------------------------------------- torch side


def require_ml(what: str | None = None) -> None:
    """Raise :class:`MissingExtraError` (exit 3) unless torch, transformers and peft import."""
    for pkg in ("torch", "transformers", "peft"):
        try:
            __import__(pkg)
        except ImportError as e:
            raise MissingExtraError(what, pkg) from e


def read_config_json(base: BaseSpec) -> dict[str, Any]:
    """The base's ``config.json`` as a dict, torch-free; refuses what no path can use (remote code, no type)."""
    assert base.config_path is not None
    try:
        with open(base.config_path, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(base.config_path, f"cannot read the model config: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(base.config_path, "config.json must be a JSON object")
    if "auto_map" in raw:
        raise UnsupportedInputError(
            base.config_path,
            "the config needs trust_remote_code (auto_map); adapterdoc never runs repository code",
        )
    if "model_type" not in raw:
        raise ConfigError(base.config_path, "config.json has no `model_type`")
    return raw


def load_config(base: BaseSpec, what: str | None = None) -> Any:
    """The transformers config of ``base``; never runs repository code, never touches the network."""
    if base.kind != "tiny":
        read_config_json(base)
    require_ml(what or base.spec)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if base.kind == "tiny":
        from adapterdoc.ml.tiny import tiny_config

        return tiny_config(base.tiny_layout or "")
    from transformers import AutoConfig

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoConfig.from_pretrained(base.config_path, local_files_only=True)
    except (ValueError, KeyError, TypeError, OSError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsupportedInputError(
            base.config_path, f"transformers cannot build this config: {reason}"
        ) from e


def model_class_for(config: Any, base: BaseSpec) -> Any:
    """The transformers model class to build: ``architectures[0]``, else the registry, else the Auto mappings."""
    import transformers as tf

    if base.kind == "tiny":
        from adapterdoc.ml.tiny import model_class

        return model_class(base.tiny_layout or "")
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(tf, name, None)
        if cls is not None:
            return cls
    for layout in LAYOUTS.values():
        if layout.model_type == config.model_type and hasattr(tf, layout.model_class):
            return getattr(tf, layout.model_class)
    for auto in ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel"):
        mapping = getattr(getattr(tf, auto, None), "_model_mapping", None)
        try:
            return mapping[type(config)]  # type: ignore[index]
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


def counterpart_class(config: Any, base: BaseSpec, class_name: str | None) -> tuple[Any, Any, BuiltAs] | None:
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
            sub = config
            for attr in attrs:
                sub = getattr(sub, attr, None)
            if sub is None or getattr(sub, "model_type", None) is None:
                continue
            return getattr(tf, class_name), sub, BuiltAs(class_name, name, own.__name__, home, attrs)
    return None


def build_meta_model(base: BaseSpec, config: Any = None, *, as_class: tuple[Any, Any] | None = None) -> Any:
    """The base model's module tree on the meta device (no memory for weights); ``as_class`` = (class,
    config) from :func:`counterpart_class` builds that class instead of the config's own."""
    import torch

    config = config if config is not None else load_config(base)
    cls = model_class_for(config, base)
    if as_class is not None:
        cls, config = as_class
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):
                return cls._from_config(config)
    except Exception as e:  # model constructors raise anything on odd configs
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsupportedInputError(
            base.config_path or base.spec, f"cannot build {cls.__name__} from this config: {reason}"
        ) from e


# --------------------------------------------------------------------------------------------- LoRA config


def lora_config_from_raw(raw: Mapping[str, Any], path: str | None = None) -> Any:
    """PEFT's ``LoraConfig`` from an adapter_config.json dict, the way ``LoraConfig.from_pretrained`` builds it."""
    from peft import LoraConfig

    kwargs = dict(raw)
    peft_type = str(kwargs.get("peft_type") or "LORA").upper()
    if peft_type != "LORA":
        raise UnsupportedInputError(path, f"peft_type {peft_type} is not LoRA; verify checks LoRA adapters")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kwargs = LoraConfig.check_kwargs(**kwargs)
            return LoraConfig.from_peft_type(**kwargs)
    except (TypeError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(path, f"PEFT refuses this LoRA config: {reason}") from e


def _for_meta(config: Any) -> Any:
    """A copy whose initialisation needs no base weights: shapes do not depend on the init method."""
    cfg = copy.deepcopy(config)
    if not isinstance(cfg.init_lora_weights, bool):
        cfg.init_lora_weights = True
    if getattr(cfg, "loftq_config", None):
        cfg.loftq_config = {}
    cfg.inference_mode = True
    return cfg


_REWRITE_FIELDS = ("target_modules", "target_parameters", "rank_pattern", "alpha_pattern", "modules_to_save")


def _snapshot(cfg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in _REWRITE_FIELDS:
        v = getattr(cfg, f, None)
        if isinstance(v, (set, frozenset, list, tuple)):
            v = sorted(v)
        elif isinstance(v, dict):
            v = dict(sorted(v.items()))
        out[f] = v or None
    return out


# --------------------------------------------------------------------------------------------- the meta adapter model


@dataclass
class KeyMatch:
    """An adapter's tensors put through PEFT's load path on the meta model."""

    missing: list[str]
    """Saved-naming keys PEFT would create and the adapter does not provide (PEFT's ``missing_keys``)."""
    unexpected: list[str]
    """Adapter keys (after PEFT's transformers conversion) that match no model key (PEFT's ``unexpected_keys``)."""
    shape_mismatch: list[tuple[str, tuple[int, ...], tuple[int, ...]]]
    """(saved-naming key, shape in the file, shape PEFT builds)."""
    loaded: int
    converted: bool = False
    """Whether transformers' weight conversion renamed or fused any key (e.g. per-expert → fused)."""


@dataclass
class MetaAdapterModel:
    """A base on the meta device with one adapter config injected by PEFT."""

    base: BaseSpec
    model_class: str
    model_type: str
    base_modules: list[str]
    """Every module name of the base before injection (no wrapper)."""
    lora_capable_leaves: dict[str, bool]
    """Leaf name → True if it occurs outside towers, for Linear/Embedding/Conv1D modules and fused experts."""
    expected: dict[str, tuple[int, ...]]
    """Saved-naming key → shape, as ``get_peft_model_state_dict`` would write them."""
    injected_modules: list[str]
    """Module paths (no wrapper) PEFT put LoRA on; fused-expert ParamWrappers collapse to ``...experts``."""
    config_before: dict[str, Any]
    config_after: dict[str, Any]
    inject_error: str | None = None
    layout: str | None = None
    """The registry layout of the base, when one matches."""
    built_as: BuiltAs | None = None
    """Set when the base was built as the counterpart class the adapter names, not the config's own class."""
    peft_warnings: list[str] = field(default_factory=list)
    _pm: Any = None
    _model_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def rewritten(self) -> bool:
        return self.inject_error is None and self.config_before != self.config_after

    @property
    def effective_config(self) -> Any:
        return None if self._pm is None else self._pm.peft_config[ADAPTER]

    def match(self, shapes: Mapping[str, tuple[int, ...]]) -> KeyMatch:
        """Missing, unexpected and shape-mismatched keys for an adapter with these tensor names and shapes."""
        if self._pm is None:
            return KeyMatch([], sorted(shapes), [], 0)
        import torch

        state = {k: torch.empty(tuple(s), device="meta") for k, s in shapes.items()}
        converted = self._convert(state)
        state = self._aux_remap(state)
        state = self._tuner_remap(state)
        model = self._model_shapes
        unexpected = sorted(k for k in state if k not in model)
        loaded = [k for k in state if k in model]
        missing = sorted(
            _saved_name(k) for k in model if _is_adapter_key(k) and k not in state and not _is_aux(k)
        )
        mismatch = sorted(
            (_saved_name(k), tuple(state[k].shape), model[k])
            for k in loaded
            if tuple(state[k].shape) != model[k]
        )
        return KeyMatch(missing, unexpected, mismatch, len(loaded), converted)

    # -- PEFT's load steps (peft.utils.save_and_load.set_peft_model_state_dict), on meta tensors
    def _convert(self, state: dict[str, Any]) -> bool:
        try:
            from peft.import_utils import is_transformers_ge_v5
            from peft.utils.transformers_weight_conversion import (
                convert_peft_adapter_state_dict_for_transformers,
            )
        except ImportError:  # older stacks: no conversion step
            return False
        if not is_transformers_ge_v5 or not hasattr(getattr(self._pm, "config", None), "model_type"):
            return False
        before = set(state)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = convert_peft_adapter_state_dict_for_transformers(
                    model=self._pm,
                    peft_config=self._pm.peft_config[ADAPTER],
                    adapter_state_dict=state,
                    adapter_name=ADAPTER,
                )
        except (
            Exception
        ):  # a conversion that fails on these shapes fails in PEFT too; keep the names as they are
            return False
        out = dict(out)  # PEFT returns its input unchanged when there is nothing to convert
        state.clear()
        state.update(out)
        return set(out) != before

    def _aux_remap(self, state: dict[str, Any]) -> dict[str, Any]:
        from peft.utils.other import AuxiliaryTrainingWrapper

        for name, module in self._pm.named_modules():
            if isinstance(module, AuxiliaryTrainingWrapper):
                for k, v in module.adapter_state_dict_load_map(ADAPTER).items():
                    lookup, store = f"{name}.{k}", f"{name}.{v}"
                    if lookup in state:
                        state[store] = state.pop(lookup)
        return state

    def _tuner_remap(self, state: dict[str, Any]) -> dict[str, Any]:
        from peft.mapping import PEFT_TYPE_TO_TUNER_MAPPING

        cfg = self._pm.peft_config[ADAPTER]
        tuner = PEFT_TYPE_TO_TUNER_MAPPING[cfg.peft_type]
        remap = getattr(tuner, "_remap_adapter_state_dict_for_load", None)
        if remap is not None:
            return remap(model=self._pm, config=cfg, adapter_name=ADAPTER, state_dict=state)
        to_model = {_saved_name(k): k for k in self._model_shapes if _is_adapter_key(k)}  # pragma: no cover
        return {to_model.get(k, k): v for k, v in state.items()}  # pragma: no cover


def _is_adapter_key(key: str) -> bool:
    """PeftModel.load_adapter's filter for ``missing_keys``: the tuner prefix and the adapter name."""
    return "lora_" in key and ADAPTER in key


def _is_aux(key: str) -> bool:
    return f".modules_to_save.{ADAPTER}." in key or ".original_module." in key


def _saved_name(key: str) -> str:
    """PEFT's saved naming: the adapter name removed (``lora_A.default.weight`` → ``lora_A.weight``)."""
    aux = key.replace(f".modules_to_save.{ADAPTER}.", ".")
    if aux != key:
        return aux
    if key.endswith(f".{ADAPTER}"):
        return key[: -len(ADAPTER) - 1]
    head, _, tail = key.rpartition(".")
    head = re.sub(re.escape(f".{ADAPTER}") + r"$", "", head)
    return f"{head}.{tail}"


def _leaf_kinds(model: Any) -> tuple[list[str], dict[str, bool]]:
    import torch

    names: list[str] = []
    leaves: dict[str, bool] = {}
    linear_types: tuple[type, ...] = (torch.nn.Linear, torch.nn.Embedding)
    try:
        from transformers.pytorch_utils import Conv1D

        linear_types = (*linear_types, Conv1D)
    except ImportError:  # pragma: no cover
        pass
    for name, mod in model.named_modules():
        if not name:
            continue
        names.append(name)
        leaf = name.rpartition(".")[2]
        fused = any(p.dim() == 3 for p in mod.parameters(recurse=False))
        if isinstance(mod, linear_types) or fused:
            key = "experts" if fused and leaf == "experts" else leaf
            outside = tower_segment(name) is None
            leaves[key] = leaves.get(key, False) or outside
    return names, leaves


def base_layout(model: Any, injected: list[str] | None = None) -> str | None:
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


def build_meta_adapter(
    base: BaseSpec, lora_config: Any, *, config: Any = None, model: Any = None, as_class: str | None = None
) -> MetaAdapterModel:
    """Build the base on the meta device and inject ``lora_config`` with PEFT (weights stay on meta).

    ``as_class`` (the adapter's ``auto_mapping.base_model_class``) picks the class when the base can be built
    as more than one (a VL config and its text counterpart): see :func:`counterpart_class`."""
    from peft import get_peft_model, get_peft_model_state_dict

    built_as = None
    if model is None:
        config = config if config is not None else load_config(base)
        picked = counterpart_class(config, base, as_class)
        built_as = picked[2] if picked else None
        model = build_meta_model(base, config, as_class=picked[:2] if picked else None)
    names, leaves = _leaf_kinds(model)
    cfg = _for_meta(lora_config)
    before = _snapshot(cfg)
    out = MetaAdapterModel(
        base=base,
        model_class=type(model).__name__,
        model_type=str(getattr(model.config, "model_type", "")),
        base_modules=names,
        lora_capable_leaves=leaves,
        expected={},
        injected_modules=[],
        config_before=before,
        config_after=before,
        built_as=built_as,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            pm = get_peft_model(model, cfg, adapter_name=ADAPTER, low_cpu_mem_usage=True)
        except (ValueError, KeyError, TypeError, RuntimeError, NotImplementedError) as e:
            out.inject_error = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            out.layout = base_layout(model)
            return out
        sd = get_peft_model_state_dict(pm, adapter_name=ADAPTER, save_embedding_layers=False)
    out.peft_warnings = sorted({str(w.message).splitlines()[0] for w in caught})[:20]
    out._pm = pm
    out._model_shapes = {k: tuple(v.shape) for k, v in pm.state_dict().items()}
    out.expected = {k: tuple(v.shape) for k, v in sd.items()}
    out.config_after = _snapshot(pm.peft_config[ADAPTER])
    injected = sorted({_module_of(k) for k in out.expected if ".lora_" in k})
    out.injected_modules = injected
    out.layout = base_layout(model, injected)
    return out


def _module_of(saved_key: str) -> str:
    from adapterdoc.adapter import fused_expert_owner, parse_key

    return fused_expert_owner(parse_key(saved_key).module)


def tower_modules(modules: list[str]) -> list[str]:
    """Modules under a tower/projector/talker segment."""
    return [m for m in modules if tower_segment(m) is not None]


__all__ = [
    "ADAPTER",
    "TOWER_SEGMENTS",
    "BaseSpec",
    "BuiltAs",
    "KeyMatch",
    "MetaAdapterModel",
    "base_layout",
    "build_meta_adapter",
    "build_meta_model",
    "counterpart_class",
    "load_config",
    "lora_config_from_raw",
    "model_class_for",
    "read_config_json",
    "require_ml",
    "resolve_base",
    "tower_modules",
]
