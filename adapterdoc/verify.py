"""`adapterdoc verify`: the pre-deploy gate. Does an adapter load, fully and meaningfully, on this base (and server)?

Per adapter: its header (every inspect finding), its keys against what PEFT builds on the base from the config alone
(the registry's module tree and PEFT's rules, torch-free, :mod:`adapterdoc.expected`; else PEFT's own injection on
the meta device, :mod:`adapterdoc.ml.meta`), a diagnosis of known layout moves with the exact
``adapterdoc remap`` command, config checks, the ``lora_B`` zero and NaN/Inf scans (:mod:`adapterdoc.st.tensors`),
optional serving-profile rules (vLLM) and an optional real PEFT load (:mod:`adapterdoc.ml.load`).
Torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.adapter import (
    WRAPPER,
    AdapterConfig,
    LoraKey,
    fused_expert_owner,
    module_name_matches,
    parse_key,
)
from adapterdoc.checkpoint import Checkpoint, load_bin, open_checkpoint
from adapterdoc.codes.serving import VLLM_DEFAULT_MAX_LORA_RANK, VLLM_MAX_LORA_RANKS, VLLM_VERSION
from adapterdoc.errors import AdapterdocError, ConfigError, MissingExtraError, UnsupportedInputError
from adapterdoc.inspect import inspect_checkpoint
from adapterdoc.layouts import LAYOUTS, remap_path, tower_segment
from adapterdoc.layouts.moves import best_move, candidate_moves
from adapterdoc.report.findings import Finding, has_errors, make, sort_findings

PROFILES = ("peft", "vllm")
SERVED_AS = ("text", "vl")
SCAN_MODES = ("all", "lora-b", "nonzero")
"""``all``: every tensor for NaN/Inf and every lora_B for zeros; ``lora-b``: lora_B only (zeros and NaN/Inf);
``nonzero``: lora_B zeros only, each scan ending at its first non-zero element."""
MAX_LISTED = 20
"""Per-kind cap on findings that name single keys (the JSON lists stay complete)."""

_VL_SEGMENTS = (
    "visual",
    "vision_tower",
    "multi_modal_projector",
    "audio_tower",
    "embed_vision",
    "embed_audio",
)
_VLLM_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")
_VLLM_HEADS = ("classifier", "score")


@dataclass
class VerifyOptions:
    profile: str = "peft"
    max_lora_rank: int = VLLM_DEFAULT_MAX_LORA_RANK
    served_as: str | None = None
    """``text`` or ``vl``; ``None`` infers it from the base."""
    load: bool = False
    scan: str = "all"
    max_inert_share: float | None = None
    """Fail (AD313) when more than this share of the LoRA modules is inert (the weights audit)."""
    expected_keys: str = "auto"
    """``auto``: the registry's torch-free expected keys where it describes the base exactly, else the meta device;
    ``meta-device``: always PEFT on the meta device (the oracle the registry is tested against)."""

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r}; choose from {', '.join(PROFILES)}")
        if self.max_lora_rank not in VLLM_MAX_LORA_RANKS:
            allowed = ", ".join(map(str, VLLM_MAX_LORA_RANKS))
            raise ValueError(
                f"max_lora_rank must be one of {allowed} (vLLM {VLLM_VERSION}), got {self.max_lora_rank}"
            )
        if self.served_as not in (None, *SERVED_AS):
            raise ValueError(f"served_as must be text or vl, got {self.served_as!r}")
        if self.expected_keys not in ("auto", "meta-device"):
            raise ValueError(f"expected_keys must be auto or meta-device, got {self.expected_keys!r}")
        if self.scan not in SCAN_MODES:
            raise ValueError(f"scan must be one of {', '.join(SCAN_MODES)}, got {self.scan!r}")
        share = self.max_inert_share
        if share is not None and (
            isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1
        ):
            raise ValueError(f"max_inert_share must be a number from 0 to 1, got {share!r}")


@dataclass
class VerifyReport:
    """The verdict on one adapter."""

    adapter: str
    path: str | None = None
    layout: str = "unknown"
    """The adapter's layout, detected from its keys (``ambiguous`` or ``unknown`` when detection cannot tell)."""
    layout_candidates: list[str] = field(default_factory=list)
    """Other layouts the keys fit (all of them when ``layout`` is ``ambiguous``)."""
    base_layout: str | None = None
    expected_keys_from: str | None = None
    """``registry`` (the layout registry's module tree and PEFT's rules, torch-free) or ``meta-device`` (PEFT
    injected into the base built on the meta device)."""
    expected_keys_note: str | None = None
    """Why the registry did not decide, when the meta-device path did."""
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatch: list[str] = field(default_factory=list)
    shape_details: list[dict[str, Any]] = field(default_factory=list)
    lora_b: dict[str, int] = field(default_factory=lambda: {"nonzero": 0, "total": 0})
    """How many lora_B tensors hold a non-zero element, of how many."""
    nonfinite: dict[str, int] = field(default_factory=dict)
    """Tensor → NaN/Inf count, for tensors that have any."""
    dtypes: dict[str, int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    move: dict[str, Any] | None = None
    """The diagnosed layout move, when the mismatch is one."""
    served_as: str | None = None
    load: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None
    """The weights audit's summary (modules, inert, inert_share, total_delta_norm), when it ran."""
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    """Set when the adapter could not be examined at all (exit code 3)."""

    @property
    def ok(self) -> bool:
        return self.error is None and not has_errors(self.findings)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "adapter": self.adapter,
            "ok": self.ok,
            "error": self.error,
            "path": self.path,
            "layout": self.layout,
            "layout_candidates": self.layout_candidates,
            "base_layout": self.base_layout,
            "expected_keys_from": self.expected_keys_from,
            "expected_keys_note": self.expected_keys_note,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "shape_mismatch": self.shape_mismatch,
            "shape_details": self.shape_details,
            "lora_b": dict(self.lora_b),
            "nonfinite": dict(self.nonfinite),
            "dtypes": dict(self.dtypes),
            "config": self.config,
            "move": self.move,
            "served_as": self.served_as,
            "load": self.load,
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.weights is not None:
            d["weights"] = self.weights
        return d


@dataclass
class VerifyRun:
    """One ``verify`` call: the base, the options and a report per adapter."""

    base: str
    options: VerifyOptions
    adapters: list[VerifyReport]
    base_info: dict[str, Any] = field(default_factory=dict)
    exit_zero: bool = False
    """``--exit-zero``: error findings do not fail the run (exit 0, JSON ``ok`` true, ``passed`` false)."""

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.adapters)

    @property
    def findings(self) -> list[Finding]:
        return [f for a in self.adapters for f in a.findings]

    @property
    def exit_code(self) -> int:
        if any(a.error for a in self.adapters):
            return 3
        return 0 if self.ok or self.exit_zero else 1

    def to_dict(self) -> dict[str, Any]:
        o = self.options
        findings = [f.to_dict() for f in self.findings]
        for a in self.adapters:  # an unusable adapter (exit 3) is finding AD100, as in every command's JSON
            if a.error:
                findings.append({"code": "AD100", "severity": "error", "message": a.error, "path": a.adapter})
        return {
            "ok": self.exit_code == 0,
            "passed": self.ok and not any(a.error for a in self.adapters),
            "findings": findings,
            "base": {"spec": self.base, **self.base_info},
            "profile": o.profile,
            "max_lora_rank": o.max_lora_rank if o.profile == "vllm" else None,
            "vllm_version": VLLM_VERSION if o.profile == "vllm" else None,
            "served_as": o.served_as,
            "adapters": [a.to_dict() for a in self.adapters],
        }


# --------------------------------------------------------------------------------------------- the run


class _Base:
    """The resolved base and the two ways to its expected keys: the registry's module tree (torch-free) when it
    describes the config exactly, else the transformers config for the meta-device model (loaded on first use)."""

    def __init__(self, spec: Any, tree: Any, why: str | None, raw: dict[str, Any] | None) -> None:
        self.spec, self.tree, self.why, self.raw = spec, tree, why, raw
        self._config: Any = None

    @classmethod
    def resolve(cls, base: str) -> _Base:
        from adapterdoc.layouts.trees import Unmodeled, build_tree
        from adapterdoc.ml import meta as M

        spec = M.resolve_base(base)
        if spec.kind == "tiny":
            return cls(spec, None, "tiny reference bases are built by transformers", None)
        raw = M.read_config_json(spec)
        try:
            return cls(spec, build_tree(raw), None, raw)
        except Unmodeled as e:
            return cls(spec, None, str(e), raw)

    def config(self, why: str | None = None) -> Any:
        """The transformers config (the meta-device path); exit 3 naming the ML extra when it is not installed."""
        from adapterdoc.ml import meta as M

        if self._config is None:
            reason = why or self.why
            what = (
                self.spec.spec if not reason else f"{self.spec.spec} (the registry cannot decide: {reason})"
            )
            self._config = M.load_config(self.spec, what)
        return self._config

    @property
    def model_type(self) -> Any:
        if self.raw is not None:
            return self.raw.get("model_type")
        return getattr(self.config(), "model_type", None)


def verify(adapters: Iterable[str], base: str, options: VerifyOptions | None = None) -> VerifyRun:
    """Verify each adapter against ``base``; an unusable base raises, an unusable adapter is reported.

    Expected keys come from the registry's module tree and PEFT's rules (:mod:`adapterdoc.expected`, no torch)
    when the registry describes the base config and the adapter config exactly, else from PEFT on the meta
    device; each report says which (``expected_keys_from``)."""
    from adapterdoc.ml import meta as M

    options = options or VerifyOptions()
    b = _Base.resolve(base)
    spec = b.spec
    if options.load:
        M.require_ml("--load")
    info = {"kind": spec.kind, "has_weights": spec.has_weights, "model_type": b.model_type}
    if options.load and not spec.has_weights:
        raise MissingWeightsError(base, "--load needs a base with weights (config.json alone is not enough)")
    reports: list[VerifyReport] = []
    for adapter in adapters:
        try:
            reports.append(verify_one(adapter, b, options))
        except MissingExtraError:
            raise
        except AdapterdocError as e:
            reports.append(VerifyReport(adapter=adapter, error=str(e)))
    run = VerifyRun(base=base, options=options, adapters=reports, base_info=info)
    for r in reports:
        if r.base_layout:
            run.base_info.setdefault("layout", r.base_layout)
    return run


OWN_BASE = "(each adapter's base_model_name_or_path)"


def verify_own_bases(adapters: Iterable[str], options: VerifyOptions | None = None) -> VerifyRun:
    """Verify each adapter against the base its ``adapter_config.json`` names (``base_model_name_or_path``: a
    model folder, a cached repo id or ``tiny:LAYOUT``); an adapter whose base does not resolve locally is
    reported as unusable (exit 3). Adapters that name the same base share one meta-device build."""
    from adapterdoc.checkpoint import open_checkpoint

    options = options or VerifyOptions()
    order = list(adapters)
    groups: dict[str, list[str]] = {}
    reports: dict[str, VerifyReport] = {}
    for adapter in order:
        try:
            cfg = open_checkpoint(adapter).adapter_config
            named = cfg.base_model if cfg else None
            if not named:
                raise ConfigError(
                    adapter, "no --base given and adapter_config.json names no base_model_name_or_path"
                )
        except AdapterdocError as e:
            reports[adapter] = VerifyReport(adapter=adapter, error=str(e))
            continue
        groups.setdefault(named, []).append(adapter)
    for named, members in groups.items():
        try:
            run = verify(members, named, options)
        except MissingExtraError:
            raise
        except AdapterdocError as e:
            for adapter in members:
                reports[adapter] = VerifyReport(adapter=adapter, error=f"its base {named!r}: {e}")
            continue
        for rep in run.adapters:
            reports[rep.adapter] = rep
    return VerifyRun(base=OWN_BASE, options=options, adapters=[reports[a] for a in order])


class MissingWeightsError(AdapterdocError):
    """``--load`` on a base that has only a config."""


def verify_one(spec: str, base: Any, options: VerifyOptions) -> VerifyReport:
    """Verify one adapter (``base`` is a resolved :class:`_Base`)."""
    ckpt = open_checkpoint(spec)
    where = ckpt.root
    insp = inspect_checkpoint(ckpt)
    report = VerifyReport(
        adapter=spec,
        path=where,
        layout=insp.layout.name,
        layout_candidates=list(insp.layout.candidates),
        dtypes=dict(insp.dtypes),
    )
    findings: list[Finding] = [_at(f, spec) for f in insp.findings if f.code != "AD205"]
    keys = [parse_key(k) for k in ckpt.tensors]

    acfg, inferred = _adapter_config(ckpt, keys)
    if inferred:
        findings.append(
            make("AD231", "no adapter_config.json: targets and ranks inferred from the tensors", path=spec)
        )
    shapes = {k: tuple(t.shape) for k, t in ckpt.tensors.items()}
    meta = _expected_model(base, acfg, shapes, report, options.expected_keys == "auto")
    report.base_layout = meta.layout
    if getattr(meta, "built_as", None) is not None:
        findings.append(_built_as_finding(spec, meta.built_as))
    km = meta.match(shapes)
    report.missing, report.unexpected = km.missing, km.unexpected
    report.shape_mismatch = [k for k, _, _ in km.shape_mismatch]
    report.shape_details = [
        {"key": k, "adapter": list(a), "expected": list(e)} for k, a, e in km.shape_mismatch
    ]
    report.config = _config_summary(acfg, meta, inferred)

    findings += _key_findings(spec, ckpt, keys, meta, km, report, acfg)
    findings += _config_findings(spec, acfg, meta, keys)
    findings += _weight_findings(spec, ckpt, keys, options.scan, report, options.max_inert_share)
    if options.profile == "vllm":
        findings += _vllm_findings(spec, acfg, inferred, keys, meta, options, report)
    if options.load:
        findings += _load_findings(spec, ckpt, base.spec, report, getattr(meta, "built_as", None))
    report.findings = sort_findings(_dedupe(findings))
    return report


def _auto_mapping_class(acfg: AdapterConfig) -> str | None:
    auto = acfg.raw.get("auto_mapping")
    cls = auto.get("base_model_class") if isinstance(auto, dict) else None
    return cls if isinstance(cls, str) else None


def _built_as_finding(spec: str, b: Any) -> Finding:
    where = "the same config" if not b.config_path else f"the config's {'.'.join(b.config_path)}"
    return make(
        "AD115",
        f"base built as {b.model_class} (the adapter's auto_mapping.base_model_class, layout {b.layout}) from "
        f"{where}; its config's own class is {b.default_class}",
        path=spec,
        key="auto_mapping",
    )


def _expected_model(
    base: _Base, acfg: AdapterConfig, shapes: dict[str, tuple[int, ...]], report: VerifyReport, registry: bool
) -> Any:
    """The registry's expected keys when it can say exactly, else PEFT's own on the meta device."""
    from adapterdoc.layouts.trees import Unmodeled
    from adapterdoc.ml import meta as M

    why = base.why if registry else "meta-device path requested"
    as_class = _auto_mapping_class(acfg)
    if registry and base.tree is not None and as_class not in (None, base.tree.model_class):
        why = f"the adapter's auto_mapping names {as_class}, which the meta device builds from this config"
    elif registry and base.tree is not None:
        from adapterdoc.expected import registry_adapter

        try:
            meta = registry_adapter(base.tree, acfg, shapes, base=base.spec)
            report.expected_keys_from = "registry"
            return meta
        except Unmodeled as e:
            why = str(e)
    config = base.config(why)
    lora_cfg = M.lora_config_from_raw(acfg.raw, acfg.path)
    report.expected_keys_from = "meta-device"
    report.expected_keys_note = why
    return M.build_meta_adapter(base.spec, lora_cfg, config=config, as_class=as_class)


def _at(f: Finding, spec: str) -> Finding:
    return Finding(f.code, f.severity, f.message, key=f.key, path=spec, hint=f.hint)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str, str | None]] = set()
    out = []
    for f in findings:
        k = (f.code, f.message, f.key)
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out


def _adapter_config(ckpt: Checkpoint, keys: list[LoraKey]) -> tuple[AdapterConfig, bool]:
    if ckpt.adapter_config is not None:
        return ckpt.adapter_config, False
    return AdapterConfig(infer_config(ckpt, keys), None), True


def infer_config(ckpt: Checkpoint, keys: list[LoraKey]) -> dict[str, Any]:
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
    raw: dict[str, Any] = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": r,
        "target_modules": sorted(leaves) or None,
        "rank_pattern": {re.escape(m): v for m, v in sorted(per_module.items()) if v != r},
    }
    if params:
        raw["target_parameters"] = sorted(params)
    return raw


# --------------------------------------------------------------------------------------------- keys


def _key_findings(
    spec: str,
    ckpt: Checkpoint,
    keys: list[LoraKey],
    meta: Any,
    km: Any,
    report: VerifyReport,
    acfg: AdapterConfig,
) -> list[Finding]:
    out: list[Finding] = []
    if meta.inject_error:
        out.append(
            make(
                "AD226",
                f"PEFT refuses to inject the config into {meta.model_class}: {meta.inject_error}",
                path=spec,
            )
        )
        return out  # nothing is expected, so every key "mismatches": the refusal is the one finding
    move = None
    if km.unexpected or km.missing:
        current = (len(km.unexpected), len(km.missing))

        def score(renamed: list[str]) -> tuple[int, int]:
            m = meta.match({new: tuple(ckpt.tensors[old].shape) for old, new in zip(names, renamed)})
            return len(m.unexpected), len(m.missing)

        names = list(ckpt.tensors)
        preferred = [report.layout, *report.layout_candidates]
        move = best_move(
            candidate_moves(preferred, keys), names, score, current, target=meta.layout, sources=preferred
        )
    hint = move.command(spec, report.layout) if move else None
    if move:
        report.move = move.to_dict(spec, report.layout)
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
    return out


def _untargeted(spec: str, unexpected: list[str], meta: Any, acfg: AdapterConfig) -> list[Finding]:
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


# --------------------------------------------------------------------------------------------- config


def _config_summary(acfg: AdapterConfig, meta: Any, inferred: bool) -> dict[str, Any]:
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


def _config_findings(spec: str, acfg: AdapterConfig, meta: Any, keys: list[LoraKey]) -> list[Finding]:
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


# --------------------------------------------------------------------------------------------- weights


def _weight_findings(
    spec: str,
    ckpt: Checkpoint,
    keys: list[LoraKey],
    mode: str,
    report: VerifyReport,
    max_inert_share: float | None = None,
) -> list[Finding]:
    b_keys = [k.key for k in keys if k.role in ("lora_B", "lora_embedding_B")]
    audit = _audit(spec, ckpt, mode, max_inert_share)
    results: dict[str, tuple[bool, int | None, int]] = {}
    if audit is not None:  # the audit decoded every LoRA factor once: reuse its zero and NaN/Inf counts
        wanted = set(b_keys) if mode == "lora-b" else None
        for name, t in audit.tensors.items():
            if t.scanned and (wanted is None or name in wanted):
                results[name] = (True, 0 if t.nonzero else None, t.nonfinite)
    rest_b = [k for k in b_keys if k not in results]
    other = (
        [k.key for k in keys if k.key not in set(b_keys) and k.key not in results] if mode == "all" else []
    )
    results.update(_scan(ckpt, rest_b, other, mode))
    out: list[Finding] = []
    zero: list[str] = []
    nonzero = 0
    unscanned: list[str] = []
    for name, (scanned, first, bad) in results.items():
        if not scanned:
            unscanned.append(name)
            continue
        if bad:
            report.nonfinite[name] = bad
        if name in b_keys:
            if first is None:
                zero.append(name)
            else:
                nonzero += 1
    report.lora_b = {"nonzero": nonzero, "total": len(b_keys)}
    if b_keys and not nonzero and not unscanned:
        out.append(
            make(
                "AD301",
                f"all {len(b_keys)} lora_B tensor(s) are exactly zero: the adapter changes nothing",
                path=spec,
            )
        )
    elif zero:
        for name in zero[:MAX_LISTED]:
            out.append(
                make("AD302", f"lora_B is all zero ({nonzero} of {len(b_keys)} are not)", path=spec, key=name)
            )
    for name, bad in list(report.nonfinite.items())[:MAX_LISTED]:
        dtype = ckpt.tensors[name].dtype
        out.append(make("AD303", f"{bad} NaN/Inf value(s) ({dtype})", path=spec, key=name))
    if unscanned:
        out.append(make("AD304", f"{len(unscanned)} tensor(s) not scanned", path=spec, key=unscanned[0]))
    if audit is not None:
        out += _audit_findings(spec, audit, max_inert_share, all_b_zero=any(f.code == "AD301" for f in out))
        report.weights = audit.summary()
    return out


def _audit(spec: str, ckpt: Checkpoint, mode: str, max_inert_share: float | None) -> Any:
    """The weights audit of a safetensors adapter, unless the scan is the quick ``nonzero`` one (which stops at
    each lora_B's first non-zero element) and no inert-share gate asks for it; ``None`` without numpy then."""
    if ckpt.weights_format != "safetensors" or (mode == "nonzero" and max_inert_share is None):
        return None
    from adapterdoc.audit import audit_checkpoint

    try:
        return audit_checkpoint(ckpt)
    except UnsupportedInputError:
        if max_inert_share is not None:
            raise
        return None


def _audit_findings(spec: str, audit: Any, limit: float | None, *, all_b_zero: bool) -> list[Finding]:
    """The audit's delta findings (AD310-AD312; AD310 only when AD301 has not said it already) and the gate."""
    keep = ("AD311", "AD312") if all_b_zero else ("AD310", "AD311", "AD312")
    out = [_at(f, spec) for f in audit.findings if f.code in keep]
    n = len(audit.measured)
    if limit is not None and n and audit.inert_share > limit:
        out.append(
            make(
                "AD313",
                f"{audit.inert_count} of {n} LoRA module(s) ({audit.inert_share:.0%}) are inert; "
                f"the limit is {limit:.0%}",
                path=spec,
                hint=f"adapterdoc inspect {shlex.quote(spec)} --weights --plot inert.png",
            )
        )
    return out


def _scan(
    ckpt: Checkpoint, b_keys: list[str], other: list[str], mode: str
) -> dict[str, tuple[bool, int | None, int]]:
    """name → (scanned, first non-zero index or None, NaN/Inf count)."""
    if ckpt.weights_format == "bin":
        return _scan_bin(ckpt, b_keys, other, mode)
    from adapterdoc.st.tensors import scan_tensor

    headers = {h.path: h for h in ckpt.headers}
    out: dict[str, tuple[bool, int | None, int]] = {}
    finite = mode in ("all", "lora-b")
    for name in b_keys:
        s = scan_tensor(
            headers[ckpt.tensor_file[name]], name, zeros=True, finite=finite, stop_at_nonzero=not finite
        )
        out[name] = (s.scanned, s.first_nonzero, s.nonfinite or 0)
    for name in other:
        s = scan_tensor(headers[ckpt.tensor_file[name]], name, zeros=False, finite=True)
        out[name] = (s.scanned, None, s.nonfinite or 0)
    return out


def _scan_bin(
    ckpt: Checkpoint, b_keys: list[str], other: list[str], mode: str
) -> dict[str, tuple[bool, int | None, int]]:
    try:
        state = load_bin(ckpt.weights_path or ckpt.root)
    except MissingExtraError:
        return {n: (False, None, 0) for n in [*b_keys, *other]}
    import torch

    out: dict[str, tuple[bool, int | None, int]] = {}
    for name in [*b_keys, *other]:
        t = state[name].detach().reshape(-1)
        first = None
        if name in b_keys:
            nz = torch.nonzero(t.ne(0))
            first = int(nz[0]) if len(nz) else None
        bad = int((~torch.isfinite(t)).sum()) if t.is_floating_point() and mode != "nonzero" else 0
        out[name] = (True, first, bad)
    return out


# --------------------------------------------------------------------------------------------- vLLM


def _is_vl(layout: str | None) -> bool:
    return bool(layout in LAYOUTS and any(t in _VL_SEGMENTS for t in LAYOUTS[layout].towers))


def served_layout(base_layout: str | None, served_as: str) -> str | None:
    """The registry layout of the model as served (``text`` or ``vl``), reached from the base's layout."""
    if base_layout not in LAYOUTS:
        return None
    if served_as == ("vl" if _is_vl(base_layout) else "text"):
        return base_layout
    if served_as == "text":
        here: str | None = base_layout
        for _ in range(len(LAYOUTS)):
            here = LAYOUTS[here].text_counterpart if here else None
            if here is None or not _is_vl(here):
                return here
        return None
    for name, lay in LAYOUTS.items():  # served as VL on a text base: the VL layout whose counterpart it is
        if lay.text_counterpart == base_layout and _is_vl(name):
            return name
    return None


def served_modules(meta: Any, layout: str | None) -> set[str] | None:
    """Module names of the model as served: the base's own, or renamed along the registry move to ``layout``."""
    if layout is None:
        return None
    if layout == meta.layout:
        return set(meta.base_modules)
    path = remap_path(meta.layout, layout) if meta.layout else None
    if path is None:
        return None
    rules = [r for _, rs in path for r in rs]
    out = set()
    for name in meta.base_modules:
        for r in rules:
            name = r.apply(name)
        if _is_vl(layout) or tower_segment(name) is None:
            out.add(name)
    return out


def _vllm_findings(
    spec: str,
    acfg: AdapterConfig,
    inferred: bool,
    keys: list[LoraKey],
    meta: Any,
    options: VerifyOptions,
    report: VerifyReport,
) -> list[Finding]:
    v = f"vLLM {VLLM_VERSION}"
    raw = acfg.raw
    out: list[Finding] = []

    def add(code: str, msg: str, **kw: Any) -> None:
        out.append(make(code, f"{v}: {msg}", path=spec, **kw))

    missing = [f for f in ("r", "lora_alpha", "target_modules") if f not in raw or inferred]
    if missing:
        add("AD401", "missing required configuration fields: " + ", ".join(missing))
    ranks: list[Any] = [raw.get("r", 8), *(raw.get("rank_pattern") or {}).values()]
    bad = [r for r in ranks if not isinstance(r, int) or isinstance(r, bool) or r <= 0]
    if bad:
        add("AD417", f"non-positive or non-integer rank(s) {bad}", key="rank_pattern")
    else:
        top = max(ranks)
        if top > options.max_lora_rank:
            add(
                "AD411",
                f"LoRA rank {top} is greater than max_lora_rank {options.max_lora_rank}",
                hint=f"start the server with --max-lora-rank {_rank_slot(top)} and verify with the same value",
            )
    if acfg.use_dora or any(k.role == "magnitude" for k in keys):
        add("AD402", "does not support DoRA (use_dora / lora_magnitude_vector)")
    mts = raw.get("modules_to_save")
    if mts and not set(mts) <= set(_VLLM_HEADS):
        add("AD403", f'modules_to_save {mts} is not None or ["classifier", "score"]', key="modules_to_save")
    if raw.get("lora_bias"):
        add("AD404", "does not support lora_bias", key="lora_bias")
    init = raw.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in _VLLM_INITS:
        add("AD405", f"init_lora_weights {init!r} changes the base weights; refused", key="init_lora_weights")
    for fld, code in (
        ("alora_invocation_tokens", "AD406"),
        ("layer_replication", "AD407"),
        ("use_bdlora", "AD408"),
        ("use_qalora", "AD409"),
    ):
        if raw.get(fld):
            add(code, f"{fld} is set; refused", key=fld)
    if raw.get("bias", "none") not in (None, "none"):
        add("AD410", f"bias {raw.get('bias')!r}: adapter bias is not supported", key="bias")

    unsupported = [k.key for k in keys if not _vllm_accepts(k)]
    if unsupported:
        add("AD412", f"{len(unsupported)} tensor name(s) are unsupported LoRA weights", key=unsupported[0])

    served_as, why = _served_as(options.served_as, meta)
    report.served_as = served_as
    own_layout = meta.built_as.default_layout if meta.built_as else meta.layout
    add("AD416", f"served as {served_as}: {why}")
    lora_mods = sorted({fused_expert_owner(k.module) for k in keys if k.is_lora})
    towers = [m for m in lora_mods if tower_segment(m)]
    if towers:
        add(
            "AD414",
            f"{len(towers)} LoRA module(s) outside the language model are dropped "
            "(only supports adding LoRA to language model)",
            key=towers[0],
        )
    lm_mods = [m for m in lora_mods if not tower_segment(m)]
    heads = set(mts or [])
    leaves_ok = {leaf for leaf, outside in meta.lora_capable_leaves.items() if outside}
    odd = [m for m in lm_mods if _leaf(m) not in leaves_ok and _leaf(m) not in heads]
    if odd:
        add(
            "AD413",
            f"expected target modules in {sorted(leaves_ok)} but received {sorted({_leaf(m) for m in odd})}",
            key=odd[0],
        )
    layout = served_layout(own_layout, served_as)
    names = served_modules(meta, layout)
    if names is not None and lm_mods:
        absent = [m for m in lm_mods if m not in names]
        if absent:
            hint = None

            def score(renamed: list[str]) -> tuple[int, int]:
                mods = {fused_expert_owner(parse_key(k).module) for k in renamed if parse_key(k).is_lora}
                return sum(1 for m in mods if not tower_segment(m) and m not in names), 0

            lora_keys = [k.key for k in keys if k.is_lora and not tower_segment(k.module)]
            preferred = [report.layout, *report.layout_candidates]
            mv = best_move(
                candidate_moves(preferred, keys),
                lora_keys,
                score,
                (len(absent), 0),
                target=layout,
                sources=preferred,
            )
            hint = mv.command(spec, report.layout) if mv else None
            add(
                "AD415",
                f"{len(absent)} of {len(lm_mods)} LoRA module path(s) do not exist in the model as served "
                f"({layout}); vLLM checks only the last name component and silently serves the base model",
                key=absent[0],
                hint=hint,
            )
    return out


def _rank_slot(rank: int) -> int:
    return next((r for r in VLLM_MAX_LORA_RANKS if r >= rank), VLLM_MAX_LORA_RANKS[-1])


def _leaf(module: str) -> str:
    owner = fused_expert_owner(module)
    return "experts" if owner.endswith(".experts") or owner == "experts" else owner.rpartition(".")[2]


def _vllm_accepts(k: LoraKey) -> bool:
    name = k.key[len(WRAPPER) :] if k.wrapped else k.key
    if "base_layer" in name:
        return True
    if name.endswith(("lora_A.weight", "lora_B.weight", "lora_embedding_A", "lora_embedding_B")):
        return True
    return k.role == "full" and k.module.rpartition(".")[2] in _VLLM_HEADS


def _served_as(explicit: str | None, meta: Any) -> tuple[str, str]:
    if explicit:
        return explicit, "--served-as"
    # vLLM serves a base folder as its config's own class, whatever class the adapter was made for
    layout = meta.built_as.default_layout if meta.built_as else meta.layout
    cls = meta.built_as.default_class if meta.built_as else meta.model_class
    if _is_vl(layout):
        return "vl", (
            f"inferred: the base is {cls}, which vLLM serves with its VL class "
            "(language_model_only skips the tower but keeps the naming)"
        )
    return "text", f"inferred: the base is {cls}"


# --------------------------------------------------------------------------------------------- real load


def _load_findings(
    spec: str, ckpt: Checkpoint, base: Any, report: VerifyReport, built_as: Any = None
) -> list[Finding]:
    from adapterdoc.ml.load import load_check

    res = load_check(base, ckpt, built_as)
    report.load = res.to_dict()
    out: list[Finding] = []
    if res.skipped:
        out.append(make("AD235", f"real load skipped: {res.skipped}", path=spec))
        return out
    if res.lora_modules == 0:
        out.append(make("AD232", "PEFT load left 0 LoRA modules in the model", path=spec))
    if res.missing or res.unexpected:
        first = (res.missing or res.unexpected)[0]
        out.append(
            make(
                "AD233",
                f"PEFT load_adapter reported {len(res.missing)} missing and {len(res.unexpected)} unexpected "
                "LoRA key(s)",
                path=spec,
                key=first,
            )
        )
    if res.max_abs_diff == 0.0:
        out.append(make("AD234", f"output unchanged on the probe input ({res.probe})", path=spec))
    out.append(
        make(
            "AD235",
            f"real PEFT load: {res.lora_modules} LoRA module(s), {len(res.missing)} missing, "
            f"{len(res.unexpected)} unexpected, max |Δ output| {res.max_abs_diff:.3g}",
            path=spec,
        )
    )
    return out
