"""The vLLM profile (``verify --profile vllm``): vLLM's adapter rules as its own source states them, AD401-AD417.

Every rule here describes :data:`VLLM_VERSION`; the messages say so, because vLLM changes these rules between
releases. The findings' explanations are in :mod:`adapterdoc.codes.serving`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar, TypeGuard

from adapterdoc.engines.base import EngineNeeds, Profile, ProfileInput, ProfileOptions, engine_finding
from adapterdoc.engines.options import MAX_LORA_RANK, SERVED_AS
from adapterdoc.engines.served import is_vl, served_layout, served_modules

if TYPE_CHECKING:
    from adapterdoc.adapter import AdapterConfig, LoraKey
    from adapterdoc.adapter.expert_picture import ExpertBlock, ExpertPicture
    from adapterdoc.ml.meta import ExpectedModel
    from adapterdoc.quant import Quantization, QuantizedModule
    from adapterdoc.report.findings import Finding
    from adapterdoc.report.verify_report import VerifySubject

VLLM_VERSION = "0.33.0"
"""The vLLM release whose source these rules were read from: ``vllm/lora/peft_helper.py``, ``lora_model.py``,
``utils.py``, ``model_manager.py``, ``worker_manager.py``, ``request.py``, ``layers/fused_moe.py``,
``config/lora.py`` and the MoE model classes' ``is_3d_moe_weight``, in the released wheel (commit
:data:`VLLM_COMMIT`)."""
VLLM_COMMIT = "4ba787ec9"
"""The commit of :data:`VLLM_VERSION` (``vllm/_version.py``'s ``__commit_id__`` in the 0.33.0 wheel)."""

VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``--max-lora-rank``."""
VLLM_DEFAULT_MAX_LORA_RANK = 16
"""vLLM's ``--max-lora-rank`` when none is given (:data:`~adapterdoc.engines.options.MAX_LORA_RANK`'s default)."""

_VLLM_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")
_VLLM_HEADS = ("classifier", "score")


class VllmProfile(Profile):
    name = "vllm"
    summary = "vLLM serving"
    options = ("max_lora_rank", "served_as")
    option_help: ClassVar[Mapping[str, str]] = {
        "max_lora_rank": f"vLLM one of {', '.join(map(str, VLLM_MAX_LORA_RANKS))} (default {VLLM_DEFAULT_MAX_LORA_RANK})"
    }

    def check_options(self, options: ProfileOptions) -> None:
        running = options.profile_rules
        if running is not self and "max_lora_rank" in running.options:
            return  # the running profile reads --max-lora-rank itself and checks it by its own rule
        if MAX_LORA_RANK.of(options) not in VLLM_MAX_LORA_RANKS:
            allowed = ", ".join(map(str, VLLM_MAX_LORA_RANKS))
            raise ValueError(
                f"max_lora_rank must be one of {allowed} (vLLM {VLLM_VERSION}), got {MAX_LORA_RANK.of(options)}"
            )

    def run_fields(self, options: ProfileOptions, *, active: bool) -> dict[str, object]:
        return {
            "max_lora_rank": MAX_LORA_RANK.of(options) if active else None,
            "vllm_version": VLLM_VERSION if active else None,
        }

    def needs(self, base_layout: str | None, options: ProfileOptions | None = None) -> EngineNeeds | None:
        """vLLM serves the base's own class (or ``served_as``): its layout's keys and the expert layout that class
        reads (``Experts.served_fused``); it honours ``use_rslora``, the patterns and a regex ``target_modules``
        (names are matched on the tensors, PEFTHelper only requires the field), refuses DoRA and
        ``modules_to_save`` other than the classification heads."""
        from adapterdoc.layouts import LAYOUTS

        served_as = (SERVED_AS.of(options) if options else None) or ("vl" if is_vl(base_layout) else "text")
        layout = served_layout(base_layout, served_as)
        facts = LAYOUTS[layout].experts if layout in LAYOUTS else None
        reads = None if facts is None or facts.served_fused is None else facts.served_fused
        return EngineNeeds(
            keys="served",
            experts=None if reads is None else ("fused" if reads else "per-expert"),
            modules_to_save_heads=_VLLM_HEADS,
            version=VLLM_VERSION,
        )

    def label(self, options: ProfileOptions) -> str:
        return f"vllm {VLLM_VERSION}, max LoRA rank {MAX_LORA_RANK.of(options)}"

    def rules(self, a: ProfileInput) -> list[Finding]:
        out = _config_findings(a.spec, a.config, bool(a.subject.config.get("inferred")), a.keys, a.options)
        out += _served_findings(a.spec, a.config, a.keys, a.meta, a.options, a.subject)
        return out + _expert_findings(a.spec, a.config, a.keys, a.meta, self.served_as(a.meta, a.options))

    def served_as(self, meta: ExpectedModel, options: ProfileOptions) -> str:
        return _served_as(SERVED_AS.of(options), meta)[0]

    def quantized_base(
        self, spec: str, q: Quantization, quantized: Sequence[QuantizedModule]
    ) -> list[Finding]:
        from adapterdoc.engines.quantized import vllm_findings

        return vllm_findings(spec, q, quantized, VLLM_VERSION)


PROFILE = VllmProfile()


def _config_findings(
    spec: str, acfg: AdapterConfig, inferred: bool, keys: list[LoraKey], options: ProfileOptions
) -> list[Finding]:
    """The config and tensor-name rules (AD401-AD412, AD417)."""
    raw = acfg.raw
    out: list[Finding] = []

    def add(code: str, msg: str, *, key: str | None = None, hint: str | None = None) -> None:
        out.append(_make(code, spec, msg, key=key, hint=hint))

    missing = [f for f in ("r", "lora_alpha", "target_modules") if f not in raw or inferred]
    if missing:
        add("AD401", "missing required configuration fields: " + ", ".join(missing))
    ranks: list[object] = [raw.get("r", 8), *(raw.get("rank_pattern") or {}).values()]
    good = [r for r in ranks if _is_rank(r)]
    bad = [r for r in ranks if not _is_rank(r)]
    limit = MAX_LORA_RANK.of(options)
    if bad:
        add("AD417", f"non-positive or non-integer rank(s) {bad}", key="rank_pattern")
    else:
        top = max(good)
        if limit is not None and top > limit:
            add(
                "AD411",
                f"LoRA rank {top} is greater than max_lora_rank {limit}",
                hint=f"start the server with --max-lora-rank {_rank_slot(top)} and verify with the same value",
            )
    if acfg.use_dora or any(k.role == "magnitude" for k in keys):
        add("AD402", "does not support DoRA (use_dora / lora_magnitude_vector)")
    mts = raw.get("modules_to_save")
    if mts and not set(mts) <= set(_VLLM_HEADS):
        add("AD403", f'modules_to_save {mts} is not None or ["classifier", "score"]', key="modules_to_save")
    full_heads = sorted({k.module.rpartition(".")[2] for k in keys if k.role == "full"} & set(_VLLM_HEADS))
    if len(full_heads) > 1:
        add(
            "AD403",
            f"full weights for {full_heads}: only one full classification module is supported per adapter",
            key="modules_to_save",
        )
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
    return out


def _is_rank(r: object) -> TypeGuard[int]:
    """A positive integer (not a bool)."""
    return isinstance(r, int) and not isinstance(r, bool) and r > 0


def _served_findings(
    spec: str,
    acfg: AdapterConfig,
    keys: list[LoraKey],
    meta: ExpectedModel,
    options: ProfileOptions,
    report: VerifySubject,
) -> list[Finding]:
    """The model as served (AD416), tower LoRA (AD414), leaf names (AD413) and full paths (AD415)."""
    from adapterdoc.adapter import fused_expert_owner, parse_key
    from adapterdoc.layouts import tower_segment
    from adapterdoc.layouts.moves import best_move, candidate_moves

    out: list[Finding] = []

    def add(code: str, msg: str, *, key: str | None = None, hint: str | None = None) -> None:
        out.append(_make(code, spec, msg, key=key, hint=hint))

    mts = acfg.raw.get("modules_to_save")
    served_as, why = _served_as(SERVED_AS.of(options), meta)
    own_layout = meta.built_as.default_layout if meta.built_as else meta.layout
    add("AD416", f"served as {served_as}: {why}")
    lora_mods = sorted({fused_expert_owner(k.module) for k in keys if k.is_lora})
    towers = [m for m in lora_mods if tower_segment(m)]
    if towers:
        add(
            "AD414",
            f"{len(towers)} LoRA module(s) outside the language model are not applied: no tower or connector "
            "module gets a LoRA wrapper unless the server runs --enable-tower-connector-lora on a class that "
            "supports it (and not language_model_only)",
            key=towers[0],
        )
    lm_mods = [m for m in lora_mods if not tower_segment(m)]
    heads = set(mts or [])
    leaves_ok = {leaf for leaf, outside in meta.lora_capable_leaves.items() if outside}
    layout = served_layout(own_layout, served_as)
    per_expert = _packed_expert_leaves(layout)
    odd = [m for m in lm_mods if not _expected(m, leaves_ok, heads, per_expert)]
    if odd:
        shown = sorted(leaves_ok | {f"experts.N.{leaf}" for leaf in per_expert or ()})
        add(
            "AD413",
            f"expected target modules in {shown} but received {sorted({_suffix(m) for m in odd})}",
            key=odd[0],
        )
    names = served_modules(meta, layout)
    if names is not None and lm_mods:
        absent = [m for m in lm_mods if m not in names and _packed_owner(m, per_expert) not in names]
        if absent:

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
            add(
                "AD415",
                f"{len(absent)} of {len(lm_mods)} LoRA module path(s) do not exist in the model as served "
                f"({layout}); vLLM checks only the last name component and silently serves the base model",
                key=absent[0],
                hint=mv.command(spec, report.layout) if mv else None,
            )
    return out


def _expert_findings(
    spec: str, acfg: AdapterConfig, keys: list[LoraKey], meta: ExpectedModel, served_as: str
) -> list[Finding]:
    """The expert layout vLLM reads for the served class (AD418) and the fused pair it requires (AD419).

    vLLM chooses the layout from the model class (``is_3d_moe_weight``; the registry's ``Experts.served_fused``),
    not from the file, unless the server runs ``--enable-mixed-moe-lora-format`` (then the 2-D wrapper reads
    both, the fused form when the request sets ``is_3d_lora_weight``). ``FusedMoE3DWithLoRA`` stacks PEFT's
    ``experts.base_layer`` (gate_up) and ``experts`` (down) only when ``experts`` is there, asserting gate_up
    beside it (``_stack_moe_lora_weights``); its name check refuses per-expert ``experts.N.*`` modules
    (``check_unexpected_modules``). ``FusedMoEWithLoRA`` packs per-expert modules and refuses a fused ``experts``
    tensor at load (``_validate_moe_lora_format``); a fused gate_up alone is skipped by the name check
    (``"base_layer" in name``) and applied nowhere (vllm/lora/model_manager.py, lora_model.py, worker_manager.py)."""
    from adapterdoc.adapter.expert_picture import expert_picture
    from adapterdoc.layouts import LAYOUTS

    pic = expert_picture({k.key: () for k in keys}, config=acfg)
    if not pic.routed:
        return []
    layout = served_layout(meta.built_as.default_layout if meta.built_as else meta.layout, served_as)
    served = LAYOUTS.get(layout) if layout is not None else None
    facts = served.experts if served is not None else None
    if (
        served is None
        or facts is None
        or facts.served_fused is None
        or pic.layout not in ("per-expert", "fused")
    ):
        return []
    reads = "fused" if facts.served_fused else "per-expert"
    out: list[Finding] = []
    if pic.layout != reads:
        example = next(k.key for b in pic.routed for k in b.keys)
        mixed = "--enable-mixed-moe-lora-format"
        if pic.layout == "per-expert":
            what = f"its name check refuses the per-expert modules at load, unless the server runs {mixed}"
        elif any(_outer(b) for b in pic.routed):
            what = (
                "it refuses the fused 3-D expert weights (experts.base_layer = gate_up, experts = down) at load "
                f"(2-D MoE LoRA wrapper), unless the server runs {mixed} and the request sets is_3d_lora_weight"
            )
        else:
            what = "the fused gate_up (experts.base_layer) is skipped by its name check and applied nowhere"
        out.append(
            _make(
                "AD418",
                spec,
                f"reads {reads} expert LoRA for {served.model_class} (is_3d_moe_weight "
                f"{facts.served_fused}); the adapter is {pic.layout}: {what}",
                key=example,
                hint=f"adapterdoc remap {spec} --experts {reads} --out DIR",
            )
        )
    elif reads == "per-expert":
        out += _packing_findings(spec, pic)
    elif reads == "fused":
        half = [b for b in pic.routed if len(b.projections) == 1]
        if half:
            only = next(iter(half[0].projections))
            out.append(
                _make(
                    "AD419",
                    spec,
                    f"{len(half)} MoE block(s) carry only {only} of the fused pair; "
                    + (
                        "vLLM reads the lone `experts` LoRA as down_proj and its stacking asserts gate_up "
                        "(experts.base_layer) beside it: the load fails"
                        if _outer(half[0])
                        else "the stacking runs only when the `experts` (down_proj) LoRA is there, so gate_up is "
                        "applied nowhere"
                    ),
                    key=half[0].path,
                )
            )
    return out


def _packing_findings(spec: str, pic: ExpertPicture) -> list[Finding]:
    """What ``PackedLoRALayerWeights.pack_moe`` (``vllm/lora/lora_weights.py``) needs of per-expert LoRA on a 2-D
    class when the adapter is added: every expert of a block with expert LoRA carries gate, up and down (it
    asserts each of the three, AD476), and one projection has one rank across the experts (ValueError, AD477)."""
    out: list[Finding] = []
    gaps = []
    for b in pic.routed:
        n = b.experts or 0
        lack = {p: sorted(set(range(n)) - set(b.covered.get(p, []))) for p in ("gate", "up", "down")}
        lack = {p: e for p, e in lack.items() if e}
        if lack:
            gaps.append((b, lack))
    if gaps:
        b, lack = gaps[0]
        what = "; ".join(f"{p} for expert(s) {_span(e)}" for p, e in lack.items())
        out.append(
            _make(
                "AD476",
                spec,
                f"{len(gaps)} MoE block(s) lack a projection's LoRA for some experts (first: {b.path}: {what}); "
                "pack_moe asserts gate, up and down LoRA for every expert: the adapter fails to load",
                key=b.path,
            )
        )
    for b in pic.routed:
        ranks: dict[str, set[int]] = {}
        for k in b.keys:
            if k.form == "per-expert" and k.role == "lora_A" and k.shape:
                ranks.setdefault(k.projection, set()).add(int(k.shape[0]))
        uneven = {p: sorted(r) for p, r in ranks.items() if len(r) > 1}
        if uneven:
            p, r = next(iter(uneven.items()))
            out.append(
                _make(
                    "AD477",
                    spec,
                    f"the experts of {b.path} have different LoRA ranks for {p} ({r}); pack_moe refuses it "
                    "(ValueError): the adapter fails to load",
                    key=b.path,
                )
            )
            break
    return out


def _span(experts: list[int]) -> str:
    return ", ".join(map(str, experts[:4])) + (f" and {len(experts) - 4} more" if len(experts) > 4 else "")


def _outer(block: ExpertBlock) -> bool:
    """Whether a fused block has a LoRA on ``experts`` itself (no ``base_layer``): vLLM reads that one as down_proj,
    whatever parameter PEFT wrapped (PEFT saves a lone wrapper there even when only gate_up is targeted)."""
    return any(k.form == "fused" and k.leaf == "experts" for k in block.keys)


def _make(code: str, spec: str, msg: str, *, key: str | None = None, hint: str | None = None) -> Finding:
    return engine_finding(f"vLLM {VLLM_VERSION}", code, spec, msg, key=key, hint=hint)


def _rank_slot(rank: int) -> int:
    return next((r for r in VLLM_MAX_LORA_RANKS if r >= rank), VLLM_MAX_LORA_RANKS[-1])


def _packed_expert_leaves(layout: str | None) -> tuple[str, ...] | None:
    """The per-expert leaves vLLM packs into a 2-D class's ``experts`` module: ``process_packed_modules_mapping``
    gives ``packed_modules_mapping["experts"]`` the expert mapping's ``experts.{e}.{gate,down,up}_proj`` when the
    class leaves ``is_3d_moe_weight`` at ``False`` (``vllm/lora/utils.py``); ``None`` for a 3-D or dense class."""
    from adapterdoc.layouts import LAYOUTS

    facts = LAYOUTS[layout].experts if layout in LAYOUTS else None
    if facts is None or facts.served_fused is not False:
        return None
    return facts.per_expert


def _suffix(module: str) -> str:
    """What ``check_unexpected_modules`` compares: the name from ``experts`` on for an expert module, else the
    last component."""
    from adapterdoc.adapter import fused_expert_owner

    owner = fused_expert_owner(module)
    i = owner.find(".experts")
    return owner[i + 1 :] if i >= 0 else owner.rpartition(".")[2]


def _expected(module: str, leaves_ok: set[str], heads: set[str], per_expert: tuple[str, ...] | None) -> bool:
    """vLLM 0.33.0's name check for one LoRA module (``LoRAModel.from_local_checkpoint``): an expert module's
    suffix must be ``experts`` or, on a 2-D class, ``experts.{e}.<leaf>``; any other module's last component
    must be a supported (or saved) module."""
    suffix = _suffix(module)
    if suffix == "experts" or suffix.startswith("experts."):
        parts = suffix.split(".")
        if suffix == "experts":
            return "experts" in leaves_ok
        return per_expert is not None and len(parts) == 3 and parts[1].isdigit() and parts[2] in per_expert
    return suffix in leaves_ok or suffix in heads


def _packed_owner(module: str, per_expert: tuple[str, ...] | None) -> str | None:
    """The served ``experts`` module a per-expert LoRA module is packed into on a 2-D class (``pack_moe``)."""
    if per_expert is None:
        return None
    owner, sep, rest = module.partition(".experts.")
    parts = rest.split(".")
    if sep and len(parts) == 2 and parts[0].isdigit() and parts[1] in per_expert:
        return f"{owner}.experts"
    return None


def _leaf(module: str) -> str:
    from adapterdoc.adapter import fused_expert_owner

    owner = fused_expert_owner(module)
    return "experts" if owner.endswith(".experts") or owner == "experts" else owner.rpartition(".")[2]


def _vllm_accepts(k: LoraKey) -> bool:
    from adapterdoc.adapter import WRAPPER

    name = k.key[len(WRAPPER) :] if k.wrapped else k.key
    if "base_layer" in name:
        return True
    if name.endswith(("lora_A.weight", "lora_B.weight", "lora_embedding_A", "lora_embedding_B")):
        return True
    return k.role == "full" and k.module.rpartition(".")[2] in _VLLM_HEADS


def _served_as(explicit: str | None, meta: ExpectedModel) -> tuple[str, str]:
    if explicit:
        return explicit, "--served-as"
    # vLLM serves a base folder as its config's own class, whatever class the adapter was made for
    layout = meta.built_as.default_layout if meta.built_as else meta.layout
    cls = meta.built_as.default_class if meta.built_as else meta.model_class
    if is_vl(layout):
        return "vl", (
            f"inferred: the base is {cls}, which vLLM serves with its VL class "
            "(language_model_only skips the tower but keeps the naming)"
        )
    return "text", f"inferred: the base is {cls}"
