"""``remap --experts per-expert|fused``: rewrite a mixture-of-experts adapter between one LoRA per expert and
projection and PEFT's fused-parameter form, exactly, as a streamed copy (one MoE block in memory at a time).

The fused form is PEFT's ParamWrapper layout (``peft/tuners/lora/layer.py``, ``ParamWrapper.get_delta_weight``):
``lora_A`` ``[E·r, in]`` with expert e's rows ``e·r … e·r+r-1``, ``lora_B`` ``[out, r·E]`` with expert e's rank k in
column ``k·E + e``; ``gate_up_proj`` (the inner wrapper, ``experts.base_layer``, when ``down_proj`` is targeted too)
holds gate's rows then up's. Per-expert → fused is PEFT's own load conversion
(``peft/utils/transformers_weight_conversion.py``: ``lora_A`` of gate and up concatenated along the rank, ``lora_B``
block-diagonal, rank and alpha of ``gate_up_proj`` doubled); fused → per-expert keeps the rank: expert e's gate and
up take the same ``A_e`` and their rows of ``B_e``. Both are permutations of elements plus zero blocks, done on raw
bytes (:mod:`adapterdoc.st.compose`), so every dtype is moved bit for bit and no torch is imported.

Fused factors in an old PEFT's layout (:mod:`adapterdoc.adapter.expert_layout`) are read as such: ``per-expert``
splits them right, ``fused`` rewrites them in today's layout (:func:`plan_relayout`), exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from adapterdoc.adapter import WRAPPER, AdapterConfig, LoraKey, parse_key
from adapterdoc.adapter.expert_layout import (
    FIXED,
    differs_from_today,
    pair_layout,
    swap_factors,
    transposed_base,
    written_by,
)
from adapterdoc.errors import RefusedError
from adapterdoc.remap.expert_names import (
    DOWN,
    FUSED_PARAMS,
    GATE_UP,
    ExpertNames,
    fused_owner_prefix,
    fused_style,
    per_expert_module,
    per_expert_style,
)
from adapterdoc.st.compose import Spec, element_bytes, transpose
from adapterdoc.st.header import Header
from adapterdoc.st.tensors import TensorSource

Pieces = Iterator["bytes | bytearray | memoryview"]
Producer = Callable[[TensorSource], Pieces]
"""Yields the bytes of one group's tensors, in order, reading the input through the one open source."""
Group = tuple[list[Spec], Producer]


@dataclass(frozen=True)
class Block:
    """One MoE projection of one layer (``gate_up_proj`` or ``down_proj`` of ``owner``), in both forms."""

    owner: str
    """The fused module without the wrapper, ``...mlp.experts``."""
    param: str
    pre: str
    wrapped: bool
    experts: int
    dtype: str
    fused_in: int
    fused_out: int
    leaf_ranks: Mapping[str, int]
    """The per-expert rank of each leaf (gate, up or down); the fused rank is their sum."""
    leaf_keys: Mapping[tuple[int, str], tuple[str, str]] = field(default_factory=dict)
    """(expert, leaf) → (lora_A key, lora_B key) of the per-expert form."""
    fused_keys: tuple[str, str] = ("", "")
    fused_module: str = ""
    fused_rank: int = 0
    """The rank of the fused module (gate_up: gate's plus up's when fused from per-expert LoRA)."""
    swapped: bool = False
    """The input's fused factors are the other way round from today's PEFT (``lora_A`` ``[E·r, out]``,
    ``lora_B`` ``[in, r·E]``, as PEFT 0.17–0.18 wrote them); ``fused_in`` / ``fused_out`` are the true ones."""

    @property
    def leaves(self) -> list[str]:
        return list(self.leaf_ranks)


@dataclass(frozen=True)
class ExpertPlan:
    """The whole rewrite: the output tensors in order with the producer of each group's bytes."""

    direction: str
    style: ExpertNames
    style_reason: str
    blocks: list[Block]
    groups: list[Group]
    """(specs, producer): ``producer(source)`` yields the bytes of those tensors, in order."""
    tensors_in: int
    copied: int
    header: Header | None = None
    """The input's header (the file every producer reads)."""
    parsed: Mapping[str, LoraKey] = field(default_factory=dict)
    """Every input tensor name, parsed once."""
    old_layout: str | None = None
    """Why the input's fused factors were read in an old PEFT's layout (:attr:`Block.swapped`), else ``None``."""

    def tensor_counts(self) -> tuple[int, int]:
        """(tensors read, tensors written) by the conversion: two per fused module, two per expert and leaf."""
        fused = 2 * len(self.blocks)
        per_expert = sum(2 * len(b.leaf_keys) for b in self.blocks)
        if self.direction == "relayout":
            return fused, fused
        return (per_expert, fused) if self.direction == "fused" else (fused, per_expert)

    @property
    def specs(self) -> list[Spec]:
        return [s for specs, _ in self.groups for s in specs]

    def pieces(self) -> Pieces:
        """The output's tensor bytes in order: one pass over the input through one open file, one group (one MoE
        block) in memory at a time."""
        assert self.header is not None
        with TensorSource(self.header) as src:
            for _, produce in self.groups:
                yield from produce(src)


def _key(wrapped: bool, module: str, role: str) -> str:
    return f"{WRAPPER if wrapped else ''}{module}.{role}.weight"


def _refuse(path: str, why: str, key: str | None = None) -> RefusedError:
    return RefusedError(path, why, key=key)


def plan_experts(header: Header, cfg: AdapterConfig | None, direction: str, weights: str) -> ExpertPlan:
    """Plan ``direction`` (``fused`` or ``per-expert``) for the adapter whose header is ``header``."""
    if cfg is None:
        raise _refuse(
            weights,
            "remap --experts needs the adapter folder with its adapter_config.json (the rank and the "
            "expert targets are read from it)",
        )
    if cfg.use_dora:
        raise _refuse(weights, "is a DoRA adapter: PEFT's fused expert LoRA (ParamWrapper) refuses DoRA")
    parsed = {k: parse_key(k) for k in header.tensors}
    _refuse_3d(header, parsed, weights)
    return (_to_fused if direction == "fused" else _to_per_expert)(header, cfg, parsed, weights)


def _refuse_3d(header: Header, parsed: dict[str, LoraKey], weights: str) -> None:
    """The 3-D form (``experts.gate_up_proj.lora_A.weight`` ``[E, r, in]`` / ``lora_B`` ``[E, out, r]``, the
    parameter name in the key, as some engines write fused-MoE LoRA) is named by inspect but not converted here:
    which axis and which half is which differs between writers, and PEFT loads neither."""
    from adapterdoc.adapter.expert_picture import classify

    for key, info in parsed.items():
        ek = classify(info, header.tensors[key].shape)
        if ek is not None and ek.form == "3d":
            raise _refuse(
                weights,
                f"holds 3-D expert LoRA (`{ek.block}.{ek.leaf}`, {list(header.tensors[key].shape)}): remap "
                "--experts converts between per-expert LoRA and PEFT's fused (ParamWrapper) layout only; serve "
                "it with the engine that wrote it, or re-export the adapter per expert from its trainer",
                key=key,
            )


# ------------------------------------------------------------------------------------------ per-expert → fused


def _to_fused(header: Header, cfg: AdapterConfig, parsed: dict[str, LoraKey], weights: str) -> ExpertPlan:
    style = per_expert_style(k.module for k in parsed.values() if k.is_lora)
    if style is None:
        raise _refuse(weights, "has no per-expert LoRA (`experts.N.<projection>`): nothing to fuse")
    drafts: dict[tuple[str, str], Block] = {}
    leaf_keys: dict[tuple[str, str], dict[tuple[int, str], tuple[str, str]]] = {}
    member: dict[str, tuple[str, str]] = {}
    for key, info in parsed.items():
        em = per_expert_module(info.module, style)
        if em is None:
            continue
        if info.role not in ("lora_A", "lora_B"):
            raise _refuse(weights, f"{info.role} on an expert projection cannot be fused", key=key)
        if info.adapter_name is not None:
            raise _refuse(weights, "an adapter name inside an expert key is not supported", key=key)
        where = (em.owner, style.param_of(em.leaf))
        t = header.tensors[key]
        block = drafts.get(where)
        if block is None:
            block = drafts[where] = Block(em.owner, where[1], em.pre, info.wrapped, 0, t.dtype, 0, 0, {})
            leaf_keys[where] = {}
        if t.dtype != block.dtype or len(t.shape) != 2:
            raise _refuse(weights, f"expert tensors of `{em.owner}` differ in dtype or are not 2-D", key=key)
        pairs = leaf_keys[where]
        a, b = pairs.get((em.expert, em.leaf), ("", ""))
        pairs[(em.expert, em.leaf)] = (key, b) if info.role == "lora_A" else (a, key)
        member[key] = where
    checked = {
        k: _check_per_expert(header, cfg, replace(drafts[k], leaf_keys=leaf_keys[k]), style, weights, parsed)
        for k in sorted(drafts)
    }
    _check_pairs(list(checked.values()), style, weights)
    found: dict[tuple[str, str], Block] = {}
    for k, block in checked.items():
        both = (block.owner, GATE_UP) in checked and (block.owner, DOWN) in checked
        module = f"{block.owner}.base_layer" if both and block.param == GATE_UP else block.owner
        keys = (_key(block.wrapped, module, "lora_A"), _key(block.wrapped, module, "lora_B"))
        found[k] = replace(block, fused_module=module, fused_keys=keys)
    groups, copied = _groups(header, member, {k: _fuse_group(header, b, style) for k, b in found.items()})
    return ExpertPlan(
        "fused",
        style,
        "the adapter's expert keys",
        list(found.values()),
        groups,
        len(header.tensors),
        copied,
        header,
        parsed,
    )


def _groups(
    header: Header, member: Mapping[str, Hashable], made: Mapping[Hashable, Group]
) -> tuple[list[Group], int]:
    """The output's groups in the input's tensor order: each tensor copied as it is, except the members of a
    converted block, whose group ``made[block]`` takes the place of its first member; and how many were copied."""
    groups: list[Group] = []
    placed: set[Hashable] = set()
    copied = 0
    for key in header.tensors:
        where = member.get(key)
        if where is None:
            groups.append(_copy_group(header, key))
            copied += 1
        elif where not in placed:
            placed.add(where)
            groups.append(made[where])
    return groups, copied


def _check_per_expert(
    header: Header,
    cfg: AdapterConfig,
    block: Block,
    style: ExpertNames,
    weights: str,
    parsed: dict[str, LoraKey],
) -> Block:
    """Every expert 0…E-1 with both factors for each leaf, one rank and one shape per leaf, and gate and up with
    the same in/out features and scaling (so the fused block is exact); ``block`` with its sizes."""
    leaves = sorted({leaf for _, leaf in block.leaf_keys}, key=style.leaves.index)
    experts = sorted({e for e, _ in block.leaf_keys})
    if experts != list(range(len(experts))):
        raise _refuse(weights, f"`{block.owner}`: experts {experts} are not 0…{len(experts) - 1}")
    scalings = set()
    dims = set()
    leaf_ranks: dict[str, int] = {}
    fused_in = fused_out = 0
    for leaf in leaves:
        shapes = set()
        for e in experts:
            a, b = block.leaf_keys.get((e, leaf), ("", ""))
            if not a or not b:
                raise _refuse(
                    weights, f"`{block.pre}…experts.{e}.{leaf}` lacks its lora_A or lora_B (or the expert)"
                )
            ta, tb = header.tensors[a], header.tensors[b]
            if ta.shape[0] != tb.shape[1]:
                raise _refuse(weights, "lora_A and lora_B ranks differ", key=a)
            shapes.add((ta.shape, tb.shape))
            scalings.add(cfg.scaling_for(parsed[a].module))
        if len(shapes) != 1:
            raise _refuse(
                weights, f"`{block.owner}` {leaf}: the experts' ranks or shapes differ; cannot fuse"
            )
        ((sa, sb),) = shapes
        leaf_ranks[leaf] = sa[0]
        fused_in = sa[1]
        fused_out += sb[0]
        dims.add((sa[1], sb[0]))
    if len(dims) != 1:
        raise _refuse(weights, f"`{block.owner}`: gate and up differ in shape; cannot fuse")
    if len(scalings) != 1:
        raise _refuse(
            weights,
            f"`{block.owner}` {block.param}: the experts' LoRA scalings differ ({sorted(scalings)}); "
            "one fused block has one scaling",
        )
    return replace(
        block,
        experts=len(experts),
        fused_in=fused_in,
        fused_out=fused_out,
        leaf_ranks=leaf_ranks,
        fused_rank=sum(leaf_ranks.values()),
    )


def _check_pairs(blocks: list[Block], style: ExpertNames, weights: str) -> None:
    """gate without up (or up without gate) is half of ``gate_up_proj``: PEFT raises on it, and so do we."""
    for block in blocks:
        if block.param == GATE_UP and len(block.leaf_ranks) != 2:
            have = next(iter(block.leaf_ranks))
            other = style.up if have == style.gate else style.gate
            raise _refuse(
                weights,
                f"`{block.owner}` has LoRA on {have} but not on {other}: the two are fused into {GATE_UP}, "
                "so one half alone has no fused form (PEFT refuses it too)",
            )


def _fuse_group(header: Header, block: Block, style: ExpertNames) -> Group:
    E, R = block.experts, block.fused_rank
    specs = [
        Spec(block.fused_keys[0], block.dtype, (E * R, block.fused_in)),
        Spec(block.fused_keys[1], block.dtype, (block.fused_out, R * E)),
    ]

    def produce(src: TensorSource) -> Pieces:
        w = element_bytes(block.dtype)
        got = src.read_many(k for pair in block.leaf_keys.values() for k in pair)
        for e in range(E):  # lora_A: expert-major rows, gate's then up's
            for leaf in block.leaves:
                yield got[block.leaf_keys[(e, leaf)][0]]
        # lora_B [out, R·E], per expert block-diagonal, rank-major columns (expert e's rank k is column k·E + e):
        # the leaf's B_e stacked [E, rows·r] and transposed is [rows, r, E], its rows' columns col0·E … (col0+r)·E
        if len(block.leaf_ranks) == 1:
            ((leaf, r),) = block.leaf_ranks.items()
            stack = b"".join(got[block.leaf_keys[(e, leaf)][1]] for e in range(E))
            yield transpose(stack, w, E, len(stack) // (w * E))
            return
        out = bytearray(block.fused_out * R * E * w)
        row0 = col0 = 0
        line = R * E * w
        for leaf, r in block.leaf_ranks.items():
            stack = b"".join(got[block.leaf_keys[(e, leaf)][1]] for e in range(E))
            rows = len(stack) // (w * r * E)
            part = memoryview(transpose(stack, w, E, rows * r))
            del stack
            run = r * E * w
            for i in range(rows):
                at = (row0 + i) * line + col0 * E * w
                out[at : at + run] = part[i * run : (i + 1) * run]
            part.release()
            row0 += rows
            col0 += r
        yield out

    return specs, produce


def _copy_group(header: Header, key: str) -> Group:
    t = header.tensors[key]

    def produce(src: TensorSource) -> Pieces:
        yield from src.chunks(key)

    return [Spec(key, t.dtype, t.shape)], produce


# ------------------------------------------------------------------------------------------ fused → per-expert


def _to_per_expert(
    header: Header, cfg: AdapterConfig, parsed: dict[str, LoraKey], weights: str
) -> ExpertPlan:
    style, reason = fused_style(cfg.layout_hints)
    blocks, member, old = _fused_blocks(header, cfg, parsed, weights, style)
    groups, copied = _groups(header, member, {i: _split_group(header, b) for i, b in enumerate(blocks)})
    return ExpertPlan(
        "per-expert", style, reason, blocks, groups, len(header.tensors), copied, header, parsed, old
    )


def plan_relayout(header: Header, cfg: AdapterConfig | None, weights: str) -> ExpertPlan | None:
    """``--experts fused`` of a fused adapter whose factors are in an old PEFT's layout (:attr:`Block.swapped`):
    the same keys, each fused module's ``lora_A`` and ``lora_B`` in today's layout; ``None`` when there is nothing
    of the kind (no config, a ``peft_version`` at or after the change, no fused expert LoRA, per-expert LoRA to
    fuse, or factors already in today's layout)."""
    if cfg is None or cfg.use_dora:
        return None
    release = written_by(cfg.raw)
    if release is None or release >= FIXED:
        return None
    parsed = {k: parse_key(k) for k in header.tensors}
    lora = [k.module for k in parsed.values() if k.is_lora]
    if per_expert_style(lora) is not None:
        return None
    if not any(fused_owner_prefix(m.removesuffix(".base_layer")) for m in lora):
        return None
    style, _ = fused_style(cfg.layout_hints)
    blocks, member, old = _fused_blocks(header, cfg, parsed, weights, style)
    if old is None:
        return None
    groups, copied = _groups(header, member, {i: _relayout_group(b) for i, b in enumerate(blocks)})
    return ExpertPlan(
        "relayout", style, old, blocks, groups, len(header.tensors), copied, header, parsed, old
    )


def _fused_blocks(
    header: Header, cfg: AdapterConfig, parsed: dict[str, LoraKey], weights: str, style: ExpertNames
) -> tuple[list[Block], dict[str, int], str | None]:
    """The fused expert modules as blocks (their true in/out features), which input tensor belongs to which, and
    why the factors are in an old PEFT's layout (``None`` when they are in today's)."""
    targeted = [p for p in FUSED_PARAMS if any(t == p or t.endswith("." + p) for t in cfg.target_parameters)]
    owners: dict[str, dict[str, dict[str, str]]] = {}  # owner → fused module → role → key
    for key, info in parsed.items():
        owner = info.module.removesuffix(".base_layer")
        if fused_owner_prefix(owner) is None or not info.is_lora:
            continue
        if info.role not in ("lora_A", "lora_B") or info.adapter_name is not None:
            raise _refuse(weights, f"{info.role} on a fused expert module is not supported", key=key)
        owners.setdefault(owner, {}).setdefault(info.module, {})[info.role] = key
    if not owners:
        raise _refuse(
            weights, "has no fused expert LoRA (`...mlp.experts` / `experts.base_layer`): nothing to split"
        )
    if not targeted:
        raise _refuse(
            weights,
            f"adapter_config.json target_parameters names neither {GATE_UP} nor {DOWN}: which fused parameter "
            "each expert module holds is unknown",
        )
    blocks: list[Block] = []
    member: dict[str, int] = {}
    for owner in sorted(owners):
        mods = owners[owner]
        inner = f"{owner}.base_layer"
        if set(mods) - {owner, inner}:
            raise _refuse(
                weights, f"`{owner}` is wrapped more than twice; only {GATE_UP} and {DOWN} are known"
            )
        which = {inner: GATE_UP, owner: DOWN} if len(targeted) == 2 else {owner: targeted[0]}
        if inner in mods and inner not in which:
            raise _refuse(weights, f"`{inner}` exists but target_parameters names one expert parameter only")
        for module in sorted(mods, key=lambda m: m != inner):
            roles = mods[module]
            if set(roles) != {"lora_A", "lora_B"}:
                raise _refuse(weights, f"`{module}` lacks its lora_A or lora_B")
            param = which[module]
            blocks.append(_fused_block(header, cfg, owner, module, param, roles, style, weights))
            member[roles["lora_A"]] = member[roles["lora_B"]] = len(blocks) - 1
    blocks, old = _orient(cfg, blocks, weights)
    for b in blocks:
        if b.fused_out % len(b.leaves):
            raise _refuse(
                weights, f"`{b.fused_module}`: {b.param} has an odd number of rows", key=b.fused_keys[1]
            )
    _check_fused_dims(blocks, weights)
    return blocks, member, old


def _orient(cfg: AdapterConfig, blocks: list[Block], weights: str) -> tuple[list[Block], str | None]:
    """``blocks`` with their true in/out features, and why they were read in an old PEFT's layout: a
    ``peft_version`` before 0.19.1 and the shapes of a layer's gate_up and down (:func:`pair_layout`), or, for one
    parameter alone, the base the config names (:func:`transposed_base`, :func:`differs_from_today`)."""
    version = cfg.raw.get("peft_version", "< 0.18 (no peft_version)")
    release = written_by(cfg.raw)
    if release is None or release >= FIXED:
        return blocks, None
    verdicts = {
        pair_layout(gu.fused_in, gu.fused_out, dn.fused_in, dn.fused_out)
        for gu, dn in ((pair[GATE_UP], pair[DOWN]) for pair in _pairs(blocks))
    }
    if len(verdicts) > 1:
        raise _refuse(
            weights,
            "the layers' fused expert factors are not all in one layout (some as PEFT ≤ 0.18 wrote them)",
        )
    if verdicts == {"old"}:
        why = (
            f"written by PEFT {version}, and {GATE_UP}'s lora_A is twice as wide as {DOWN}'s lora_B is tall (it "
            "reads the experts' outputs, not their inputs): that PEFT's layout"
        )
    elif verdicts or "peft_version" not in cfg.raw:  # no version: only the shapes can tell
        return blocks, None
    else:
        transposed, whence = transposed_base(cfg)
        if not differs_from_today(release, transposed):
            return blocks, None
        why = (
            f"written by PEFT {version} for {whence}: that PEFT stored the fused factors the other way round"
        )
    return [replace(b, fused_in=b.fused_out, fused_out=b.fused_in, swapped=True) for b in blocks], why


def _pairs(blocks: list[Block]) -> list[dict[str, Block]]:
    """The layers whose ``gate_up_proj`` and ``down_proj`` are both targeted: {param: block} each."""
    by_owner: dict[str, dict[str, Block]] = {}
    for b in blocks:
        by_owner.setdefault(b.owner, {})[b.param] = b
    return [pair for pair in by_owner.values() if GATE_UP in pair and DOWN in pair]


def _fused_block(
    header: Header,
    cfg: AdapterConfig,
    owner: str,
    module: str,
    param: str,
    roles: dict[str, str],
    style: ExpertNames,
    weights: str,
) -> Block:
    ta, tb = header.tensors[roles["lora_A"]], header.tensors[roles["lora_B"]]
    rank = cfg.rank_for(f"{owner}.{param}")
    if len(ta.shape) != 2 or len(tb.shape) != 2 or ta.dtype != tb.dtype:
        raise _refuse(weights, "fused expert factors must be 2-D and of one dtype", key=ta.name)
    if ta.shape[0] % rank or tb.shape[1] != ta.shape[0]:
        raise _refuse(
            weights,
            f"`{module}` ({param}): lora_A {list(ta.shape)} and lora_B {list(tb.shape)} do not fit rank {rank} "
            "from adapter_config.json",
            key=ta.name,
        )
    leaves = style.leaf_of(param)
    pre = fused_owner_prefix(owner)
    assert pre is not None
    wrapped = parse_key(ta.name).wrapped
    experts = ta.shape[0] // rank
    leaf_keys = {}
    for e in range(experts):
        for leaf in leaves:
            m = f"{pre}.{style.container}.experts.{e}.{leaf}"
            leaf_keys[(e, leaf)] = (_key(wrapped, m, "lora_A"), _key(wrapped, m, "lora_B"))
    return Block(
        owner,
        param,
        pre,
        wrapped,
        experts,
        ta.dtype,
        ta.shape[1],
        tb.shape[0],
        {leaf: rank for leaf in leaves},
        leaf_keys,
        (roles["lora_A"], roles["lora_B"]),
        module,
        rank,
    )


def _check_fused_dims(blocks: list[Block], weights: str) -> None:
    """gate_up and down of one layer must agree (gate_up in = down out = hidden, gate_up out = 2 × down in) and have
    one experts count: a check that the nesting read from the config is the one PEFT wrote."""
    for pair in _pairs(blocks):
        gu, dn = pair[GATE_UP], pair[DOWN]
        owner = gu.owner
        if gu.fused_in != dn.fused_out or gu.fused_out != 2 * dn.fused_in or gu.experts != dn.experts:
            raise _refuse(
                weights,
                f"`{owner}`: the inner ({GATE_UP}) and outer ({DOWN}) factors do not fit together "
                f"(in/out {gu.fused_in}/{gu.fused_out} and {dn.fused_in}/{dn.fused_out}, experts {gu.experts} "
                f"and {dn.experts}); check rank_pattern and target_parameters",
            )


def _split_group(header: Header, block: Block) -> Group:
    E, R = block.experts, block.fused_rank
    rows = block.fused_out // len(block.leaves)
    specs = []
    for e in range(E):
        for leaf in block.leaves:
            a, b = block.leaf_keys[(e, leaf)]
            specs += [Spec(a, block.dtype, (R, block.fused_in)), Spec(b, block.dtype, (rows, R))]

    def produce(src: TensorSource) -> Pieces:
        w = element_bytes(block.dtype)
        a_raw, b_raw = src.read(block.fused_keys[0]), src.read(block.fused_keys[1])
        if block.swapped:
            a_raw, b_raw = swap_factors(a_raw, b_raw, w, E, R)
        a_all = memoryview(a_raw)
        # lora_B [out, R·E] is [out·R, E]; transposed, [E, out·R]: expert e's [out, R] (fused column k·E + e) whole
        b_t = memoryview(transpose(b_raw, w, block.fused_out * R, E))
        step = R * block.fused_in * w
        b_step = block.fused_out * R * w
        part = rows * R * w
        for e in range(E):
            for i, _leaf in enumerate(block.leaves):
                yield a_all[e * step : (e + 1) * step]
                yield b_t[e * b_step + i * part : e * b_step + (i + 1) * part]

    return specs, produce


def _relayout_group(block: Block) -> Group:
    """One fused module's factors in today's layout, under the same keys (:func:`~adapterdoc.adapter.expert_layout.swap_factors`)."""
    E, R = block.experts, block.fused_rank
    specs = [
        Spec(block.fused_keys[0], block.dtype, (E * R, block.fused_in)),
        Spec(block.fused_keys[1], block.dtype, (block.fused_out, R * E)),
    ]

    def produce(src: TensorSource) -> Pieces:
        a, b = src.read(block.fused_keys[0]), src.read(block.fused_keys[1])
        yield from swap_factors(a, b, element_bytes(block.dtype), E, R)

    return specs, produce
