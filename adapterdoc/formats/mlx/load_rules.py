"""``verify`` (and ``inspect``) of an mlx-lm adapter folder: what mlx-lm's ``load_adapters`` would refuse on a base,
header-only, each finding with its fix.

``load_adapters`` builds LoRA layers on the last ``num_layers`` decoder layers (``-1``/``0``: all) at the module
paths ``lora_parameters.keys`` lists (all linear layers without it) and at the top-level paths it lists, then refuses
any tensor that is not one of those layers' ``lora_a``/``lora_b``/``m`` or whose shape differs. The base's modules
and shapes are read from its weights' headers (no weights read), named as mlx-lm names them
(:mod:`adapterdoc.formats.mlx.names`)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from adapterdoc.errors import AdapterdocError
from adapterdoc.report.findings import Finding, make

if TYPE_CHECKING:
    from collections.abc import Mapping

    from adapterdoc.formats.mlx.names import BaseFacts
    from adapterdoc.st.header import TensorInfo

_FUSED = re.compile(r"^(?P<owner>.+)\.experts\.(?P<proj>gate_up_proj|down_proj)$")


def check(path: str | os.PathLike[str], base: str | None) -> list[Finding]:
    """The findings on the mlx-lm adapter folder ``path`` (against ``base`` when given)."""
    from adapterdoc.formats.mlx.folder import LEAVES, lora_parameters, open_mlx
    from adapterdoc.formats.mlx.names import base_facts, family_of, split_layer, unknown_top
    from adapterdoc.layouts.mlx_models import MLX_LM_VERSION

    spec = os.fspath(path)
    adapter = open_mlx(spec)
    try:
        kind, rank, _scale, _dropout, num_layers = lora_parameters(adapter)
    except AdapterdocError as e:
        code = "AD807" if "(AD807)" in e.reason else "AD815"
        return [make(code, e.reason.replace(f" ({code})", ""), path=spec)]
    out: list[Finding] = []
    params = adapter.raw["lora_parameters"]
    keys = params.get("keys")
    tensors = adapter.header.tensors
    for name in tensors:
        module, _, leaf = name.rpartition(".")
        if leaf not in LEAVES:
            hint = (
                " (a PEFT name: convert with `adapterdoc convert ADAPTER --to mlx`)"
                if ".lora_" in name
                else ""
            )
            out.append(
                make(
                    "AD812",
                    f"`{name}` is not an adapter parameter (lora_a, lora_b, m){hint}",
                    path=spec,
                    key=name,
                )
            )
            continue
        _, key = split_layer(module)
        if isinstance(keys, list) and key not in keys:
            out.append(
                make(
                    "AD811",
                    f"`{name}`: `{key}` is not in lora_parameters.keys {keys}; add it",
                    path=spec,
                    key=name,
                )
            )
        r = _rank_of(leaf, tuple(tensors[name].shape))
        if r is not None and r != rank:
            out.append(
                make("AD814", f"`{name}` has rank {r}, lora_parameters.rank is {rank}", path=spec, key=name)
            )
    if kind == "dora" and not any(n.endswith(".m") for n in tensors):
        out.append(make("AD815", "fine_tune_type is dora but no `.m` magnitude tensor is present", path=spec))
    if base is None:
        return out
    facts = base_facts(base)
    modules = sorted({n.rpartition(".")[0] for n in tensors})
    model_type, family = family_of(facts, facts.layout, modules)
    if model_type and family is None:
        out.append(
            make(
                "AD816",
                f"model_type `{model_type}` of {base} has no mlx-lm model file (mlx-lm {MLX_LM_VERSION})",
                path=spec,
            )
        )
    foreign = [m for m in modules if unknown_top(m, family) is not None]
    for module in foreign:
        top = unknown_top(module, family) or ()
        if top:
            out.append(
                make(
                    "AD812",
                    f"`{module}` is not a module of {base} as mlx-lm names it: mlx-lm's `{family}` model's "
                    f"modules start with {', '.join(f'`{t}.`' for t in top)} (convert the PEFT adapter with "
                    "`adapterdoc convert ADAPTER --to mlx --base BASE`)",
                    path=spec,
                    key=module,
                )
            )
    if foreign:
        return out
    if facts.layers:
        first = 0 if num_layers <= 0 else max(facts.layers - num_layers, 0)
        placed = [(split_layer(n.rpartition(".")[0])[0], n) for n in tensors]
        low = [(layer, n) for layer, n in placed if layer is not None and layer < first]
        if low:
            lowest = min(layer for layer, _ in low)
            out.append(
                make(
                    "AD810",
                    f"{len(low)} tensors sit below layer {first} (`{low[0][1]}`): num_layers {num_layers} of "
                    f"{facts.layers} layers gives LoRA to layers {first}-{facts.layers - 1}; set num_layers to "
                    f"{facts.layers - lowest} (or -1 for all layers)",
                    path=spec,
                    key=low[0][1],
                )
            )
    built = _base_modules(base, facts, family)
    if built is None:
        return out + _config_only(spec, base, facts, tensors)
    for name, info in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf not in LEAVES:
            continue
        dims = built.get(module)
        if dims is None:
            out.append(
                make("AD812", f"`{module}` is not a module of {base} as mlx-lm names it", path=spec, key=name)
            )
            continue
        want = _expected(leaf, dims, rank)
        own = _expected(leaf, dims, _rank_of(leaf, tuple(info.shape)) or rank)
        if tuple(info.shape) not in (want, own):  # a rank alone that differs is AD814
            out.append(
                make(
                    "AD813",
                    f"`{name}` is {list(info.shape)}, mlx-lm builds {list(want)}",
                    path=spec,
                    key=name,
                )
            )
    return out


def _config_only(spec: str, base: str, facts: BaseFacts, tensors: Mapping[str, TensorInfo]) -> list[Finding]:
    """What a base without weights (a config.json, ``tiny:LAYOUT``) still tells, one finding per module: a module
    in a decoder layer the base does not have, or under a prefix mlx-lm does not give this model (a Qwen3.5 or VL
    model's modules are ``language_model.model.…``, a plain decoder's ``model.…``): an adapter of another
    architecture."""
    from adapterdoc.formats.mlx.names import split_layer
    from adapterdoc.layouts.mlx_prefixes import MLX_PREFIXES, MLX_WRAPPER

    rules = MLX_PREFIXES.get(facts.layout or "")
    out: list[Finding] = []
    seen: set[str] = set()
    for name in tensors:
        module = name.rpartition(".")[0]
        if module in seen:
            continue
        seen.add(module)
        layer, _ = split_layer(module)
        why = None
        if layer is not None and facts.layers is not None and layer >= facts.layers:
            why = f"it sits in layer {layer}, and {base} has {facts.layers} layers"
        elif rules and not any(f"{module}.".startswith(new) for _, new in rules):
            names = ", ".join(f"`{new}…`" for _, new in rules)
            why = f"mlx-lm names this model's modules {names}"
        elif not rules and facts.layout is not None and module.startswith(MLX_WRAPPER):
            why = f"mlx-lm gives this model no `{MLX_WRAPPER}` wrapper"
        if why is not None:
            out.append(
                make(
                    "AD812",
                    f"`{module}` is not a module of {base} as mlx-lm names it: {why} (an adapter of another "
                    "model? convert the PEFT adapter with `adapterdoc convert ADAPTER --to mlx --base BASE`)",
                    path=spec,
                    key=name,
                )
            )
    return out


def _rank_of(leaf: str, shape: tuple[int, ...]) -> int | None:
    """The rank a tensor carries as mlx-lm lays it out (``None`` for ``m`` or an odd shape)."""
    if leaf == "lora_a" and len(shape) in (2, 3):
        return shape[-1] if len(shape) == 2 else shape[1]
    if leaf == "lora_b" and len(shape) in (2, 3):
        return shape[0] if len(shape) == 2 else shape[2]
    return None


def _expected(leaf: str, dims: tuple[int | None, int, int], rank: int) -> tuple[int, ...]:
    experts, dout, din = dims
    if leaf == "m":
        return (dout,)
    if experts is None:
        return (din, rank) if leaf == "lora_a" else (rank, dout)
    return (experts, rank, din) if leaf == "lora_a" else (experts, dout, rank)


def _base_modules(
    base: str, facts: BaseFacts, family: str | None
) -> dict[str, tuple[int | None, int, int]] | None:
    """mlx-lm module path → (experts or ``None``, out, in) from the base's weights headers; ``None`` without
    weights (a config alone or a tiny base)."""
    from adapterdoc.formats.mlx.names import base_weights, to_mlx
    from adapterdoc.formats.mlx.write import EMBEDDINGS
    from adapterdoc.layouts.mlx_prefixes import SWITCH_SEGMENT

    ckpt = base_weights(base)
    if ckpt is None:
        return None
    out: dict[str, tuple[int | None, int, int]] = {}
    experts: dict[str, set[int]] = {}
    for name, info in ckpt.tensors.items():
        module, _, leaf = name.rpartition(".")
        fused = _FUSED.match(name)
        if fused and len(info.shape) == 3:
            e, rows, cols = info.shape
            switch = f"{fused['owner']}.{SWITCH_SEGMENT}"
            try:
                owner = to_mlx(switch, facts.layout, base, family).path
            except AdapterdocError:
                continue
            if fused["proj"] == "gate_up_proj":
                out[f"{owner}.gate_proj"] = out[f"{owner}.up_proj"] = (e, rows // 2, cols)
            else:
                out[f"{owner}.down_proj"] = (e, rows, cols)
            continue
        if leaf != "weight" or len(info.shape) != 2:
            continue
        try:
            place = to_mlx(module, facts.layout, base, family)
        except AdapterdocError:
            continue
        rows, cols = info.shape
        if module.rsplit(".", 1)[-1] in EMBEDDINGS:  # LoRAEmbedding: lora_a [vocab, r], lora_b [r, dims]
            rows, cols = cols, rows
        if place.expert is None:
            out[place.path] = (None, rows, cols)
        else:
            experts.setdefault(place.path, set()).add(place.expert)
            out[place.path] = (len(experts[place.path]), rows, cols)
    return out
