"""Planning ``remap --experts``: open the adapter (its header read once), plan the tensors
(:mod:`~adapterdoc.remap.expert_rewrite`) and the config (:mod:`~adapterdoc.remap.expert_config`), and the report; nothing
is written here. The weights are always a new file (the tensor data changes), streamed by
:func:`adapterdoc.st.compose.compose`."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from adapterdoc.adapter import AdapterConfig
from adapterdoc.adapter.expert_layout import FIXED, peft_release
from adapterdoc.checkpoint import Checkpoint
from adapterdoc.remap.config import dump_like
from adapterdoc.remap.expert_config import block_mapping, expert_config
from adapterdoc.remap.expert_names import GATE_UP, STYLES
from adapterdoc.remap.expert_rewrite import Block, ExpertPlan, plan_experts, plan_relayout
from adapterdoc.remap.plan import Plan, open_safetensors
from adapterdoc.report.remap_report import ConfigChange, RemapReport
from adapterdoc.st.atomic import target_mode
from adapterdoc.st.compose import compose
from adapterdoc.st.header import Header

_LEAVES = "|".join(sorted({re.escape(leaf) for s in STYLES for leaf in s.leaves}))
_PER_EXPERT_KEY = re.compile(rf"\.experts\.\d+\.(?:{_LEAVES})\.lora_[AB]\.(?:[^.]+\.)?weight$")
_FUSED_KEY = re.compile(r"\.experts(?:\.base_layer)*\.lora_[AB]\.(?:[^.]+\.)?weight$")
TODAY = ".".join(map(str, FIXED))
"""The ``peft_version`` an expert remap writes over an older one: the first release whose fused layout it wrote."""
RELAYOUT_EXACT = (
    "exact: each expert's lora_A is its old lora_B transposed and its lora_B its old lora_A transposed (bit for bit); "
    "the delta, and so the outputs, are the ones the writing PEFT gave"
)
EXACT = (
    "exact in outputs: fused → per-expert keeps each projection's rank (gate and up share A_e and take their rows "
    "of B_e); per-expert → fused is PEFT's own construction (gate_up rank = gate's + up's, lora_B block-diagonal). "
    "A round trip fused → per-expert → fused therefore gives the same outputs, not the same bytes (gate_up's rank "
    "doubles)"
)


def make_expert_plan(spec: str, direction: str, out: str | None) -> Plan:
    """Plan ``remap --experts DIRECTION`` of ``spec``."""
    ckpt, weights = open_safetensors(
        spec, "remap --experts reads safetensors only; convert the .bin first (adapterdoc remap --rule)"
    )
    header = ckpt.headers[0]
    cfg = ckpt.adapter_config
    relayout = plan_relayout(header, cfg, weights) if direction == "fused" else None
    if relayout is not None:
        assert cfg is not None
        return _relayout_plan(spec, ckpt, header, cfg, relayout, weights, out)
    done = _already(spec, ckpt, header, cfg, direction, out)
    if done is not None:
        return done
    plan = plan_experts(header, cfg, direction, weights)
    assert cfg is not None and cfg.path is not None
    touched = {k for b in plan.blocks for pair in _keys_of(b) for k in pair}
    others = sorted({k.module for name, k in plan.parsed.items() if name not in touched and k.is_lora})
    with open(cfg.path, "rb") as f:
        original = f.read()
    raw = json.loads(original.decode("utf-8"))
    changes = expert_config(raw, cfg, plan, others, cfg.path, keys_only=_keys_only(cfg))
    if plan.direction == "fused":
        changes += _today_version(raw)
    planned = RemapReport(
        input=spec,
        mode="experts",
        strategy="copy",
        mapping=block_mapping(plan),
        weights=weights,
        out=out,
        config_changes=changes,
        notes=_notes(plan),
        experts=_summary(plan),
    )
    config_bytes = dump_like(raw, original) if changes or out is not None else None

    write_weights = _writer(plan, header, weights)

    return Plan(
        planned, ckpt, weights, header, config_path=cfg.path, config_bytes=config_bytes, compose=write_weights
    )


def _writer(
    plan: ExpertPlan, header: Header, weights: str
) -> Callable[[str, str, Callable[[int], None] | None], None]:
    """The remap plan's ``compose``: ``plan``'s tensors written to ``dest`` with the source's metadata and mode."""

    def write_weights(dest: str, link: str, progress: Callable[[int], None] | None) -> None:
        compose(
            dest,
            plan.specs,
            plan.pieces(),
            metadata=header.metadata,
            mode=target_mode(weights),
            link=link,
            progress=progress,
        )

    return write_weights


def _today_version(raw: dict[str, object]) -> list[ConfigChange]:
    """``peft_version`` raised to 0.19.1 when it is older: the fused factors written are in the layout of PEFT ≥
    0.19.1, and an older version would make verify (AD271) and this remap read them as an old PEFT's."""
    if "peft_version" not in raw:
        return []
    release = peft_release(raw["peft_version"])
    if release is None or release >= FIXED:
        return []
    old, raw["peft_version"] = raw["peft_version"], TODAY
    return [ConfigChange("peft_version", old, TODAY, "experts")]


def _relayout_plan(
    spec: str,
    ckpt: Checkpoint,
    header: Header,
    cfg: AdapterConfig,
    plan: ExpertPlan,
    weights: str,
    out: str | None,
) -> Plan:
    """``--experts fused`` of a fused adapter in an old PEFT's layout: the same keys with each fused module's
    factors in today's layout, and ``peft_version`` raised to match."""
    assert cfg.path is not None and plan.old_layout is not None
    with open(cfg.path, "rb") as f:
        original = f.read()
    raw = json.loads(original.decode("utf-8"))
    changes = _today_version(raw)
    read, written = plan.tensor_counts()
    tensors = {
        f"{b.fused_module} (lora_A {[b.experts * b.fused_rank, b.fused_out]}, lora_B "
        f"{[b.fused_in, b.fused_rank * b.experts]})": f"lora_A {[b.experts * b.fused_rank, b.fused_in]}, "
        f"lora_B {[b.fused_out, b.fused_rank * b.experts]}"
        for b in plan.blocks
    }
    planned = RemapReport(
        input=spec,
        mode="experts",
        strategy="copy",
        mapping={},
        weights=weights,
        out=out,
        config_changes=changes,
        notes=[f"{plan.old_layout}; rewritten in the layout of PEFT ≥ {TODAY}", RELAYOUT_EXACT],
        experts={
            "direction": "fused",
            "relayout": {"from": cfg.raw.get("peft_version"), "to": TODAY, "why": plan.old_layout},
            "blocks": len(plan.blocks),
            "experts": sorted({b.experts for b in plan.blocks}),
            "tensors_before": plan.tensors_in,
            "tensors_after": len(plan.specs),
            "tensors_read": read,
            "tensors_written": written,
            "tensors_copied": plan.copied,
            "exact": RELAYOUT_EXACT,
        },
        rewrites=[
            {
                "rewrite": "experts",
                "from": f"fused, PEFT {cfg.raw.get('peft_version', '< 0.18')}'s layout",
                "to": f"fused, PEFT ≥ {TODAY}'s layout",
                "tensors": tensors,
            }
        ],
    )

    write_weights = _writer(plan, header, weights)

    return Plan(
        planned,
        ckpt,
        weights,
        header,
        config_path=cfg.path,
        config_bytes=dump_like(raw, original),
        compose=write_weights,
    )


def _already(
    spec: str, ckpt: Checkpoint, header: Header, cfg: AdapterConfig | None, direction: str, out: str | None
) -> Plan | None:
    """An adapter whose expert LoRA is already in ``direction``'s layout: nothing to do (exit 0, strategy
    ``none``, as ``--vl`` on a text adapter); with ``--out`` an unchanged copy."""
    from adapterdoc.adapter.expert_picture import expert_picture

    if cfg is None or cfg.path is None:
        return None
    if _other_form(header, direction):
        return None
    pic = expert_picture({k: t.shape for k, t in header.tensors.items()}, config=cfg)
    if pic.layout != direction:
        return None
    weights = ckpt.weights_path
    assert weights is not None
    planned = RemapReport(
        input=spec,
        mode="experts",
        strategy="none",
        mapping={},
        weights=weights,
        out=out,
        notes=[f"the expert LoRA is already {direction}: nothing to do"],
    )
    with open(cfg.path, "rb") as f:
        config_bytes = f.read() if out is not None else None
    return Plan(planned, ckpt, weights, header, config_path=cfg.path, config_bytes=config_bytes)


def _other_form(header: Header, direction: str) -> bool:
    """A quick look (one regular expression per name, no parsing) for a key that is plainly in the other expert
    form, so the adapter cannot be already ``direction``; when it says nothing, the whole picture decides."""
    other = _PER_EXPERT_KEY if direction == "fused" else _FUSED_KEY
    return any(other.search(name) for name in header.tensors)


def _keys_of(b: Block) -> list[tuple[str, str]]:
    return [b.fused_keys, *b.leaf_keys.values()]


def _keys_only(cfg: AdapterConfig) -> bool:
    """Whether the class the adapter was made for (PEFT's ``auto_mapping.base_model_class``) is one whose
    per-expert keys PEFT fuses at load without a config rewrite (:func:`~adapterdoc.remap.expert_config.peft_fuses_keys_only`)."""
    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.remap.expert_config import peft_fuses_keys_only

    mapping = cfg.raw.get("auto_mapping")
    cls = mapping.get("base_model_class") if isinstance(mapping, dict) else None
    return any(lay.model_class == cls and peft_fuses_keys_only(name) for name, lay in LAYOUTS.items())


def _summary(plan: ExpertPlan) -> dict[str, object]:
    ranks: dict[str, dict[str, object]] = {}
    for b in plan.blocks:
        per = dict(b.leaf_ranks)
        before, after = (per, b.fused_rank) if plan.direction == "fused" else (b.fused_rank, per)
        ranks.setdefault(b.param, {"before": before, "after": after})
    read, written = plan.tensor_counts()
    return {
        "direction": plan.direction,
        "names": {
            "container": plan.style.container,
            "gate": plan.style.gate,
            "up": plan.style.up,
            "down": plan.style.down,
            "from": plan.style_reason,
        },
        "blocks": len(plan.blocks),
        "experts": sorted({b.experts for b in plan.blocks}),
        "tensors_before": plan.tensors_in,
        "tensors_after": len(plan.specs),
        "tensors_read": read,
        "tensors_written": written,
        "tensors_copied": plan.copied,
        "rank": ranks,
        "exact": EXACT,
    }


def _notes(plan: ExpertPlan) -> list[str]:
    notes = []
    if plan.old_layout is not None:
        notes.append(f"{plan.old_layout}: its factors were read in that layout")
    if plan.direction == "per-expert":
        notes.append(
            f"per-expert names: {plan.style.container}.experts.N.{{{','.join(plan.style.leaves)}}} "
            f"({plan.style_reason})"
        )
        if any(b.param == GATE_UP for b in plan.blocks):
            notes.append(
                "target_modules names the expert leaves: a shared expert or dense MLP with the same leaf "
                "names is targeted too (PEFT starts it at zero, so outputs are unchanged)"
            )
    notes.append(EXACT)
    return notes
