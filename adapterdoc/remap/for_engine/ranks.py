"""One rank and one scaling for an engine that ignores ``rank_pattern`` / ``alpha_pattern`` (``remap --for``).

Every module's rank is zero-padded to the largest, ``R``: ``lora_A`` gains zero rows and ``lora_B`` zero columns, so
``B' A' = B A`` exactly in every dtype. The new config has ``r = R`` and one ``lora_alpha``; padding changes ``r``, so
the alpha follows: ``lora_alpha = s · R`` (``s · sqrt(R)`` with rsLoRA kept on) gives the scaling ``s`` every module
had. When the modules' scalings ``s_m`` differ, no single alpha gives each its own, and the only exact route left is
the tensor values: ``lora_B`` of module ``m`` is multiplied by ``s_m / s`` (``s`` the scaling most of the LoRA bytes
already have, so the fewest tensors change). A power-of-two ratio is exact; any other is rounded once per element
(float32: at most 2^-24 relative; bfloat16: up to 2^-9), measured here and reported as ``max_rel_rounding``.
"""

from __future__ import annotations

import math
from collections import Counter

from adapterdoc.adapter import parse_key
from adapterdoc.errors import RefusedError
from adapterdoc.remap.expert_names import fused_owner_prefix
from adapterdoc.remap.for_engine import config as C
from adapterdoc.remap.for_engine.tensors import RANK_AXIS, Change, rank_of, rounding_of
from adapterdoc.st.compose import element_bytes
from adapterdoc.st.header import Header
from adapterdoc.st.tensor_edits import is_power_of_two


def plan_uniform(
    raw: dict[str, object],
    names: list[tuple[str, tuple[int, ...]]],
    view: Header,
    path: str,
    padding: tuple[int, int] | None = None,
) -> tuple[dict[str, Change], list[dict[str, object]]]:
    """Rewrite ``raw`` for one rank and one scaling; the tensor changes and the ``rewrites`` entries. ``names`` are
    the tensors (name, shape) after the earlier steps, ``view`` the header they are read through. ``padding``
    (``EngineNeeds.rank_padding``): the rank is raised further to one the engine does not pad itself."""
    cfg = C.parse(raw)
    factors: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}  # module → role → (tensor, shape)
    for name, shape in names:
        k = parse_key(name)
        if k.role in RANK_AXIS and rank_of(k, shape) is not None:
            factors.setdefault(k.module, {})[k.role] = (name, shape)
    fused = [m for m in factors if fused_owner_prefix(m.removesuffix(".base_layer")) is not None]
    has_patterns = bool(cfg.rank_pattern or cfg.alpha_pattern)
    if fused and raw.get("target_parameters"):
        if has_patterns:
            raise RefusedError(
                path,
                f"fused expert LoRA (`{fused[0]}`) with rank_pattern/alpha_pattern cannot be made uniform exactly "
                "(convert it with --experts per-expert first)",
            )
        for m in fused:  # their rows are experts × r: the top-level r, uniform already
            del factors[m]
    ranks: dict[str, int] = {}
    scalings: dict[str, float] = {}
    weight: Counter[float] = Counter()
    for module, roles in factors.items():
        a = roles.get("lora_A") or roles.get("lora_embedding_A")
        b = roles.get("lora_B") or roles.get("lora_embedding_B")
        if a is None or b is None:
            raise RefusedError(path, f"`{module}` lacks its lora_A or lora_B")
        r = a[1][0]
        if cfg.rank_for(module) != r:
            raise RefusedError(
                path,
                f"`{module}`: adapter_config.json gives rank {cfg.rank_for(module)}, its tensors have {r}",
            )
        ranks[module], scalings[module] = r, cfg.scaling_for(module)
        weight[scalings[module]] += math.prod(a[1]) + math.prod(b[1])
    if not ranks:
        return {}, []
    top = engine_rank(max(ranks.values()), padding)
    s = max(weight, key=lambda x: (weight[x], x))
    uniform_already = set(ranks.values()) == {top} and len(set(scalings.values())) == 1
    if uniform_already and not has_patterns:
        return {}, []
    C.uniform(raw, top, s)
    new = C.parse(raw)
    changes: dict[str, Change] = {}
    added = 0
    scaled: list[tuple[str, float]] = []
    rounding = 0.0
    for module, roles in factors.items():
        ratio = scalings[module] / new.scaling_for(module)
        factor = None if math.isclose(ratio, 1.0, rel_tol=C.REL) else ratio
        for role, (name, shape) in roles.items():
            axis = RANK_AXIS[role]
            pad = top if shape[axis] < top else None
            f = factor if axis == 1 else None
            if pad is None and f is None:
                continue
            changes[name] = Change(pad, axis, f)
            if pad is not None:
                other = shape[1 - axis]
                added += (
                    (top - shape[axis])
                    * other
                    * element_bytes(view.tensors[name].dtype if name in view.tensors else "F32")
                )
            if f is not None:
                if name not in view.tensors:
                    raise RefusedError(
                        path, f"`{name}` is written by the expert conversion; it cannot also be scaled"
                    )
                rounding = max(rounding, rounding_of(view, name, view.tensors[name].dtype, f))
                scaled.append((name, f))
    rewrites: list[dict[str, object]] = []
    padded = sum(1 for r in ranks.values() if r < top)
    if padded:
        rewrites.append(
            {
                "rewrite": "ranks",
                "to": top,
                "modules": padded,
                "from": sorted(set(ranks.values())),
                "bytes_added": added,
                "exact": True,
            }
        )
    if scaled:
        exact = all(is_power_of_two(f) for _, f in scaled) or rounding == 0.0
        rewrites.append(
            {
                "rewrite": "scaling",
                "scaling": s,
                "tensors": len(scaled),
                "factors": sorted({f for _, f in scaled}),
                "max_rel_rounding": rounding,
                "bit_exact": exact,
                "bytes_changed": sum(view.tensors[n].nbytes for n, _ in scaled),
            }
        )
    if not padded and not scaled:
        rewrites.append({"rewrite": "patterns", "dropped": True, "exact": True})
    return changes, rewrites


def engine_rank(rank: int, padding: tuple[int, int] | None) -> int:
    """The smallest rank >= ``rank`` that an engine padding ``(minimum, block)`` leaves as it is: ``minimum`` at or
    below it, else the next multiple of ``block`` (the punica SGMV rule TGI and LoRAX apply)."""
    if padding is None:
        return rank
    minimum, block = padding
    return minimum if rank <= minimum else -(-rank // block) * block
