"""PEFT's own LoRA injection on a meta-device model: the one place a ``LoraConfig`` is built from an adapter's
config and injected, yielding the keys PEFT would save (``expected``) and every layer it wrapped (``targets``).

Verify reads the expected keys and the config rewrites; merge reads the targets (rank, scaling, layer kind).
torch and peft are imported inside the functions.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from adapterdoc.adapter import WRAPPER, AdapterConfig, fused_expert_owner
from adapterdoc.errors import ConfigError, UnsupportedInputError
from adapterdoc.ml.build import first_line
from adapterdoc.ml.quiet import no_warnings

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, PeftConfig, PeftModel
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.layer import ParamWrapper
    from peft.tuners.trainable_tokens import TrainableTokensLayer
    from torch import nn

ADAPTER = "default"
"""The adapter name used on the meta model: the one ``PeftModel.from_pretrained`` uses."""


def lora_config_from_raw(
    raw: Mapping[str, object], path: str | None = None, *, not_lora: str | None = None
) -> LoraConfig:
    """PEFT's ``LoraConfig`` from an adapter_config.json dict, the way ``LoraConfig.from_pretrained`` builds it.

    ``not_lora`` is the refusal for another ``peft_type`` (after ``peft_type X``); verify's wording by default."""
    from peft import LoraConfig

    kwargs = dict(raw)
    peft_type = str(kwargs.get("peft_type") or "LORA").upper()
    if peft_type != "LORA":
        raise UnsupportedInputError(
            path, f"peft_type {peft_type} {not_lora or 'is not LoRA; verify checks LoRA adapters'}"
        )
    try:
        with no_warnings():
            kwargs = LoraConfig.check_kwargs(**kwargs)  # type: ignore[no-untyped-call]  # unannotated in PEFT
            config: LoraConfig = LoraConfig.from_peft_type(**kwargs)  # type: ignore[no-untyped-call]  # unannotated in PEFT
            return config
    except (TypeError, ValueError) as e:
        raise ConfigError(path, f"PEFT refuses this LoRA config: {first_line(e)}") from e


def for_meta(config: LoraConfig) -> LoraConfig:
    """A copy whose initialisation needs no base weights: shapes do not depend on the init method."""
    cfg = copy.deepcopy(config)
    if not isinstance(cfg.init_lora_weights, bool):
        cfg.init_lora_weights = True
    if getattr(cfg, "loftq_config", None):
        cfg.loftq_config = {}
    cfg.inference_mode = True
    return cfg


_REWRITE_FIELDS = ("target_modules", "target_parameters", "rank_pattern", "alpha_pattern", "modules_to_save")


def snapshot(cfg: PeftConfig) -> dict[str, object]:
    """The config fields PEFT may rewrite on injection, in a normal form (sorted, empty → ``None``)."""
    out: dict[str, object] = {}
    for f in _REWRITE_FIELDS:
        v = getattr(cfg, f, None)
        if isinstance(v, (set, frozenset, list, tuple)):
            v = sorted(v)
        elif isinstance(v, dict):
            v = dict(sorted(v.items()))
        out[f] = v or None
    return out


@dataclass(frozen=True)
class LoraTarget:
    """One module PEFT wraps for the adapter, described by PEFT's own layer object."""

    module: str
    """Module path as saved keys spell it (no ``base_model.model.``, ``.base_layer`` kept for nested wrappers)."""
    kind: str
    """``linear``, ``embedding``, ``experts`` (a ParamWrapper over a 2-D/3-D Parameter), ``tokens``, or the class name."""
    param: str
    """The in-memory base parameter the module's weight update lands in."""
    scaling: float = 1.0
    rank: int = 0
    a_shape: tuple[int, ...] = ()
    b_shape: tuple[int, ...] = ()
    magnitude_shape: tuple[int, ...] | None = None
    """DoRA's magnitude vector (``use_dora``)."""
    lora_bias: bool = False
    fan_in_fan_out: bool = False
    num_experts: int = 1
    experts_out_in: bool = True
    """Fused experts stored ``[E, out, in]`` (PEFT swapped in/out features) rather than ``[E, in, out]``."""
    token_indices: tuple[int, ...] = ()
    variant: str | None = None
    """PEFT's LoRA variant class for this layer (``DoraLinearVariant``, ``ALoraLinearVariant``, ...), if any."""


@dataclass
class Injection:
    """One LoRA config injected by PEFT on a meta model (which it mutates)."""

    config_before: dict[str, object]
    """The config fields PEFT may rewrite, before injection (see :func:`snapshot`)."""
    config_after: dict[str, object]
    modules_to_save: tuple[str, ...] = ()
    """The config's ``modules_to_save`` as written."""
    error: str | None = None
    """Why PEFT created nothing (its error message), if it refused the config on this model."""
    warnings: list[str] = field(default_factory=list)
    """PEFT's warnings during the injection (first lines, deduplicated, at most 20)."""
    expected: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Saved-naming key → shape, as ``get_peft_model_state_dict`` would write them."""
    pm: PeftModel | None = None
    """The ``PeftModel`` (``None`` when PEFT refused)."""

    @property
    def note(self) -> str | None:
        return self.error

    @cached_property
    def _layers(self) -> tuple[dict[str, LoraTarget], dict[str, LoraTarget]]:
        return describe_layers(self.pm) if self.pm is not None else ({}, {})

    @property
    def targets(self) -> dict[str, LoraTarget]:
        """LoRA layers by saved module path."""
        return self._layers[0]

    @property
    def tokens(self) -> dict[str, LoraTarget]:
        """Trainable-token layers by the wrapped embedding's path."""
        return self._layers[1]


def inject(model: nn.Module, lora_config: LoraConfig) -> Injection:
    """Inject ``lora_config`` into the meta ``model`` with PEFT (no weights; ``model`` is mutated)."""
    from peft import get_peft_model, get_peft_model_state_dict

    cfg = for_meta(lora_config)
    before = snapshot(cfg)
    out = Injection(before, before, modules_to_save=tuple(cfg.modules_to_save or ()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            pm = get_peft_model(model, cfg, adapter_name=ADAPTER, low_cpu_mem_usage=True)
        except (
            Exception
        ) as e:  # PEFT refuses with ValueError (nothing matches) and others; all mean "not here"
            out.error = first_line(e)
            return out
        sd = get_peft_model_state_dict(pm, adapter_name=ADAPTER, save_embedding_layers=False)
    out.warnings = sorted({str(w.message).splitlines()[0] for w in caught})[:20]
    out.pm = pm
    out.expected = {k: tuple(v.shape) for k, v in sd.items()}
    out.config_after = snapshot(pm.peft_config[ADAPTER])
    return out


def describe_layers(pm: PeftModel) -> tuple[dict[str, LoraTarget], dict[str, LoraTarget]]:
    """(LoRA layers by saved module path, trainable-token layers by embedding path) of a ``PeftModel``."""
    from peft.tuners.lora import LoraLayer

    targets: dict[str, LoraTarget] = {}
    tokens: dict[str, LoraTarget] = {}
    for name, mod in pm.named_modules():
        if not name.startswith(WRAPPER):
            continue
        path = name[len(WRAPPER) :]
        if isinstance(mod, LoraLayer) and ADAPTER in getattr(mod, "r", {}):
            targets[path] = _describe(path, mod)
        elif type(mod).__name__ == "TrainableTokensLayer" and ADAPTER in mod.trainable_tokens_delta:
            target = _describe_tokens(path, mod)
            tokens.setdefault(target.module, target)
    return targets, tokens


def inventory(model: nn.Module, adapter_config: AdapterConfig, where: str | None = None) -> Injection:
    """Merge's view: the adapter's config injected into the meta ``model`` (build the name map first)."""
    lora = lora_config_from_raw(adapter_config.raw, where, not_lora="cannot be merged (only LORA)")
    return inject(model, lora)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _weight_shape(layer: nn.Module) -> tuple[int, ...]:
    """The shape of ``layer.weight`` (a LoRA A or B layer's)."""
    import torch

    weight = layer.weight
    assert isinstance(weight, torch.Tensor)
    return _shape(weight)


def _describe(path: str, mod: LoraLayer) -> LoraTarget:
    cls = type(mod).__name__
    owner = fused_expert_owner(path)
    common: dict[str, Any] = dict(
        module=path,
        scaling=float(mod.scaling[ADAPTER]),
        rank=int(mod.r[ADAPTER]),
        lora_bias=bool(getattr(mod, "lora_bias", {}).get(ADAPTER, False)),
        fan_in_fan_out=bool(getattr(mod, "fan_in_fan_out", False)),
    )
    variant = getattr(mod, "lora_variant", {}).get(ADAPTER)
    if variant is not None:
        common["variant"] = type(variant).__name__
    mag = getattr(mod, "lora_magnitude_vector", None)
    if mag is not None and ADAPTER in mag:
        common["magnitude_shape"] = _shape(mag[ADAPTER].weight)
    if cls == "ParamWrapper":
        wrapper = cast("ParamWrapper", mod)
        return LoraTarget(
            kind="experts",
            param=f"{owner}.{wrapper.parameter_name}",
            a_shape=_weight_shape(mod.lora_A[ADAPTER]),
            b_shape=_weight_shape(mod.lora_B[ADAPTER]),
            num_experts=int(wrapper.num_experts),
            experts_out_in=bool(getattr(mod, "_did_swap_in_out_features", False)),
            **common,
        )
    if ADAPTER in getattr(mod, "lora_embedding_A", {}):
        return LoraTarget(
            kind="embedding",
            param=f"{path}.weight",
            a_shape=_shape(mod.lora_embedding_A[ADAPTER]),
            b_shape=_shape(mod.lora_embedding_B[ADAPTER]),
            **common,
        )
    kind = "linear" if cls == "Linear" else cls
    return LoraTarget(
        kind=kind,
        param=f"{path}.weight",
        a_shape=_weight_shape(mod.lora_A[ADAPTER]),
        b_shape=_weight_shape(mod.lora_B[ADAPTER]),
        **common,
    )


def _describe_tokens(path: str, mod: TrainableTokensLayer) -> LoraTarget:
    owner = path.rsplit(".token_adapter", 1)[0]
    delta = mod.trainable_tokens_delta[ADAPTER]
    return LoraTarget(
        module=owner,
        kind="tokens",
        param=f"{owner}.weight",
        a_shape=_shape(delta),
        token_indices=tuple(int(i) for i in mod.token_indices[ADAPTER]),
    )


__all__ = [
    "ADAPTER",
    "Injection",
    "LoraTarget",
    "describe_layers",
    "for_meta",
    "inject",
    "inventory",
    "lora_config_from_raw",
    "snapshot",
]
