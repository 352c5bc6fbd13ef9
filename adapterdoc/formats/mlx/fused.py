"""mlx-lm's stacked experts → PEFT's fused expert form (``target_parameters``) at the rank they have, exactly.

mlx-lm's ``LoRASwitchLinear`` holds each expert's PEFT factors as they are (``lora_a`` ``[E, r, in]``, ``lora_b``
``[E, out, r]``), gate and up as two modules. PEFT's fused form (``ParamWrapper``: ``lora_A`` ``[E·r, in]`` with
expert e's rows ``e·r …``, ``lora_B`` ``[out, r·E]`` with expert e's rank k in column ``k·E + e``) holds gate and up
as one ``gate_up_proj`` whose ``B_e`` is gate's rows then up's over one ``A_e``. So when gate's and up's ``lora_a``
are the same bytes (an adapter written from PEFT's fused form: ``convert --to mlx`` gives both the fused ``A_e``),
the fused form comes back at its own rank, byte for byte: ``lora_A`` is the stacked ``lora_a`` as it is and
``lora_B`` a permutation of the stacked ``lora_b``. Otherwise (an adapter mlx-lm trained, gate and up apart) the
fused ``gate_up_proj`` needs both ranks side by side (PEFT's own construction, ``remap --experts fused``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.layouts.mlx_prefixes import SWITCH_PROJECTIONS, SWITCH_SEGMENT
from adapterdoc.st.compose import Spec, element_bytes, transpose

if TYPE_CHECKING:
    from adapterdoc.formats.mlx.folder import MlxAdapter
    from adapterdoc.st.header import Header
    from adapterdoc.st.tensors import TensorSource

GATE, UP, DOWN = SWITCH_PROJECTIONS
GATE_UP = "gate_up_proj"


@dataclass(frozen=True)
class FusedJob:
    """One tensor of PEFT's fused form: its spec and the stacked mlx-lm tensors it is made of."""

    spec: Spec
    sources: tuple[str, ...]
    """For ``lora_A``: the stacked ``lora_a`` of gate (or down), whose bytes it is; for ``lora_B``: the stacked
    ``lora_b`` of gate and up, or of down, whose experts move to the last axis."""


def switch_modules(adapter: MlxAdapter) -> dict[str, dict[str, tuple[str, str]]]:
    """Stacked owner (``…mlp.switch_mlp``) → projection → (``lora_a``, ``lora_b``) tensor names."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for name, info in adapter.header.tensors.items():
        module, _, leaf = name.rpartition(".")
        owner, _, proj = module.rpartition(".")
        if leaf != "lora_a" or len(info.shape) != 3 or not owner.endswith(SWITCH_SEGMENT):
            continue
        if proj in SWITCH_PROJECTIONS and f"{module}.lora_b" in adapter.header.tensors:
            out.setdefault(owner, {})[proj] = (name, f"{module}.lora_b")
    return out


def shares_gate_up(adapter: MlxAdapter) -> bool:
    """Whether every stacked gate has its up with the same ``lora_a`` bytes (and the same ``lora_b`` dtype), so
    the fused ``gate_up_proj`` comes back at its own rank; ``False`` without stacked experts."""
    from adapterdoc.st.tensors import TensorSource

    found = switch_modules(adapter)
    if not found:
        return False
    tensors = adapter.header.tensors
    with TensorSource(adapter.header) as src:
        for projs in found.values():
            if (GATE in projs) != (UP in projs):
                return False
            if GATE not in projs:
                continue
            (ga, gb), (ua, ub) = projs[GATE], projs[UP]
            if (tensors[ga].dtype, tensors[ga].shape) != (tensors[ua].dtype, tensors[ua].shape):
                return False
            if tensors[gb].dtype != tensors[ub].dtype:
                return False
            if any(x != y for x, y in zip(src.chunks(ga), src.chunks(ua), strict=True)):
                return False
    return True


def fused_jobs(
    header: Header, owners: Mapping[str, Mapping[str, tuple[str, str]]], dtypes: Mapping[str, str]
) -> tuple[list[FusedJob], list[str]]:
    """The fused tensors of every stacked owner (PEFT module path of ``…mlp.experts`` → projection → names) and
    the ``target_parameters`` they need (the parameter path inside a layer, ``mlp.experts.gate_up_proj``).
    ``dtypes``: the output dtype of each source tensor. ``gate_up_proj`` is PEFT's inner wrapper
    (``experts.base_layer``) when ``down_proj`` is targeted too."""
    from adapterdoc.formats.mlx.names import split_layer

    jobs: list[FusedJob] = []
    params: list[str] = []
    for owner, projs in sorted(owners.items()):
        both = GATE in projs and DOWN in projs
        parts: list[tuple[str, tuple[tuple[str, str], ...]]] = []
        if GATE in projs:
            parts.append((GATE_UP, (projs[GATE], projs[UP])))
        if DOWN in projs:
            parts.append((DOWN, (projs[DOWN],)))
        for param, pairs in parts:
            module = f"{owner}.base_layer" if both and param == GATE_UP else owner
            a, bs = pairs[0][0], tuple(b for _, b in pairs)
            e, r, din = header.tensors[a].shape
            dout = sum(header.tensors[b].shape[1] for b in bs)
            key = f"base_model.model.{module}"
            jobs.append(FusedJob(Spec(f"{key}.lora_A.weight", dtypes[a], (e * r, din)), (a,)))
            jobs.append(FusedJob(Spec(f"{key}.lora_B.weight", dtypes[bs[0]], (dout, r * e)), bs))
            where = f"{split_layer(owner)[1]}.{param}"
            if where not in params:
                params.append(where)
    return jobs, params


def fused_bytes(src: TensorSource, header: Header, job: FusedJob) -> bytes | bytearray | memoryview:
    """The bytes of one fused tensor in the sources' dtype (the caller re-casts): ``lora_A`` is the stacked
    ``lora_a`` as it is; ``lora_B`` ``[out, r·E]`` is each expert's ``B_e`` (gate's rows then up's) stacked
    ``[E, out·r]`` and transposed, which puts expert e's rank k in column ``k·E + e``."""
    if job.spec.name.endswith(".lora_A.weight"):
        return src.read(job.sources[0])
    info = header.tensors[job.sources[0]]
    experts, w = info.shape[0], element_bytes(info.dtype)
    views = [memoryview(src.read(b)) for b in job.sources]
    sizes = [len(v) // experts for v in views]
    stack = b"".join(_expert_rows(views, sizes, experts))
    return transpose(stack, w, experts, len(stack) // (w * experts))


def _expert_rows(views: list[memoryview], sizes: list[int], experts: int) -> Iterator[memoryview]:
    for e in range(experts):
        for v, n in zip(views, sizes, strict=True):
            yield v[e * n : (e + 1) * n]
