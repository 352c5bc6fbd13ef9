"""Where an adapter's weights live on disk: in-memory parameter names → on-disk tensor names and slices.

Saved adapters use the module names of the model in memory; a base checkpoint may store the same weights
under older names (transformers 5 renames on load: Mistral3's ``language_model.model.*``, the Omni thinker's
``model.layers.*``) and split (Qwen3.5-MoE experts stored one tensor per expert). Nothing here is a hand-written
table: the mapping is transformers' own load-time conversion (``get_model_conversion_mapping`` on a model built
on the meta device, :mod:`adapterdoc.ml.build`), applied to every on-disk name. Which modules an adapter config
creates, with which rank and scaling, PEFT says on the same meta model (:mod:`adapterdoc.ml.inject`).

transformers is imported inside the functions that need it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapterdoc.ml.inject import LoraTarget

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedModel
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    _Entry = tuple[str, WeightConverter, int | None, int]
    """(on-disk name, the converter that takes it, its expert index, its source pattern's slot)."""


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

    def take(self, value: torch.Tensor, *, expert_selected: bool = False) -> torch.Tensor:
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
    conversions: dict[str, tuple[str, str | None]] = field(default_factory=dict, repr=False)
    """Checkpoint-style name → (in-memory name, converter pattern), for every name :meth:`memory_name` was asked."""
    _rename: Callable[[str], tuple[str, str | None]] | None = field(default=None, repr=False)

    def memory_name(self, disk: str) -> tuple[str, str | None]:
        """transformers' load-time rename of a checkpoint-style name (on disk or not): (in-memory parameter,
        the converter pattern that matched, ``None`` for a plain rename). A per-expert adapter module ``M``
        lands where its weight ``M.weight`` would load."""
        if disk not in self.conversions:
            self.conversions[disk] = self._rename(disk) if self._rename else (disk, None)
        return self.conversions[disk]

    def resolve(self, param: str) -> tuple[str, list[Piece]] | None:
        """The parameter that holds ``param``'s data on disk (itself, or a tied alias) and its pieces."""
        if self.by_param.get(param):
            return param, self.by_param[param]
        for alias in self.tied.get(param, ()):
            if self.by_param.get(alias):
                return alias, self.by_param[alias]
        return None


def _split_transforms(model: PreTrainedModel) -> tuple[list[WeightRenaming], list[WeightConverter]]:
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    return renamings, converters


def to_memory_name(
    model: nn.Module,
    disk: str,
    renamings: list[WeightRenaming],
    converters: list[WeightConverter],
    names: dict[str, tuple[int, ...]],
) -> tuple[str, str | None]:
    """transformers' own load-time rename of one checkpoint key: (in-memory name, matched converter pattern)."""
    from transformers.core_model_loading import rename_source_key

    prefix = getattr(model, "base_model_prefix", None)
    renamed, pattern = rename_source_key(disk, renamings, converters, prefix, names)
    if renamed not in names and disk in names:
        renamed, pattern = rename_source_key(disk, [], [], prefix, names)
    return renamed, pattern


def build_name_map(model: PreTrainedModel, disk_shapes: dict[str, tuple[int, ...]]) -> NameMap:
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
    nm._rename = lambda disk: to_memory_name(model, disk, renamings, converters, state)
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    fused: dict[str, list[_Entry]] = {}
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
    # transformers spells some patterns with their leading dot (Mixtral's ``.experts.*.w1.weight``)
    rx = re.escape(pattern.lstrip(".")).replace(r"\*", r"(\d+)")
    m = re.search(rf"(?:^|\.){rx}$", disk)
    return int(m.group(1)) if m else None


def _op_signature(conv: WeightConverter) -> list[tuple[str, dict[str, Any]]]:
    return [(type(op).__name__, dict(vars(op))) for op in conv.operations]


def _slice_plan(
    mem: str,
    entries: list[_Entry],
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
    if stacked and set(by_expert) != set(range(param_shape[0])):
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


__all__ = [
    "LoraTarget",
    "NameMap",
    "Piece",
    "build_name_map",
    "saved_weight_param",
    "to_memory_name",
]
