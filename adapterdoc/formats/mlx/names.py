"""PEFT module paths ⇄ mlx-lm parameter paths, and what a base says about them (layers, experts, class).

The family facts are :mod:`adapterdoc.layouts.mlx_prefixes`; this module applies them generically: the layout's prefix
rules, then mlx-lm's stacked experts (``X.experts.E.P`` ⇄ ``X.switch_mlp.P``), then the split of a path into the
decoder layer it sits in and its key inside that layer (what ``lora_parameters.keys`` lists)."""

from __future__ import annotations

import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapterdoc.errors import RefusedError
from adapterdoc.layouts.mlx_prefixes import (
    FAMILY_PREFIXES,
    MLX_DEFAULT_FROM,
    MLX_PREFIXES,
    MLX_WRAPPER,
    PREFIX_FAMILY,
    SWITCH_PROJECTIONS,
    SWITCH_SEGMENT,
    mlx_model,
)

if TYPE_CHECKING:
    from adapterdoc.checkpoint import Checkpoint

_EXPERT = re.compile(r"^(?P<owner>.+)\.experts\.(?P<e>\d+)\.(?P<proj>[^.]+)$")
_SWITCH = re.compile(rf"^(?P<owner>.+)\.{SWITCH_SEGMENT}\.(?P<proj>[^.]+)$")
_LAYER = re.compile(r"^(?P<stack>(?:.+\.)?(?:layers|h|blocks))\.(?P<n>\d+)\.(?P<key>.+)$")
"""A decoder layer's module: mlx-lm's stacks are ``….layers.N`` (``model.layers``, ``language_model.model.layers``,
``backbone.layers``), ``….h.N`` (``gpt_neox``, ``gptj``, ``gpt_bigcode``) or ``….blocks.N`` (``dbrx``, ``olmo``)."""


@dataclass(frozen=True)
class MlxPath:
    """Where one PEFT module lands in mlx-lm."""

    path: str
    """The mlx-lm module path (``model.layers.3.self_attn.q_proj``); its tensors are ``path.lora_a`` and so on."""
    layer: int | None
    """The decoder layer, or ``None`` for a module outside the layer stack (``lm_head``)."""
    key: str
    """The key ``lora_parameters.keys`` lists: the path inside the layer (``self_attn.q_proj``), or ``path``."""
    expert: int | None = None
    """For a per-expert PEFT module, its expert index inside the stacked ``switch_mlp`` module."""


def split_layer(path: str) -> tuple[int | None, str]:
    """(decoder layer, key inside it) of an mlx-lm module path; ``(None, path)`` outside the layer stack."""
    m = _LAYER.match(path)
    return (int(m["n"]), m["key"]) if m else (None, path)


def to_mlx(module: str, layout: str | None, where: str, family: str | None = None) -> MlxPath:
    """The mlx-lm place of PEFT module ``module`` (no ``base_model.model.``) under ``layout``'s rules, else those
    of mlx-lm model ``family``; refused where that model has no module of that name (AD809)."""
    rules = MLX_PREFIXES.get(layout or "", ())
    if rules:
        path = _apply(module, rules, where, module)
    else:
        path = _rename(module, FAMILY_PREFIXES.get(family or "", ()))
        top = unknown_top(path, family)
        if top is not None:
            raise RefusedError(
                where,
                f"`{module}` has no place in mlx-lm's `{family}` model: its modules start with "
                f"{', '.join(f'`{t}.`' for t in top)}, and adapterdoc does not map this family's `{path.split('.')[0]}.` "
                "names (AD809)",
            )
    expert = None
    m = _EXPERT.match(path)
    if m and m["proj"] in SWITCH_PROJECTIONS:
        path, expert = f"{m['owner']}.{SWITCH_SEGMENT}.{m['proj']}", int(m["e"])
    layer, key = split_layer(path)
    return MlxPath(path, layer, key, expert)


def from_mlx(path: str, layout: str | None, where: str, family: str | None = None) -> str:
    """The PEFT module path of mlx-lm module ``path`` (a stacked ``switch_mlp`` path keeps ``{e}`` for the
    expert index)."""
    m = _SWITCH.match(path)
    if m and m["proj"] in SWITCH_PROJECTIONS:
        path = f"{m['owner']}.experts.{{e}}.{m['proj']}"
    rules = tuple((b, a) for a, b in MLX_PREFIXES.get(layout or "", ()))
    if rules:
        return _apply(path, rules, where, path)
    back = sorted(((b, a) for a, b in FAMILY_PREFIXES.get(family or "", ())), key=lambda r: -len(r[0]))
    return _rename(path, tuple(back))


def unknown_top(path: str, family: str | None) -> tuple[str, ...] | None:
    """mlx-lm model ``family``'s top-level modules when ``path`` is under none of them (mlx-lm refuses it), else
    ``None`` (also for a family whose top-level modules are unknown)."""
    from adapterdoc.layouts.mlx_models import MLX_MODELS

    top = MLX_MODELS.get(family or "")
    if top is None or path.split(".")[0] in top:
        return None
    return top


def family_of(
    facts: BaseFacts | None, layout: str | None, modules: list[str]
) -> tuple[str | None, str | None]:
    """(model_type, mlx-lm model or ``None`` when mlx-lm has none) of an adapter: ``--base``'s config, else the
    registry layout's class, else a module prefix only one family has; ``(None, None)`` when nothing says."""
    from adapterdoc.layouts import LAYOUTS

    if facts is not None and facts.model_type:
        return facts.model_type, mlx_model(facts.model_type, facts.architectures)
    lay = LAYOUTS.get(layout or "")
    if lay is not None:
        return lay.model_type, mlx_model(lay.model_type, (lay.model_class,))
    for prefix, family in PREFIX_FAMILY.items():
        if any(m.startswith(prefix) for m in modules):
            return family, mlx_model(family)
    return None, None


def _rename(path: str, rules: tuple[tuple[str, str], ...]) -> str:
    """``path`` under the first rule whose left side it starts with (``path + "."``), or as it is."""
    dotted = path + "."
    for old, new in rules:
        if dotted.startswith(old):
            return (new + dotted[len(old) :])[:-1]
    return path


def _apply(path: str, rules: tuple[tuple[str, str], ...], where: str, module: str) -> str:
    if not rules:
        return path
    dotted = path + "."
    for old, new in rules:
        if dotted.startswith(old):
            return (new + dotted[len(old) :])[:-1]
    raise RefusedError(
        where,
        f"`{module}` has no place in mlx-lm's model (it loads only the language model: "
        f"{', '.join(repr(a) for a, _ in rules)} paths); drop that module's LoRA first (AD805)",
    )


def wrapped(paths: list[str]) -> bool:
    """Whether mlx-lm paths are those of a model mlx-lm wraps as ``language_model`` (VL classes, Qwen3.5)."""
    return any(p.startswith(MLX_WRAPPER) for p in paths)


def default_from_layout() -> str:
    return MLX_DEFAULT_FROM


@dataclass
class BaseFacts:
    """What a ``--base`` says about how mlx-lm builds the model."""

    spec: str
    layout: str | None
    model_type: str | None
    layers: int | None
    experts: int | None
    tied: bool | None
    config: dict[str, Any] = field(default_factory=dict)
    architectures: tuple[str, ...] = ()


def base_weights(spec: str) -> Checkpoint | None:
    """``--base``'s weights opened header-only, or ``None`` for a base without weights (a config alone, a tiny
    base) or one that does not open."""
    from adapterdoc.bases import resolve_base
    from adapterdoc.checkpoint import open_checkpoint
    from adapterdoc.errors import AdapterdocError

    base = resolve_base(spec)
    if base.root is None or not base.has_weights:
        return None
    try:
        return open_checkpoint(base.root)
    except AdapterdocError:
        return None


def base_facts(spec: str) -> BaseFacts:
    """Read ``--base`` (model folder, config.json, cached repo id, ``tiny:LAYOUT``) torch-free."""
    from adapterdoc.bases import read_config_json, resolve_base
    from adapterdoc.layouts import LAYOUTS, get_layout

    base = resolve_base(spec)
    if base.kind == "tiny":
        assert base.tiny_layout is not None
        layout = get_layout(base.tiny_layout)
        raw = dict(layout.tiny.kwargs()) if layout.tiny else {}
        raw.setdefault("model_type", layout.model_type)
        raw.setdefault("architectures", [layout.model_class])
        name: str | None = layout.name
    else:
        raw = read_config_json(base)
        archs = raw.get("architectures") or []
        name = next(
            (n for n, lay in LAYOUTS.items() if isinstance(archs, Container) and lay.model_class in archs),
            None,
        )
    config: Mapping[str, Any] = raw  # config.json's values, as JSON gives them
    text_config = config.get("text_config")
    text: Mapping[str, Any] = text_config if isinstance(text_config, dict) else config
    if hasattr(text, "to_dict"):
        text = text.to_dict()
    layers = text.get("num_hidden_layers")
    experts = text.get("num_experts") or text.get("num_local_experts")
    tied = raw.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    return BaseFacts(
        spec,
        name,
        config.get("model_type"),
        layers if isinstance(layers, int) else None,
        experts if isinstance(experts, int) else None,
        tied if isinstance(tied, bool) else None,
        raw,
        tuple(a for a in archs if isinstance(a, str))
        if isinstance(archs := raw.get("architectures"), list)
        else (),
    )
