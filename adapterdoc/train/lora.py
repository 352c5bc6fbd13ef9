"""LoRA for the reference runs: the per-layout config from the registry, injection with a tower-leak check, and
extraction and saving of the adapter state."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapterdoc.adapter import WRAPPER as _PEFT_ROOT
from adapterdoc.errors import AdapterdocError
from adapterdoc.layouts import LAYOUTS, Layout, all_tower_segments, forward_module, get_layout

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, PeftModel
    from torch import nn

DEFAULT_RANK = 8
_WRAPPERS = ("module.", "_orig_mod.")
"""Prefixes a distributed or compiled wrapper adds in front of parameter names."""


class TowerLeakError(AdapterdocError):
    """LoRA (or anything trainable) ended up on a vision/audio tower, projector, talker or MTP head."""


class EmptyAdapterStateError(AdapterdocError):
    """The gathered adapter state holds an empty tensor or no LoRA tensor at all (ZeRO-3 saved before gathering)."""


def lora_config(
    layout: str | Layout,
    *,
    r: int = DEFAULT_RANK,
    alpha: float | None = None,
    dropout: float = 0.0,
    exclude: str | bool | None = True,
    **extra: Any,
) -> LoraConfig:
    """The ``peft.LoraConfig`` the registry asks for: language-model attention/MLP leaves, fused experts through
    ``target_parameters``, towers excluded by the layout's fullmatch regex, and ``lora_alpha = 2 r`` by default.

    ``exclude=False`` drops the exclusion (only to demonstrate the leak check); a string replaces it. ``extra``
    goes to ``LoraConfig`` as is (``init_lora_weights=False`` for a non-zero ``lora_B``, ``use_dora``, ...).
    """
    from peft import LoraConfig

    lay = get_layout(layout) if isinstance(layout, str) else layout
    if not lay.lora_leaves and not lay.target_parameters:
        raise AdapterdocError(lay.name, "the registry lists no LoRA targets for this layout")
    if lay.target_parameters and dropout:
        raise AdapterdocError(
            lay.name,
            f"lora_dropout={dropout} with fused experts: PEFT's parameter wrapper refuses dropout; use 0",
        )
    if exclude is True:
        exclude_regex = lay.exclude_regex
    elif exclude is False or exclude is None:
        exclude_regex = None
    else:
        exclude_regex = exclude
    args: dict[str, Any] = dict(
        r=r,
        lora_alpha=2 * r if alpha is None else alpha,
        lora_dropout=dropout,
        target_modules=list(lay.lora_leaves),
        target_parameters=list(lay.target_parameters) or None,
        exclude_modules=exclude_regex,
        bias="none",
    )
    args.update(extra)
    return LoraConfig(**args)


ALL_LINEAR = "all-linear"
"""PEFT's own rule: every linear layer but the output head (``_maybe_include_all_linear_layers``)."""


def generic_lora_config(
    *,
    r: int = DEFAULT_RANK,
    alpha: float | None = None,
    dropout: float = 0.0,
    targets: tuple[str, ...] | None = None,
) -> LoraConfig:
    """The ``peft.LoraConfig`` for a base outside the registry: ``targets`` as ``target_modules``, else PEFT's
    ``all-linear`` (the output head excluded by PEFT); no tower exclusion, since the registry knows none."""
    from peft import LoraConfig

    return LoraConfig(
        r=r,
        lora_alpha=2 * r if alpha is None else alpha,  # type: ignore[arg-type]  # PEFT says int; a float works
        lora_dropout=dropout,
        target_modules=list(targets) if targets else ALL_LINEAR,
        bias="none",
    )


def inject(
    model: nn.Module,
    layout: str | Layout | None,
    *,
    seed: int = 0,
    config: LoraConfig | None = None,
    **kw: Any,
) -> PeftModel:
    """Wrap ``model`` with LoRA for ``layout`` (``lora_A`` initialised from ``seed``); fails on any tower leak.
    ``layout`` empty: a base outside the registry, with ``config`` given (no towers known, none checked)."""
    import torch
    from peft import get_peft_model

    lay = (get_layout(layout) if layout else None) if isinstance(layout, str) or layout is None else layout
    if config is not None:
        cfg = config
    elif lay is not None:
        cfg = lora_config(lay, **kw)
    else:
        raise AdapterdocError(type(model).__name__, "outside the registry a LoRA config must be given")
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        peft_model = get_peft_model(model, cfg)
    finally:
        torch.random.set_rng_state(state)
    if lay is not None:
        check_no_tower_trainable(peft_model, lay)
    return peft_model


def tower_segments(layout: Layout) -> frozenset[str]:
    return frozenset(layout.towers) | all_tower_segments()


def trainable_tower_parameters(model: nn.Module, layout: str | Layout) -> list[str]:
    """Names of trainable parameters that run through a tower/projector/talker/MTP segment."""
    lay = get_layout(layout) if isinstance(layout, str) else layout
    segments = tower_segments(lay)
    return [
        name
        for name, p in model.named_parameters()
        if p.requires_grad and any(seg in segments for seg in name.split("."))
    ]


def check_no_tower_trainable(model: nn.Module, layout: str | Layout) -> None:
    """Raise :class:`TowerLeakError` if any tower parameter is trainable (the exclusion regex missed something)."""
    lay = get_layout(layout) if isinstance(layout, str) else layout
    leaked = trainable_tower_parameters(model, lay)
    if leaked:
        raise TowerLeakError(
            lay.name,
            f"{len(leaked)} tower parameter(s) are trainable, e.g. `{leaked[0]}`; "
            f"exclude them with exclude_modules={lay.exclude_regex or 'a tower regex'!r}",
        )


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name (a process's local view of the LoRA state)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def strip_wrappers(name: str, *, unwrap_forward: bool = False) -> str:
    """Remove ``module.``/``_orig_mod.`` prefixes and, with ``unwrap_forward``, a forward-routing wrapper's level
    (a registry layout's ``forward_via``)."""
    changed = True
    while changed:
        changed = False
        for w in _WRAPPERS:
            if name.startswith(w):
                name, changed = name[len(w) :], True
    if unwrap_forward:
        for level in _forward_levels():
            if name.startswith(_PEFT_ROOT + level):
                name = _PEFT_ROOT + name[len(_PEFT_ROOT + level) :]
                break
            if name.startswith(level):
                name = name[len(level) :]
                break
    return name


def _forward_levels() -> tuple[str, ...]:
    """``"<forward_via>."`` of every registry layout that routes its forward through a submodule."""
    return tuple(dict.fromkeys(f"{lay.forward_via}." for lay in LAYOUTS.values() if lay.forward_via))


def adapter_state(
    state: Mapping[str, torch.Tensor], *, unwrap_forward: bool = False, what: str | None = None
) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a (possibly full, possibly gathered) state dict, on the CPU, with wrappers stripped.

    Refuses an empty tensor (a ZeRO-3 shard saved before gathering) and a state without any LoRA tensor:
    both would otherwise be written as an adapter that loads and does nothing.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        clean = strip_wrappers(name, unwrap_forward=unwrap_forward)
        if "lora_" not in clean:
            continue
        if tensor.numel() == 0:
            raise EmptyAdapterStateError(
                what, f"the gathered LoRA tensor is empty (shape {list(tensor.shape)})", key=name
            )
        if clean in out:
            raise EmptyAdapterStateError(what, "two state entries map to the same adapter key", key=clean)
        out[clean] = tensor.detach().to("cpu", copy=True).contiguous()
    if not out:
        raise EmptyAdapterStateError(what, f"none of the {len(state)} state entries is a LoRA tensor")
    return out


def save_adapter(
    peft_model: PeftModel,
    state: Mapping[str, torch.Tensor],
    out_dir: str | os.PathLike[str],
    *,
    base_name: str | None = None,
    unwrap_forward: bool = False,
) -> dict[str, torch.Tensor]:
    """Write ``adapter_model.safetensors`` and ``adapter_config.json`` atomically; returns the saved tensors.

    ``state`` is in ``peft_model``'s own naming (from :func:`adapter_state` without ``unwrap_forward``). The adapter
    name is dropped by PEFT's own ``get_peft_model_state_dict``; with ``unwrap_forward`` the forward-routing level
    is removed afterwards. PEFT selects entries by the model's LoRA layers and silently drops names it does not know
    (``save_pretrained(state_dict=...)`` then writes an adapter with no tensors), so every tensor of ``state`` must
    survive, or nothing is written. The config is written as ``save_pretrained`` writes it.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import save as st_save

    from adapterdoc.st.atomic import atomic_write_bytes

    what = os.fspath(out_dir)
    lora = {k: v for k, v in state.items() if "lora_" in k}
    kept = get_peft_model_state_dict(peft_model, state_dict=dict(lora))
    if len(kept) != len(lora) or not kept:
        raise EmptyAdapterStateError(
            what,
            f"only {len(kept)} of {len(lora)} LoRA tensors match the model's LoRA layers "
            "(renamed before saving?); refusing to write an incomplete adapter",
        )
    saved = {}
    for k, v in sorted(kept.items()):
        name = strip_wrappers(k, unwrap_forward=unwrap_forward)
        if name in saved:
            raise EmptyAdapterStateError(what, "two tensors map to the same adapter key", key=name)
        saved[name] = v.contiguous()
    os.makedirs(out_dir, exist_ok=True)
    atomic_write_bytes(
        os.path.join(out_dir, "adapter_model.safetensors"), st_save(saved, metadata={"format": "pt"})
    )
    cfg = peft_model.peft_config["default"].to_dict()
    cfg["inference_mode"] = True
    if base_name is not None:
        cfg["base_model_name_or_path"] = base_name
    if cfg.get("task_type") is None:
        base = peft_model.get_base_model()
        if unwrap_forward:
            base = forward_module(base)
        cfg["auto_mapping"] = {
            "base_model_class": type(base).__name__,
            "parent_library": type(base).__module__,
        }
    atomic_write_bytes(
        os.path.join(out_dir, "adapter_config.json"),
        (json.dumps(cfg, indent=2, sort_keys=True, default=jsonable) + "\n").encode(),
    )
    return saved


def jsonable(o: object) -> object:
    """``json.dumps`` default for PEFT config values: sets as sorted lists, enums as their value."""
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if hasattr(o, "value"):  # enums (task_type, peft_type)
        return o.value
    return str(o)


def load_peft(base: nn.Module, adapter_dir: str) -> tuple[PeftModel, list[str]]:
    """``PeftModel.from_pretrained`` plus the LoRA keys it reported missing (PEFT only warns about them)."""
    import warnings

    from peft import PeftModel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base, adapter_dir)
    missing = [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
    return model.eval(), missing
