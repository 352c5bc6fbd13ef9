"""A base's module tree read off its own safetensors headers and ``config.json``, for a causal LM outside the registry.

Transformers saves a model's parameters under their ``named_modules()`` names, so the base's tensor names spell the
module tree: every prefix of a tensor name is a module, and a module whose own tensors are one 2-D float ``weight``
(and a 1-D ``bias`` as long as its first dimension) inside the numbered layer list is a ``Linear``. That holds only
where the checkpoint's names are the in-memory names: the ``config.json`` must name, as ``architectures[0]``, the
causal-LM class transformers builds for its ``model_type`` with no load-time key conversion
(:data:`adapterdoc.layouts.plain_causal_lm.PLAIN_CAUSAL_LM`), no key may match one of transformers' legacy renames,
and the numbered layers stored must be those the config declares.

What the header cannot vouch for is left out of the tree's Linear modules or refused (:class:`Unmodeled`, whose
message says why; the caller then plans on the meta-device model):

- a 2-D weight outside the numbered layers or as tall as the vocabulary (an embedding or the output head: the header
  cannot tell an ``Embedding`` from a ``Linear``, nor whether it is tied) is of kind :data:`SIZED`, never a LoRA
  target here;
- a 2-D weight whose bias is as long as its second dimension is stored transposed (a ``Conv1D``, which PEFT merges
  with ``fan_in_fan_out``): the whole base is refused;
- remote code (``auto_map``), a ``quantization_config``, a model type or class outside the plain list.

Modules without parameters (activations, dropouts, rotary embeddings) are invisible in a header; the planner checks
that no target could name one. Nodes come in name order with layer numbers compared as numbers, which is not always
``named_modules()`` order (the merged bytes do not depend on it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from adapterdoc.layouts.plain_causal_lm import LEGACY_RENAMES, PLAIN_CAUSAL_LM
from adapterdoc.layouts.trees import LINEAR, OTHER, Tree, Unmodeled
from adapterdoc.st.dtypes import FLOAT_DTYPES
from adapterdoc.st.header import TensorInfo

HEADER_LAYOUT = "(read off the base's headers)"
"""The :attr:`~adapterdoc.layouts.trees.Tree.layout` of a tree this module reads."""
SIZED = "embedding or head"
"""The kind of a 2-D weight the header cannot vouch for as a ``Linear`` (see the module docstring)."""


def header_tree(raw: Mapping[str, object], tensors: Mapping[str, TensorInfo]) -> Tree:
    """The module tree of the plain causal LM that ``raw`` (its ``config.json``) describes and ``tensors`` (every
    tensor of its checkpoint, by name) stores; :class:`Unmodeled` where the header cannot vouch for it."""
    model_type, model_class = _plain_class(raw)
    if raw.get("quantization_config") is not None:
        raise Unmodeled("config.json has a quantization_config")
    for key in tensors:
        _check_legacy(key)
    own: dict[str, dict[str, TensorInfo]] = {}
    parents: dict[str, str] = {}
    for key, info in tensors.items():
        owner, _, leaf = key.rpartition(".")
        own.setdefault(owner, {})[leaf] = info
        name = owner
        while name and name not in parents:
            parents[name] = name.rpartition(".")[0]
            name = parents[name]
    has_children = set(parents.values())
    vocab = raw.get("vocab_size")
    names = sorted(parents, key=_natural)
    kinds = {name: _kind(name, own.get(name, {}), name in has_children, vocab) for name in names}
    _check_layers(raw, names)
    tree = Tree(HEADER_LAYOUT, model_class, model_type)
    for name in names:
        if kinds[name] == OTHER:
            tree.add(name)
        else:
            params = own[name]
            tree.add(name, kinds[name], tuple((leaf, tuple(info.shape)) for leaf, info in params.items()))
    return tree


def _plain_class(raw: Mapping[str, object]) -> tuple[str, str]:
    """(model_type, class): the class must be the one transformers builds for the type with no key conversion."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in PLAIN_CAUSAL_LM:
        raise Unmodeled(
            f"model_type {model_type!r} is not a causal LM that transformers loads without converting its keys"
        )
    want = PLAIN_CAUSAL_LM[model_type]
    archs = raw.get("architectures")
    if not isinstance(archs, list) or not archs or archs[0] != want:
        raise Unmodeled(f"config.json's architectures is {archs!r}, not [{want!r}]")
    return model_type, want


def _check_legacy(key: str) -> None:
    for pattern in LEGACY_RENAMES:
        if re.search(pattern, key):
            raise Unmodeled(f"the base tensor `{key}` is renamed by transformers on load")


_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers")
"""The spellings of the layer count in transformers' configs (``attribute_map`` aliases), first found first."""


def _check_layers(raw: Mapping[str, object], modules: list[str]) -> None:
    """The numbered list nearest the root (the decoder layers) holds exactly the config's layer count."""
    lists: dict[str, set[int]] = {}
    for name in modules:
        path, _, last = name.rpartition(".")
        if last.isdigit():
            lists.setdefault(path, set()).add(int(last))
    if not lists:
        raise Unmodeled("the base stores no numbered layers")
    depth = min(p.count(".") for p in lists)
    top = sorted(p for p in lists if p.count(".") == depth)
    if len(top) != 1:
        raise Unmodeled(f"the base stores several layer lists ({', '.join(f'`{p}`' for p in top)})")
    field = next((f for f in _LAYER_COUNTS if f in raw), _LAYER_COUNTS[0])
    n = raw.get(field)
    if not isinstance(n, int) or isinstance(n, bool):
        raise Unmodeled(f"config.json's {field} is {n!r}")
    if lists[top[0]] != set(range(n)):
        raise Unmodeled(
            f"the base stores {len(lists[top[0]])} layers under `{top[0]}`, config.json says {field} {n}"
        )


def _kind(name: str, params: Mapping[str, TensorInfo], has_children: bool, vocab: object) -> str:
    """:data:`~adapterdoc.layouts.trees.LINEAR`, :data:`SIZED` or :data:`~adapterdoc.layouts.trees.OTHER`."""
    weight, bias = params.get("weight"), params.get("bias")
    if has_children or weight is None or len(weight.shape) != 2 or set(params) - {"weight", "bias"}:
        return OTHER
    if bias is not None and len(bias.shape) == 1 and bias.shape[0] != weight.shape[0]:
        if bias.shape[0] == weight.shape[1]:
            raise Unmodeled(
                f"`{name}` stores its weight transposed ([in, out], a Conv1D, which PEFT merges with fan_in_fan_out)"
            )
        return OTHER
    if weight.dtype not in FLOAT_DTYPES or (bias is not None and bias.dtype not in FLOAT_DTYPES):
        return OTHER
    if bias is not None and len(bias.shape) != 1:
        return OTHER
    in_layers = any(part.isdigit() for part in name.split("."))
    if not in_layers or weight.shape[0] == vocab:
        return SIZED
    return LINEAR


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """Module names in order with layer numbers compared as numbers (``layers.2`` before ``layers.10``)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in name.split("."))


__all__ = ["HEADER_LAYOUT", "SIZED", "header_tree"]
