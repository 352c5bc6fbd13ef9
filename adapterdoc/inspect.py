"""`adapterdoc inspect`: what a checkpoint or adapter holds, from headers alone, and what looks wrong."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from adapterdoc.adapter import AdapterConfig, LoraKey, fused_expert_owner, module_counts, parse_key
from adapterdoc.checkpoint import Checkpoint, open_checkpoint
from adapterdoc.layouts import LAYOUTS, Detection, detect_layout, tower_segment
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.report.inspect_report import FileSummary, InspectReport, LoraSummary
from adapterdoc.st.header import TensorInfo

_SAVED_WHOLE = ("lm_head", "embed_tokens", "score", "classifier", "embed_out", "wte", "word_embeddings")
_PT_FORMATS = ("pt", "tf", "flax", "mlx")


@dataclass
class ModuleLora:
    """The LoRA tensors of one module, as the header describes them."""

    module: str
    a: TensorInfo | None = None
    b: TensorInfo | None = None
    embedding: bool = False
    magnitude: bool = False
    bias: bool = False

    @property
    def fused_experts(self) -> bool:
        return self.module.endswith(".experts") or ".experts.base_layer" in self.module

    @property
    def rank(self) -> int | None:
        if self.a is not None and self.a.shape:
            return self.a.shape[0]
        if self.b is not None and len(self.b.shape) == 2:
            return self.b.shape[1]
        return None


def inspect(spec: str | os.PathLike[str]) -> InspectReport:
    """Open ``spec`` header-only and describe it."""
    return inspect_checkpoint(open_checkpoint(spec))


def inspect_checkpoint(ckpt: Checkpoint) -> InspectReport:
    files = _file_summaries(ckpt)
    dtypes = Counter(t.dtype for t in ckpt.tensors.values())
    parameters = sum(t.numel for t in ckpt.tensors.values())
    keys = [parse_key(k) for k in ckpt.tensors]
    lora_keys = [k for k in keys if k.is_lora]
    findings: list[Finding] = []
    path = ckpt.weights_path or ckpt.root
    findings += _format_findings(ckpt, dtypes, path)
    is_adapter = ckpt.adapter_config is not None or bool(lora_keys)
    lora = None
    if is_adapter:
        modules = _group_modules(ckpt.tensors, keys)
        lora = _lora_summary(ckpt.adapter_config, modules)
        findings += _adapter_findings(ckpt, keys, modules, path)
        hint = ckpt.adapter_config.layout_hints if ckpt.adapter_config else None
        layout = detect_layout((m for m in modules), hint)
    else:
        archs = _architectures(ckpt)
        layout = detect_layout(_weight_modules(ckpt.tensors), archs)
        named = [n for n, lay in LAYOUTS.items() if lay.model_class in archs]
        if (
            layout.name == "unknown" and len(named) == 1
        ):  # checkpoints store older on-disk names: trust config
            layout = Detection(
                named[0],
                (
                    f"config.json architectures names {LAYOUTS[named[0]].model_class}; "
                    "the weights use transformers' on-disk names",
                ),
            )
    if is_adapter and layout.name in ("unknown", "ambiguous") and lora_keys:
        cands = f" (candidates: {', '.join(layout.candidates)})" if layout.candidates else ""
        findings.append(make("AD209", f"layout is {layout.name}{cands}", path=path))
    return InspectReport(
        spec=ckpt.spec,
        kind=ckpt.kind,
        files=files,
        tensors=len(ckpt.tensors),
        parameters=parameters,
        bytes=sum(f.bytes for f in files),
        dtypes=dict(sorted(dtypes.items())),
        metadata=ckpt.metadata,
        layout=layout,
        lora=lora,
        findings=sort_findings(findings),
        weights_format=ckpt.weights_format,
        bytes_received=ckpt.bytes_received if ckpt.spec.startswith("hf://") else None,
    )


def _file_summaries(ckpt: Checkpoint) -> list[FileSummary]:
    if ckpt.headers:
        return [FileSummary(h.path, h.file_size, 8 + h.header_len, len(h.tensors)) for h in ckpt.headers]
    p = ckpt.weights_path or ckpt.root
    return [FileSummary(p, os.path.getsize(p), 0, len(ckpt.tensors))]


def _architectures(ckpt: Checkpoint) -> list[str]:
    """``architectures`` from a ``config.json`` beside the weights (a hint for layout detection, never required)."""
    import json

    folder = ckpt.root if os.path.isdir(ckpt.root) else os.path.dirname(ckpt.root)
    try:
        with open(os.path.join(folder, "config.json"), "rb") as f:
            archs = json.loads(f.read()).get("architectures")
    except (OSError, ValueError, AttributeError):
        return []
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def _weight_modules(tensors: dict[str, TensorInfo]) -> list[str]:
    return [name.rpartition(".")[0] for name in tensors if "." in name]


def _format_findings(ckpt: Checkpoint, dtypes: Counter[str], path: str) -> list[Finding]:
    out: list[Finding] = []
    if len(dtypes) > 1:
        mix = ", ".join(f"{d} × {n}" for d, n in sorted(dtypes.items()))
        out.append(make("AD101", f"tensors in {len(dtypes)} dtypes: {mix}", path=path))
    for h in ckpt.headers:
        fmt = (h.metadata or {}).get("format")
        if fmt not in _PT_FORMATS:
            got = "no `format` entry" if fmt is None else f"format {fmt!r}"
            out.append(make("AD102", f"__metadata__ has {got}", path=h.path))
        if not h.tensors:
            out.append(make("AD105", "the file holds no tensors", path=h.path))
    if ckpt.weights_format == "bin":
        out.append(make("AD103", "weights are a pickle (read with torch.load(weights_only=True))", path=path))
    for shard, tensor in ckpt.extra_in_shards[:20]:
        out.append(make("AD104", "tensor in the shard but not in the index", path=shard, key=tensor))
    return out


def _group_modules(tensors: dict[str, TensorInfo], keys: list[LoraKey]) -> dict[str, ModuleLora]:
    modules: dict[str, ModuleLora] = {}
    for k in keys:
        if k.role not in (
            "lora_A",
            "lora_B",
            "lora_embedding_A",
            "lora_embedding_B",
            "magnitude",
            "lora_B.bias",
        ):
            continue
        m = modules.setdefault(k.module, ModuleLora(k.module))
        info = tensors[k.key]
        if k.is_a:
            m.a = info
        elif k.is_b:
            m.b = info
        elif k.role == "magnitude":
            m.magnitude = True
        elif k.role == "lora_B.bias":
            m.bias = True
        if k.role.startswith("lora_embedding"):
            m.embedding = True
    return modules


def _lora_summary(cfg: AdapterConfig | None, modules: dict[str, ModuleLora]) -> LoraSummary:
    ranks = Counter(m.rank for m in modules.values() if m.rank is not None)
    per_prefix, per_leaf = module_counts(modules)
    default_scaling = None
    if cfg is not None:
        default_scaling = cfg.scaling_for("")
    return LoraSummary(
        modules=len(modules),
        ranks=dict(sorted(ranks.items())),
        alpha=cfg.lora_alpha if cfg else None,
        scaling=default_scaling,
        use_rslora=cfg.use_rslora if cfg else False,
        use_dora=(cfg.use_dora if cfg else False) or any(m.magnitude for m in modules.values()),
        target_modules=cfg.target_modules if cfg else None,
        exclude_modules=cfg.exclude_modules if cfg else None,
        target_parameters=cfg.target_parameters if cfg else [],
        modules_to_save=cfg.modules_to_save if cfg else [],
        rank_pattern=cfg.rank_pattern if cfg else {},
        alpha_pattern=cfg.alpha_pattern if cfg else {},
        per_prefix=per_prefix,
        per_leaf=per_leaf,
        fused_expert_modules=sum(1 for m in modules.values() if m.fused_experts),
        embedding_modules=sum(1 for m in modules.values() if m.embedding),
        config_r=cfg.r if cfg else None,
        peft_type=cfg.peft_type if cfg else None,
    )


def _adapter_findings(
    ckpt: Checkpoint, keys: list[LoraKey], modules: dict[str, ModuleLora], path: str
) -> list[Finding]:
    cfg = ckpt.adapter_config
    out: list[Finding] = []
    if not any(k.is_lora for k in keys):
        out.append(make("AD201", f"none of the {len(keys)} tensors is a LoRA factor", path=path))
    unwrapped = [k.key for k in keys if not k.wrapped]
    if unwrapped:
        out.append(
            make(
                "AD208",
                f"{len(unwrapped)} key(s) lack `base_model.model.`",
                path=path,
                key=unwrapped[0],
                hint=f"adapterdoc remap {ckpt.spec} --rule '^(?!base_model\\.model\\.)=>base_model.model.'",
            )
        )
    named = [k for k in keys if k.adapter_name]
    if named:
        out.append(
            make(
                "AD207",
                f"{len(named)} key(s) carry the adapter name {named[0].adapter_name!r}",
                path=path,
                key=named[0].key,
            )
        )
    towers: dict[str, list[str]] = {}
    for m in modules:
        seg = tower_segment(m)
        if seg:
            towers.setdefault(seg, []).append(m)
    for seg, mods in sorted(towers.items()):
        out.append(make("AD202", f"{len(mods)} LoRA module(s) under `{seg}`", path=path, key=mods[0]))
    if cfg is not None:
        out += config_findings(cfg, path)
    _whole_weight_findings(cfg, keys, out, path)
    for m in sorted(modules.values(), key=lambda m: m.module):
        out += _module_findings(cfg, m, path)
    return out


def config_findings(cfg: AdapterConfig, path: str) -> list[Finding]:
    """adapter_config.json fields PEFT would drop (typos) or misread (wrong JSON types): AD110-AD114."""
    where = cfg.path or path
    return [make(p.code, p.message, path=where, key=p.field, hint=p.hint) for p in cfg.problems()]


def _whole_weight_findings(
    cfg: AdapterConfig | None, keys: list[LoraKey], out: list[Finding], path: str
) -> None:
    mts = cfg.modules_to_save if cfg else []
    whole: list[LoraKey] = []
    for k in keys:
        if k.role == "tokens":
            whole.append(k)
        elif k.role == "full":
            leaf = fused_expert_owner(k.module).rpartition(".")[2]
            known = (
                k.module.endswith(".base_layer")
                or leaf in _SAVED_WHOLE
                or any(k.module == m or k.module.endswith(f".{m}") for m in mts)
            )
            if known:
                whole.append(k)
            else:
                out.append(make("AD211", "not a LoRA tensor of any known kind", path=path, key=k.key))
    if whole:
        names = sorted({k.module.removesuffix(".base_layer") for k in whole})
        out.append(
            make(
                "AD203",
                f"{len(whole)} whole-weight tensor(s) for {', '.join(names[:4])}"
                + (" ..." if len(names) > 4 else ""),
                path=path,
                key=whole[0].key,
            )
        )


def _module_findings(cfg: AdapterConfig | None, m: ModuleLora, path: str) -> list[Finding]:
    out: list[Finding] = []
    if (m.a is None) != (m.b is None):
        have, miss = ("lora_A", "lora_B") if m.a is not None else ("lora_B", "lora_A")
        out.append(make("AD206", f"{have} without {miss}", path=path, key=m.module))
        return out
    if m.a is None or m.b is None:
        return out
    a_rank = m.a.shape[0] if m.a.shape else None
    b_rank = m.b.shape[-1] if m.b.shape else None
    if m.embedding:  # lora_embedding_A [r, vocab], lora_embedding_B [dim, r]
        a_rank, b_rank = m.a.shape[0] if m.a.shape else None, m.b.shape[-1] if m.b.shape else None
    if len(m.a.shape) != 2 or len(m.b.shape) != 2 or a_rank != b_rank:
        out.append(
            make(
                "AD210",
                f"lora_A {list(m.a.shape)} and lora_B {list(m.b.shape)} disagree on the rank",
                path=path,
                key=m.module,
            )
        )
        return out
    if cfg is None:
        return out
    target = fused_expert_owner(m.module)
    if m.fused_experts:
        targeted = cfg.targets_parameter(target) or cfg.targets(m.module)
        ranks = {cfg.r, *(v for v in cfg.rank_pattern.values() if type(v) is int and v > 0)}
        rank_ok = a_rank is not None and any(r and a_rank % r == 0 for r in ranks)
        expected = "a multiple of r"
    else:
        targeted = cfg.targets(m.module)
        expected_r = cfg.rank_for(m.module)
        rank_ok = a_rank == expected_r
        expected = str(expected_r)
    if not targeted:
        out.append(
            make(
                "AD205",
                "no target_modules/target_parameters entry selects this module",
                path=path,
                key=m.module,
            )
        )
    if not rank_ok and not cfg.bad_pattern_for(m.module):  # an unusable pattern value is AD113 already
        out.append(
            make("AD204", f"rank {a_rank} in the tensors, config says {expected}", path=path, key=m.module)
        )
    return out
