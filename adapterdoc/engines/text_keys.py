"""The exact-text-key reading that TGI and LoRAX share (both from LoRAX's ``adapters/lora.py``): which of an
adapter's tensors the engine reads, which it drops and why. Pure data; each profile turns it into its own findings.

The engine builds, for every layer ``i`` of the served text model and every layer type it supports, the weight
name ``model.layers.{i}.self_attn.{t}`` / ``model.layers.{i}.mlp.{t}`` (and ``lm_head`` where supported), and
reads exactly ``base_model.model.{name}.lora_A.weight`` and ``.lora_B.weight`` (``map_weights_for_model``). A
layer type is loaded only when every layer has both tensors; one missing layer drops the whole type
(``prepare_weights`` / ``LoraWeights.load`` return ``None``). Anything else is logged as "unused adapter weights".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from adapterdoc.engines.base import EngineNeeds, Profile, ProfileInput, ProfileOptions, engine_finding

if TYPE_CHECKING:
    from adapterdoc.adapter import AdapterConfig, LoraKey
    from adapterdoc.bases import BaseSpec
    from adapterdoc.checkpoint import Checkpoint
    from adapterdoc.engines.zero_lora import FillInput, ZeroLora
    from adapterdoc.ml.meta import ExpectedModel
    from adapterdoc.report.findings import Finding

RULES = (
    "format",
    "config",
    "keys",
    "dropped",
    "unsupported",
    "dora",
    "mts",
    "patterns",
    "arch",
    "model_type",
    "padding",
    "rescale",
    "kernels",
    "fan",
    "not_modelled",
    "reads",
)
"""Every rule of an exact-text-key engine, in the order of its finding codes."""


def numbered(first: int, *, without: tuple[str, ...] = ()) -> dict[str, str]:
    """Rule → code: the engine's codes from ``AD{first}`` on, one per rule of :data:`RULES` it has."""
    rules = [r for r in RULES if r not in without]
    return {rule: f"AD{first + i}" for i, rule in enumerate(rules)}


_TEXT = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.([^.]+)\.lora_([AB])\.weight$"
)
_HEAD = re.compile(r"^base_model\.model\.lm_head\.lora_([AB])\.weight$")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:[^.]+\.)*?(self_attn|mlp)\.([^.]+)$")
_ANY_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_ATTN = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"})
_MLP = frozenset({"gate_proj", "up_proj", "down_proj", "c_fc", "c_proj"})


@dataclass(frozen=True)
class TextKeyReading:
    """What an exact-text-key engine makes of one adapter's tensor names."""

    nlayers: int
    read: tuple[str, ...]
    """Tensor names the engine loads."""
    applied: Mapping[str, int]
    """Layer type → layers it is applied on (every layer, or 1 for ``lm_head``)."""
    not_text: tuple[str, ...]
    """LoRA tensors on a supported layer type whose name is not the exact text-style key (a wrapper such as
    ``model.language_model.``, a different prefix, an adapter name in the key)."""
    dropped: Mapping[str, list[int]]
    """Layer type → the layers that lack it (both lora_A and lora_B), when some layers have it: the engine drops
    the whole type."""
    unsupported: tuple[str, ...]
    """LoRA modules on a layer type the engine does not load (lm_head where unsupported, experts, embeddings,
    towers, other leaves)."""
    other: tuple[str, ...]
    """Tensors with an effect that are no LoRA factor the engine reads (lora_B biases, trainable tokens)."""


def layer_count(meta: ExpectedModel, keys: list[LoraKey]) -> int:
    """Layers of the served text model: the base's ``layers.N`` outside towers, else the adapter's own."""
    from adapterdoc.layouts import tower_segment

    found = [
        int(m.group(1))
        for name in meta.base_modules
        if tower_segment(name) is None and (m := _ANY_LAYER.search(name))
    ]
    if not found:
        found = [int(m.group(1)) for k in keys if (m := _ANY_LAYER.search(k.module))]
    return max(found) + 1 if found else 0


def base_lacks(meta: ExpectedModel, leaf: str, layers: list[int]) -> list[int]:
    """The ``layers`` whose base module tree has no ``leaf`` (hybrid stacks: linear-attention layers)."""
    has = {
        int(m.group(1))
        for name in meta.base_modules
        if name.endswith("." + leaf) and (m := _ANY_LAYER.search(name))
    }
    return [i for i in layers if i not in has] if has or meta.base_modules else []


def read_text_keys(keys: list[LoraKey], layer_types: tuple[str, ...], nlayers: int) -> TextKeyReading:
    """How an engine that loads ``layer_types`` on ``nlayers`` layers reads ``keys`` (parsed :class:`LoraKey`)."""
    from adapterdoc.adapter import fused_expert_owner
    from adapterdoc.layouts import tower_segment

    read: list[str] = []
    applied: dict[str, int] = {}
    not_text: list[str] = []
    dropped: dict[str, list[int]] = {}
    other: list[str] = []
    types = set(layer_types)
    have: dict[str, dict[int, set[str]]] = {}
    names: dict[tuple[str, int], list[str]] = {}
    unsupported: set[str] = set()
    for k in keys:
        if k.role == "magnitude" or k.role == "full":
            continue  # DoRA and modules_to_save have rules of their own
        if not k.is_lora:
            other.append(k.key)
            continue
        m, h = _TEXT.match(k.key), _HEAD.match(k.key)
        if m and m.group(3) in types and _block_ok(m.group(2), m.group(3)):
            layer, leaf = int(m.group(1)), m.group(3)
            have.setdefault(leaf, {}).setdefault(layer, set()).add(m.group(4))
            names.setdefault((leaf, layer), []).append(k.key)
            continue
        if h and "lm_head" in types:
            have.setdefault("lm_head", {}).setdefault(0, set()).add(h.group(1))
            names.setdefault(("lm_head", 0), []).append(k.key)
            continue
        module = fused_expert_owner(k.module)
        lm = _LAYER.search(module)
        served_leaf = (
            lm is not None
            and lm.group(3) in types
            and _block_ok(lm.group(2), lm.group(3))
            and ".experts." not in module
            and tower_segment(module) is None
        )
        head = tower_segment(module) is None and module.rpartition(".")[2] == "lm_head" and "lm_head" in types
        if (served_leaf and k.role in ("lora_A", "lora_B")) or head:
            not_text.append(k.key)
        else:
            unsupported.add(module)
    for leaf, layers in have.items():
        complete = {i for i, ab in layers.items() if ab == {"A", "B"}}
        span = range(1) if leaf == "lm_head" else range(nlayers)
        missing = [i for i in span if i not in complete]
        if missing:
            dropped[leaf] = missing
            continue
        applied[leaf] = len(span)
        for i in span:
            read.extend(names[(leaf, i)])
    return TextKeyReading(
        nlayers, tuple(read), applied, tuple(not_text), dropped, tuple(sorted(unsupported)), tuple(other)
    )


def _block_ok(block: str, leaf: str) -> bool:
    return leaf in (_ATTN if block == "self_attn" else _MLP)


def padded_rank(rank: int, minimum: int = 8, block: int = 16) -> int:  # PAD_MINIMUM, PAD_BLOCK
    """The rank the punica SGMV path pads ``rank`` to (``pad_to_min_rank``): ``minimum`` at or below it, else the
    next multiple of ``block``."""
    return minimum if rank <= minimum else (rank + block - 1) // block * block


def scaling(alpha: float, rank: int, rslora: bool) -> float:
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def pattern_modules(config: AdapterConfig, modules: list[str]) -> list[tuple[str, float, float]]:
    """(module, PEFT's scaling, the engine's ``lora_alpha / r`` scaling) for modules whose ``rank_pattern`` /
    ``alpha_pattern`` entry makes the two differ (the engine reads only ``r`` and ``lora_alpha``)."""
    flat = scaling(config.lora_alpha, config.r, config.use_rslora)
    out = []
    for module in modules:
        peft = config.scaling_for(module)
        if not math.isclose(peft, flat, rel_tol=1e-9):
            out.append((module, peft, flat))
    return out


def layers_text(layers: list[int]) -> str:
    """``0, 2-5`` for a sorted list of layer indices."""
    runs: list[str] = []
    for i in layers:
        if runs and runs[-1].split("-")[-1] == str(i - 1):
            runs[-1] = f"{runs[-1].split('-')[0]}-{i}"
        else:
            runs.append(str(i))
    return ", ".join(runs)


def architectures_of(spec: str | BaseSpec) -> list[str] | None:
    """The ``architectures`` of a base (a spec string or a resolved :class:`BaseSpec`) read from its local
    config.json (a tiny base: its layout's class); ``None`` when it cannot be resolved here without network."""
    from adapterdoc.bases import read_config_json, resolve_base
    from adapterdoc.errors import AdapterdocError
    from adapterdoc.layouts import LAYOUTS

    try:
        base = resolve_base(spec) if isinstance(spec, str) else spec
        if base.kind == "tiny":
            lay = LAYOUTS.get(base.tiny_layout or "")
            return [lay.model_class] if lay else None
        raw = read_config_json(base)
    except (AdapterdocError, OSError, ValueError):
        return None
    archs = raw.get("architectures")
    return list(archs) if isinstance(archs, list) else None


class Add(Protocol):
    """A profile's ``add(rule, message, key=..., hint=...)``."""

    def __call__(self, rule: str, msg: str, *, key: str | None = None, hint: str | None = None) -> None: ...


class TextKeyProfile(Profile):
    """A serving engine that reads exact text-style keys (TGI, LoRAX): one subclass per engine sets its name,
    version, codes and layer types; the rules are the same code (the engines share LoRAX's loader)."""

    engine = ""
    """The engine's name in messages (``TGI``)."""
    version = ""
    """The commit (and release) the rules were read from."""
    codes: ClassVar[dict[str, str]] = {}
    """Rule → finding code: format, config, keys, dropped, unsupported, dora, mts, patterns, arch, model_type,
    padding, rescale, kernels (optional), fan, reads, not_modelled (optional)."""

    def layer_types(self, model_type: str | None) -> tuple[str, ...]:
        """The layer types the engine loads on a base of ``model_type``, in its loading order."""
        raise NotImplementedError

    def model_type_problem(self, model_type: str | None) -> tuple[str, str] | None:
        """(rule, message) when the engine cannot serve LoRA on ``model_type`` as this profile models it."""
        return None

    def unservable(
        self, config: Mapping[str, object], modules: list[str], model_type: str | None
    ) -> str | None:
        if model_type is None:
            return None
        problem = self.model_type_problem(model_type)
        if problem is not None and problem[0] == "model_type":
            return problem[1]
        loaded = set(self.layer_types(model_type))
        odd = sorted({m.rpartition(".")[2] for m in modules} - loaded)
        if odd:
            return f"{self.name} loads LoRA only on {', '.join(sorted(loaded))}; the adapter has {odd}"
        return None

    def needs(self, base_layout: str | None, options: ProfileOptions | None = None) -> EngineNeeds | None:
        return EngineNeeds(
            keys="text",
            expert_lora=False,
            rslora=True,
            patterns=False,
            regex_targets=True,
            dora=False,
            modules_to_save=False,
            version=self.version,
            rank_padding=(PAD_MINIMUM, PAD_BLOCK),
            fill="layer-types",
        )

    def zero_lora(self, a: FillInput) -> ZeroLora | None:
        """A layer type is loaded only when every layer of the served model has it: the type is added, with its
        rank, on every layer that lacks it (:func:`missing_layer_types`)."""
        return missing_layer_types(a, self.name)

    def drops_partial_layer_types(self) -> bool:
        return True

    def keys_against(self, base_layout: str | None, options: ProfileOptions | None = None) -> str | None:
        """The engine reads text-style keys on a VL base too (TGI's Qwen2-VL / Qwen2.5-VL classes find the
        language model under ``language_model`` but look up ``model.layers.{i}...``): check the keys against the
        base's text model, not PEFT's VL class."""
        from adapterdoc.engines.served import is_vl

        return "text" if is_vl(base_layout) else None

    def run_fields(self, options: ProfileOptions, *, active: bool) -> dict[str, object]:
        return {f"{self.name}_version": self.version if active else None}

    def label(self, options: ProfileOptions) -> str:
        return f"{self.name} {self.version}"

    def rules(self, a: ProfileInput) -> list[Finding]:
        from adapterdoc.checkpoint import open_checkpoint

        spec, report, keys, meta, config = a.spec, a.subject, a.keys, a.meta, a.config
        out: list[Finding] = []

        def add(rule: str, msg: str, *, key: str | None = None, hint: str | None = None) -> None:
            if rule in self.codes:
                out.append(
                    engine_finding(
                        f"{self.engine} {self.version}", self.codes[rule], spec, msg, key=key, hint=hint
                    )
                )

        fix = f"adapterdoc remap {spec} --for {self.name} --out DIR"
        ckpt = open_checkpoint(spec)
        if ckpt.weights_format != "safetensors":
            add("format", f"weights are {ckpt.weights_format}; only *.safetensors files are read")
        if report.config.get("inferred"):
            add(
                "config", "no adapter_config.json; the engine reads it with PEFT's LoraConfig.from_pretrained"
            )
        model_type = meta.model_type
        problem = self.model_type_problem(model_type)
        if problem:
            add(problem[0], problem[1], key="model_type")
        types = self.layer_types(model_type)
        nlayers = layer_count(meta, keys)
        rd = read_text_keys(keys, types, nlayers)
        lora = [k for k in keys if k.is_lora]
        if rd.not_text:
            add(
                "keys",
                f"{len(rd.not_text)} LoRA tensor(s) are not exact text-style keys "
                "(base_model.model.model.layers.{i}.self_attn.* / mlp.*); they match no weight name and are "
                "silently not applied",
                key=rd.not_text[0],
                hint=fix,
            )
        for leaf, missing in sorted(rd.dropped.items()):
            absent = base_lacks(meta, leaf, missing)
            why = f"the base has no {leaf} in layer(s) {layers_text(absent)}; " if absent else ""
            add(
                "dropped",
                f"{leaf} LoRA is missing in layer(s) {layers_text(missing)} of {nlayers} ({why}a type is loaded "
                f"only when every layer has it): the engine drops {leaf} in every layer",
                key=leaf,
                hint=None if absent else fix,
            )
        categorized = set(rd.read) | set(rd.not_text) | set(rd.other)
        categorized |= {k.key for k in lora if k.target.rpartition(".")[2] in rd.dropped}
        strays = sorted({k.target for k in lora if k.key not in categorized} | set(rd.unsupported))
        if strays or rd.other:
            where = strays[0] if strays else rd.other[0]
            add(
                "unsupported",
                f"{len(strays)} LoRA module(s) and {len(rd.other)} other tensor(s) are on layers the engine does "
                f"not load (it loads {', '.join(types)}); they are logged as unused and not applied",
                key=where,
            )
        if config.use_dora or any(k.role == "magnitude" for k in keys):
            add("dora", "DoRA (use_dora / lora_magnitude_vector) is ignored: served as plain LoRA")
        if config.modules_to_save:
            add("mts", f"modules_to_save {config.modules_to_save} are never read", key="modules_to_save")
        mods = sorted({k.module for k in keys if k.role == "lora_A"})
        off = pattern_modules(config, mods)
        if off:
            m, peft, flat = off[0]
            add(
                "patterns",
                f"{len(off)} module(s) have a rank_pattern/alpha_pattern scaling the engine ignores (e.g. {m}: "
                f"PEFT {peft:g}, served {flat:g})",
                key=m,
                hint=fix,
            )
        self._architecture(config, meta, add)
        self._ranks(rd, keys, ckpt, config, types, add, fix)
        if config.raw.get("fan_in_fan_out") is True:
            add(
                "fan",
                "fan_in_fan_out is read and never used (no effect on lora_A/lora_B)",
                key="fan_in_fan_out",
            )
        applied = ", ".join(t for t in types if t in rd.applied) or "nothing"
        against = report.keys_against
        checked = f"; keys checked against {against['model_class']}, not PEFT's VL class" if against else ""
        add(
            "reads",
            f"applies {applied} on {nlayers} layer(s) ({len(rd.read)} of {len(lora)} LoRA tensors){checked}",
        )
        return out

    def _architecture(self, config: AdapterConfig, meta: ExpectedModel, add: Add) -> None:
        named = config.base_model
        base = meta.base
        if not named or base is None or named == getattr(base, "spec", None):
            return
        theirs, ours = architectures_of(named), architectures_of(base)
        if theirs and ours and theirs != ours:
            add(
                "arch",
                f"base_model_name_or_path {named!r} is {theirs}, the served base {ours}: ValueError "
                "(Architectures differ) when the adapter is loaded by id",
                key="base_model_name_or_path",
            )

    def _ranks(
        self,
        rd: TextKeyReading,
        keys: list[LoraKey],
        ckpt: Checkpoint,
        config: AdapterConfig,
        types: tuple[str, ...],
        add: Add,
        fix: str,
    ) -> None:
        """Padding cost (info), the padded-rank scaling of later layer types, kernel range."""
        shapes = {name: tuple(t.shape) for name, t in ckpt.tensors.items()}
        rank: dict[str, int] = {}
        extra = 0
        for name in rd.read:
            shape = shapes.get(name, ())
            if len(shape) != 2:
                continue
            is_a = ".lora_A." in name
            r = shape[0] if is_a else shape[1]
            leaf = "lm_head" if name.startswith("base_model.model.lm_head.") else name.split(".")[-3]
            rank.setdefault(leaf, r)
            extra += (padded_rank(r) - r) * (shape[1] if is_a else shape[0])
        if not rank:
            return
        padded = {leaf: padded_rank(r) for leaf, r in rank.items()}
        grown = sorted(f"{leaf} {rank[leaf]}→{p}" for leaf, p in padded.items() if p != rank[leaf])
        if grown:
            add(
                "padding",
                f"ranks padded for SGMV ({', '.join(grown)}; tensor-parallel size 1): {extra} zero parameters, "
                f"{extra * 2} bytes at 16 bits",
            )
        alpha, rs = config.lora_alpha, config.use_rslora
        flat, cur, wrong = scaling(alpha, config.r, rs), config.r, []
        for leaf in (t for t in types if t in rank):
            served = scaling(alpha, cur, rs)
            if not math.isclose(served, flat, rel_tol=1e-9):
                wrong.append(f"{leaf} {served:g} instead of {flat:g}")
            cur = padded[leaf]
        if wrong:
            add(
                "rescale",
                "config.r is set to the padded rank after each layer type, so later types are scaled with it: "
                + "; ".join(wrong),
                key="r",
                hint=fix,
            )
        top = max(padded.values())
        if top > KERNEL_MAX_RANK:
            add(
                "kernels",
                f"padded rank {top} is above the kernels' {KERNEL_MAX_RANK}: the slower SGMV loop runs",
            )


_MODULE = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.([^.]+)$")
_LAYER_FIELDS = ("layers_to_transform", "layers_pattern")


def missing_layer_types(a: FillInput, engine: str) -> ZeroLora | None:
    """The zero LoRA an engine that drops a layer type unless every layer has it needs (``remap --for``): each type
    the adapter has, on every layer of the base that lacks it. Refused (AD269) when the base is unknown and some
    layers lack a type (or ``layers_to_transform`` is set), and when the base itself has no such module in some
    layer (a hybrid stack: no fill makes the type load)."""
    from adapterdoc.engines.served import serving_elsewhere
    from adapterdoc.engines.zero_lora import ZeroLora, describe, layer_count, read_base
    from adapterdoc.errors import RefusedError

    have: dict[tuple[str, str], dict[int, str]] = {}
    for module, roles in a.factors.items():
        m = _MODULE.match(module)
        if m and len(roles) == 2 and _block_ok(m.group(2), m.group(3)):
            have.setdefault((m.group(2), m.group(3)), {})[int(m.group(1))] = module
    if not have:
        return None
    spec = a.spec()
    top = max(i for layers in have.values() for i in layers) + 1
    counted = layer_count(spec) if spec is not None else None
    nlayers = max(top, counted or 0)
    gaps = any(len(layers) < nlayers for layers in have.values())
    if spec is None:
        if gaps or any(a.raw.get(f) for f in _LAYER_FIELDS):
            every = {
                _layer_module(b, leaf, i): next(iter(v.values()))
                for (b, leaf), v in have.items()
                for i in range(top)
            }
            absent = {m: like for m, like in every.items() if m not in a.factors}
            raise RefusedError(
                a.path,
                f"AD269: {engine} drops a layer type unless every layer has it, and which layers the base has is "
                f"unknown ({describe(absent) if absent else 'layers_to_transform is set'}); pass --base",
            )
        a.notes.append("the base is unknown: layer types checked against the adapter's own layers only")
        return None
    if not gaps and counted is not None:
        return None  # every type on every layer the base's config counts: nothing to read
    bm = read_base(spec)
    nlayers = max(nlayers, bm.nlayers)
    missing: dict[str, str] = {}
    lacking: dict[str, list[int]] = {}
    for (block, leaf), layers in sorted(have.items()):
        like = layers[min(layers)]
        for i in range(nlayers):
            if i in layers:
                continue
            module = _layer_module(block, leaf, i)
            if module in bm.linear:
                missing[module] = like
            else:
                lacking.setdefault(leaf, []).append(i)
    if lacking:
        leaf, where = next(iter(sorted(lacking.items())))
        instead = serving_elsewhere(engine, a.raw, sorted(a.factors), spec, dropped=leaf)
        raise RefusedError(
            a.path,
            f"AD269: the base has no {leaf} in layer(s) {layers_text(where)} of {nlayers}, and {engine} loads a layer "
            f"type only when every layer has it: it drops {leaf} whatever is added; {instead}",
        )
    return ZeroLora(missing, bm)


def _layer_module(block: str, leaf: str, i: int) -> str:
    return f"model.layers.{i}.{block}.{leaf}"


PAD_MINIMUM = 8
"""``MIN_SGMV_RANK`` (LoRAX utils/punica.py)."""
PAD_BLOCK = 16
"""``SGMV_BLOCK_SIZE``."""
KERNEL_MAX_RANK = 128
"""``MAX_RANK_CUSTOM`` and ``BGMV_MAX_RANK``."""
