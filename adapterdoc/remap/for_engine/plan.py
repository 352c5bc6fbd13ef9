"""``remap --for ENGINE``: every exact rewrite one serving engine needs, planned in one pass from what its verify
profile says it needs (:meth:`~adapterdoc.engines.base.Profile.needs`):

1. the key layout (the registry move ``--vl`` / ``--to`` use; header-only);
2. the expert layout the engine reads (``--experts``' own conversion, :mod:`adapterdoc.remap.expert_rewrite`);
3. rsLoRA folded into ``lora_alpha`` (config only, exact);
4. one rank and one scaling for an engine that ignores ``rank_pattern`` / ``alpha_pattern``: ranks zero-padded to
   the largest (exact in every dtype), and where the modules' scalings differ, ``lora_B`` multiplied by
   ``s_m / s`` (exact for a power of two, else rounded once per element: measured and reported);
5. zero LoRA added where the engine drops or fails on a module that lacks a partner (:mod:`.fill`);
6. a regex ``target_modules`` replaced by the module paths it selected.

DoRA, ``modules_to_save`` and expert LoRA on an engine that serves none of them have no exact rewrite: refused
(exit 3) before anything is written, with what to do instead. Header-only when only keys and config change; a
streamed copy (:func:`adapterdoc.st.compose.compose`) when tensor data changes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import cast

from adapterdoc.adapter import AdapterConfig, LoraKey, fused_expert_owner, parse_key
from adapterdoc.engines.base import EngineNeeds, Profile
from adapterdoc.errors import RefusedError, UnsupportedInputError
from adapterdoc.remap.config import dump_like
from adapterdoc.remap.expert_config import block_mapping, peft_fuses_keys_only
from adapterdoc.remap.expert_names import DOWN, GATE_UP, fused_owner_prefix
from adapterdoc.remap.expert_rewrite import Pieces, Producer
from adapterdoc.remap.for_engine import config as C
from adapterdoc.remap.for_engine.fill import fill_step
from adapterdoc.remap.for_engine.ranks import plan_uniform
from adapterdoc.remap.for_engine.served_keys import base_layout, key_move
from adapterdoc.remap.for_engine.tensors import Group, identity_groups, transform
from adapterdoc.remap.plan import KeyMoves, Plan, WriteWeights, move_keys, open_safetensors, plan_header
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.report.remap_report import ConfigChange, RemapReport
from adapterdoc.st.atomic import target_mode
from adapterdoc.st.compose import compose
from adapterdoc.st.header import Header


def make_engine_plan(
    spec: str, engine: str, base: str | None, out: str | None, needs: EngineNeeds | None = None
) -> Plan:
    """Plan ``remap --for ENGINE`` of ``spec``; nothing is written here. The engine's profile says what it needs
    (:meth:`~adapterdoc.engines.base.Profile.needs`, as data) and decides its own rules (the zero LoRA it needs
    added, the copies it skips, what it cannot serve). ``needs`` replaces the profile (a library caller's own
    engine description: the profile is then not looked up, and no engine-specific rule applies). Each step below
    returns what it changed; the plan (and its report) is assembled once, at the end."""
    from adapterdoc.engines import get_profile

    ckpt, weights = open_safetensors(
        spec, "remap --for reads safetensors only (engines need it); save the adapter as safetensors first"
    )
    cfg = ckpt.adapter_config
    if cfg is None or cfg.path is None:
        raise RefusedError(weights, "remap --for needs the adapter folder with its adapter_config.json")
    profile = None
    if needs is None:
        try:
            profile = get_profile(engine)
        except ValueError:
            raise UnsupportedInputError(engine, "this build has no verify profile for that engine") from None
    header = ckpt.headers[0]
    keys = list(header.tensors)
    parsed = [parse_key(k) for k in keys]
    modules = sorted({k.module for k in parsed if k.is_lora or k.role == "magnitude"})
    notes: list[str] = []
    layout, base_from = base_layout(ckpt, base, modules, notes)
    if needs is None:
        assert profile is not None
        needs = profile.needs(layout, None)
    if needs is None:
        raise UnsupportedInputError(
            engine, "is not a serving engine; remap --for has nothing to rewrite for it"
        )
    rules = profile if profile is not None else Profile()
    _refuse_inexact(weights, engine, needs, rules, cfg, header, parsed, base)
    with open(cfg.path, "rb") as f:
        original = f.read()
    raw = json.loads(original.decode("utf-8"))
    changes: list[ConfigChange] = []
    rewrites: list[Mapping[str, object]] = []
    findings: list[Finding] = []

    # 1. keys (header-only)
    move = key_move(needs.keys, weights, modules, cfg.layout_hints, layout, notes)
    moved = move_keys(ckpt, keys, parsed, move) if move is not None else KeyMoves({})
    mapping = moved.mapping
    changes += moved.changes
    notes += moved.notes
    findings += moved.findings
    if moved.config_bytes is not None:
        raw = json.loads(moved.config_bytes.decode("utf-8"))
    if mapping:
        assert move is not None
        rewrites.append({"rewrite": "keys", "from": move.source, "to": move.target, "renamed": len(mapping)})
    if needs.keys == "served" and layout is None:
        findings.append(
            make(
                "AD267",
                f"the model {engine} serves is unknown: keys kept as they are; pass --base",
                path=spec,
            )
        )
    view = renamed_header(header, mapping)
    groups: list[Group] | None = None

    # 2. experts (a streamed copy)
    experts = _experts(raw, view, needs.experts, weights, layout)
    if experts is not None:
        groups = list(experts.groups) or None or None
        changes += experts.changes
        rewrites.append(experts.rewrite)
    specs = [s for g in groups for s in g[0]] if groups is not None else None
    names = [(s.name, s.shape) for s in specs] if specs else [(k, t.shape) for k, t in view.tensors.items()]

    # 3. rsLoRA folded (config only)
    if not needs.rslora and raw.get("use_rslora") is True:
        before = json.loads(json.dumps(raw))
        C.fold_rslora(raw, resolution_names(names, raw), cfg.path)
        changes += C.changes(before, raw, "rslora")
        rewrites.append(
            {"rewrite": "rslora", "lora_alpha": [before.get("lora_alpha"), raw["lora_alpha"]], "exact": True}
        )

    # 4. one rank, one scaling (and a rank the engine does not pad itself)
    if not needs.patterns or needs.rank_padding:
        before = json.loads(json.dumps(raw))
        tensor_changes, ranks = plan_uniform(raw, names, view, cfg.path, needs.rank_padding)
        changes += C.changes(before, raw, "ranks")
        rewrites += ranks
        if tensor_changes:
            groups = transform(groups if groups is not None else identity_groups(view), tensor_changes)

    # 5. zero LoRA the engine needs added (a streamed copy)
    filled = fill_step(rules, needs.fill, raw, names, groups, view, base, cfg.path)
    if filled is not None:
        groups, names = filled.groups, filled.names
        changes += filled.changes
        notes += filled.notes
        if filled.rewrite is not None:
            rewrites.append(filled.rewrite)

    # 6. regex target_modules → the list
    if not needs.regex_targets and C.is_regex(raw.get("target_modules")):
        before = json.loads(json.dumps(raw))
        listed = C.explicit_targets(raw, _targetable(names, raw), cfg.path)
        changes += C.changes(before, raw, "targets")
        rewrites.append(
            {"rewrite": "target_modules", "from": before["target_modules"], "entries": len(listed)}
        )

    # 7. what no rewrite can make the engine apply
    if profile is not None:
        lora = sorted({parse_key(n).module for n, _ in names if parse_key(n).is_lora})
        why = profile.unservable(raw, lora, _model_type(layout, base, cfg.base_model))
        if why is not None:
            raise RefusedError(
                weights,
                f"AD270: {why}: no rewrite makes {engine} apply it; serve it on an engine that does, or merge it "
                "into the base (adapterdoc merge ADAPTER --base BASE --out DIR)",
            )

    findings += _findings(engine, spec, rewrites)
    raw_before = json.loads(original.decode("utf-8"))
    config_bytes = dump_like(raw, original) if raw != raw_before else (original if out is not None else None)
    strategy, compose_weights, hp = "none", None, None
    if groups is not None:
        strategy, compose_weights = "copy", _composer(weights, groups, header)
    elif mapping:
        hp = plan_header(weights, header, mapping, out)
        strategy = hp.strategy
        notes += hp.notes
    elif raw != raw_before:
        strategy = "copy" if out is not None else "in-place"
    if not rewrites:
        notes.append(f"the adapter already fits {engine} {needs.version}: nothing to do")
    planned = RemapReport(
        input=spec,
        mode="for",
        strategy=strategy,
        mapping=mapping,
        source_layout=move.source if mapping and move is not None else None,
        target_layout=move.target if mapping and move is not None else None,
        weights=weights,
        out=out,
        config_changes=changes,
        notes=notes,
        findings=sort_findings(findings),
        engine={
            "name": engine,
            "version": needs.version,
            "base_layout": layout,
            "base_from": base_from,
            "needs": dataclasses.asdict(needs),
        },
        rewrites=rewrites,
    )
    return Plan(
        planned,
        ckpt,
        weights,
        hp.header if hp is not None else header,
        hp.body if hp is not None else None,
        cfg.path,
        config_bytes,
        hp.blocker if hp is not None else None,
        compose=compose_weights,
        config_only=groups is None and not mapping and raw != raw_before,
    )


def _model_type(layout: str | None, base: str | None, named: str | None) -> str | None:
    """The base's ``model_type``: its registry layout's, else its config.json's (``--base`` or a local
    ``base_model_name_or_path``); ``None`` when neither says."""
    from adapterdoc.layouts import LAYOUTS

    if layout in LAYOUTS:
        return LAYOUTS[layout].model_type
    from adapterdoc.bases import read_config_json
    from adapterdoc.engines.zero_lora import resolve
    from adapterdoc.errors import AdapterdocError

    try:
        spec = resolve(base, named)
        raw = read_config_json(spec) if spec is not None and spec.kind != "tiny" else None
    except (AdapterdocError, OSError, ValueError):
        return None
    mt = raw.get("model_type") if isinstance(raw, dict) else None
    return mt if isinstance(mt, str) else None


def _refuse_inexact(
    weights: str,
    engine: str,
    needs: EngineNeeds,
    rules: Profile,
    cfg: AdapterConfig,
    header: Header,
    parsed: list[LoraKey],
    base: str | None = None,
) -> None:
    """DoRA, modules_to_save, LoRA biases and expert LoRA on an engine that serves none: no exact rewrite."""
    merge = "merge it into the base instead (adapterdoc merge ADAPTER --base BASE --out DIR) and serve the merged model"
    if not needs.dora and (cfg.use_dora or any(k.role == "magnitude" for k in parsed)):
        raise RefusedError(
            weights,
            f"AD260: is a DoRA adapter (use_dora / lora_magnitude_vector) and {engine} does not serve DoRA; "
            f"no LoRA-only rewrite is exact; {merge}",
        )
    biases = [k.key for k in parsed if k.role == "lora_B.bias"]
    if not needs.lora_bias and (biases or cfg.raw.get("lora_bias")):
        raise RefusedError(
            weights,
            f"AD492: trains LoRA biases ({len(biases)} lora_B.bias tensor(s), lora_bias=True) and {engine} drops "
            f"them (each is overwritten by its module's lora_B weight); no LoRA-only rewrite is exact; {merge}, "
            "or retrain with lora_bias=False",
        )
    copies = _skipped_copies(weights, engine, rules, parsed, base, merge)
    if not needs.modules_to_save:
        saved = [m for m in cfg.modules_to_save if m not in needs.modules_to_save_heads]
        full = [
            k.key
            for k in parsed
            if k.role == "full"
            and k.key not in copies
            and k.module.rpartition(".")[2] not in needs.modules_to_save_heads
        ]
        if saved or full:
            what = f"modules_to_save {saved}" if saved else f"whole weights such as `{full[0]}`"
            raise RefusedError(
                weights,
                f"AD261: carries {what}, which {engine} does not apply; dropping them would change the outputs; "
                f"{merge}, or retrain without modules_to_save",
            )
    if not needs.expert_lora:
        from adapterdoc.adapter.expert_picture import expert_picture

        pic = expert_picture({k: t.shape for k, t in header.tensors.items()}, config=cfg)
        if pic.routed:
            raise RefusedError(
                weights,
                f"AD262: carries LoRA on {len(pic.routed)} MoE expert block(s) and {engine} applies no expert LoRA "
                f"(it would serve them as the base); {merge}",
            )


def _skipped_copies(
    weights: str, engine: str, rules: Profile, parsed: list[LoraKey], base: str | None, merge: str
) -> set[str]:
    """The copies of base weights the engine skips (:meth:`~adapterdoc.engines.base.Profile.skipped_copies`): kept
    as they are, and refused where ``--base`` has weights and a copy differs from the base's (or its shape does)."""
    import os

    checked = rules.skipped_copies(parsed, os.path.dirname(weights), base)
    for c in checked:
        if c.verdict in ("differs", "shape"):
            raise RefusedError(
                weights,
                f"AD490: `{c.key}` (PEFT's copy of the base's {c.head}) differs from the base's ({c.detail}); "
                f"{engine} skips the copy and serves the base's {c.head}; {merge}",
            )
    return {c.key for c in checked}


@dataclass(frozen=True)
class ExpertsStep:
    """``--experts``' conversion inside ``--for``: the streamed groups, the config changes, the ``rewrites`` entry."""

    groups: tuple[Group, ...]
    changes: tuple[ConfigChange, ...]
    rewrite: Mapping[str, object]


def _experts(
    raw: dict[str, object], view: Header, reads: str | None, weights: str, layout: str | None
) -> ExpertsStep | None:
    """``--experts``' conversion when the engine reads the other expert layout (``None``: not needed); ``raw``
    rewritten for it."""
    from adapterdoc.adapter.expert_picture import expert_picture
    from adapterdoc.remap.expert_config import expert_config
    from adapterdoc.remap.expert_rewrite import plan_experts

    if reads is None:
        return None
    cfg = C.parse(raw)
    pic = expert_picture({k: t.shape for k, t in view.tensors.items()}, config=cfg)
    if pic.layout == reads or pic.layout is None:
        return None
    if pic.layout not in ("per-expert", "fused"):
        raise RefusedError(weights, f"the expert LoRA is {pic.layout}: no exact conversion to {reads}")
    eplan = plan_experts(view, cfg, reads, weights)
    touched = {k for b in eplan.blocks for pair in (b.fused_keys, *b.leaf_keys.values()) for k in pair}
    others = sorted({parse_key(k).module for k in view.tensors if k not in touched and parse_key(k).is_lora})
    before = json.loads(json.dumps(raw))
    expert_config(raw, cfg, eplan, others, weights, keys_only=peft_fuses_keys_only(layout))
    read, written = eplan.tensor_counts()
    rewrite = {
        "rewrite": "experts",
        "from": pic.layout,
        "to": reads,
        "blocks": len(eplan.blocks),
        "exact": True,
        "tensors_read": read,
        "tensors_written": written,
        "tensors": block_mapping(eplan),
    }
    groups = tuple((specs, _bound(eplan.header or view, produce)) for specs, produce in eplan.groups)
    return ExpertsStep(groups, tuple(C.changes(before, raw, "experts")), rewrite)


def _bound(header: Header, produce: Producer) -> Callable[[], Pieces]:
    """An expert plan's producer (it reads through an open :class:`~adapterdoc.st.tensors.TensorSource`) as a
    group producer that opens its own: one open file per MoE block."""
    from adapterdoc.st.tensors import TensorSource

    def run() -> Pieces:
        with TensorSource(header) as src:
            yield from produce(src)

    return run


def renamed_header(header: Header, mapping: dict[str, str]) -> Header:
    """``header`` with its tensors under their new names (same offsets, same file): the later steps read the
    moved adapter through it without anything written."""
    if not mapping:
        return header
    tensors = {mapping.get(k, k): t._replace(name=mapping.get(k, k)) for k, t in header.tensors.items()}
    return Header(header.path, header.file_size, header.header_len, header.metadata, tensors, header.raw)


def resolution_names(names: list[tuple[str, tuple[int, ...]]], raw: dict[str, object]) -> list[str]:
    """The names PEFT resolves ``rank_pattern`` / ``alpha_pattern`` on, one per LoRA module: the module path, or
    for a fused expert module the parameter's name (``...experts.gate_up_proj`` / ``...experts.down_proj``)."""
    targets = raw.get("target_parameters")
    params = [
        p
        for p in (GATE_UP, DOWN)
        if isinstance(targets, list) and any(str(t).rpartition(".")[2] == p for t in targets)
    ]
    out: set[str] = set()
    for name, _ in names:
        k = parse_key(name)
        if not k.is_lora:
            continue
        owner = k.module.removesuffix(".base_layer")
        if params and fused_owner_prefix(owner) is not None:
            param = GATE_UP if k.module.endswith(".base_layer") or params == [GATE_UP] else params[-1]
            out.add(f"{owner}.{param}")
        else:
            out.add(fused_expert_owner(k.module))
    return sorted(out)


def _targetable(names: list[tuple[str, tuple[int, ...]]], raw: dict[str, object]) -> list[str]:
    """The LoRA modules ``target_modules`` selects (fused expert modules come from ``target_parameters``)."""
    fused = bool(raw.get("target_parameters"))
    mods = {parse_key(n).module for n, _ in names if parse_key(n).is_lora}
    return sorted(
        m for m in mods if not (fused and fused_owner_prefix(m.removesuffix(".base_layer")) is not None)
    )


def _findings(engine: str, spec: str, rewrites: list[Mapping[str, object]]) -> list[Finding]:
    """One finding per rewrite that changes what the user has (a folded alpha, padded ranks, rounded values, zero
    LoRA, a listed target_modules)."""
    out = []
    for r in rewrites:
        kind = r["rewrite"]
        if kind == "rslora":
            before, after = cast("list[object]", r["lora_alpha"])
            out.append(
                make(
                    "AD264",
                    f"use_rslora folded into lora_alpha {before} → {after} for {engine}",
                    path=spec,
                )
            )
        elif kind == "ranks":
            out.append(
                make(
                    "AD265",
                    f"ranks zero-padded to {r['to']} for {engine} ({r['bytes_added']} bytes added)",
                    path=spec,
                )
            )
        elif kind == "scaling" and not r["bit_exact"]:
            out.append(
                make(
                    "AD263",
                    f"{r['tensors']} lora_B tensor(s) multiplied by their scaling ratio for {engine}: rounded once, "
                    f"largest relative change {r['max_rel_rounding']:.3g}",
                    path=spec,
                )
            )
        elif kind == "fill":
            added = cast("Mapping[str, list[int]]", r["added"])
            what = ", ".join(f"{leaf} on {len(layers)} layer(s)" for leaf, layers in added.items())
            out.append(
                make(
                    "AD268",
                    f"zero LoRA added for {engine} ({r['fill']}): {what}; {r['bytes_added']} bytes added",
                    path=spec,
                )
            )
        elif kind == "target_modules":
            out.append(
                make(
                    "AD266",
                    f"regex target_modules replaced by {r['entries']} module path(s) for {engine}",
                    path=spec,
                )
            )
    return out


def _composer(weights: str, groups: list[Group], header: Header) -> WriteWeights:
    """Writes the new weights file from ``groups`` (the header's metadata, the input's mode)."""
    specs = [s for g in groups for s in g[0]]

    def pieces() -> Iterator[bytes | bytearray | memoryview]:
        for _, produce in groups:
            yield from produce()

    def write_weights(dest: str, link: str, progress: Callable[[int], None] | None) -> None:
        compose(
            dest,
            specs,
            pieces(),
            metadata=header.metadata,
            mode=target_mode(weights),
            link=link,
            progress=progress,
        )

    return write_weights
