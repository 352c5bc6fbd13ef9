"""Planning a remap from the adapter's own keys: open the input, build the key mapping, refuse what a loader would
misread (collisions, a left-over ``.language_model.``, LoRA names lost), warn about towers, choose in place or copy,
and plan the new adapter_config.json. Nothing is written here."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace

from adapterdoc.adapter import ADAPTER_CONFIG, WRAPPER, LoraKey, fused_expert_owner, parse_key
from adapterdoc.checkpoint import ADAPTER_BIN, ADAPTER_WEIGHTS, Checkpoint, open_checkpoint
from adapterdoc.errors import InputNotFoundError, RefusedError, UnsupportedInputError
from adapterdoc.layouts import LAYOUTS, Rule, tower_segment
from adapterdoc.remap.config import plan_config
from adapterdoc.remap.moves import INFIX, RemapMove, detect, resolve_layout_move, user_move, vl_move
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.report.remap_report import ConfigChange, RemapReport
from adapterdoc.st import rewrite
from adapterdoc.st.header import Header, read_header

BIN_BACKUP = ADAPTER_BIN + ".bak"
"""What an ``adapter_model.bin`` is renamed to once ``adapter_model.safetensors`` has replaced it."""

WriteWeights = Callable[[str, str, Callable[[int], None] | None], None]
"""Writes a new weights file: (dest, link rule, progress callback)."""


@dataclass(frozen=True)
class Plan:
    """A remap worked out before anything is written: what the report will say (``planned``) and what the write
    needs."""

    planned: RemapReport
    """The report as planning leaves it (the write adds the files it wrote and its notes)."""
    ckpt: Checkpoint
    weights_path: str
    header: Header | None
    body: bytes | None = None
    config_path: str | None = None
    config_bytes: bytes | None = None
    blocker: str | None = None
    compose: WriteWeights | None = None
    """``--experts``: writes the new weights file (dest, link rule, progress callback) instead of a header copy."""
    config_only: bool = False
    """``--for``: only adapter_config.json changes; in place, the weights file is not written at all."""


@dataclass(frozen=True)
class HeaderPlan:
    """The renamed header of a header-only remap, and whether it is written in place."""

    header: Header
    body: bytes
    blocker: str | None
    strategy: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class KeyMoves:
    """A move planned as ``--to`` plans it, for a caller that adds more rewrites (``remap --for``)."""

    mapping: dict[str, str]
    config_bytes: bytes | None = None
    """adapter_config.json's new bytes (``None``: unchanged)."""
    changes: tuple[ConfigChange, ...] = ()
    notes: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()


def make_plan(
    spec: str,
    *,
    vl: bool,
    to: str | None,
    source: str | None,
    user_rules: list[Rule],
    out: str | os.PathLike[str] | None,
) -> Plan:
    """Open ``spec`` (its header read once), choose the move, map every key, and plan both writes."""
    ckpt = open_input(spec)
    weights = ckpt.weights_path
    assert weights is not None
    keys = list(ckpt.tensors)
    parsed = [parse_key(k) for k in keys]
    if not any(k.is_lora for k in parsed):
        raise RefusedError(
            weights,
            f"no LoRA keys (none of the {len(keys)} tensors is a lora_A/lora_B/lora_embedding factor); "
            "nothing to remap",
        )
    notes: list[str] = []
    move = _choose_move(
        ckpt, weights, parsed, vl=vl, to=to, source=source, user_rules=user_rules, notes=notes
    )
    mapping = _mapping(weights, keys, parsed, move)
    out_path = os.fspath(out) if out is not None else None

    def report(
        strategy: str,
        notes: list[str],
        changes: tuple[ConfigChange, ...] = (),
        findings: list[Finding] | None = None,
    ) -> RemapReport:
        """The plan's report (the write adds what it wrote: :func:`~adapterdoc.report.remap_report.build_remap_report`)."""
        return RemapReport(
            input=spec,
            mode=move.mode,
            strategy=strategy,
            mapping=mapping,
            source_layout=move.source,
            target_layout=move.target,
            weights=weights,
            out=out_path,
            config_changes=list(changes),
            notes=notes,
            findings=sort_findings(findings or []),
        )

    header = ckpt.headers[0] if ckpt.headers else None
    if not mapping:
        notes.append(
            f"no key contains `{INFIX}`: the adapter is already in text form"
            if move.mode == "vl"
            else "the rules rename no key"
        )
        cfg_path = ckpt.adapter_config.path if ckpt.adapter_config else None
        config_bytes = None
        if out is not None and cfg_path is not None:
            with open(cfg_path, "rb") as f:
                config_bytes = f.read()
        return Plan(
            report("none", notes),
            ckpt,
            weights,
            header,
            config_path=cfg_path if config_bytes is not None else None,
            config_bytes=config_bytes,
        )
    old_parsed = dict(zip(keys, parsed))
    new_parsed = _parse_new(mapping, old_parsed, move)
    _check_lora_kept(weights, keys, parsed, mapping)
    module_map = _module_map(mapping, old_parsed, new_parsed)
    cfg = plan_config(ckpt, move, module_map, parsed, keep_original=out is not None)
    towers = _tower_findings(weights, mapping, keys, parsed, new_parsed, move)
    if ckpt.weights_format == "bin":  # always copied, into safetensors (AD103 says where)
        planned = report("copy", [*notes, *cfg.notes], cfg.changes, [*towers, _bin_finding(weights, out)])
        return Plan(planned, ckpt, weights, header, config_path=cfg.path, config_bytes=cfg.data)
    hp = plan_header(weights, header, mapping, out)
    planned = report(hp.strategy, [*notes, *cfg.notes, *hp.notes], cfg.changes, towers)
    return Plan(planned, ckpt, weights, hp.header, hp.body, cfg.path, cfg.data, hp.blocker)


def _choose_move(
    ckpt: Checkpoint,
    weights: str,
    parsed: list[LoraKey],
    *,
    vl: bool,
    to: str | None,
    source: str | None,
    user_rules: list[Rule],
    notes: list[str],
) -> RemapMove:
    """The move the call asks for; source and target layouts from detection on the LoRA modules."""
    modules = sorted({k.module for k in parsed if k.is_lora or k.role == "magnitude"})
    cfg = ckpt.adapter_config
    hint = cfg.layout_hints if cfg else None
    if vl:
        move = vl_move()
        detection = detect(modules, hint)  # shown to the user only; --vl decides from the keys alone
        if detection.name in LAYOUTS:
            move = replace(move, source=detection.name, target=LAYOUTS[detection.name].text_counterpart)
        return move
    if to is not None:
        return resolve_layout_move(weights, modules, hint, to, source, notes)
    return user_move(user_rules)


def _check_lora_kept(weights: str, keys: list[str], parsed: list[LoraKey], mapping: dict[str, str]) -> None:
    """Refuse a mapping that turns LoRA names into names no loader reads as LoRA."""
    lora_after = sum(parse_key(mapping.get(k, k)).is_lora for k in keys)
    lora_before = sum(k.is_lora for k in parsed)
    if lora_after < lora_before:
        lost = next(
            mapping[k] for k, p in zip(keys, parsed) if p.is_lora and not parse_key(mapping[k]).is_lora
        )
        raise RefusedError(
            weights,
            f"the remap would turn {lora_before - lora_after} LoRA tensor name(s) into names no loader reads as "
            f"LoRA (e.g. `{lost}`); check the rule",
        )


def _bin_finding(weights: str, out: str | os.PathLike[str] | None) -> Finding:
    """A ``.bin`` adapter is always copied, into safetensors: where to."""
    return make(
        "AD103",
        f"weights are a pickle: written as {ADAPTER_WEIGHTS}; the .bin is kept as {BIN_BACKUP}"
        if out is None
        else f"weights are a pickle: written as {ADAPTER_WEIGHTS} in the output folder",
        path=weights,
    )


def plan_header(
    weights: str, header: Header | None, mapping: dict[str, str], out: str | os.PathLike[str] | None
) -> HeaderPlan:
    """The renamed header (from the bytes read when the input was opened), and in place or copy."""
    header = header or read_header(weights)
    body, n = rewrite.renamed_header(header.raw, mapping)
    assert n == len(mapping), (n, len(mapping))
    blocker = rewrite.in_place_blocker(weights, header, body)
    strategy = "copy" if (out is not None or blocker) else "in-place"
    notes = (f"copy instead of in-place: {blocker}",) if blocker and out is None else ()
    return HeaderPlan(header, body, blocker, strategy, notes)


def move_keys(ckpt: Checkpoint, keys: list[str], parsed: list[LoraKey], move: RemapMove) -> KeyMoves:
    """A move planned as ``--to`` plans it, for a caller that adds more rewrites (``remap --for``): the key
    mapping (with the same refusals), adapter_config.json's new bytes, its changes, notes and tower findings."""
    weights = ckpt.weights_path
    assert weights is not None
    mapping = _mapping(weights, keys, parsed, move)
    if not mapping:
        return KeyMoves({})
    old_parsed = dict(zip(keys, parsed))
    new_parsed = _parse_new(mapping, old_parsed, move)
    _check_lora_kept(weights, keys, parsed, mapping)
    module_map = _module_map(mapping, old_parsed, new_parsed)
    cfg = plan_config(
        ckpt, move, module_map, parsed, keep_original=False
    )  # bytes only when something changes
    towers = _tower_findings(weights, mapping, keys, parsed, new_parsed, move)
    return KeyMoves(mapping, cfg.data, cfg.changes, cfg.notes, tuple(towers))


def open_input(spec: str) -> Checkpoint:
    path = spec
    if os.path.isfile(spec) and os.path.basename(spec) in (ADAPTER_WEIGHTS, ADAPTER_BIN):
        folder = os.path.dirname(os.path.abspath(spec))
        if os.path.exists(os.path.join(folder, ADAPTER_CONFIG)):
            path = folder  # the adapter folder, so that its config is kept consistent
    ckpt = open_checkpoint(path)
    if ckpt.kind == "sharded":
        raise UnsupportedInputError(
            spec, "is a sharded checkpoint; remap works on one adapter file or folder"
        )
    if ckpt.weights_path is None:
        raise InputNotFoundError(spec, "holds no weights file")
    if ckpt.weights_format == "bin" and ckpt.kind == "adapter":
        st = os.path.join(ckpt.root, ADAPTER_WEIGHTS)
        if os.path.lexists(st):  # open_checkpoint prefers safetensors; this is only a guard
            raise RefusedError(st, "already exists next to the .bin")
    return ckpt


def open_safetensors(spec: str, refusal: str) -> tuple[Checkpoint, str]:
    """:func:`open_input` for a remap that rewrites tensor data or needs safetensors (``--experts``, ``--for``): the
    checkpoint and its weights path; a ``.bin`` is refused with ``refusal``."""
    ckpt = open_input(spec)
    weights = ckpt.weights_path
    assert weights is not None
    if ckpt.weights_format == "bin":
        raise UnsupportedInputError(weights, refusal)
    return ckpt, weights


def _mapping(weights: str, keys: list[str], parsed: list[LoraKey], move: RemapMove) -> dict[str, str]:
    new_names: dict[str, str] = {}
    mapping: dict[str, str] = {}
    for key, info in zip(keys, parsed):
        new = move.key_fn(key, info)
        if not new:
            raise RefusedError(weights, "the rules turn this key into an empty name", key=key)
        if new != key:
            mapping[key] = new
            if move.strips_infix and INFIX in new:
                raise RefusedError(
                    weights,
                    f"would still contain `{INFIX}` after the remap (it has the infix twice): a text model "
                    f"would ignore it. Inspect the adapter; rename it explicitly with --rule",
                    key=key,
                )
        other = new_names.get(new)
        if other is not None:
            raise RefusedError(
                weights,
                f"collision: `{other}` and `{key}` would both be named `{new}`; nothing was changed",
            )
        new_names[new] = key
    return mapping


def _parse_new(
    mapping: dict[str, str], old_parsed: dict[str, LoraKey], move: RemapMove
) -> dict[str, LoraKey]:
    """The parsed new keys; for registry moves and --vl derived from the old parse (the move acts on the module)."""
    out: dict[str, LoraKey] = {}
    moved: dict[str, str] = {}  # module → moved module (the factors of one module share it)
    for old, new in mapping.items():
        info = old_parsed[old]
        cut = len(WRAPPER) * info.wrapped + len(info.module)
        if move.mode == "to" or (move.mode == "vl" and 0 <= old.find(INFIX) < cut):
            module = moved.get(info.module)
            if module is None:
                module = moved[info.module] = move.path_fn(info.module)
            out[new] = LoraKey(new, info.wrapped, module, info.role, info.adapter_name)
        else:
            out[new] = parse_key(new)
    return out


def _module_map(
    mapping: dict[str, str], old_parsed: dict[str, LoraKey], new_parsed: dict[str, LoraKey]
) -> dict[str, str]:
    """Old module path → new one (fused-expert owners too); the first key of a module decides."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for old, new in mapping.items():
        a, b = old_parsed[old], new_parsed[new]
        if a.module in seen:
            continue
        seen.add(a.module)
        out.setdefault(a.module, b.module)
        out.setdefault(fused_expert_owner(a.module), fused_expert_owner(b.module))
    return out


def _tower_findings(
    weights: str,
    mapping: dict[str, str],
    keys: list[str],
    parsed: list[LoraKey],
    new_parsed: dict[str, LoraKey],
    move: RemapMove,
) -> list[Finding]:
    """LoRA left on a tower the target model does not have (always the case for --vl: text models have none)."""
    if move.mode == "rule":
        return []
    keep = set(move.target_towers)
    towers: dict[str, list[str]] = {}
    seg_of: dict[str, str | None] = {}
    for key, info in zip(keys, parsed):
        k = new_parsed[mapping[key]] if key in mapping else info
        if not k.is_lora:
            continue
        if k.module not in seg_of:
            seg_of[k.module] = tower_segment(k.module)
        seg = seg_of[k.module]
        if seg and seg not in keep:
            towers.setdefault(seg, []).append(k.module)
    out = []
    target = move.target or "the text model"
    for seg, mods in sorted(towers.items()):
        n = len(set(mods))
        out.append(
            make(
                "AD202",
                f"{n} LoRA module(s) under `{seg}` stay as they are: {target} has no `{seg}`, so a loader "
                "ignores them",
                path=weights,
                key=sorted(mods)[0],
                hint="if they were not meant to be trained, retrain with exclude_modules covering the towers",
            )
        )
    return out
