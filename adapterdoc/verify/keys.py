"""Key findings: the adapter's keys against the expected ones (missing, unexpected, shape), the layout move that
explains a mismatch (:mod:`adapterdoc.layouts.moves`) and modules the config leaves untargeted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from adapterdoc.adapter import AdapterConfig, LoraKey, fused_expert_owner, parse_key
from adapterdoc.checkpoint import Checkpoint
from adapterdoc.layouts.moves import best_move, candidate_moves
from adapterdoc.ml.meta import ExpectedModel, KeyMatch
from adapterdoc.report.findings import Finding, make
from adapterdoc.report.verify_report import VerifySubject
from adapterdoc.verify.common import MAX_LISTED


@dataclass(frozen=True)
class KeyCheck:
    """The key findings and the layout move that explains a mismatch (the report's ``move``), if one does."""

    findings: tuple[Finding, ...]
    move: Mapping[str, object] | None = None


def check_keys(
    subject: VerifySubject,
    ckpt: Checkpoint,
    keys: list[LoraKey],
    meta: ExpectedModel,
    km: KeyMatch,
    acfg: AdapterConfig,
) -> KeyCheck:
    """The adapter's keys (matched: ``km``) against the expected model ``meta``."""
    spec = subject.adapter
    out: list[Finding] = expert_key_findings(spec, ckpt, meta, km, acfg)
    if meta.inject_error:
        out.append(
            make(
                "AD226",
                f"PEFT refuses to inject the config into {meta.model_class}: {meta.inject_error}",
                path=spec,
            )
        )
        return KeyCheck(
            tuple(out)
        )  # nothing is expected, so every key "mismatches": the refusal is the one finding
    move = None
    fix = meta.fix  # keys checked as an engine names them: its remap --for is the fix
    if (km.unexpected or km.missing) and not fix:
        current = (len(km.unexpected), len(km.missing))

        def score(renamed: list[str]) -> tuple[int, int]:
            m = meta.match({new: tuple(ckpt.tensors[old].shape) for old, new in zip(names, renamed)})
            return len(m.unexpected), len(m.missing)

        names = list(ckpt.tensors)
        preferred = [subject.layout, *subject.layout_candidates]
        move = best_move(
            candidate_moves(preferred, keys), names, score, current, target=meta.layout, sources=preferred
        )
    hint = fix or (move.command(spec, subject.layout) if move else None)
    if move:
        n = len(km.unexpected) or len(km.missing)
        out.append(
            make(
                "AD223",
                f"{move.describe()}; the {n} mismatched key(s) all match {meta.model_class} after the move",
                path=spec,
                hint=hint,
            )
        )
    if km.missing:
        out.append(
            make(
                "AD220",
                f"{len(km.missing)} LoRA key(s) that PEFT creates on {meta.model_class} are not in the adapter "
                "(they stay at their zero initialisation)",
                path=spec,
                key=km.missing[0],
                hint=hint,
            )
        )
    if km.unexpected:
        out.append(
            make(
                "AD221",
                f"{len(km.unexpected)} adapter key(s) match nothing on {meta.model_class} and would be dropped "
                "without a warning",
                path=spec,
                key=km.unexpected[0],
                hint=hint,
            )
        )
        if not move:
            out += _untargeted(spec, km.unexpected, meta, acfg)
    for k, got, want in km.shape_mismatch[:MAX_LISTED]:
        why = ""
        if len(got) < len(want) or 0 in got:
            why = " (a 1-D or empty LoRA tensor: ZeRO-3/FSDP shards saved without gathering them first)"
        out.append(
            make(
                "AD222",
                f"shape {list(got)} in the adapter, PEFT builds {list(want)} on {meta.model_class}{why}",
                path=spec,
                key=k,
            )
        )
    return KeyCheck(tuple(out), move.to_dict(spec, subject.layout) if move else None)


def fused_base(meta: ExpectedModel) -> bool:
    """Whether the base model (as PEFT builds it) holds fused 3-D experts (transformers 5): an ``experts`` module
    with no per-expert children."""
    mods = meta.base_modules
    experts = [m for m in mods if m.endswith(".experts")]
    return bool(experts) and not any(".experts.0." in m or m.endswith(".experts.0") for m in mods)


def expert_key_findings(
    spec: str, ckpt: Checkpoint, meta: ExpectedModel, km: KeyMatch, acfg: AdapterConfig
) -> list[Finding]:
    """What PEFT does with the adapter's expert layout on this base: AD241 as an error when one half of gate/up
    is targeted and the base fuses them (PEFT's conversion refuses it), AD243 when PEFT converts a per-expert
    adapter to its fused layout at load (``convert_peft_adapter_state_dict_for_transformers``)."""
    from adapterdoc.adapter.expert_picture import expert_picture
    from adapterdoc.facts import expert_findings

    pic = expert_picture({k: t.shape for k, t in ckpt.tensors.items()}, config=acfg)
    if not pic.routed:
        return []
    fused = fused_base(meta)
    out: list[Finding] = []
    if pic.one_sided and fused:
        out += [f for f in expert_findings(pic, spec, spec=spec, fused_base=True) if f.code == "AD241"]
    if km.converted and pic.layout == "per-expert" and _peft_fuses(meta):
        after = meta.config_after.get("rank_pattern")
        ranks = ", ".join(f"{k}: {v}" for k, v in after.items()) if isinstance(after, Mapping) else ""
        n = sum(1 for k in pic.routed for x in k.keys if x.role == "lora_A")
        out.append(
            make(
                "AD243",
                f"PEFT converts {n} per-expert LoRA module(s) in {len(pic.routed)} MoE block(s) to its fused "
                f"layout on {meta.model_class} at load (convert_peft_adapter_state_dict_for_transformers)"
                + (f"; rank_pattern {{{ranks}}}" if ranks else ""),
                path=spec,
            )
        )
    return out


def _peft_fuses(meta: ExpectedModel) -> bool:
    """Whether PEFT's injection rewrote the adapter config to fused ``target_parameters`` (its per-expert → fused
    conversion, which PEFT 0.21 has only for some model types: none for Qwen3.5-MoE, whose per-expert keys it then
    drops, AD221)."""

    def fused(cfg: Mapping[str, object]) -> bool:
        targets = cfg.get("target_parameters")
        return isinstance(targets, (list, tuple, set)) and any(
            str(t).endswith("gate_up_proj") for t in targets
        )

    return meta.inject_error is None and fused(meta.config_after) and not fused(meta.config_before)


def _untargeted(spec: str, unexpected: list[str], meta: ExpectedModel, acfg: AdapterConfig) -> list[Finding]:
    """Unexpected keys on modules that exist in the base: the adapter's own config excludes them or does not
    target them, so PEFT never puts LoRA there."""
    modules = set(meta.base_modules)
    targets = meta.config_after.get("target_modules")
    out: list[Finding] = []
    seen: set[str] = set()
    for key in unexpected:
        k = parse_key(key)
        if not k.is_lora:
            continue
        owner = fused_expert_owner(k.module)
        if owner not in modules or owner in seen:
            continue
        seen.add(owner)
        if len(seen) > MAX_LISTED:
            break
        if acfg.exclude_modules and not acfg.targets(owner) and _excluded(acfg, owner):
            why = f"the config's exclude_modules excludes it ({acfg.exclude_modules!r})"
        else:
            why = f"no target_modules entry selects it (target_modules: {targets})"
        out.append(make("AD224", f"the module exists on the base but {why}", path=spec, key=owner))
    return out


def _excluded(acfg: AdapterConfig, module: str) -> bool:
    """Whether ``exclude_modules`` alone is what keeps ``module`` out."""
    without = AdapterConfig({**acfg.raw, "exclude_modules": None}, acfg.path)
    return without.targets(module)
