"""What a profile's zero-LoRA rule (:meth:`~adapterdoc.engines.base.Profile.zero_lora`) reads and returns, and the
base's modules it reads: ``remap --for`` adds zero LoRA (``B A = 0``: PEFT's outputs unchanged) where an engine drops
or fails on a module that lacks a partner (:mod:`adapterdoc.remap.for_engine.fill` writes it).

The base's modules are which Linear modules it has, with their ``(out_features, in_features)``, and which modules
PEFT can put LoRA on at all: the registry's module tree when it describes the base (torch-free), else the base built
on the meta device (:mod:`adapterdoc.ml.build`; needs the ML extra). Only a fill that is needed reads the base."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.bases import BaseSpec

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class BaseModules:
    """The base's LoRA-capable modules (no ``base_model.model.`` wrapper)."""

    linear: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    """Linear module → ``(out_features, in_features)``."""
    capable: frozenset[str] = frozenset()
    """Every module PEFT can put LoRA on (Linear, Embedding, Conv)."""
    output_embedding: str | None = None
    """``get_output_embeddings()``'s module (PEFT's ``all-linear`` leaves it out)."""
    source: str = "registry"

    @property
    def nlayers(self) -> int:
        """Layers of the decoder stack (outside towers): the largest ``layers.N`` + 1."""
        from adapterdoc.layouts import tower_segment

        found = [int(m.group(1)) for n in self.capable if tower_segment(n) is None and (m := LAYER.search(n))]
        return max(found) + 1 if found else 0


Factors = dict[str, dict[str, tuple[str, tuple[int, ...]]]]
"""LoRA module (no wrapper) → role (``lora_A`` / ``lora_B``) → (tensor, shape): the adapter's 2-D factors."""

Missing = dict[str, str]
"""Module to add → the adapter module it copies its dtype and key spelling from."""


@dataclass(frozen=True)
class FillInput:
    """What a zero-LoRA rule reads: the adapter's factors (after the earlier ``remap --for`` steps), its
    adapter_config.json as a dict, ``--base`` as given (``None``: the config's ``base_model_name_or_path`` when it
    resolves locally, :meth:`spec`), the file refusals name, and the notes the report prints (a rule may add one)."""

    factors: Factors
    raw: Mapping[str, object]
    base: str | None
    path: str
    notes: list[str]

    def spec(self) -> BaseSpec | None:
        """The base: ``--base``, else ``base_model_name_or_path`` when it resolves locally; ``None`` otherwise."""
        named = self.raw.get("base_model_name_or_path")
        return resolve(self.base, named if isinstance(named, str) else None)


@dataclass(frozen=True)
class ZeroLora:
    """The zero LoRA a rule adds: ``missing`` (module → the module it copies dtype and spelling from) and the base's
    modules when the rule read them (``None``: ``remap --for`` reads them, for the new tensors' shapes)."""

    missing: Missing
    base: BaseModules | None = None


def describe(missing: Missing) -> str:
    """``3 module(s): q_proj, v_proj``."""
    leaves = sorted({m.rpartition(".")[2] for m in missing})
    return f"{len(missing)} module(s): {', '.join(leaves)}"


def resolve(base: str | None, named: str | None) -> BaseSpec | None:
    """``--base``, else ``base_model_name_or_path`` when it resolves locally; ``None`` when neither does."""
    from adapterdoc.bases import resolve_base
    from adapterdoc.errors import AdapterdocError

    if base is not None:
        return resolve_base(base)
    if not named:
        return None
    try:
        return resolve_base(named)
    except AdapterdocError:
        return None


def layer_count(spec: BaseSpec) -> int | None:
    """``num_hidden_layers`` of the base's (text) config, read torch-free; ``None`` when it does not say."""
    from adapterdoc.bases import read_config_json
    from adapterdoc.errors import AdapterdocError
    from adapterdoc.layouts import LAYOUTS

    try:
        if spec.kind == "tiny":
            lay = LAYOUTS.get(spec.tiny_layout or "")
            raw: object = lay.tiny.kwargs() if lay and lay.tiny else None
        else:
            raw = read_config_json(spec)
    except (AdapterdocError, OSError, ValueError):
        return None
    return _find(raw, "num_hidden_layers")


def _find(raw: object, key: str) -> int | None:
    if not isinstance(raw, dict):
        return None
    text = raw.get("text_config")
    for value in (text.get(key) if isinstance(text, dict) else None, raw.get(key)):
        if isinstance(value, int):
            return value
    for value in raw.values():
        found = _find(value, key)
        if found is not None:
            return found
    return None


def read_base(spec: BaseSpec) -> BaseModules:
    """The base's modules: the registry tree when it describes the base, else the meta device."""
    from adapterdoc.bases import registry_view
    from adapterdoc.layouts.trees import CONV, EMBEDDING, LINEAR

    tree, _, _ = registry_view(spec)
    if tree is None:
        return _meta(spec)
    linear: dict[str, tuple[int, int]] = {}
    for node in tree.nodes:
        if node.kind == LINEAR:
            out_f, in_f = dict(node.params)["weight"]
            linear[node.name] = (out_f, in_f)
    capable = frozenset(node.name for node in tree.nodes if node.kind in (LINEAR, EMBEDDING, CONV))
    return BaseModules(linear, capable, tree.output_embedding, "registry")


def _meta(spec: BaseSpec) -> BaseModules:
    from adapterdoc.ml.build import build_meta_model, require_ml

    require_ml(f"remap --for on {spec.spec} (the base's module shapes: the registry does not describe it)")
    import torch

    model: Any = build_meta_model(spec)  # a transformers model, whose get_output_embeddings is unannotated
    linear: dict[str, tuple[int, int]] = {}
    capable: set[str] = set()
    output_embedding = None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, mod in model.named_modules():
        if not name:
            continue
        if mod is head:
            output_embedding = name
        if isinstance(mod, torch.nn.Linear):
            linear[name] = (mod.out_features, mod.in_features)
            capable.add(name)
        elif isinstance(mod, (torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d)) or (
            type(mod).__name__ == "Conv1D"
        ):
            capable.add(name)
    return BaseModules(linear, frozenset(capable), output_embedding, "meta device")
