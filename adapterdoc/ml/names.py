"""Where an adapter's weights live on disk: in-memory parameter names → on-disk tensor names and slices.

Saved adapters use the module names of the model in memory; a base checkpoint may store the same weights
under older names (transformers 5 renames on load: Mistral3's ``language_model.model.*``, the Omni thinker's
``model.layers.*``) and split (Qwen3.5-MoE experts stored one tensor per expert). Nothing here is a hand-written
table: the mapping is transformers' own load-time conversion (``get_model_conversion_mapping`` on a model built
on the meta device from the base's ``config.json``), applied to every on-disk name, and PEFT itself (injected on
the same meta model) says which modules an adapter config creates, with which rank, scaling and layer type.

Torch, transformers and peft are imported inside the functions that need them.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.adapter import WRAPPER, AdapterConfig, fused_expert_owner
from adapterdoc.errors import ConfigError, UnsupportedInputError
from adapterdoc.ml.meta import require_ml


@dataclass(frozen=True)
class Piece:
    """One on-disk tensor as a part of one in-memory parameter.

    ``param[expert]`` (when ``expert`` is set), then ``.narrow(*narrow)`` (when set), then a transpose of the last
    two dimensions (when ``transpose``) gives exactly the on-disk tensor.
    """

    disk: str
    param: str
    expert: int | None = None
    """Index on dim 0 of a stacked (fused-expert) parameter."""
    narrow: tuple[int, int, int] | None = None
    """(dim, start, length) in the per-expert parameter's coordinates."""
    transpose: bool = False

    @property
    def whole(self) -> bool:
        return self.expert is None and self.narrow is None and not self.transpose

    def take(self, value: Any, *, expert_selected: bool = False) -> Any:
        """This piece out of a parameter-shaped tensor (or out of ``value[expert]`` if ``expert_selected``)."""
        t = value
        if self.expert is not None and not expert_selected:
            t = t[self.expert]
        if self.narrow is not None:
            t = t.narrow(*self.narrow)
        if self.transpose:
            t = t.transpose(-2, -1)
        return t


@dataclass
class NameMap:
    """The base checkpoint's tensors, each placed inside the in-memory parameter transformers loads it into."""

    model_class: str
    by_param: dict[str, list[Piece]] = field(default_factory=dict)
    by_disk: dict[str, Piece] = field(default_factory=dict)
    param_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Every in-memory parameter/buffer of the model and its shape."""
    tied: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """In-memory name → the other names sharing the same Parameter (tied embeddings)."""
    unsupported: dict[str, str] = field(default_factory=dict)
    """In-memory parameter → why its on-disk tensors cannot be sliced (an unknown conversion op)."""
    unmapped: list[str] = field(default_factory=list)
    """On-disk tensors the model does not load (transformers would call them unexpected)."""

    def resolve(self, param: str) -> tuple[str, list[Piece]] | None:
        """The parameter that holds ``param``'s data on disk (itself, or a tied alias) and its pieces."""
        if self.by_param.get(param):
            return param, self.by_param[param]
        for alias in self.tied.get(param, ()):
            if self.by_param.get(alias):
                return alias, self.by_param[alias]
        return None


def load_base_config(base_dir: str) -> Any:
    """The transformers config of the base model directory (``config.json``), read locally only."""
    require_ml(base_dir)
    cfg_path = os.path.join(base_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise ConfigError(
            base_dir, "has no config.json; merge needs it to map adapter names to checkpoint names"
        )
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(base_dir, local_files_only=True)
    except Exception as e:  # transformers raises ValueError/KeyError/OSError for unknown or broken configs
        raise ConfigError(cfg_path, f"transformers cannot read it: {_first_line(e)}") from e


def meta_model(config: Any, where: str | None = None) -> Any:
    """The base model built on the meta device (no weights): the class named by ``architectures``."""
    import torch
    import transformers

    cls = None
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            break
    candidates = [cls] if cls is not None else []
    candidates += [transformers.AutoModelForCausalLM, transformers.AutoModel]
    last: Exception | None = None
    for c in candidates:
        try:
            with torch.device("meta"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if hasattr(c, "_from_config"):
                    return c._from_config(config)
                return c.from_config(config)
        except Exception as e:  # unknown architectures raise ValueError; broken configs anything
            last = e
    raise UnsupportedInputError(where, f"cannot build the model from config.json: {_first_line(last)}")


def _first_line(e: BaseException | None) -> str:
    text = str(e).strip() if e is not None else ""
    return text.splitlines()[0] if text else type(e).__name__


def _split_transforms(model: Any) -> tuple[list[Any], list[Any]]:
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    return renamings, converters


def to_memory_name(
    model: Any, disk: str, renamings: list[Any], converters: list[Any], names: Any
) -> tuple[str, Any]:
    """transformers' own load-time rename of one checkpoint key: (in-memory name, matched converter pattern)."""
    from transformers.core_model_loading import rename_source_key

    prefix = getattr(model, "base_model_prefix", None)
    renamed, pattern = rename_source_key(disk, renamings, converters, prefix, names)
    if renamed not in names and disk in names:
        renamed, pattern = rename_source_key(disk, [], [], prefix, names)
    return renamed, pattern


def build_name_map(model: Any, disk_shapes: dict[str, tuple[int, ...]]) -> NameMap:
    """Place every on-disk tensor (name → shape) inside the meta ``model``'s parameters."""
    state = {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}
    nm = NameMap(model_class=type(model).__name__, param_shapes=state)
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    for names in groups.values():
        if len(names) > 1:
            for n in names:
                nm.tied[n] = tuple(x for x in names if x != n)

    renamings, converters = _split_transforms(model)
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    fused: dict[str, list[tuple[str, Any, int | None, int]]] = {}
    for disk in sorted(disk_shapes):
        mem, pattern = to_memory_name(model, disk, renamings, converters, state)
        if mem not in state:
            nm.unmapped.append(disk)
            continue
        if pattern is None:
            _add(nm, Piece(disk, mem))
            continue
        conv = by_pattern[pattern]
        expert = _expert_index(disk, pattern)
        fused.setdefault(mem, []).append((disk, conv, expert, conv.source_patterns.index(pattern)))
    for mem, entries in fused.items():
        try:
            for piece in _slice_plan(mem, entries, disk_shapes, state[mem]):
                _add(nm, piece)
        except _Unsupported as e:
            nm.unsupported[mem] = str(e)
            for disk, *_ in entries:
                nm.by_disk[disk] = Piece(disk, mem)
    return nm


def _add(nm: NameMap, piece: Piece) -> None:
    nm.by_param.setdefault(piece.param, []).append(piece)
    nm.by_disk[piece.disk] = piece


class _Unsupported(Exception):
    pass


def _expert_index(disk: str, pattern: str) -> int | None:
    if "*" not in pattern:
        return None
    rx = re.escape(pattern).replace(r"\*", r"(\d+)")
    m = re.search(rf"(^|\.){rx}$", disk)
    return int(m.group(2)) if m else None


def _op_signature(conv: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(type(op).__name__, dict(vars(op))) for op in conv.operations]


def _slice_plan(
    mem: str,
    entries: list[tuple[str, Any, int | None, int]],
    disk_shapes: dict[str, tuple[int, ...]],
    param_shape: tuple[int, ...],
) -> list[Piece]:
    """Invert the supported load-time ops: stack experts (MergeModulelist 0), concatenate sources, transpose."""
    conv = entries[0][1]
    ops = _op_signature(conv)
    kinds = [k for k, _ in ops]
    stacked = kinds[:1] == ["MergeModulelist"]
    if stacked and ops[0][1].get("dim", 0) != 0:
        raise _Unsupported(f"experts stacked on dim {ops[0][1].get('dim')}")
    rest = ops[1:] if stacked else ops
    concat_dim: int | None = None
    transpose = False
    if [k for k, _ in rest] == ["Concatenate"]:
        concat_dim = rest[0][1].get("dim", 0) - (1 if stacked else 0)
        if concat_dim < 0:
            raise _Unsupported("concatenation along the expert dimension")
    elif [k for k, _ in rest] == ["Transpose"] and not stacked and len(conv.source_patterns) == 1:
        t = rest[0][1]
        if {t.get("dim0"), t.get("dim1")} not in ({0, 1}, {len(param_shape) - 2, len(param_shape) - 1}):
            raise _Unsupported(f"transpose of dims {t.get('dim0')},{t.get('dim1')}")
        disk_shape = disk_shapes[entries[0][0]]
        transpose = not (t.get("check_dims") and tuple(disk_shape) == tuple(param_shape))
    elif rest:
        raise _Unsupported(f"conversion ops {kinds} are not supported by merge")
    if stacked and any(e is None for _, _, e, _ in entries):
        raise _Unsupported("an expert tensor without an expert index")

    pieces: list[Piece] = []
    by_expert: dict[int | None, list[tuple[str, int]]] = {}
    for disk, _, expert, slot in entries:
        by_expert.setdefault(expert if stacked else None, []).append((disk, slot))
    inner_shape = param_shape[1:] if stacked else param_shape
    if stacked and sorted(by_expert) != list(range(param_shape[0])):
        raise _Unsupported(f"{len(by_expert)} expert tensors on disk for {param_shape[0]} experts")
    for expert, items in by_expert.items():
        items.sort(key=lambda x: x[1])
        if concat_dim is None:
            if len(items) != 1:
                raise _Unsupported("several on-disk tensors for one slot")
            disk = items[0][0]
            shape = disk_shapes[disk]
            want = tuple(reversed(inner_shape[-2:])) if transpose else tuple(inner_shape)
            if transpose:
                want = tuple(inner_shape[:-2]) + want
            if tuple(shape) != want:
                raise _Unsupported(f"on-disk shape {list(shape)} does not fit {list(param_shape)}")
            pieces.append(Piece(disk, mem, expert=expert, transpose=transpose))
            continue
        start = 0
        for disk, _slot in items:
            shape = disk_shapes[disk]
            if len(shape) != len(inner_shape):
                raise _Unsupported(f"on-disk shape {list(shape)} does not fit {list(param_shape)}")
            length = shape[concat_dim]
            pieces.append(Piece(disk, mem, expert=expert, narrow=(concat_dim, start, length)))
            start += length
        if start != inner_shape[concat_dim]:
            raise _Unsupported(
                f"the on-disk tensors cover {start} of {inner_shape[concat_dim]} along dim {concat_dim}"
            )
    return pieces


# --------------------------------------------------------------------------------------------------------------
# What PEFT creates for an adapter config on this model


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
class Inventory:
    targets: dict[str, LoraTarget] = field(default_factory=dict)
    """LoRA layers by saved module path."""
    tokens: dict[str, LoraTarget] = field(default_factory=dict)
    """Trainable-token layers by the wrapped embedding's path."""
    modules_to_save: tuple[str, ...] = ()
    note: str | None = None
    """Why PEFT created nothing (its error message), if it refused the config on this model."""


def peft_config_from(adapter_config: AdapterConfig, where: str | None) -> Any:
    """A PEFT ``LoraConfig`` from the adapter's config (only LoRA can be merged)."""
    from peft import LoraConfig

    if adapter_config.peft_type.upper() != "LORA":
        raise UnsupportedInputError(
            where, f"peft_type {adapter_config.peft_type} cannot be merged (only LORA)"
        )
    raw = dict(adapter_config.raw)
    raw.pop("peft_type", None)
    known = set(LoraConfig.__dataclass_fields__)
    kwargs = {k: v for k, v in raw.items() if k in known}
    # Neither changes the weights of a trained adapter; both only matter when training starts.
    kwargs.update(inference_mode=True, lora_dropout=0.0, init_lora_weights=True)
    for k in ("loftq_config", "eva_config", "corda_config"):
        kwargs.pop(k, None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return LoraConfig(**kwargs)
    except Exception as e:  # LoraConfig validates combinations with ValueError/TypeError
        raise ConfigError(where, f"PEFT refuses this LoRA config: {_first_line(e)}") from e


def inventory(model: Any, adapter_config: AdapterConfig, where: str | None = None) -> Inventory:
    """Inject the adapter config into the meta ``model`` with PEFT (no weights) and describe every LoRA layer.

    Mutates ``model``; build the :class:`NameMap` first.
    """
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer

    cfg = peft_config_from(adapter_config, where)
    inv = Inventory(modules_to_save=tuple(cfg.modules_to_save or ()))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm = get_peft_model(model, cfg, low_cpu_mem_usage=True)
    except Exception as e:  # PEFT raises ValueError when no module matches; treat as "nothing targeted"
        inv.note = _first_line(e)
        return inv
    for name, mod in pm.named_modules():
        if not name.startswith(WRAPPER):
            continue
        path = name[len(WRAPPER) :]
        if isinstance(mod, LoraLayer) and "default" in getattr(mod, "r", {}):
            inv.targets[path] = _describe(path, mod)
        elif type(mod).__name__ == "TrainableTokensLayer" and "default" in mod.trainable_tokens_delta:
            target = _describe_tokens(path, mod)
            inv.tokens.setdefault(target.module, target)
    return inv


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _describe(path: str, mod: Any) -> LoraTarget:
    cls = type(mod).__name__
    owner = fused_expert_owner(path)
    common: dict[str, Any] = dict(
        module=path,
        scaling=float(mod.scaling["default"]),
        rank=int(mod.r["default"]),
        lora_bias=bool(getattr(mod, "lora_bias", {}).get("default", False)),
        fan_in_fan_out=bool(getattr(mod, "fan_in_fan_out", False)),
    )
    variant = getattr(mod, "lora_variant", {}).get("default")
    if variant is not None:
        common["variant"] = type(variant).__name__
    mag = getattr(mod, "lora_magnitude_vector", None)
    if mag is not None and "default" in mag:
        common["magnitude_shape"] = _shape(mag["default"].weight)
    if cls == "ParamWrapper":
        return LoraTarget(
            kind="experts",
            param=f"{owner}.{mod.parameter_name}",
            a_shape=_shape(mod.lora_A["default"].weight),
            b_shape=_shape(mod.lora_B["default"].weight),
            num_experts=int(mod.num_experts),
            experts_out_in=bool(getattr(mod, "_did_swap_in_out_features", False)),
            **common,
        )
    if "default" in getattr(mod, "lora_embedding_A", {}):
        return LoraTarget(
            kind="embedding",
            param=f"{path}.weight",
            a_shape=_shape(mod.lora_embedding_A["default"]),
            b_shape=_shape(mod.lora_embedding_B["default"]),
            **common,
        )
    kind = "linear" if cls == "Linear" else cls
    return LoraTarget(
        kind=kind,
        param=f"{path}.weight",
        a_shape=_shape(mod.lora_A["default"].weight),
        b_shape=_shape(mod.lora_B["default"].weight),
        **common,
    )


def _describe_tokens(path: str, mod: Any) -> LoraTarget:
    owner = path.rsplit(".token_adapter", 1)[0]
    delta = mod.trainable_tokens_delta["default"]
    return LoraTarget(
        module=owner,
        kind="tokens",
        param=f"{owner}.weight",
        a_shape=_shape(delta),
        token_indices=tuple(int(i) for i in mod.token_indices["default"]),
    )


def saved_weight_param(module: str, param: str) -> str:
    """The in-memory base parameter a saved whole weight (``full`` key) loads into.

    ``embed_tokens.base_layer.weight`` (a saved embedding under a LoRA wrapper) → ``embed_tokens.weight``;
    ``lm_head.modules_to_save.default.weight`` or a ``modules_to_save`` module's ``lm_head.weight`` → itself.
    """
    path = re.sub(r"\.(modules_to_save\.[^.]+|original_module)(?=\.|$)", "", module)
    while path.endswith(".base_layer"):
        path = path[: -len(".base_layer")]
    path = path.replace(".base_layer.", ".")
    return f"{path}.{param}" if path else param
