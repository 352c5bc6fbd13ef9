"""Expected LoRA keys from a base model's config: the module tree on the meta device, PEFT's own injection.

Nothing here reads a weight. The base is built with ``torch.device("meta")`` from its config
(:mod:`adapterdoc.ml.build`), the adapter's ``LoraConfig`` is injected by PEFT (:mod:`adapterdoc.ml.inject`, so
PEFT's own config rewrites, exclusions and target matching apply), and an adapter's tensor names and shapes are
then put through the same steps ``PeftModel.load_adapter`` takes (transformers' weight conversion,
auxiliary-wrapper key maps, the tuner's key remap) with meta tensors standing in for the data. A 400B-parameter
MoE config takes about a second.

The base resolution (:mod:`adapterdoc.bases`) and the builders are re-exported here for the callers that import
them from this module.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from adapterdoc.adapter import WRAPPER
from adapterdoc.bases import TINY_PREFIX, BaseSpec, read_config_json, resolve_base
from adapterdoc.layouts import TOWER_SEGMENTS, tower_segment
from adapterdoc.ml.build import (
    BuiltAs,
    base_layout,
    build_meta_model,
    counterpart_class,
    load_config,
    model_class_for,
    require_ml,
)
from adapterdoc.ml.inject import ADAPTER, inject, lora_config_from_raw
from adapterdoc.ml.quiet import no_warnings

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from torch import Tensor, nn
    from transformers import PretrainedConfig, PreTrainedModel


@dataclass(frozen=True)
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


Shapes = Mapping[str, tuple[int, ...]]
"""Tensor name → shape."""


class KeyMatcher(Protocol):
    """How an adapter's tensor names are matched to an :class:`ExpectedModel`: PEFT's own load steps on the meta
    model (:class:`PeftLoad`), the registry's model of them (:mod:`adapterdoc.verify.expected`), or an engine's
    view of either (:func:`adapterdoc.verify.base.keys_view`)."""

    def match(self, model: ExpectedModel, shapes: Shapes) -> KeyMatch: ...


@dataclass(frozen=True)
class ExpectedModel:
    """What PEFT builds for one adapter config on one base, from the registry's module tree (torch-free,
    :func:`adapterdoc.verify.expected.registry_adapter`) or from the base on the meta device with PEFT's own
    injection (:func:`build_meta_adapter`): the same fields either way, and :meth:`match` for an adapter's keys."""

    base: BaseSpec | None
    model_class: str
    model_type: str
    base_modules: tuple[str, ...]
    """Every module name of the base before injection (no wrapper)."""
    lora_capable_leaves: Mapping[str, bool]
    """Leaf name → True if it occurs outside towers, for Linear/Embedding/Conv1D modules and fused experts."""
    expected: Mapping[str, tuple[int, ...]]
    """Saved-naming key → shape, as ``get_peft_model_state_dict`` would write them."""
    injected_modules: tuple[str, ...]
    """Module paths (no wrapper) PEFT put LoRA on; fused-expert ParamWrappers collapse to ``...experts``."""
    config_before: Mapping[str, object]
    config_after: Mapping[str, object]
    matcher: KeyMatcher | None = field(default=None, compare=False, repr=False)
    """``None`` when nothing can be matched (PEFT refused the injection: every key is unexpected)."""
    inject_error: str | None = None
    layout: str | None = None
    """The registry layout of the base (or of the engine's view of it), when one matches."""
    built_as: BuiltAs | None = None
    """Set when the base was built as the counterpart class the adapter names, not the config's own class."""
    peft_warnings: tuple[str, ...] = ()
    source: str = "meta-device"
    """``registry`` or ``meta-device``."""
    fix: str | None = None
    """On an engine's view of the base (:func:`adapterdoc.verify.base.keys_view`): its ``remap --for`` command."""
    keys_against: Mapping[str, object] | None = None
    """On an engine's view of the base: the report's ``keys_against`` (view, layout, model_class)."""

    @property
    def rewritten(self) -> bool:
        return self.inject_error is None and self.config_before != self.config_after

    def match(self, shapes: Shapes) -> KeyMatch:
        """Missing, unexpected and shape-mismatched keys for an adapter with these tensor names and shapes."""
        if self.matcher is None:
            return KeyMatch([], sorted(shapes), [], 0)
        return self.matcher.match(self, shapes)

    def _convert(self, state: dict[str, Tensor]) -> bool:
        """PEFT's transformers weight conversion alone, on meta tensors (the meta path only)."""
        return isinstance(self.matcher, PeftLoad) and self.matcher.convert(state)


@dataclass(frozen=True)
class PeftLoad:
    """PEFT's load steps (``peft.utils.save_and_load.set_peft_model_state_dict``) on the injected meta model."""

    pm: PeftModel
    model_shapes: Mapping[str, tuple[int, ...]]

    def match(self, model: ExpectedModel, shapes: Shapes) -> KeyMatch:
        import torch

        state = {k: torch.empty(tuple(s), device="meta") for k, s in shapes.items()}
        converted = self.convert(state)
        state = self._aux_remap(state)
        state = self._tuner_remap(state)
        own = self.model_shapes
        unexpected = sorted(k for k in state if k not in own)
        loaded = [k for k in state if k in own]
        missing = sorted(
            _saved_name(k) for k in own if _is_adapter_key(k) and k not in state and not _is_aux(k)
        )
        mismatch = sorted(
            (_saved_name(k), tuple(state[k].shape), own[k]) for k in loaded if tuple(state[k].shape) != own[k]
        )
        return KeyMatch(missing, unexpected, mismatch, len(loaded), converted)

    def convert(self, state: dict[str, Tensor]) -> bool:
        try:
            from peft.import_utils import is_transformers_ge_v5
            from peft.utils.transformers_weight_conversion import (
                convert_peft_adapter_state_dict_for_transformers,
            )
        except ImportError:  # older stacks: no conversion step
            return False
        if not is_transformers_ge_v5 or not hasattr(getattr(self.pm, "config", None), "model_type"):
            return False
        before = set(state)
        try:
            with no_warnings():
                out = convert_peft_adapter_state_dict_for_transformers(
                    model=self.pm,
                    peft_config=self.pm.peft_config[ADAPTER],
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

    def _aux_remap(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        from peft.utils.other import AuxiliaryTrainingWrapper

        for name, module in self.pm.named_modules():
            if isinstance(module, AuxiliaryTrainingWrapper):
                load_map: dict[str, str] = module.adapter_state_dict_load_map(ADAPTER)  # type: ignore[no-untyped-call]  # unannotated in PEFT
                for k, v in load_map.items():
                    lookup, store = f"{name}.{k}", f"{name}.{v}"
                    if lookup in state:
                        state[store] = state.pop(lookup)
        return state

    def _tuner_remap(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        from peft.mapping import PEFT_TYPE_TO_TUNER_MAPPING
        from peft.utils import PeftType

        cfg = self.pm.peft_config[ADAPTER]
        tuner = PEFT_TYPE_TO_TUNER_MAPPING[PeftType(cfg.peft_type)]
        remap = getattr(tuner, "_remap_adapter_state_dict_for_load", None)
        if remap is not None:
            out: dict[str, Tensor] = remap(model=self.pm, config=cfg, adapter_name=ADAPTER, state_dict=state)
            return out
        to_model = {_saved_name(k): k for k in self.model_shapes if _is_adapter_key(k)}  # pragma: no cover
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


def _leaf_kinds(model: nn.Module) -> tuple[list[str], dict[str, bool]]:
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


def build_meta_adapter(
    base: BaseSpec,
    lora_config: LoraConfig,
    *,
    config: PretrainedConfig | None = None,
    model: PreTrainedModel | None = None,
    as_class: str | None = None,
) -> ExpectedModel:
    """Build the base on the meta device and inject ``lora_config`` with PEFT (weights stay on meta).

    ``as_class`` (the adapter's ``auto_mapping.base_model_class``) picks the class when the base can be built
    as more than one (a VL config and its text counterpart): see :func:`counterpart_class`."""
    built_as = None
    if model is None:
        config = config if config is not None else load_config(base)
        picked = counterpart_class(config, base, as_class)
        built_as = picked[2] if picked else None
        model = build_meta_model(base, config, as_class=picked[:2] if picked else None)
    names, leaves = _leaf_kinds(model)
    inj = inject(model, lora_config)
    common = functools.partial(
        ExpectedModel,
        base=base,
        model_class=type(model).__name__,
        model_type=str(getattr(model.config, "model_type", "")),
        base_modules=tuple(names),
        lora_capable_leaves=leaves,
        config_before=inj.config_before,
        config_after=inj.config_after,
        built_as=built_as,
    )
    if inj.pm is None:
        return common(expected={}, injected_modules=(), inject_error=inj.error, layout=base_layout(model))
    injected = sorted({_module_of(k) for k in inj.expected if ".lora_" in k})
    return common(
        expected=inj.expected,
        injected_modules=tuple(injected),
        matcher=PeftLoad(inj.pm, {k: tuple(v.shape) for k, v in inj.pm.state_dict().items()}),
        layout=base_layout(model, injected),
        peft_warnings=tuple(inj.warnings),
    )


def _module_of(saved_key: str) -> str:
    from adapterdoc.adapter import fused_expert_owner, parse_key

    return fused_expert_owner(parse_key(saved_key).module)


def tower_modules(modules: list[str]) -> list[str]:
    """Modules under a tower/projector/talker segment."""
    return [m for m in modules if tower_segment(m) is not None]


__all__ = [
    "ADAPTER",
    "TINY_PREFIX",
    "TOWER_SEGMENTS",
    "WRAPPER",
    "BaseSpec",
    "BuiltAs",
    "ExpectedModel",
    "KeyMatch",
    "KeyMatcher",
    "PeftLoad",
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
