"""Planning a merge from headers and a meta-device model: place every adapter module on the on-disk tensors its
update lands in (see :mod:`adapterdoc.ml.names`), in PEFT's order (whole weights, LoRA modules, trainable tokens),
split tied tensors the adapter changes differently, and lay out the output shards. Nothing is read or written."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from adapterdoc.adapter import WRAPPER, parse_key
from adapterdoc.checkpoint import Checkpoint, safe_shard_name
from adapterdoc.merge.checks import check_shapes, group_keys, lora_edits, merge_blocker, unused_hint
from adapterdoc.merge.edits import META_MODEL, Edit, Output, Plan
from adapterdoc.report.findings import Finding, make
from adapterdoc.st.dtypes import CAST_DTYPES, FLOAT_DTYPES
from adapterdoc.st.header import Header

if TYPE_CHECKING:
    from adapterdoc.adapter import LoraKey
    from adapterdoc.merge.fuse_experts import ExpertConversion
    from adapterdoc.ml.inject import Injection
    from adapterdoc.ml.names import NameMap, Piece


def make_plan(adapter: Checkpoint, base: Checkpoint, dtype: str) -> Plan:
    """Place ``adapter`` on ``base`` (PEFT's order: whole weights, LoRA modules, trainable tokens), then lay out the
    output tensors of every shard in ``dtype``."""
    from adapterdoc.bases import BaseSpec
    from adapterdoc.merge.fuse_experts import convert_experts, refused_finding
    from adapterdoc.ml import names
    from adapterdoc.ml.build import build_meta_model, folder_config
    from adapterdoc.ml.inject import inventory, lora_config_from_raw

    config = folder_config(base.root, "merge needs it to map adapter names to checkpoint names")
    model = build_meta_model(BaseSpec(base.root, "dir", root=base.root), config)
    name_map = names.build_name_map(model, {n: t.shape for n, t in base.tensors.items()})
    assert adapter.adapter_config is not None
    inv = inventory(model, adapter.adapter_config, adapter.spec)
    if inv.error is not None:
        return _refused(adapter, base, name_map.model_class, refused_finding(inv.error, adapter.spec))
    groups, full, tokens, strays = group_keys(adapter)
    raw_config = lora_config_from_raw(adapter.adapter_config.raw, adapter.spec)
    experts = convert_experts(groups, adapter, name_map, inv, raw_config)
    placer = _Placer(adapter, name_map, inv, experts)
    placer.findings.extend(experts.findings)
    placer.unused.extend(experts.unused)
    placer.whole_weights(full)
    placer.lora_modules(groups)
    placer.trainable_tokens(tokens)
    for key in strays:
        placer.fail_unused(parse_key(key).module, "is a tensor kind merge does not know", key)
    if placer.unused:
        hint = unused_hint(placer.unused, inv.targets, model, adapter.spec, base.spec)
        placer.findings[:] = [
            replace(f, hint=hint) if f.code == "AD501" and f.hint is None else f for f in placer.findings
        ]
    by_disk_edits, pieces, added = placer.per_disk_tensor(names.Piece)
    return finish_plan(
        adapter,
        base,
        dtype,
        by_disk_edits,
        pieces,
        applied=placer.applied,
        model_class=name_map.model_class,
        planner=META_MODEL,
        findings=placer.findings,
        unused=placer.unused,
        member_edits=placer.member_edits,
        added=added,
        experts=experts,
    )


def finish_plan(
    adapter: Checkpoint,
    base: Checkpoint,
    dtype: str,
    by_disk_edits: dict[str, list[Edit]],
    pieces: Mapping[str, Piece],
    *,
    applied: list[str],
    model_class: str,
    planner: str,
    findings: list[Finding] | None = None,
    unused: list[str] | None = None,
    member_edits: dict[str, list[Edit]] | None = None,
    added: dict[str, tuple[str, str]] | None = None,
    experts: ExpertConversion | None = None,
) -> Plan:
    """The plan both planners end with: the edits per on-disk tensor checked (floating point only) and laid out
    in the output shards, in ``dtype``."""
    findings = list(findings or [])
    added = added or {}
    _check_float(base, by_disk_edits, findings)
    return Plan(
        base=base,
        adapter=adapter,
        shards=_shards(base, dtype, by_disk_edits, member_edits or {}, added),
        applied=applied,
        unused=list(unused or []),
        findings=findings,
        pieces=dict(pieces),
        untie=bool(added),
        model_class=model_class,
        added=list(added),
        experts=experts,
        planner=planner,
    )


def _refused(adapter: Checkpoint, base: Checkpoint, model_class: str, finding: Finding) -> Plan:
    return Plan(base, adapter, [], [], [], [finding], {}, False, model_class)


class _Placer:
    """Places adapter tensors on the base's in-memory parameters, collecting findings as it goes."""

    def __init__(
        self, adapter: Checkpoint, name_map: NameMap, inv: Injection, experts: ExpertConversion
    ) -> None:
        self.adapter = adapter
        self.experts = experts
        self.name_map = name_map
        self.inv = inv
        self.findings: list[Finding] = []
        self.applied: list[str] = []
        self.unused: list[str] = []
        self.member_edits: dict[str, list[Edit]] = {}
        """In-memory parameter → its edits in order (tied parameters are separate members here)."""

    def _shape(self, key: str) -> tuple[int, ...]:
        conv = self.experts.converted.get(key)
        return conv.shape if conv is not None else tuple(self.adapter.tensors[key].shape)

    def add(self, param: str, edit: Edit, *, shared: bool = False) -> None:
        # ``shared``: the edit lands in the Parameter object itself (a weight loaded into a tied tensor);
        # otherwise only the module that owns ``param`` sees it (LoRA, a modules_to_save copy).
        for m in (param, *(self.name_map.tied.get(param, ()) if shared else ())):
            self.member_edits.setdefault(m, []).append(edit)

    def fail_unused(self, label: str, why: str, key: str | None = None) -> None:
        self.unused.append(label)
        self.findings.append(make("AD501", f"`{label}` {why}", key=key or label))

    def whole_weights(self, full: list[LoraKey]) -> None:
        """1. Whole weights first: PEFT loads them before it merges anything."""
        from adapterdoc.ml import names

        for lk in full:
            param = names.saved_weight_param(lk.module, lk.key.rpartition(".")[2])
            label = lk.key[len(WRAPPER) :] if lk.wrapped else lk.key
            if not lk.wrapped:
                self.fail_unused(
                    label, "lacks PEFT's `base_model.model.` prefix, so PEFT would not load it", lk.key
                )
                continue
            shape = tuple(self.adapter.tensors[lk.key].shape)
            if param not in self.name_map.param_shapes:
                self.fail_unused(label, "names no parameter of the base model", lk.key)
                continue
            if shape != tuple(self.name_map.param_shapes[param]):
                want = list(self.name_map.param_shapes[param])
                self.findings.append(
                    make(
                        "AD502",
                        f"saved weight `{label}` is {list(shape)}, the base `{param}` is {want}",
                        key=lk.key,
                    )
                )
                continue
            if self.name_map.resolve(param) is None:
                self.fail_unused(
                    label, f"targets `{param}`, which the base checkpoint does not store", lk.key
                )
                continue
            own_copy = any(lk.module == m or lk.module.endswith(f".{m}") for m in self.inv.modules_to_save)
            self.add(param, Edit("replace", label, {"value": lk.key}), shared=not own_copy)
            self.applied.append(label)

    def lora_modules(self, groups: dict[str, dict[str, str]]) -> None:
        """2. LoRA modules, in the order PEFT merges them (module order of the model)."""
        order = {m: i for i, m in enumerate(self.inv.targets)}
        for module in sorted(groups, key=lambda m: (order.get(m, len(order)), m)):
            keys = groups[module]
            target = self.inv.targets.get(module)
            if any(parse_key(k).adapter_name for k in keys.values()):
                self.fail_unused(
                    module, "has keys that still carry an adapter name (`lora_A.default.weight`)"
                )
                continue
            if not all(parse_key(k).wrapped for k in keys.values()):
                self.fail_unused(module, "lacks PEFT's `base_model.model.` prefix, so PEFT would not load it")
                continue
            if target is None and module in self.experts.unconverted:
                from adapterdoc.merge.fuse_experts import unconverted_finding

                self.unused.append(module)
                param = self.experts.unconverted[module]
                self.findings.append(unconverted_finding(module, param, self.adapter.spec))
                continue
            if target is None:
                self.fail_unused(module, "is not a module PEFT creates on this base for the adapter's config")
                continue
            sources = self.experts.sources.get(module)
            problem = check_shapes(self._shape, keys, target)
            if problem and sources:
                problem = f"{problem}, after PEFT's conversion of its {len(sources)} per-expert modules"
            if problem:
                self.findings.append(make("AD502", f"`{module}`: {problem}", key=module))
                continue
            new_edits = lora_edits(module, keys, target)
            resolved = self.name_map.resolve(target.param)
            if resolved is None:
                self.fail_unused(
                    module, f"updates `{target.param}`, which the base checkpoint does not store"
                )
                continue
            canonical, pieces = resolved
            blocker = merge_blocker(target, self.name_map, canonical, pieces, new_edits)
            bias_param = target.param.rpartition(".")[0] + ".bias"
            if blocker is None and target.lora_bias:
                res = self.name_map.resolve(bias_param)
                if res is None or len(res[1]) != 1 or not res[1][0].whole:
                    blocker = f"it has a LoRA bias but the base stores no single `{bias_param}`"
            if blocker:
                self.findings.append(make("AD503", f"`{module}`: {blocker}", key=module))
                continue
            for e in new_edits:
                self.add(bias_param if e.kind == "bias" else target.param, e)
            self.applied.extend(sources or [module])
        absent = [m for m in self.inv.targets if m not in groups]
        if absent:
            self.findings.append(
                make(
                    "AD505",
                    f"{len(absent)} module(s) PEFT creates for this config have no tensors in the adapter "
                    f"(e.g. `{absent[0]}`); they merge as no-ops",
                )
            )

    def trainable_tokens(self, tokens: dict[str, str]) -> None:
        """3. Trainable tokens: rows of the (shared) embedding matrix replaced."""
        for module, key in tokens.items():
            target = self.inv.tokens.get(module)
            if target is None or not parse_key(key).wrapped:
                self.fail_unused(
                    module, "holds trainable-token deltas for a module PEFT does not wrap on this base", key
                )
                continue
            shape = tuple(self.adapter.tensors[key].shape)
            if shape != target.a_shape:
                self.findings.append(
                    make(
                        "AD502",
                        f"`{module}`: token deltas are {list(shape)}, PEFT expects {list(target.a_shape)}",
                    )
                )
                continue
            resolved = self.name_map.resolve(target.param)
            if resolved is None:
                self.fail_unused(
                    module, f"updates `{target.param}`, which the base checkpoint does not store", key
                )
                continue
            if len(resolved[1]) != 1 or not resolved[1][0].whole:
                self.findings.append(
                    make("AD503", f"`{module}`: trainable tokens on a split tensor", key=module)
                )
                continue
            # the token layer swaps rows of the shared embedding matrix itself
            self.add(target.param, Edit("tokens", module, {"delta": key}, target), shared=True)
            self.applied.append(module)

    def per_disk_tensor(
        self, piece_cls: type[Piece]
    ) -> tuple[dict[str, list[Edit]], dict[str, Piece], dict[str, tuple[str, str]]]:
        """4. Edits per on-disk tensor; tied parameters that end up different get their own tensor.

        Returns (on-disk tensor → its edits, output tensor → its piece, untied new tensor → (its parameter, the
        on-disk tensor it copies))."""
        name_map, member_edits = self.name_map, self.member_edits
        by_disk_edits: dict[str, list[Edit]] = {}
        pieces_by_out: dict[str, Piece] = {}
        added: dict[str, tuple[str, str]] = {}
        for param, plist in name_map.by_param.items():
            mine = member_edits.get(param, [])
            for piece in plist:
                pieces_by_out[piece.disk] = piece
                if mine:
                    by_disk_edits[piece.disk] = mine
            for other in name_map.tied.get(param, ()):
                if name_map.by_param.get(other) or other in added:
                    continue  # stored on its own, or already split off
                theirs = member_edits.get(other, [])
                if [id(e) for e in theirs] == [id(e) for e in mine]:
                    continue
                partner = plist[0].disk
                added[other] = (other, partner)
                pieces_by_out[other] = piece_cls(other, other)
                self.findings.append(
                    make(
                        "AD504",
                        f"`{other}` and `{param}` share one matrix in the base, but the adapter changes them "
                        "differently; the merged checkpoint stores both (tie_word_embeddings set to false)",
                        key=other,
                    )
                )
        return by_disk_edits, pieces_by_out, added


def _check_float(base: Checkpoint, by_disk_edits: dict[str, list[Edit]], findings: list[Finding]) -> None:
    """A computed update lands only on floating-point weights (a replacement may land on any)."""
    for disk, e in by_disk_edits.items():
        info = base.tensors.get(disk)
        if info is not None and info.dtype not in FLOAT_DTYPES and any(x.kind != "replace" for x in e):
            findings.append(
                make(
                    "AD503", f"`{disk}` is {info.dtype}; merge only updates floating-point weights", key=disk
                )
            )


def _shards(
    base: Checkpoint,
    dtype: str,
    by_disk_edits: dict[str, list[Edit]],
    member_edits: dict[str, list[Edit]],
    added: dict[str, tuple[str, str]],
) -> list[tuple[str, Header, list[Output]]]:
    """Every base shard's output tensors in data order, an untied copy right after the tensor it copies."""
    after: dict[str, list[str]] = {}
    for new, (_param, partner) in added.items():
        after.setdefault(partner, []).append(new)
    shards: list[tuple[str, Header, list[Output]]] = []
    for header in base.headers:
        rel = relative_name(base, header.path)
        outs: list[Output] = []
        for info in sorted(header.tensors.values(), key=lambda t: (t.begin, t.end)):
            out_dtype = _out_dtype(info.dtype, dtype)
            outs.append(
                Output(info.name, out_dtype, info.shape, info, header.path, by_disk_edits.get(info.name, []))
            )
            for new in after.get(info.name, []):
                outs.append(Output(new, out_dtype, info.shape, info, header.path, member_edits.get(new, [])))
        shards.append((rel, header, outs))
    return shards


def relative_name(base: Checkpoint, shard_path: str) -> str:
    rel = os.path.relpath(shard_path, base.root)
    if base.index_path:
        safe_shard_name(base.index_path, rel)  # refuses ../ and absolute names
    return rel


def _out_dtype(st_dtype: str, dtype: str) -> str:
    if dtype == "auto" or st_dtype not in FLOAT_DTYPES:
        return st_dtype
    return CAST_DTYPES[dtype]
