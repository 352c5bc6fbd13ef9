"""What a checkpoint or adapter holds and what looks wrong, from its headers alone (no tensor data): the layout it
belongs to, its dtypes, the LoRA picture and the findings. ``inspect`` reports it; ``verify`` starts from it."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from operator import attrgetter

from adapterdoc.adapter import AdapterConfig, LoraKey, fused_expert_owner, module_counts, parse_key
from adapterdoc.adapter.expert_picture import ExpertPicture, expert_picture
from adapterdoc.checkpoint import Checkpoint
from adapterdoc.layouts import LAYOUTS, MOE_NAME_HINT, Detection, detect_layout, tower_segment
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.report.inspect_report import LoraSummary
from adapterdoc.st.header import TensorInfo

_SAVED_WHOLE = ("lm_head", "embed_tokens", "score", "classifier", "embed_out", "wte", "word_embeddings")
_PT_FORMATS = ("pt", "tf", "flax", "mlx")
_DTYPE = attrgetter("dtype")
_SHAPE = attrgetter("shape")


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class HeaderFacts:
    """The header-only examination of one checkpoint: what ``inspect`` reports and ``verify`` starts from."""

    layout: Detection
    dtypes: dict[str, int]
    parameters: int
    lora: LoraSummary | None
    findings: list[Finding]
    experts: ExpertPicture | None = None
    """The expert layout and coverage, for a mixture-of-experts adapter (else ``None``)."""


def header_facts(ckpt: Checkpoint) -> HeaderFacts:
    """What the header (and adapter_config.json) alone say about ``ckpt``: the detected layout, the dtypes, the
    LoRA summary and the findings (sorted), without reading tensor data."""
    infos = ckpt.tensors.values()
    dtypes = Counter(map(_DTYPE, infos))
    parameters = sum(map(math.prod, map(_SHAPE, infos)))  # each TensorInfo.numel, without its property call
    keys = list(map(parse_key, ckpt.tensors))
    has_lora = any(k.is_lora for k in keys)
    findings: list[Finding] = []
    path = ckpt.weights_path or ckpt.root
    findings += _format_findings(ckpt, dtypes, path)
    is_adapter = ckpt.adapter_config is not None or has_lora
    lora = None
    experts = None
    if is_adapter:
        modules = _group_modules(ckpt.tensors, keys)
        lora = _lora_summary(ckpt.adapter_config, modules)
        findings += _adapter_findings(ckpt, keys, modules, path)
        hint = ckpt.adapter_config.layout_hints if ckpt.adapter_config else None
        layout = detect_layout((m for m in modules), hint)
        experts = _experts(ckpt, layout, keys)
        if experts is not None:
            findings += expert_findings(experts, path, spec=ckpt.spec)
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
    if is_adapter and layout.name in ("unknown", "ambiguous") and has_lora:
        cands = f" (candidates: {', '.join(layout.candidates)})" if layout.candidates else ""
        findings.append(make("AD209", f"layout is {layout.name}{cands}", path=path))
    return HeaderFacts(
        layout=layout,
        dtypes=dict(sorted(dtypes.items())),
        parameters=parameters,
        lora=lora,
        findings=sort_findings(findings),
        experts=experts,
    )


def is_moe_adapter(pic: ExpertPicture, layout: str | None, names: list[str]) -> bool:
    """Whether an adapter belongs to a mixture-of-experts model: it has expert keys, its detected layout is MoE, or
    a name its config gives (base model, class) says MoE (:data:`adapterdoc.layouts.MOE_NAME_HINT`)."""
    import re

    if pic.blocks:
        return True
    if layout in LAYOUTS and LAYOUTS[layout].experts is not None:
        return True
    return any(re.search(MOE_NAME_HINT, n, re.IGNORECASE) for n in names)


def _experts(ckpt: Checkpoint, layout: Detection, keys: list[LoraKey]) -> ExpertPicture | None:
    shapes = [(k, t.shape) for k, t in ckpt.tensors.items()]
    pic = expert_picture(shapes, config=ckpt.adapter_config, keys=keys)
    names = ckpt.adapter_config.layout_hints if ckpt.adapter_config else []
    return pic if is_moe_adapter(pic, layout.name, names) else None


def expert_findings(
    pic: ExpertPicture, path: str, *, spec: str | None = None, fused_base: bool = False
) -> list[Finding]:
    """AD240 (no routed-expert LoRA), AD241 (one-sided gate/up: an error when the base fuses its experts) and
    AD242 (experts missing) for an MoE adapter's expert picture."""
    out: list[Finding] = []
    if not pic.routed:
        shared = f"; {len(pic.shared)} shared-expert module(s) carry LoRA" if pic.shared else ""
        out.append(make("AD240", f"no routed expert carries LoRA{shared}", path=path))
    one = pic.one_sided
    if one:
        half = one[0].one_sided
        other = "up" if half == "gate" else "gate"
        leaf = next(k.leaf for k in one[0].keys if k.projection == half)
        out.append(
            make(
                "AD241",
                f"{len(one)} MoE block(s) carry expert LoRA on {half} ({leaf}) without {other}"
                + ("; PEFT cannot fuse them into gate_up_proj on this base" if fused_base else ""),
                severity="error" if fused_base else None,
                path=path,
                key=one[0].path,
                hint=f"adapterdoc remap {spec or path} --experts fused --out DIR (the missing {other} half becomes a zero "
                f"LoRA), or retrain targeting both {half} and {other}",
            )
        )
    partial = pic.partial
    if partial:
        b = partial[0]
        proj, lack = next(iter(b.missing().items()))
        shown = ", ".join(map(str, lack[:8])) + (" ..." if len(lack) > 8 else "")
        out.append(
            make(
                "AD242",
                f"{len(partial)} MoE block(s) miss expert LoRA; e.g. {proj} of expert(s) {shown} "
                f"(of {b.experts}, from {b.experts_from})",
                path=path,
                key=b.path,
            )
        )
    return out


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


_A_ROLES = frozenset(("lora_A", "lora_embedding_A"))
_B_ROLES = frozenset(("lora_B", "lora_embedding_B"))
_MODULE_ROLES = _A_ROLES | _B_ROLES | {"magnitude", "lora_B.bias"}


def _group_modules(tensors: dict[str, TensorInfo], keys: list[LoraKey]) -> dict[str, ModuleLora]:
    """Each module's LoRA tensors, gathered by module in one pass, then each :class:`ModuleLora` built once."""
    acc: dict[str, list[object]] = {}  # module -> [a, b, embedding, magnitude, bias]
    for k in keys:
        role = k.role
        if role not in _MODULE_ROLES:
            continue
        slot = acc.get(k.module)
        if slot is None:
            slot = acc[k.module] = [None, None, False, False, False]
        if role in _A_ROLES:  # the last of several A (or B) tensors wins, as it always has
            slot[0] = tensors[k.key]
        elif role in _B_ROLES:
            slot[1] = tensors[k.key]
        elif role == "magnitude":
            slot[3] = True
        else:
            slot[4] = True
        if role.startswith("lora_embedding"):
            slot[2] = True
    return {m: ModuleLora(m, *s) for m, s in acc.items()}  # type: ignore[arg-type]


def _lora_summary(cfg: AdapterConfig | None, modules: dict[str, ModuleLora]) -> LoraSummary:
    ranks = Counter(r for r in (m.rank for m in modules.values()) if r is not None)
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
    for name in modules:
        seg = tower_segment(name)
        if seg:
            towers.setdefault(seg, []).append(name)
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
