"""The MLX adapter format (mlx-lm's adapter folder) ⇄ PEFT, exactly.

mlx-lm's ``load_adapters`` reads ``adapter_config.json`` (``fine_tune_type`` lora|dora|full, ``num_layers``: how
many of the *last* decoder layers get LoRA, ``-1``/``0`` all of them; ``lora_parameters``: ``rank``, ``scale``,
``dropout``, ``keys``: the module paths inside a layer, or top-level paths such as ``lm_head``) and
``adapters.safetensors``: ``<module>.lora_a`` ``[in, r]`` and ``<module>.lora_b`` ``[r, out]`` (PEFT's ``lora_A`` /
``lora_B`` transposed), DoRA's ``<module>.m`` ``[out]`` (PEFT's ``lora_magnitude_vector``), and for stacked experts
(``LoRASwitchLinear``) ``lora_a`` ``[E, r, in]`` and ``lora_b`` ``[E, out, r]`` (each expert's PEFT factors as they
are). The output is ``y + scale * (x @ lora_a) @ lora_b``: one ``scale`` for all modules, PEFT's whole scaling.

PEFT → MLX: every module's rank is zero-padded to the largest (exact), ``scale`` is the scaling most LoRA bytes have,
and a module with another scaling has it folded into its ``lora_B`` (exact for a power-of-two ratio, else rounded
once per element: measured and reported, AD806). Fused expert LoRA (``target_parameters``) is rewritten per expert
first (exact). MLX → PEFT gives one rank, ``lora_alpha = scale * rank``, per-expert keys. What mlx-lm cannot hold
is refused before anything is written: whole weights (``modules_to_save``, trainable tokens; AD801), LoRA biases
(AD802), DoRA on experts (AD803), embedding LoRA (AD804), modules outside the language model (AD805).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from adapterdoc.errors import AdapterdocError, RefusedError, UnsupportedInputError
from adapterdoc.formats import Converted, Detection
from adapterdoc.formats.mlx.folder import CONFIG, LEAVES, WEIGHTS, MlxAdapter, lora_parameters, open_mlx

if TYPE_CHECKING:
    from adapterdoc.adapter import LoraKey
    from adapterdoc.formats.mlx.names import BaseFacts
    from adapterdoc.formats.mlx.plan import Factor, Plan, Target
    from adapterdoc.formats.peft import PeftAdapter
    from adapterdoc.report.findings import Finding
    from adapterdoc.st.header import Header

NAME = "mlx"
__all__ = [
    "CONFIG",
    "LEAVES",
    "NAME",
    "WEIGHTS",
    "MlxAdapter",
    "check",
    "describe",
    "detect",
    "from_peft",
    "lora_parameters",
    "open_mlx",
    "tensors_file",
    "to_peft",
]


def detect(path: Path) -> Detection | None:
    """An mlx-lm adapter folder: ``adapters.safetensors`` (and mlx-lm's config fields, ``.lora_a`` names)."""
    try:
        p = Path(path)
        weights = p / WEIGHTS
        if not p.is_dir() or not weights.is_file():
            return None
    except OSError:
        return None
    try:
        from adapterdoc.st.header import read_header

        evidence = [WEIGHTS]
        cfg = p / CONFIG
        if cfg.is_file():
            raw = json.loads(cfg.read_text(encoding="utf-8"))
            fields = [
                f
                for f in ("fine_tune_type", "num_layers", "lora_parameters")
                if isinstance(raw, dict) and f in raw
            ]
            evidence.append(
                f"{CONFIG} with {', '.join(fields)}" if fields else f"{CONFIG} without mlx-lm's fields"
            )
        names = read_header(weights).tensors
        leaves = Counter(n.rsplit(".", 1)[-1] for n in names)
        shown = ", ".join(f"{leaves[k]} .{k}" for k in LEAVES if leaves[k])
        if shown:
            evidence.append(f"tensors {shown}")
        return Detection(NAME, tuple(evidence))
    except (OSError, ValueError, AdapterdocError) as e:
        # its tensors file is there: an mlx-lm folder that cannot be read, whose reader then says why
        why = e.reason if isinstance(e, AdapterdocError) else str(e)
        return Detection(NAME, (WEIGHTS, f"unreadable ({why}): inspect, verify and convert name why"))


# ------------------------------------------------------------------------------------------------ PEFT → MLX


def from_peft(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    """PEFT adapter folder ``src`` → mlx-lm adapter folder ``out`` (atomic; refusals before any write)."""
    from adapterdoc.formats.peft import open_peft

    adapter = open_peft(src)
    if _has_fused_experts(adapter.header, adapter.raw):
        return _via_per_expert(src, out, base=base, outtype=outtype)
    from adapterdoc.formats.mlx.write import write_mlx

    plan = _plan(adapter, os.fspath(src), base)
    return write_mlx(plan, adapter, out, outtype)


def _has_fused_experts(header: Header, raw: Mapping[str, object]) -> bool:
    """Whether a tensor is PEFT's fused expert LoRA (``target_parameters``). Not the config alone: ``remap
    --experts per-expert`` keeps ``target_parameters`` where PEFT fuses per-expert keys at load (Qwen3.5-MoE
    text), and reading the config would send that per-expert output round again, without end."""
    from adapterdoc.adapter import parse_key
    from adapterdoc.adapter.expert_picture import classify

    if not raw.get("target_parameters"):
        return False
    for name, info in header.tensors.items():
        k = classify(parse_key(name), info.shape)
        if k is not None and k.form == "fused":
            return True
    return False


def _via_per_expert(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    from adapterdoc.remap import remap

    parent = os.path.dirname(os.path.abspath(os.fspath(out)))
    with tempfile.TemporaryDirectory(prefix=".adapterdoc-convert-", dir=parent) as tmp:
        per = os.path.join(tmp, "per-expert")
        remap(os.fspath(src), experts="per-expert", out=per)
        done = from_peft(Path(per), out, base=base, outtype=outtype)
    note = "fused expert LoRA (target_parameters) rewritten per expert first (exact; `adapterdoc remap --experts`)"
    return replace(done, notes=(note, *done.notes))


def _plan(adapter: PeftAdapter, where: str, base: str | None) -> Plan:
    from adapterdoc.adapter import AdapterConfig, parse_key
    from adapterdoc.formats.mlx.names import base_facts, to_mlx
    from adapterdoc.formats.mlx.plan import Factor, Plan, Target
    from adapterdoc.layouts import LAYOUTS, detect_layout
    from adapterdoc.layouts.mlx_prefixes import FAMILY_PREFIXES

    cfg = AdapterConfig(adapter.raw, os.path.join(adapter.folder, CONFIG))
    if cfg.peft_type != "LORA":
        raise RefusedError(where, f"peft_type is {cfg.peft_type}; mlx-lm holds LoRA and DoRA only (AD801)")
    facts = base_facts(base) if base else None
    roles: dict[str, dict[str, str]] = {}
    dropped: list[str] = []
    for name in adapter.header.tensors:
        k = parse_key(name)
        if (
            k.role == "full"
            and k.module.endswith(".base_layer")
            and _same_as_base(adapter.header, name, k, base)
        ):
            dropped.append(
                name
            )  # PEFT saves a targeted lm_head / embedding's own weight: the base's, unchanged
            continue
        if k.role in ("full", "tokens"):
            what = "a whole weight (modules_to_save)" if k.role == "full" else "trainable-token deltas"
            raise RefusedError(
                where, f"`{name}` is {what}: an mlx-lm LoRA adapter holds only lora_a/lora_b/m (AD801)"
            )
        if k.key.endswith(".bias") or k.role == "lora_B.bias":
            raise RefusedError(where, f"`{name}` is a LoRA bias (lora_bias): mlx-lm's LoRA has none (AD802)")
        if k.role in ("lora_embedding_A", "lora_embedding_B"):
            _embedding_refusal(name, facts, cfg.use_dora, where)
        roles.setdefault(k.module, {})[k.role.replace("_embedding", "")] = name
    if not roles:
        raise UnsupportedInputError(where, "holds no LoRA tensors")
    layout = facts.layout if facts and facts.layout else None
    if layout is None:
        found = detect_layout(list(roles), cfg.layout_hints).name
        layout = found if found in LAYOUTS else None
    notes: list[str] = []
    family = _family(facts, layout, list(roles), where, notes)
    targets: dict[str, Target] = {}
    weight: Counter[float] = Counter()
    for module, got in sorted(roles.items()):
        a, b = got.get("lora_A"), got.get("lora_B")
        if a is None or b is None:
            raise UnsupportedInputError(where, f"`{module}` lacks its lora_A or lora_B")
        sa, sb = adapter.header.tensors[a].shape, adapter.header.tensors[b].shape
        if len(sa) != 2 or len(sb) != 2 or sa[0] != sb[1]:
            raise UnsupportedInputError(
                where, f"`{module}`: lora_A {list(sa)} and lora_B {list(sb)} do not pair"
            )
        r = sa[0]
        if cfg.rank_for(module) != r:
            raise UnsupportedInputError(
                where,
                f"`{module}`: adapter_config.json gives rank {cfg.rank_for(module)}, its tensors have {r}",
            )
        if cfg.use_dora and "magnitude" not in got:
            raise UnsupportedInputError(
                where, f"`{module}`: use_dora is set but it has no lora_magnitude_vector"
            )
        s = cfg.scaling_for(module)
        weight[s] += math.prod(sa) + math.prod(sb)
        factor = Factor(a, b, got.get("magnitude"), r, s, sa[1], sb[0])
        place = to_mlx(module, layout, where, family)
        if place.layer is None and facts is not None and facts.tied and module.endswith("lm_head"):
            raise RefusedError(
                where,
                f"`{module}`: the base ties lm_head to the embedding, and mlx-lm then builds no lm_head module "
                "(it calls embed_tokens.as_linear), so there is nothing to put this LoRA on (AD805)",
            )
        t = targets.setdefault(place.path, Target(place.path, place.layer, place.key))
        if place.expert is None:
            t.dense = factor
        else:
            if cfg.use_dora:
                raise RefusedError(
                    where, f"`{module}`: DoRA on an expert; mlx-lm's LoRASwitchLinear has no DoRA (AD803)"
                )
            t.experts[place.expert] = factor
    rank = max(f.rank for t in targets.values() for f in _factors(t))
    scale = _common_scale(weight)
    experts = _expert_count(targets, facts, where, notes)
    layers = sorted({t.layer for t in targets.values() if t.layer is not None})
    num_layers = _num_layers(layers, facts, notes)
    kind = "dora" if cfg.use_dora else "lora"
    config: dict[str, object] = {
        "fine_tune_type": kind,
        "num_layers": num_layers,
        "lora_parameters": {
            "rank": rank,
            "scale": scale,
            "dropout": float(adapter.raw.get("lora_dropout") or 0.0),
            "keys": sorted({t.key for t in targets.values()}),
        },
    }
    if cfg.base_model:
        config["model"] = cfg.base_model
    written_by: dict[str, object] = {"converted_from": "peft", "layout": layout}
    if family in FAMILY_PREFIXES:
        written_by["mlx_model"] = family
    config["adapterdoc"] = written_by
    if dropped:
        notes.append(
            f"{len(dropped)} whole weights PEFT saved beside the LoRA (`{dropped[0]}`) equal the base's and were "
            "left out (mlx-lm reads them from the base)"
        )
    ranks = Counter(f.rank for t in targets.values() for f in _factors(t))
    if len(ranks) > 1:
        notes.append(
            f"ranks {sorted(ranks)} zero-padded to {rank} (exact: the padded rows and columns are zero)"
        )
    if cfg.use_rslora:
        notes.append(f"rsLoRA folded: scale = lora_alpha / sqrt(r) = {scale:g}")
    return Plan(tuple(targets.values()), config, rank, scale, experts, tuple(notes))


def _embedding_refusal(name: str, facts: BaseFacts | None, dora: bool, where: str) -> None:
    """Embedding LoRA converts only onto a base ``--base`` shows untied: mlx-lm's ``LoRAEmbedding`` adds
    ``scale * lora_a[x] @ lora_b`` to the looked-up rows, as PEFT does (``lora_a`` = ``lora_embedding_A``ᵀ,
    ``lora_b`` = ``lora_embedding_B``ᵀ), but a tied model's output goes through its ``as_linear``, which adds the
    delta to the logits too, and PEFT's ``lm_head`` does not change."""
    if dora:
        raise RefusedError(where, f"`{name}`: DoRA on an embedding is not converted (AD804)")
    if facts is None:
        raise RefusedError(
            where,
            f"`{name}` is embedding LoRA: give --base to show the base is untied (tie_word_embeddings false); on a "
            "tied base mlx-lm's LoRAEmbedding also changes the logits (as_linear), PEFT's does not (AD804)",
        )
    if facts.tied is not False:
        why = "ties lm_head to the embedding" if facts.tied else "does not say tie_word_embeddings false"
        raise RefusedError(
            where,
            f"`{name}` is embedding LoRA and the base {why}: mlx-lm's LoRAEmbedding then also changes the logits "
            "(as_linear), PEFT's does not, so it is not converted (AD804)",
        )


def _family(
    facts: BaseFacts | None, layout: str | None, modules: list[str], where: str, notes: list[str]
) -> str | None:
    """The mlx-lm model the adapter runs on (its names: :func:`adapterdoc.formats.mlx.names.to_mlx`); a note when
        mlx-lm has no model for the base's type (AD816, as verify says), a refusal when nothing says the family and
        the module names are not the ones most mlx-lm models share (``model.``, ``lm_head``). The family is stored in
    the folder's ``adapterdoc`` stash, so that the way back to PEFT reads the names without ``--base``."""
    from adapterdoc.formats.mlx.names import family_of

    model_type, family = family_of(facts, layout, modules)
    if model_type is None:
        odd = sorted({m.split(".")[0] for m in modules} - {"model", "lm_head"})
        if odd:
            raise RefusedError(
                where,
                f"module names start with {', '.join(f'`{o}.`' for o in odd)}, which mlx-lm's models name by family: "
                "give --base so adapterdoc can write mlx-lm's names for it (AD809)",
            )
    elif family is None and facts is not None:
        notes.append(
            f"AD816: model_type `{model_type}` has no mlx-lm model file (mlx-lm {_mlx_version()}): mlx-lm "
            "cannot load the base"
        )
    return family


def _mlx_version() -> str:
    from adapterdoc.layouts.mlx_models import MLX_LM_VERSION

    return MLX_LM_VERSION


def _same_as_base(header: Header, name: str, key: LoraKey, base: str | None) -> bool:
    """Whether the whole weight ``name`` (PEFT's ``X.base_layer.weight``, saved for a targeted lm_head or
    embedding) is byte for byte the base's ``X.weight`` (read in chunks; ``False`` without a base with weights,
    or after a vocabulary resize)."""
    from adapterdoc.formats.mlx.names import base_weights
    from adapterdoc.st.tensors import TensorSource

    ckpt = base_weights(base) if base is not None else None
    if ckpt is None:
        return False
    theirs = f"{key.module.removesuffix('.base_layer')}.weight"
    mine, other = header.tensors[name], ckpt.tensors.get(theirs)
    if other is None or (other.dtype, other.shape) != (mine.dtype, mine.shape):
        return False
    file = ckpt.tensor_file[theirs]
    owner = next(h for h in ckpt.headers if h.path == file)
    with TensorSource(header) as a, TensorSource(owner) as b:
        return all(x == y for x, y in zip(a.chunks(name), b.chunks(theirs), strict=True))


def _common_scale(weight: Counter[float]) -> float:
    """The ``scale`` that leaves the most LoRA bytes exact: the candidate whose ratio to the most bytes' own
    scaling is a power of two (1 included), then the one most bytes have."""
    from adapterdoc.st.tensor_edits import is_power_of_two

    def score(c: float) -> tuple[int, int, float]:
        exact = sum(n for s, n in weight.items() if is_power_of_two(s / c))
        return exact, weight[c], c

    return max(weight, key=score)


def _factors(t: Target) -> list[Factor]:
    return [t.dense] if t.dense is not None else list(t.experts.values())


def _expert_count(
    targets: dict[str, Target], facts: BaseFacts | None, where: str, notes: list[str]
) -> int | None:
    stacked = [t for t in targets.values() if t.experts]
    if not stacked:
        return None
    top = max(max(t.experts) for t in stacked) + 1
    count = facts.experts if facts and facts.experts else top
    if count < top:
        raise UnsupportedInputError(where, f"has expert {top - 1}, the base has {count} experts")
    missing = sum(count - len(t.experts) for t in stacked)
    if missing:
        notes.append(f"{missing} expert LoRAs absent from the adapter written as zero LoRA (the identity)")
    if not (facts and facts.experts):
        notes.append(f"{count} experts per stacked module (from the adapter's keys; give --base to check)")
    return count


def _num_layers(layers: list[int], facts: BaseFacts | None, notes: list[str]) -> int:
    if not layers:
        return 0
    if facts and facts.layers:
        return facts.layers - layers[0]
    if layers[0] == 0:
        return -1
    notes.append(
        f"num_layers -1 (all layers): the first adapted layer is {layers[0]}, and without --base the layer count "
        "is unknown; mlx-lm's LoRA on the layers below it starts with lora_b = 0 (the identity)"
    )
    return -1


# ------------------------------------------------------------------------------------------------ MLX → PEFT


def to_peft(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    """mlx-lm adapter folder ``src`` → PEFT adapter folder ``out`` (one rank, ``lora_alpha = scale * rank``)."""
    from adapterdoc.formats.mlx.write import write_peft

    adapter = open_mlx(src)
    form = _expert_form(adapter, base)
    if form == "per-expert":
        return write_peft(adapter, out, base=base, outtype=outtype)
    if form == "fused":
        done = write_peft(adapter, out, base=base, outtype=outtype, fused=True)
        note = (
            "stacked experts written in PEFT's fused form (target_parameters) at their own rank, byte for byte: "
            "gate and up share each expert's lora_a, as PEFT's fused gate_up_proj does"
        )
        return replace(done, notes=(*done.notes, note))
    from adapterdoc.remap import remap
    from adapterdoc.st.header import read_header

    parent = os.path.dirname(os.path.abspath(os.fspath(out)))
    with tempfile.TemporaryDirectory(prefix=".adapterdoc-convert-", dir=parent) as tmp:
        per = Path(tmp) / "per-expert"
        done = write_peft(adapter, per, base=base, outtype=outtype)
        remap(os.fspath(per), experts="fused", out=os.fspath(out))
    tensors = len(read_header(Path(out) / "adapter_model.safetensors").tensors)
    notes = [n for n in done.notes if not n.startswith("stacked experts written per expert")]
    notes.append(
        "stacked experts written in PEFT's fused form (target_parameters; exact in function, gate_up at twice the "
        "rank): PEFT loads no per-expert LoRA on this model"
    )
    return Converted(NAME, "peft", Path(out), tensors, tuple(notes))


def _expert_form(adapter: MlxAdapter, base: str | None) -> str:
    """How stacked experts go back to PEFT: ``fused`` (PEFT's ``target_parameters`` form at their own rank) when
    the base's class holds fused experts and gate and up share every expert's ``lora_a`` (an adapter written from
    the fused form); ``fused-wide`` (``remap --experts fused``: gate_up at gate's plus up's rank) when the class has
    fused experts and PEFT has no per-expert conversion for it (the registry's ``peft_moe``); else ``per-expert``
    (no stacked experts, or PEFT fuses per-expert keys itself at load)."""
    from adapterdoc.formats.mlx.fused import shares_gate_up
    from adapterdoc.formats.mlx.names import base_facts
    from adapterdoc.layouts import LAYOUTS

    if not any(len(t.shape) == 3 for t in adapter.header.tensors.values()):
        return "per-expert"
    layout = base_facts(base).layout if base else None
    stash = adapter.raw.get("adapterdoc")
    if layout is None and isinstance(stash, dict):
        layout = stash.get("layout")
    lay = LAYOUTS.get(layout) if isinstance(layout, str) else None
    if lay is None or not lay.target_parameters:
        return "per-expert"
    if shares_gate_up(adapter):
        return "fused"
    return "fused-wide" if lay.peft_moe is None else "per-expert"


def describe(path: Path) -> dict[str, object]:
    """What ``inspect`` shows of an mlx-lm adapter folder: its config fields and what its tensors cover."""
    from adapterdoc.formats.mlx.names import split_layer

    adapter = open_mlx(path)
    raw = adapter.raw
    lora_parameters = raw.get("lora_parameters")
    params = lora_parameters if isinstance(lora_parameters, dict) else {}
    modules: dict[str, list[int]] = {}
    stacked = 0
    for name, info in adapter.header.tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "lora_a":
            layer, key = split_layer(module)
            modules.setdefault(key, []).append(-1 if layer is None else layer)
            stacked += len(info.shape) == 3
    layers = sorted({n for v in modules.values() for n in v if n >= 0})
    return {
        "fine_tune_type": raw.get("fine_tune_type", "lora"),
        "num_layers": raw.get("num_layers"),
        "rank": params.get("rank"),
        "scale": params.get("scale"),
        "dropout": params.get("dropout"),
        "keys": params.get("keys"),
        "model": raw.get("model"),
        "modules": sum(1 for n in adapter.header.tensors if n.endswith(".lora_a")),
        "stacked_expert_modules": stacked,
        "layers": [layers[0], layers[-1]] if layers else None,
        "module_keys": sorted(modules),
        "weights": os.path.join(os.fspath(path), WEIGHTS),
    }


def tensors_file(path: Path) -> Path:
    """The safetensors file ``inspect`` describes: ``adapters.safetensors``."""
    return Path(path) / WEIGHTS


def check(path: Path, base: str | None) -> list[Finding]:
    """``verify``'s findings (:mod:`adapterdoc.formats.mlx.load_rules`)."""
    from adapterdoc.formats.mlx.load_rules import check as run

    return run(path, base)
