"""The adapter_config.json of an expert remap: ``target_modules`` ↔ ``target_parameters`` and the rank and alpha of
each fused or per-expert projection, written so that PEFT gives every module the rank its tensors have and the
scaling it had.

Per-expert → fused follows ``_convert_peft_config_moe`` (``peft/utils/transformers_weight_conversion.py``): the
expert leaves leave ``target_modules``, ``gate_up_proj`` / ``down_proj`` join ``target_parameters``, and
``rank_pattern`` / ``alpha_pattern`` gain ``.*\\.gate_up_proj`` with the rank and alpha doubled (gate and up side by
side). Where PEFT's rule would not be exact (per-expert ranks from ``rank_pattern``, rsLoRA) the values follow the
tensors instead, and every value is checked by resolving the new config the way PEFT does.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import cast

from adapterdoc.adapter import AdapterConfig
from adapterdoc.adapter.targets import module_name_matches
from adapterdoc.errors import RefusedError
from adapterdoc.remap.expert_names import GATE_UP
from adapterdoc.remap.expert_rewrite import Block, ExpertPlan
from adapterdoc.report.remap_report import ConfigChange

HOW = "experts"


def expert_config(
    raw: dict[str, object],
    cfg: AdapterConfig,
    plan: ExpertPlan,
    others: list[str],
    path: str,
    keys_only: bool = False,
) -> list[ConfigChange]:
    """Rewrite ``raw`` (the parsed adapter_config.json) in place for ``plan``; the changes. ``others`` are the
    LoRA modules the remap leaves alone. ``keys_only``: the base's model type is one whose per-expert LoRA keys
    PEFT fuses at load (transformers' conversion mapping) without rewriting the config (it has no MoE config
    conversion, e.g. ``qwen3_5_moe_text``): per-expert output then keeps ``target_parameters`` and gives the fused
    parameters the rank and alpha of the keys PEFT builds (gate_up: gate's plus up's)."""
    before = json.loads(json.dumps(raw))
    if plan.direction == "fused":
        _to_fused(raw, cfg, plan, others)
    else:
        _to_per_expert(raw, cfg, plan, others)
        if keys_only:
            _fused_on_load(raw, before, plan)
    _check(raw, cfg, plan, others, path)
    if keys_only and plan.direction != "fused":
        _check_fused_on_load(raw, plan, path)
    changes = []
    for name in (
        "r",
        "lora_alpha",
        "target_modules",
        "target_parameters",
        "rank_pattern",
        "alpha_pattern",
        "lora_dropout",
    ):
        if before.get(name) != raw.get(name):
            changes.append(ConfigChange(name, before.get(name), raw.get(name), HOW))
    return changes


def _leaf(name: str) -> str:
    return name.rpartition(".")[2]


def _number(x: float, like: object) -> float | int:
    """``x`` as an int when it is one and ``like`` (the value it is derived from) is an int."""
    return round(x) if isinstance(like, int) and abs(x - round(x)) < 1e-12 else x


def _fused_alpha(cfg: AdapterConfig, block: Block, leaf_module: str) -> float | int:
    """The alpha that gives the fused rank the per-expert scaling: ``alpha · R / r`` (rsLoRA: ``· sqrt(R / r)``)."""
    alpha = cfg.alpha_for(leaf_module)
    r = cfg.rank_for(leaf_module)
    ratio = block.fused_rank / r
    return _number(alpha * (math.sqrt(ratio) if cfg.use_rslora else ratio), alpha)


def _to_fused(raw: dict[str, object], cfg: AdapterConfig, plan: ExpertPlan, others: list[str]) -> None:
    style = plan.style
    kept = {_leaf(m) for m in others}
    moved = {leaf for b in plan.blocks for leaf in b.leaves} - kept
    tm = raw.get("target_modules")
    if isinstance(tm, list):
        raw["target_modules"] = [t for t in tm if not (isinstance(t, str) and _leaf(t) in moved)]
    elif isinstance(tm, str):  # a regex or all-linear: the modules the keys carry, by name
        raw["target_modules"] = sorted(kept)
    params = {b.param for b in plan.blocks}
    raw["target_parameters"] = sorted(set(_names(raw, "target_parameters")) | params)
    rp = _patterns(raw, "rank_pattern")
    ap = _patterns(raw, "alpha_pattern")
    for param in sorted(params):
        blocks = [b for b in plan.blocks if b.param == param]
        b0 = blocks[0]
        leaf_module = f"{b0.pre}.{style.container}.experts.0.{b0.leaves[0]}"
        key = rf".*\.{re.escape(param)}"
        want = (b0.fused_rank, _fused_alpha(cfg, b0, leaf_module))
        probe = f"{b0.owner}.{param}"
        trial = _config({**raw, "rank_pattern": rp, "alpha_pattern": ap})
        if param == GATE_UP or (trial.rank_for(probe), trial.alpha_for(probe)) != want:
            rp[key], ap[key] = want  # PEFT writes gate_up's always (its rank is doubled)
    raw["rank_pattern"], raw["alpha_pattern"] = rp, ap
    dropout = raw.get("lora_dropout")
    if isinstance(dropout, (int, float)) and dropout > 0:
        raw["lora_dropout"] = 0.0  # ParamWrapper refuses dropout (inference is the same without it)


def _to_per_expert(raw: dict[str, object], cfg: AdapterConfig, plan: ExpertPlan, others: list[str]) -> None:
    params = {b.param for b in plan.blocks}
    tp = [t for t in _names(raw, "target_parameters") if not (isinstance(t, str) and _leaf(t) in params)]
    raw["target_parameters"] = tp or None
    leaves = [leaf for leaf in plan.style.leaves if any(leaf in b.leaves for b in plan.blocks)]
    tm = raw.get("target_modules")
    if isinstance(tm, str):
        alt = "|".join(re.escape(x) for x in leaves)
        raw["target_modules"] = rf"(?:{tm})|.*\.experts\.\d+\.(?:{alt})"
    else:
        old = [t for t in tm or [] if isinstance(t, str)] if isinstance(tm, list) else []
        raw["target_modules"] = old + [x for x in leaves if x not in old]
    new_modules = [m for b in plan.blocks for m in _per_expert_modules(plan, b)] + others
    fused_names = [f"{b.owner}.{b.param}" for b in plan.blocks]
    for fld in ("rank_pattern", "alpha_pattern"):
        pat = _patterns(raw, fld)
        for k in list(pat):  # keys that only ever matched the fused parameters now match nothing
            if any(module_name_matches(k, n) for n in fused_names) and not any(
                module_name_matches(k, m) for m in new_modules
            ):
                del pat[k]
        raw[fld] = pat
    gate_up = [b for b in plan.blocks if b.param == GATE_UP]
    if gate_up:
        # PEFT's load conversion on transformers 5 fuses gate and up with rank 2·r and alpha 2·lora_alpha from
        # the top-level values (it reads no rank_pattern), so those must be gate's and up's
        b = gate_up[0]
        raw["r"], raw["lora_alpha"] = b.fused_rank, cfg.alpha_for(f"{b.owner}.{b.param}")
    for b in plan.blocks:
        want = (b.fused_rank, cfg.alpha_for(f"{b.owner}.{b.param}"))
        for m in _per_expert_modules(plan, b):
            trial = _config(raw)
            if (trial.rank_for(m), trial.alpha_for(m)) != want:
                # matches PEFT's fused name too (its load conversion keeps the patterns)
                key = rf"experts\.(?:\d+\.{re.escape(_leaf(m))}|{re.escape(b.param)})"
                raw["rank_pattern"] = {key: want[0], **_patterns(raw, "rank_pattern")}
                raw["alpha_pattern"] = {key: want[1], **_patterns(raw, "alpha_pattern")}
    _keep_others(raw, cfg, others)


def _fused_on_load(raw: dict[str, object], before: dict[str, object], plan: ExpertPlan) -> None:
    """PEFT injects the fused ParamWrappers from ``target_parameters`` and fuses the per-expert keys into them
    (gate and up side by side: rank gate's + up's): keep the targets and give each fused parameter that rank and
    the per-expert scaling (probe: peft 0.21.2 on Qwen3_5MoeForCausalLM, exact to 0.0 relative)."""
    raw["target_parameters"] = before.get("target_parameters")
    raw["target_modules"] = before.get(
        "target_modules"
    )  # the experts come from target_parameters: no leaf added
    new = _config(raw)
    rp, ap = _patterns(raw, "rank_pattern"), _patterns(raw, "alpha_pattern")
    done: set[str] = set()
    for b in plan.blocks:
        if b.param in done:
            continue
        done.add(b.param)
        leaf = f"{b.pre}.{plan.style.container}.experts.0.{b.leaves[0]}"
        r, alpha = new.rank_for(leaf), new.alpha_for(leaf)
        n = len(b.leaves)
        want = (r * n, _number(alpha * (math.sqrt(n) if new.use_rslora else n), alpha))
        if (new.rank_for(f"{b.owner}.{b.param}"), new.alpha_for(f"{b.owner}.{b.param}")) != want:
            key = rf".*\.{re.escape(b.param)}"
            rp = {key: want[0], **{k: v for k, v in rp.items() if k != key}}
            ap = {key: want[1], **{k: v for k, v in ap.items() if k != key}}
    raw["rank_pattern"], raw["alpha_pattern"] = rp, ap


def _check_fused_on_load(raw: dict[str, object], plan: ExpertPlan, path: str) -> None:
    new = _config(raw)
    for b in plan.blocks:
        leaf = f"{b.pre}.{plan.style.container}.experts.0.{b.leaves[0]}"
        fused = f"{b.owner}.{b.param}"
        rank = new.rank_for(leaf) * len(b.leaves)
        if new.rank_for(fused) != rank or not math.isclose(
            new.scaling_for(fused), new.scaling_for(leaf), rel_tol=1e-12
        ):
            raise RefusedError(
                path,
                f"cannot write rank_pattern/alpha_pattern so that PEFT's fused `{fused}` gets rank {rank} and the "
                "per-expert scaling when it fuses the per-expert keys at load",
            )


def _keep_others(raw: dict[str, object], cfg: AdapterConfig, others: list[str]) -> None:
    """The modules the remap leaves alone keep their rank and alpha when ``r`` / ``lora_alpha`` changed: a
    pattern per leaf name after the existing ones, or per module where a leaf pattern would not do."""
    for exact in (False, True):
        for m in others:
            want = (cfg.rank_for(m), cfg.alpha_for(m))
            trial = _config(raw)
            if (trial.rank_for(m), trial.alpha_for(m)) == want:
                continue
            key = re.escape(m) if exact else re.escape(_leaf(m))
            raw["rank_pattern"] = {**_patterns(raw, "rank_pattern"), key: want[0]}
            raw["alpha_pattern"] = {**_patterns(raw, "alpha_pattern"), key: want[1]}
        if all(_resolves(raw, cfg, m) for m in others):
            return
        if not exact:  # a leaf pattern broke another module: start again with exact ones
            for fld in ("rank_pattern", "alpha_pattern"):
                raw[fld] = {k: v for k, v in _patterns(raw, fld).items() if k not in _leaf_keys(others)}


def _patterns(raw: dict[str, object], field: str) -> dict[str, object]:
    """``rank_pattern`` / ``alpha_pattern`` of ``raw`` as a new dict (``{}`` when absent or null)."""
    return dict(cast("Mapping[str, object]", raw.get(field) or {}))


def _names(raw: dict[str, object], field: str) -> list[str]:
    """A list field of ``raw`` (``target_parameters``) as a new list (``[]`` when absent or null)."""
    return list(cast("Iterable[str]", raw.get(field) or []))


def _leaf_keys(modules: list[str]) -> set[str]:
    return {re.escape(_leaf(m)) for m in modules}


def _resolves(raw: dict[str, object], cfg: AdapterConfig, module: str) -> bool:
    new = _config(raw)
    return (new.rank_for(module), new.alpha_for(module)) == (cfg.rank_for(module), cfg.alpha_for(module))


def _per_expert_modules(plan: ExpertPlan, block: Block) -> list[str]:
    return [
        f"{block.pre}.{plan.style.container}.experts.{e}.{leaf}"
        for e in (0, block.experts - 1)
        for leaf in block.leaves
    ]


def _config(raw: dict[str, object]) -> AdapterConfig:
    return AdapterConfig.parse(json.dumps(raw).encode("utf-8"))


def _check(
    raw: dict[str, object], cfg: AdapterConfig, plan: ExpertPlan, others: list[str], path: str
) -> None:
    """Resolve the new config the way PEFT does: every new module gets its tensors' rank and the old scaling, and
    every other module keeps its own."""
    new = _config(raw)
    for m in others:
        if (new.rank_for(m), new.scaling_for(m)) != (cfg.rank_for(m), cfg.scaling_for(m)):
            raise RefusedError(
                path, f"cannot keep the rank and scaling of `{m}` in the new adapter_config.json"
            )
    for b in plan.blocks:
        if plan.direction == "fused":
            leaf0 = f"{b.pre}.{plan.style.container}.experts.0.{b.leaves[0]}"
            pairs = [(f"{b.owner}.{b.param}", b.fused_rank, cfg.scaling_for(leaf0))]
        else:
            s = cfg.scaling_for(f"{b.owner}.{b.param}")
            pairs = [(m, b.fused_rank, s) for m in _per_expert_modules(plan, b)]
        for module, rank, scaling in pairs:
            got_r, got_s = new.rank_for(module), new.scaling_for(module)
            if got_r != rank or not math.isclose(got_s, scaling, rel_tol=1e-12):
                raise RefusedError(
                    path,
                    f"cannot write rank_pattern/alpha_pattern so that `{module}` gets rank {rank} and scaling "
                    f"{scaling:g} (an existing pattern takes precedence: it gives {got_r}, {got_s:g})",
                )


def peft_fuses_keys_only(layout: str | None) -> bool:
    """Whether PEFT fuses per-expert LoRA keys at load on ``layout``'s class (transformers registers a conversion
    for its model type) but leaves the config as it is (no MoE config conversion for it)."""
    from adapterdoc.layouts import LAYOUTS

    lay = LAYOUTS.get(layout) if layout else None
    return lay is not None and lay.experts is not None and lay.load_conversion and lay.peft_moe is None


def _span(n: int) -> str:
    return "0" if n == 1 else f"{{0..{n - 1}}}"


def _per_expert_pattern(plan: ExpertPlan, b: Block) -> str:
    leaves = b.leaves[0] if len(b.leaves) == 1 else "{" + ",".join(b.leaves) + "}"
    return f"{b.pre}.{plan.style.container}.experts.{_span(b.experts)}.{leaves}"


def block_mapping(plan: ExpertPlan) -> dict[str, str]:
    """One entry per MoE block: the per-expert modules (brace pattern) ↔ the fused module."""
    out = {}
    for b in plan.blocks:
        many = _per_expert_pattern(plan, b)
        if plan.direction == "fused":
            out[many] = b.fused_module
        else:
            out[b.fused_module] = many
    return out
