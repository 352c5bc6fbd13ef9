"""Per-expert LoRA on a base whose experts transformers 5 fuses: the conversion PEFT makes at load, made here.

An adapter written for a transformers-4 MoE model has one LoRA per expert and projection
(``mlp.experts.{e}.gate_proj``, Mixtral's ``block_sparse_moe.experts.{e}.w1``). On a transformers-5 base PEFT
rewrites the config at injection (``_convert_peft_config_moe``: the projections become ``target_parameters``
``gate_up_proj`` / ``down_proj``, gate_up's rank and alpha doubled) and the weights at load
(``convert_peft_adapter_state_dict_for_transformers``: lora_A concatenated along the rank, lora_B block-diagonal,
experts stacked). The meta model's inventory already holds the fused layers PEFT makes; this module assigns every
per-expert module to the fused layer its weight loads into (transformers' own rename of ``M.weight``), runs PEFT's
own weight conversion on meta tensors to learn the names and shapes, and again on the real tensors, one fused
layer at a time, while the merge writes. The merge then sees exactly the adapter PEFT would have loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adapterdoc.adapter import WRAPPER
from adapterdoc.report.findings import Finding, make

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, PeftModel

    from adapterdoc.checkpoint import Checkpoint
    from adapterdoc.ml.inject import Injection
    from adapterdoc.ml.names import NameMap

_ROLES = ("lora_A", "lora_B")


@dataclass(frozen=True)
class Converted:
    """One tensor of the fused adapter PEFT would load, computed from per-expert adapter tensors."""

    key: str
    shape: tuple[int, ...]
    sources: tuple[str, ...]
    """The adapter tensors PEFT converts together into this tensor (and its lora_A/lora_B partner)."""


@dataclass(frozen=True)
class ExpertConversion:
    """The per-expert modules converted to PEFT's fused layers, and how to compute the fused tensors."""

    converted: dict[str, Converted] = field(default_factory=dict)
    """Fused key (saved naming, ``base_model.model.…``) → what it is made of."""
    sources: dict[str, list[str]] = field(default_factory=dict)
    """Fused module → the per-expert modules it replaces (in the adapter's naming)."""
    findings: list[Finding] = field(default_factory=list)
    unconverted: dict[str, str] = field(default_factory=dict)
    """Per-expert module → the fused parameter its weight loads into, where PEFT builds no LoRA layer on that
    parameter for this config (PEFT converts per-expert LoRA only for the model types its tables know)."""
    unused: list[str] = field(default_factory=list)
    """Per-expert modules that land on a fused layer but cannot be converted (each group has its AD509)."""
    peft_model: PeftModel | None = None
    peft_config: LoraConfig | None = None

    def convert(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """PEFT's conversion of real per-expert tensors (saved naming) into its fused tensors (saved naming)."""
        # a conversion exists only where PEFT made one: with the injection's model and the adapter's config
        assert self.peft_model is not None and self.peft_config is not None
        return _peft_convert(self.peft_model, self.peft_config, tensors)


def _peft_convert(
    pm: PeftModel, config: LoraConfig, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    import copy

    from peft.utils.transformers_weight_conversion import convert_peft_adapter_state_dict_for_transformers

    from adapterdoc.ml.quiet import no_warnings

    with no_warnings():
        return convert_peft_adapter_state_dict_for_transformers(
            pm, copy.deepcopy(config), dict(tensors), adapter_name="default"
        )


def convert_experts(
    groups: dict[str, dict[str, str]],
    adapter: Checkpoint,
    name_map: NameMap,
    inv: Injection,
    config: LoraConfig,
) -> ExpertConversion:
    """Replace, in ``groups`` (module → role → key), the per-expert modules PEFT converts by the fused modules of
    ``inv`` (the meta injection) they become. ``config`` is the adapter's LoraConfig as written (PEFT converts the
    weights against it). Modules that land on no fused layer are left for the usual placement (and its AD501)."""
    import torch

    converted: dict[str, Converted] = {}
    sources_of: dict[str, list[str]] = {}
    findings: list[Finding] = []
    unconverted: dict[str, str] = {}
    unused: list[str] = []

    def refuse(modules: list[str], finding: Finding) -> None:
        findings.append(finding)
        for m in modules:
            groups.pop(m, None)
        unused.extend(sorted(modules))

    by_param = {t.param: t for t in inv.targets.values() if t.kind == "experts"}
    members: dict[str, list[str]] = {}
    for module in groups:
        if module in inv.targets:
            continue
        mem, pattern = name_map.memory_name(f"{module}.weight")
        if pattern is None:
            continue
        target = by_param.get(mem)
        if target is None:
            unconverted[module] = mem
        else:
            members.setdefault(target.module, []).append(module)
    for fused, modules in members.items():
        if fused in groups:
            refuse(
                modules,
                make(
                    "AD509",
                    f"`{fused}` has both fused LoRA tensors and per-expert ones (e.g. `{modules[0]}`); "
                    "PEFT would load one over the other",
                    key=fused,
                ),
            )
            continue
        extra = sorted({r for m in modules for r in groups[m] if r not in _ROLES})
        if extra:
            refuse(
                modules,
                make(
                    "AD509",
                    f"per-expert modules of `{fused}` carry {', '.join(extra)}; PEFT converts only lora_A "
                    "and lora_B of per-expert LoRA",
                    key=fused,
                ),
            )
            continue
        sources = tuple(sorted(groups[m][r] for m in modules for r in _ROLES if r in groups[m]))
        meta = {k: torch.empty(adapter.tensors[k].shape, device="meta") for k in sources}
        assert inv.pm is not None  # fused expert targets come from the injection's PeftModel
        try:
            result = _peft_convert(inv.pm, config, meta)
        except Exception as e:  # PEFT's own refusal (stacking a partial expert set, mixed dims)
            from adapterdoc.ml.build import first_line

            refuse(
                modules,
                make(
                    "AD509",
                    f"PEFT cannot convert the {len(modules)} per-expert modules of `{fused}` to its fused "
                    f"layout: {first_line(e)}",
                    key=fused,
                ),
            )
            continue
        want = {f"{WRAPPER}{fused}.{r}.weight": r for r in _ROLES}
        if set(result) != set(want):
            got = ", ".join(sorted(set(result) - set(sources))) or "nothing new"
            refuse(
                modules,
                make(
                    "AD509",
                    f"PEFT's conversion of the per-expert modules of `{fused}` gives {got}, not the fused "
                    "layer's lora_A and lora_B",
                    key=fused,
                ),
            )
            continue
        for key in want:
            converted[key] = Converted(key, tuple(int(d) for d in result[key].shape), sources)
        groups[fused] = {role: key for key, role in want.items()}
        for m in modules:
            del groups[m]
        sources_of[fused] = sorted(modules)
    if sources_of:
        n = sum(len(v) for v in sources_of.values())
        findings.append(
            make(
                "AD508",
                f"{n} per-expert LoRA modules converted to PEFT's fused layout on {len(sources_of)} expert "
                "parameters (e.g. "
                f"`{next(iter(sources_of.values()))[0]}` → `{next(iter(sources_of))}`), as PEFT converts them "
                "at load",
            )
        )
    return ExpertConversion(
        converted=converted,
        sources=sources_of,
        findings=findings,
        unconverted=unconverted,
        unused=unused,
        peft_model=inv.pm,
        peft_config=config,
    )


def unconverted_finding(module: str, param: str, spec: str) -> Finding:
    """AD501 for a per-expert module PEFT leaves unloaded: it names the fused parameter and the way out."""
    return make(
        "AD501",
        f"`{module}` is a per-expert LoRA module of `{param}`, which PEFT does not convert to its fused layout "
        "on this base (it would load none of it)",
        key=module,
        hint=f"convert the adapter to PEFT's fused layout: adapterdoc remap {spec} --experts fused",
    )


def refused_finding(error: str, spec: str) -> Finding:
    """PEFT builds nothing for the adapter's config on this base: one finding with PEFT's reason."""
    hint = None
    if "fused into" in error:
        hint = (
            "transformers 5 fuses these projections into one parameter and PEFT refuses LoRA on one half of it; "
            "target both halves (gate and up), or merge with the stack the adapter was trained on "
            f"(`adapterdoc inspect {spec}` shows the expert coverage)"
        )
    return make("AD507", f"PEFT refuses the adapter's config on this base: {error}", hint=hint)


__all__ = ["Converted", "ExpertConversion", "convert_experts", "refused_finding", "unconverted_finding"]
