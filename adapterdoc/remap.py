"""`adapterdoc remap`: rename an adapter's keys to another model layout, header-only and atomically, and keep
adapter_config.json consistent with the new names.

Three ways to say what to rename, exactly one per call:

- ``vl=True``: strip the first ``.language_model.`` from every key that has one (a VL adapter onto the text class);
  decided from the adapter's own keys only.
- ``to=LAYOUT``: the registry's rules (:mod:`adapterdoc.layouts`) from the detected (or given) source layout;
  they act on module paths without the ``base_model.model.`` wrapper.
- ``rules=["REGEX=>REPLACEMENT", ...]``: ``re.sub(REGEX, REPLACEMENT, key, count=1)`` on the full key, in order.

The weights are renamed in place when the new header fits (space padding, O(header)), else by a streamed copy to a
temp file in the same folder renamed over the file (:mod:`adapterdoc.st.atomic`). An in-place remap edits its input:
a symlink there (a Hugging Face cache snapshot links to blobs shared by every revision) is replaced by a regular file
and its target is never written, unlike an output path the user names, whose links are followed. Refusals raise :class:`~adapterdoc.errors.RefusedError` before
anything is written. Torch is imported only for ``.bin`` adapters.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.adapter import ADAPTER_CONFIG, WRAPPER, LoraKey, fused_expert_owner, parse_key
from adapterdoc.checkpoint import ADAPTER_BIN, ADAPTER_WEIGHTS, Checkpoint, load_bin, open_checkpoint
from adapterdoc.errors import InputNotFoundError, RefusedError, UnsupportedInputError
from adapterdoc.layouts import (
    LAYOUTS,
    STRIP_LANGUAGE_MODEL,
    Detection,
    Rule,
    detect_layout,
    exclusion_regex,
    get_layout,
    remap_path,
    strip_language_model,
    tower_segment,
)
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.st import rewrite
from adapterdoc.st.atomic import (
    TEMP_PREFIX,
    atomic_write_bytes,
    check_output_folder,
    folder_lock,
    make_temp_folder,
    move_aside,
    read_only,
    replace_folder,
    slow_point,
    target_mode,
)
from adapterdoc.st.header import Header, read_header

INFIX = ".language_model."
BIN_BACKUP = ADAPTER_BIN + ".bak"
"""What an ``adapter_model.bin`` is renamed to once ``adapter_model.safetensors`` has replaced it."""
MAPPING_SAMPLE = 1000
"""``to_dict`` lists at most this many renames (``mapping_total`` says how many there are)."""
_WILD = "\x00"
_INDEX = re.compile(r"\.\d+(?=\.)")


# ---------------------------------------------------------------------------------------------------------- report


@dataclass
class ConfigChange:
    """One adapter_config.json field the remap rewrites."""

    field: str
    old: Any
    new: Any
    how: str
    """``rules`` (the move's rules applied to the text), ``literal`` (the same textual rule on a regex),
    ``explicit`` (the exact module paths, because no textual rewrite selected the same modules),
    ``towers`` (exclusion of the target layout's towers added), ``class`` (``auto_mapping`` pointed at the target
    layout's class and module)."""


@dataclass
class RemapReport:
    """What a remap did (or, with ``dry_run``, would do)."""

    input: str
    mode: str
    """``vl``, ``to`` or ``rule``."""
    strategy: str
    """``in-place`` (header rewritten over the old one), ``copy`` (a new file written), ``none`` (nothing to rename)."""
    mapping: dict[str, str]
    """Every renamed key, old → new."""
    source_layout: str | None = None
    target_layout: str | None = None
    weights: str | None = None
    """The weights file read."""
    out: str | None = None
    dry_run: bool = False
    config_changes: list[ConfigChange] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    """Files written (or that would be, with ``dry_run``)."""
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    renamed: int = field(init=False)

    def __post_init__(self) -> None:
        self.renamed = len(self.mapping)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        sample = dict(list(self.mapping.items())[:MAPPING_SAMPLE])
        return {
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "input": self.input,
            "mode": self.mode,
            "renamed": self.renamed,
            "strategy": self.strategy,
            "mapping": sample,
            "mapping_total": self.renamed,
            "mapping_truncated": len(sample) < self.renamed,
            "source_layout": self.source_layout,
            "target_layout": self.target_layout,
            "weights": self.weights,
            "out": self.out,
            "dry_run": self.dry_run,
            "config_changes": [
                {"field": c.field, "old": c.old, "new": c.new, "how": c.how} for c in self.config_changes
            ],
            "written": self.written,
            "notes": self.notes,
        }


# ----------------------------------------------------------------------------------------------------------- rules


def parse_rule(text: str) -> Rule:
    """``'REGEX=>REPLACEMENT'`` → a :class:`Rule` (``re.sub`` syntax, first match only); ``ValueError`` if bad."""
    pattern, sep, replacement = text.partition("=>")
    if not sep:
        raise ValueError(f"{text!r} is not REGEX=>REPLACEMENT")
    if not pattern:
        raise ValueError(f"{text!r} has an empty REGEX")
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{text!r}: bad REGEX: {e}") from None
    try:
        compiled.sub(replacement, "", count=1)  # parses the template and its group references
    except (re.error, IndexError) as e:
        raise ValueError(f"{text!r}: bad REPLACEMENT: {e}") from None
    return Rule(pattern, replacement)


def _apply_rules(rules: Sequence[Rule], path: str) -> str:
    for rule in rules:
        path = rule.apply(path)
    return path


def _split(key: str, k: LoraKey) -> tuple[str, str, str]:
    """(wrapper, module path, suffix) of a tensor name, so ``wrapper + module + suffix == key``."""
    prefix = WRAPPER if k.wrapped else ""
    rest = key[len(prefix) :]
    if not rest.startswith(k.module):
        return prefix, rest, ""
    return prefix, k.module, rest[len(k.module) :]


@dataclass
class _Move:
    """How one remap renames keys and module paths."""

    mode: str
    key_fn: Callable[[str, LoraKey], str]
    path_fn: Callable[[str], str]
    """The same move on a module path without the wrapper (used for config entries)."""
    strips_infix: bool
    source: str | None = None
    target: str | None = None
    target_towers: tuple[str, ...] = ()


def _vl_move() -> _Move:
    return _Move("vl", lambda k, _: strip_language_model(k), strip_language_model, strips_infix=True)


def _layout_move(rules: Sequence[Rule], source: str, target: str) -> _Move:
    def key_fn(key: str, parsed: LoraKey) -> str:
        prefix, module, suffix = _split(key, parsed)
        return prefix + _apply_rules(rules, module) + suffix

    strips = any(r == STRIP_LANGUAGE_MODEL for r in rules)
    towers = get_layout(target).towers
    return _Move("to", key_fn, lambda p: _apply_rules(rules, p), strips, source, target, towers)


def _user_move(rules: Sequence[Rule]) -> _Move:
    def path_fn(path: str) -> str:
        new = _apply_rules(rules, WRAPPER + path)
        return new[len(WRAPPER) :] if new.startswith(WRAPPER) else path

    return _Move("rule", lambda k, _: _apply_rules(rules, k), path_fn, strips_infix=False)


# -------------------------------------------------------------------------------------------------------- planning


@dataclass
class _Plan:
    report: RemapReport
    ckpt: Checkpoint
    weights_path: str
    header: Header | None
    body: bytes | None
    config_path: str | None
    config_bytes: bytes | None
    blocker: str | None


def remap(
    spec: str | os.PathLike[str],
    *,
    vl: bool = False,
    to: str | None = None,
    source: str | None = None,
    rules: Iterable[str | Rule] = (),
    out: str | os.PathLike[str] | None = None,
    dry_run: bool = False,
    progress: bool = False,
) -> RemapReport:
    """Remap ``spec`` (adapter dir, .safetensors/.bin file or cached repo id); see the module docstring.

    ``source`` names the source layout for ``to`` when detection is ambiguous. ``out`` writes a complete new
    adapter folder and leaves the input untouched. ``dry_run`` plans and writes nothing. ``progress`` shows a
    progress bar on stderr for large copies. Raises an :class:`~adapterdoc.errors.AdapterdocError` (nothing
    written) when the input is unusable or the remap is refused.
    """
    user_rules = [r if isinstance(r, Rule) else parse_rule(r) for r in rules]
    modes = sum([bool(vl), to is not None, bool(user_rules)])
    if modes != 1:
        raise ValueError("choose exactly one of vl=True, to=LAYOUT or rules=[...]")
    if source is not None and to is None:
        raise ValueError("source= only goes with to=")
    if out is not None:
        out = os.path.expanduser(os.fspath(out))
    if dry_run or out is not None:
        plan = _plan(os.fspath(spec), vl=vl, to=to, source=source, user_rules=user_rules, out=out)
        plan.report.dry_run = dry_run
        if dry_run:
            plan.report.notes.append("dry run: nothing was written")
        else:
            _apply(plan, out=os.fspath(out) if out is not None else None, progress=progress)
        return plan.report
    folder = _writable_folder(os.fspath(spec))
    if folder is None:  # a repo id: planning finds its snapshot folder
        probe = _plan(os.fspath(spec), vl=vl, to=to, source=source, user_rules=user_rules, out=None)
        folder = os.path.dirname(os.path.abspath(probe.weights_path))
    # Writing in place: plan and write under the folder's lock, so that a second remap running at the same time
    # sees the first one's result (and finds nothing to do, or refuses) instead of interleaving with it.
    with folder_lock(folder):
        plan = _plan(os.fspath(spec), vl=vl, to=to, source=source, user_rules=user_rules, out=None)
        _apply(plan, out=None, progress=progress)
    return plan.report


def _writable_folder(spec: str) -> str | None:
    """The folder an in-place remap of ``spec`` writes into (locked while it does); ``None`` for a repo id."""
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        return os.path.abspath(path)
    if os.path.isfile(path):
        return os.path.dirname(os.path.abspath(path))
    return None


def _plan(
    spec: str,
    *,
    vl: bool,
    to: str | None,
    source: str | None,
    user_rules: list[Rule],
    out: str | os.PathLike[str] | None,
) -> _Plan:
    ckpt = _open(spec)
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
    modules = sorted({k.module for k in parsed if k.is_lora or k.role == "magnitude"})
    cfg = ckpt.adapter_config
    hint = cfg.layout_hints if cfg else None
    notes: list[str] = []

    if vl:
        move = _vl_move()
        detection = _detect(modules, hint)  # shown to the user only; --vl decides from the keys alone
        if detection.name in LAYOUTS:
            move.source = detection.name
            move.target = LAYOUTS[detection.name].text_counterpart
    elif to is not None:
        move = _resolve_layout_move(weights, modules, hint, to, source, notes)
    else:
        move = _user_move(user_rules)

    mapping = _mapping(weights, keys, parsed, move)
    report = RemapReport(
        input=spec,
        mode=move.mode,
        strategy="none",
        mapping=mapping,
        source_layout=move.source,
        target_layout=move.target,
        weights=weights,
        out=os.fspath(out) if out is not None else None,
        notes=notes,
    )
    plan = _Plan(report, ckpt, weights, None, None, None, None, None)
    if not mapping:
        if move.mode == "vl":
            notes.append(f"no key contains `{INFIX}`: the adapter is already in text form")
        else:
            notes.append("the rules rename no key")
        cfg_path = ckpt.adapter_config.path if ckpt.adapter_config else None
        if out is not None and cfg_path is not None:
            with open(cfg_path, "rb") as f:
                plan.config_path, plan.config_bytes = cfg_path, f.read()
        return plan

    new_parsed = _parse_new(mapping, dict(zip(keys, parsed)), move)
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
    module_map = _module_map(mapping, dict(zip(keys, parsed)), new_parsed)
    _plan_config(plan, move, module_map, parsed)
    report.findings = sort_findings(_tower_findings(weights, mapping, keys, parsed, new_parsed, move))
    if ckpt.weights_format == "bin":
        report.strategy = "copy"
        report.findings = sort_findings(
            [
                *report.findings,
                make(
                    "AD103",
                    f"weights are a pickle: written as {ADAPTER_WEIGHTS}; the .bin is kept as {BIN_BACKUP}"
                    if out is None
                    else f"weights are a pickle: written as {ADAPTER_WEIGHTS} in the output folder",
                    path=weights,
                ),
            ]
        )
        return plan
    header = ckpt.headers[0] if ckpt.headers else read_header(weights)
    body, n = rewrite.renamed_header(_raw_header(weights, header), mapping)
    assert n == len(mapping), (n, len(mapping))
    plan.header, plan.body = header, body
    plan.blocker = rewrite.in_place_blocker(weights, header, body)
    report.strategy = "copy" if (out is not None or plan.blocker) else "in-place"
    if plan.blocker and out is None:
        notes.append(f"copy instead of in-place: {plan.blocker}")
    return plan


def _open(spec: str) -> Checkpoint:
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


def _detect(modules: list[str], hint: str | list[str] | None) -> Detection:
    """Layout detection on the distinct module shapes (layer numbers folded to 0): same verdict, O(shapes)."""
    shapes = sorted({_INDEX.sub(".0", m) for m in modules})
    return detect_layout(shapes, hint)


def _resolve_layout_move(
    weights: str,
    modules: list[str],
    hint: str | list[str] | None,
    to: str,
    source: str | None,
    notes: list[str],
) -> _Move:
    if to not in LAYOUTS:
        raise UnsupportedInputError(to, f"unknown layout; known: {', '.join(LAYOUTS)}")
    detection = _detect(modules, hint)
    if source is None:
        if detection.name == "ambiguous":
            source = _settle_ambiguity(weights, modules, detection.candidates, to, notes)
        elif detection.name == "unknown":
            raise RefusedError(
                weights,
                f"the keys match no registry layout ({'; '.join(detection.evidence)}); "
                "pass --from LAYOUT or use --rule",
            )
        else:
            source = detection.name
    elif source not in LAYOUTS:
        raise UnsupportedInputError(source, f"unknown layout; known: {', '.join(LAYOUTS)}")
    elif detection.name != source:
        notes.append(f"--from {source} given; detection says {detection.name}")
    steps = remap_path(source, to)
    if steps is None:
        raise RefusedError(
            weights, f"the registry has no move from {source} to {to}; use --rule 'REGEX=>REPLACEMENT'"
        )
    if steps:
        notes.append("moves: " + " → ".join([source, *(s[0] for s in steps)]))
    rules = [r for _, rs in steps for r in rs]
    return _layout_move(rules, source, to)


def _settle_ambiguity(
    weights: str, modules: list[str], candidates: Sequence[str], to: str, notes: list[str]
) -> str:
    """Several layouts fit the keys: fine when only one of them moves to ``to``, or all move the same way."""
    moves: dict[str, list[str]] = {}
    for cand in candidates:
        steps = remap_path(cand, to)
        if steps is not None:
            rules = [r for _, rs in steps for r in rs]
            moves[cand] = [_apply_rules(rules, m) for m in modules]
    distinct = {tuple(v) for v in moves.values()}
    if len(distinct) == 1:
        chosen = next(iter(moves))
        notes.append(
            f"the keys fit {', '.join(candidates)} equally; {chosen} is used "
            + (
                "(the only one with a move to " + to + ")"
                if len(moves) == 1
                else "(all of them move the same way)"
            )
        )
        return chosen
    raise RefusedError(
        weights,
        f"cannot tell the source layout: {', '.join(candidates)} fit equally"
        + (f" and move to {to} differently" if moves else "")
        + "; pass --from LAYOUT",
    )


def _mapping(weights: str, keys: list[str], parsed: list[LoraKey], move: _Move) -> dict[str, str]:
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


def _parse_new(mapping: dict[str, str], old_parsed: dict[str, LoraKey], move: _Move) -> dict[str, LoraKey]:
    """The parsed new keys; for registry moves and --vl derived from the old parse (the move acts on the module)."""
    out: dict[str, LoraKey] = {}
    for old, new in mapping.items():
        info = old_parsed[old]
        cut = len(WRAPPER) * info.wrapped + len(info.module)
        if move.mode == "to" or (move.mode == "vl" and 0 <= old.find(INFIX) < cut):
            out[new] = LoraKey(new, info.wrapped, move.path_fn(info.module), info.role, info.adapter_name)
        else:
            out[new] = parse_key(new)
    return out


def _module_map(
    mapping: dict[str, str], old_parsed: dict[str, LoraKey], new_parsed: dict[str, LoraKey]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for old, new in mapping.items():
        a, b = old_parsed[old], new_parsed[new]
        out.setdefault(a.module, b.module)
        out.setdefault(fused_expert_owner(a.module), fused_expert_owner(b.module))
    return out


def _tower_findings(
    weights: str,
    mapping: dict[str, str],
    keys: list[str],
    parsed: list[LoraKey],
    new_parsed: dict[str, LoraKey],
    move: _Move,
) -> list[Finding]:
    """LoRA left on a tower the target model does not have (always the case for --vl: text models have none)."""
    if move.mode == "rule":
        return []
    keep = set(move.target_towers)
    towers: dict[str, list[str]] = {}
    for key, info in zip(keys, parsed):
        k = new_parsed[mapping[key]] if key in mapping else info
        if not k.is_lora:
            continue
        seg = tower_segment(k.module)
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


def _raw_header(path: str, header: Header) -> bytes:
    with open(path, "rb") as f:
        f.seek(8)
        raw = f.read(header.header_len)
    if len(raw) != header.header_len:
        raise UnsupportedInputError(path, "the file changed while it was read")
    return raw


# ------------------------------------------------------------------------------------------------- config rewrite


def _plan_config(plan: _Plan, move: _Move, module_map: dict[str, str], parsed: list[Any]) -> None:
    """Plan the new adapter_config.json bytes (``None`` when unchanged and no --out)."""
    cfg = plan.ckpt.adapter_config
    if cfg is None or cfg.path is None:
        return
    plan.config_path = cfg.path
    with open(cfg.path, "rb") as f:
        original = f.read()
    raw = json.loads(original.decode("utf-8"))
    if not isinstance(raw, dict):
        return
    lora_pairs, full_pairs = _pairs(parsed, module_map)
    changes = _ConfigRewriter(move, module_map, lora_pairs, full_pairs).rewrite(raw)
    if module_map:
        changes += _auto_mapping_change(plan.report, raw, move, lora_pairs)
    if not changes:
        if plan.report.out is not None:
            plan.config_bytes = original
        return
    plan.report.config_changes = changes
    plan.config_bytes = _dump_like(raw, original)


def _auto_mapping_change(
    report: RemapReport, raw: dict[str, Any], move: _Move, lora_pairs: list[tuple[str, str]]
) -> list[ConfigChange]:
    """PEFT's ``auto_mapping`` names the class the adapter was made for (``AutoPeftModel`` builds it from
    ``parent_library``): point it at the target layout's class when it names the source layout's, from the
    registry. A class the registry does not know is kept, with a note."""
    auto = raw.get("auto_mapping")
    if not isinstance(auto, dict) or not isinstance(auto.get("base_model_class"), str):
        return []
    source, target = move.source, move.target
    if move.mode == "rule" or source is None:
        source, target = _rule_layouts(auto["base_model_class"], lora_pairs)
    if source not in LAYOUTS or target not in LAYOUTS:
        return []
    src, dst = LAYOUTS[source], LAYOUTS[target]
    cls = auto["base_model_class"]
    if cls == dst.model_class:
        return []
    if cls != src.model_class:
        report.notes.append(
            f"adapter_config.json auto_mapping names {cls}, which is not {source}'s class (kept): "
            f"AutoPeftModel.from_pretrained would build that class; load the {dst.model_class} base yourself "
            "and use PeftModel.from_pretrained"
        )
        return []
    old = dict(auto)
    auto["base_model_class"] = dst.model_class
    if "parent_library" in auto:  # PEFT writes both; a hand-made mapping without it keeps its shape
        auto["parent_library"] = dst.model_module
    return [ConfigChange("auto_mapping", old, dict(auto), "class")]


def _rule_layouts(cls: str, lora_pairs: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    """For ``--rule`` (and an undetected ``--vl``): the source layout from the old module paths (the class
    breaks ties), the target from the new ones; a target must be reachable from the source in the registry
    (ties go to the source's family)."""
    before = _detect([m for m, _ in lora_pairs], [cls])
    if before.name not in LAYOUTS:
        return None, None
    after = _detect([n for _, n in lora_pairs], None)
    cands = [after.name] if after.name in LAYOUTS else list(after.candidates)
    if before.name in cands:  # the new names still fit the source layout: the class stays
        return before.name, None
    cands = [c for c in cands if remap_path(before.name, c) is not None]
    family = [c for c in cands if LAYOUTS[c].family == LAYOUTS[before.name].family]
    cands = family or cands
    if len({LAYOUTS[c].model_class for c in cands}) != 1:
        return before.name, None
    return before.name, cands[0]


def _pairs(
    parsed: list[LoraKey], module_map: dict[str, str]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(old, new) module pairs: LoRA targets (fused-expert wrappers collapsed) and whole-weight modules."""
    lora: dict[str, str] = {}
    full: dict[str, str] = {}
    for k in parsed:
        if k.role == "full":
            full.setdefault(k.module, module_map.get(k.module, k.module))
        elif k.is_lora and k.module not in lora:
            m = fused_expert_owner(k.module)
            lora.setdefault(m, module_map.get(m, m))
    return sorted(lora.items()), sorted(full.items())


def _dump_like(raw: dict[str, Any], original: bytes) -> bytes:
    """Serialise ``raw`` the way ``original`` was written (indent, ASCII escapes, final newline)."""
    text = original.decode("utf-8")
    lines = text.splitlines()
    indent: int | None = None
    if len(lines) > 1:
        second = lines[1]
        indent = len(second) - len(second.lstrip(" ")) or None
    ascii_only = text.isascii()
    out = json.dumps(raw, indent=indent, ensure_ascii=ascii_only)
    if text.endswith("\n"):
        out += "\n"
    return out.encode("utf-8")


def _to_view(rx: str) -> str:
    """A regex seen as a module path: ``\\.`` becomes ``.``, a bare ``.`` (any char) a placeholder."""
    out: list[str] = []
    i = 0
    while i < len(rx):
        c = rx[i]
        if c == "\\" and i + 1 < len(rx):
            out.append("." if rx[i + 1] == "." else rx[i : i + 2])
            i += 2
            continue
        out.append(_WILD if c == "." else c)
        i += 1
    return "".join(out)


def _from_view(view: str) -> str:
    return view.replace(".", "\\.").replace(_WILD, ".")


def _fullmatch(rx: str, s: str) -> bool:
    try:
        return re.fullmatch(rx, s) is not None
    except re.error:
        return False


def _list_match(entries: Sequence[str], module: str) -> bool:
    return module in entries or any(module.endswith(f".{e}") for e in entries)


def _mts_match(entries: Sequence[str], module: str) -> bool:
    """PEFT's modules_to_save rule."""
    for m in entries:
        try:
            if re.match(rf"(^|.*\.){m}($|\..*)", module):
                return True
        except re.error:
            continue
    return False


def _pattern_value(patterns: dict[str, Any], module: str) -> tuple[bool, Any]:
    """PEFT's rank/alpha pattern lookup: the first key matching ``(.*\\.)?(KEY)$`` wins."""
    for key, value in patterns.items():
        try:
            if re.match(rf"(.*\.)?({key})$", module):
                return True, value
        except re.error:
            continue
    return False, None


class _ConfigRewriter:
    """Rewrites every adapter_config.json field that carries module paths, verified against the file's modules."""

    def __init__(
        self,
        move: _Move,
        module_map: dict[str, str],
        lora_pairs: list[tuple[str, str]],
        full_pairs: list[tuple[str, str]],
    ) -> None:
        self.move = move
        self.module_map = module_map
        self.lora_pairs = lora_pairs
        self.full_pairs = full_pairs

    def rewrite(self, raw: dict[str, Any]) -> list[ConfigChange]:
        changes: list[ConfigChange] = []
        for name, fn in (
            ("target_modules", self._target_modules),
            ("exclude_modules", self._exclude_modules),
            ("modules_to_save", self._modules_to_save),
            ("rank_pattern", self._patterns),
            ("alpha_pattern", self._patterns),
            ("target_parameters", self._target_parameters),
        ):
            if name not in raw or raw[name] in (None, "", [], {}):
                continue
            new, how = fn(raw[name])
            if new != raw[name]:
                changes.append(ConfigChange(name, raw[name], new, how))
                raw[name] = new
        tower = self._tower_exclusion(raw.get("exclude_modules"))
        if tower is not None:
            changes.append(ConfigChange("exclude_modules", raw.get("exclude_modules"), tower, "towers"))
            raw["exclude_modules"] = tower
        return changes

    # text transforms -------------------------------------------------------------------------------------

    def _regex_candidates(self, rx: str) -> list[tuple[str, str]]:
        cands = [(rx, "unchanged"), (_from_view(self.move.path_fn(_to_view(rx))), "rules")]
        if self.move.strips_infix:
            cands.append((re.sub(r"language_model\\?\.", "", rx, count=1), "literal"))
        return cands

    def _path_entry(self, entry: str) -> str:
        if entry in self.module_map:
            return self.module_map[entry]
        return self.move.path_fn(entry)

    # fields ----------------------------------------------------------------------------------------------

    def _target_modules(self, value: Any) -> tuple[Any, str]:
        pairs = self.lora_pairs
        if isinstance(value, str):
            if value == "all-linear":
                return value, "unchanged"

            def ok(rx: str) -> bool:
                return all(_fullmatch(value, m) == _fullmatch(rx, n) for m, n in pairs)

            for cand, how in self._regex_candidates(value):
                if ok(cand):
                    return cand, how
            hit = [n for m, n in pairs if _fullmatch(value, m)]
            return (
                ("(?:" + "|".join(re.escape(n) for n in hit) + ")", "explicit")
                if hit
                else (value, "unchanged")
            )
        return self._list_field(value, pairs, _list_match)

    def _list_field(
        self, value: list[Any], pairs: list[tuple[str, str]], match: Callable[[Sequence[str], str], bool]
    ) -> tuple[Any, str]:
        entries = [e for e in value if isinstance(e, str)]
        if len(entries) != len(value):
            return value, "unchanged"

        def ok(cand: list[str]) -> bool:
            return all(match(entries, m) == match(cand, n) for m, n in pairs)

        moved = [e if "." not in e else self._path_entry(e) for e in entries]
        for cand, how in ((entries, "unchanged"), (moved, "rules")):
            if ok(cand):
                return cand, how
        leaves = [e for e in entries if "." not in e]
        explicit = list(leaves)
        for m, n in pairs:
            if match(entries, m) and not match(leaves, n) and n not in explicit:
                explicit.append(n)
        return explicit, "explicit"

    def _exclude_modules(self, value: Any) -> tuple[Any, str]:
        pairs = self.lora_pairs
        if isinstance(value, str):

            def ok(rx: str) -> bool:
                return all(_fullmatch(value, m) == _fullmatch(rx, n) for m, n in pairs)

            for cand, how in self._regex_candidates(value):
                if ok(cand):
                    return cand, how
            cand = self._regex_candidates(value)[1][0]
            keep = [re.escape(n) for m, n in pairs if not _fullmatch(value, m)]
            return f"(?!(?:{'|'.join(keep)})$)(?:{cand})", "explicit"
        return self._list_field(value, pairs, _list_match)

    def _modules_to_save(self, value: Any) -> tuple[Any, str]:
        if not isinstance(value, list):
            return value, "unchanged"
        return self._list_field(value, self.full_pairs, _mts_match)

    def _patterns(self, value: Any) -> tuple[Any, str]:
        if not isinstance(value, dict):
            return value, "unchanged"
        pairs = self.lora_pairs

        def ok(cand: dict[str, Any]) -> bool:
            return all(_pattern_value(value, m) == _pattern_value(cand, n) for m, n in pairs)

        moved: dict[str, Any] = {}
        for key, v in value.items():
            new_key = self.module_map.get(key) or _from_view(self.move.path_fn(_to_view(key)))
            if new_key in moved:
                break
            moved[new_key] = v
        for cand, how in ((value, "unchanged"), (moved, "rules")):
            if len(cand) == len(value) and ok(cand):
                return cand, how
        explicit: dict[str, Any] = {}
        for m, n in pairs:
            found, v = _pattern_value(value, m)
            if found:
                explicit[n] = v
        return explicit, "explicit"

    def _target_parameters(self, value: Any) -> tuple[Any, str]:
        if not isinstance(value, list) or not all(isinstance(e, str) for e in value):
            return value, "unchanged"
        out = []
        for e in value:
            owner, _, param = e.rpartition(".")
            if owner and owner in self.module_map:
                out.append(f"{self.module_map[owner]}.{param}")
            else:
                out.append(e)
        return out, "rules"

    def _tower_exclusion(self, current: Any) -> str | None:
        """When moving onto a layout with towers, exclude the towers the adapter has no LoRA on."""
        towers = self.move.target_towers
        if not towers:
            return None
        hit = {seg for _, n in self.lora_pairs for seg in n.split(".")}
        segments = tuple(t for t in towers if t not in hit)
        if not segments:
            return None
        tower_rx = exclusion_regex(segments)
        if current in (None, "", []):
            return tower_rx
        if isinstance(current, str):
            probes = ("{}.x", "model.{}.x", "thinker.model.{}.x")
            if all(any(_fullmatch(current, p.format(seg)) for p in probes) for seg in segments):
                return None
            return f"(?:{current})|{tower_rx}"
        if isinstance(current, list) and all(isinstance(e, str) for e in current):
            listed = "|".join(re.escape(e) for e in current)
            return f"(?:(?:.*\\.)?(?:{listed}))|{tower_rx}"
        return None


# ----------------------------------------------------------------------------------------------------------- apply


def _apply(plan: _Plan, *, out: str | None, progress: bool) -> None:
    report = plan.report
    if out is not None:
        _write_out(plan, out, progress=progress)
        return
    if report.strategy == "none":
        return
    weights = plan.weights_path
    bin_input = plan.ckpt.weights_format == "bin"
    # refuse before writing anything
    if bin_input:
        _check_bin(plan)
    else:
        rewrite.check_writable(weights, in_place=report.strategy == "in-place")
    if plan.config_bytes is not None and plan.config_path is not None:
        _check_config_writable(plan.config_path)
    # config first: if we are killed between the two writes, running the same command again finishes the job
    if plan.config_bytes is not None and plan.config_path is not None:
        _note_link(report, plan.config_path)
        atomic_write_bytes(plan.config_path, plan.config_bytes, link="replace")
        report.written.append(plan.config_path)
    if bin_input:
        _write_bin_as_safetensors(plan, os.path.dirname(weights), progress=progress)
        return
    assert plan.header is not None and plan.body is not None
    if report.strategy == "in-place":
        rewrite.rewrite_in_place(weights, plan.header, plan.body)
    else:
        _note_link(report, weights)
        rewrite.rewrite_copy(weights, weights, plan.header, plan.body, progress=progress, link="replace")
    report.written.append(weights)


def _note_link(report: RemapReport, path: str) -> None:
    if os.path.islink(path):
        report.notes.append(
            f"{path} was a symlink to {os.path.realpath(path)}: the link was replaced by a regular file, "
            "the file it pointed to (a shared cache blob) is unchanged"
        )


def _check_config_writable(path: str) -> None:
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode) and read_only(path, st):
        raise RefusedError(
            path, f"is read-only (mode {stat.S_IMODE(st.st_mode):04o}); make it writable or use --out DIR"
        )
    _check_folder(os.path.dirname(os.path.abspath(path)))


def _check_folder(folder: str) -> None:
    if read_only(folder):
        raise RefusedError(folder, "folder is not writable; use --out DIR")


def _check_bin(plan: _Plan) -> None:
    weights = plan.weights_path
    folder = os.path.dirname(os.path.abspath(weights))
    st = os.lstat(weights)
    if stat.S_ISREG(st.st_mode) and read_only(weights, st):
        raise RefusedError(
            weights, f"is read-only (mode {stat.S_IMODE(st.st_mode):04o}); make it writable or use --out DIR"
        )
    _check_folder(folder)
    for name in (ADAPTER_WEIGHTS, BIN_BACKUP):
        p = os.path.join(folder, name)
        if os.path.lexists(p) and plan.ckpt.kind == "adapter":
            raise RefusedError(p, "already exists; converting the .bin would overwrite it (use --out DIR)")


def _bin_target(plan: _Plan, folder: str) -> str:
    if plan.ckpt.kind == "adapter":
        return os.path.join(folder, ADAPTER_WEIGHTS)
    stem = os.path.splitext(os.path.basename(plan.weights_path))[0]
    return os.path.join(folder, stem + ".safetensors")


def _bin_bytes(plan: _Plan) -> bytes:
    """The .bin's tensors, renamed, as safetensors bytes with PEFT's metadata."""
    from safetensors.torch import save

    state = load_bin(plan.weights_path)
    renamed = {plan.report.mapping.get(k, k): v.detach().contiguous().clone() for k, v in state.items()}
    return save(renamed, metadata={"format": "pt"})


def _write_bin_as_safetensors(plan: _Plan, folder: str, *, progress: bool) -> None:
    target = _bin_target(plan, folder)
    if os.path.lexists(target):
        raise RefusedError(target, "already exists; converting the .bin would overwrite it (use --out DIR)")
    atomic_write_bytes(target, _bin_bytes(plan), mode=target_mode(plan.weights_path))
    plan.report.written.append(target)
    if plan.ckpt.kind == "adapter":
        backup = os.path.join(folder, BIN_BACKUP)
        slow_point("before-bin-backup")
        move_aside(plan.weights_path, backup)
        plan.report.written.append(backup)
        plan.report.notes.append(
            f"{plan.weights_path} renamed to {backup} (the old keys; delete it when done)"
        )


def _write_out(plan: _Plan, out: str, *, progress: bool) -> None:
    """A complete new adapter folder at ``out``, built in a temp folder beside it and renamed into place."""
    report = plan.report
    source_dir = os.path.realpath(
        plan.ckpt.root if os.path.isdir(plan.ckpt.root) else os.path.dirname(plan.weights_path)
    )
    target = os.path.realpath(out)
    if target == source_dir or target.startswith(source_dir + os.sep):
        raise RefusedError(out, "is inside the input adapter folder; choose a folder outside it")
    parent = os.path.dirname(os.path.abspath(out)) or "."
    if not os.path.isdir(parent):
        raise InputNotFoundError(parent, "the parent folder of --out does not exist")
    check_output_folder(out)  # a new or empty folder only (remap has no --force)
    tmp = make_temp_folder(out)
    try:
        written = _fill_out(plan, tmp, progress=progress)
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report.written = [os.path.join(out, w) for w in written]


def _fill_out(plan: _Plan, tmp: str, *, progress: bool) -> list[str]:
    report = plan.report
    ckpt = plan.ckpt
    written: list[str] = []
    weights_name = os.path.basename(plan.weights_path)
    skip = {weights_name, ADAPTER_CONFIG}
    if ckpt.kind == "adapter":
        skip |= {ADAPTER_WEIGHTS, ADAPTER_BIN}
        for name in sorted(os.listdir(ckpt.root)):
            src = os.path.join(ckpt.root, name)
            if name in skip or name.startswith(TEMP_PREFIX):
                continue
            if os.path.isdir(src):
                report.notes.append(f"subfolder {name}/ not copied to --out")
                continue
            if not os.path.isfile(src):
                continue
            shutil.copyfile(src, os.path.join(tmp, name))
            shutil.copymode(src, os.path.join(tmp, name))
            written.append(name)
    if plan.config_path is not None and plan.config_bytes is not None:
        with open(os.path.join(tmp, ADAPTER_CONFIG), "wb") as f:
            f.write(plan.config_bytes)
        written.append(ADAPTER_CONFIG)
    if ckpt.weights_format == "bin":
        target = os.path.basename(_bin_target(plan, tmp))
        data = _bin_bytes(plan)
        dest = os.path.join(tmp, target)
        with open(dest, "wb") as f:
            f.write(data)
        os.chmod(dest, target_mode(plan.weights_path))
        written.append(target)
        return written
    header = plan.header or read_header(plan.weights_path)
    body = plan.body
    if body is None:
        body = _raw_header(plan.weights_path, header).rstrip(b" \t\n\r")
    dest = os.path.join(tmp, weights_name)
    # a new file gets a fresh header padded the way safetensors pads (not the old, possibly padded, length): so a
    # move that had to grow the header (a copy) and its inverse written with --out give back the original bytes
    rewrite.rewrite_copy(plan.weights_path, dest, header, body, keep_length=False, progress=progress)
    written.append(weights_name)
    return written
