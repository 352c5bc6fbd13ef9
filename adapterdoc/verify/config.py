"""Config findings: what PEFT makes of the adapter config on this base (rewrites, tower targets, patterns that match
nothing, the scaling), and the config inferred for a bare tensor file."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from adapterdoc.adapter import AdapterConfig, LoraKey, fused_expert_owner, module_name_matches
from adapterdoc.checkpoint import Checkpoint
from adapterdoc.layouts import tower_segment
from adapterdoc.ml.meta import ExpectedModel
from adapterdoc.report.findings import Finding, make


@dataclass(frozen=True)
class ConfigCheck:
    """The report's ``config`` summary and the config findings."""

    summary: Mapping[str, object]
    findings: tuple[Finding, ...]


def check_config(
    spec: str, acfg: AdapterConfig, meta: ExpectedModel, keys: list[LoraKey], inferred: bool
) -> ConfigCheck:
    """What PEFT makes of the adapter config on this base (``inferred``: made up for a bare tensor file)."""
    return ConfigCheck(config_summary(acfg, meta, inferred), tuple(config_findings(spec, acfg, meta, keys)))


def adapter_config(ckpt: Checkpoint, keys: list[LoraKey]) -> tuple[AdapterConfig, bool]:
    if ckpt.adapter_config is not None:
        return ckpt.adapter_config, False
    return AdapterConfig(infer_config(ckpt, keys), None), True


def infer_config(ckpt: Checkpoint, keys: list[LoraKey]) -> dict[str, object]:
    """A best-guess adapter_config for a bare tensor file: leaf names as targets, the most common rank."""
    leaves: set[str] = set()
    params: set[str] = set()
    ranks: Counter[int] = Counter()
    per_module: dict[str, int] = {}
    for k in keys:
        if not k.is_lora:
            continue
        owner = fused_expert_owner(k.module)
        if owner.endswith(".experts") or owner == "experts":
            params.update(("gate_up_proj", "down_proj"))
            continue
        leaves.add(k.module.rpartition(".")[2])
        if k.is_a:
            r = ckpt.tensors[k.key].shape[0] if ckpt.tensors[k.key].shape else 0
            ranks[r] += 1
            per_module[k.module] = r
    r = ranks.most_common(1)[0][0] if ranks else 8
    raw: dict[str, object] = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": r,
        "target_modules": sorted(leaves) or None,
        "rank_pattern": {re.escape(m): v for m, v in sorted(per_module.items()) if v != r},
    }
    if params:
        raw["target_parameters"] = sorted(params)
    return raw


def config_summary(acfg: AdapterConfig, meta: ExpectedModel, inferred: bool) -> dict[str, object]:
    scalings = sorted({acfg.scaling_for(m) for m in meta.injected_modules} or {acfg.scaling_for("")})
    return {
        "inferred": inferred,
        "r": acfg.r,
        "lora_alpha": acfg.lora_alpha,
        "use_rslora": acfg.use_rslora,
        "use_dora": acfg.use_dora,
        "scaling": scalings,
        "target_modules": meta.config_before.get("target_modules"),
        "target_parameters": meta.config_before.get("target_parameters"),
        "peft_rewrite": meta.config_after if meta.rewritten else None,
        "injected_modules": len(meta.injected_modules),
        "expected_keys": len(meta.expected),
        "model_class": meta.model_class,
    }


def config_findings(
    spec: str, acfg: AdapterConfig, meta: ExpectedModel, keys: list[LoraKey]
) -> list[Finding]:
    out: list[Finding] = []
    if meta.rewritten:
        changes = [
            f"{f}: {meta.config_before.get(f)} → {meta.config_after.get(f)}"
            for f in meta.config_after
            if meta.config_before.get(f) != meta.config_after.get(f)
        ]
        out.append(
            make("AD225", f"PEFT rewrites the config for {meta.model_type}: " + "; ".join(changes), path=spec)
        )
    towers = sorted(m for m in meta.injected_modules if tower_segment(m))
    if towers:
        segs = sorted({tower_segment(m) or "" for m in towers})
        out.append(
            make(
                "AD227",
                f"on {meta.model_class} the config's targets select {len(towers)} module(s) under "
                + ", ".join(f"`{s}`" for s in segs),
                path=spec,
                key=towers[0],
            )
        )
    names = list(meta.base_modules) + list(meta.injected_modules)
    names += [
        f"{m}.{p}"
        for m in meta.injected_modules
        if m.endswith("experts")
        for p in ("gate_up_proj", "down_proj")
    ]
    for fld, pattern in (("rank_pattern", acfg.rank_pattern), ("alpha_pattern", acfg.alpha_pattern)):
        for pat in pattern:
            if not any(module_name_matches(pat, n) for n in names):
                out.append(
                    make("AD228", f"{fld} key {pat!r} matches no module of {meta.model_class}", path=spec)
                )
    scalings = sorted({acfg.scaling_for(m) for m in meta.injected_modules} or {acfg.scaling_for("")})
    how = "lora_alpha / sqrt(r) (rsLoRA)" if acfg.use_rslora else "lora_alpha / r"
    vals = ", ".join(f"{s:g}" for s in scalings)
    out.append(
        make("AD229", f"scaling {how} = {vals} (r {acfg.r}, lora_alpha {acfg.lora_alpha:g})", path=spec)
    )
    if acfg.use_dora or any(k.role == "magnitude" for k in keys):
        out.append(make("AD230", "DoRA adapter (lora_magnitude_vector per module)", path=spec))
    return out
