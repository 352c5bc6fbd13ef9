"""The result of the algebra as a plain PEFT adapter, written atomically: float32 factors whose product is the
delta itself (scaling 1), ``r`` and ``lora_alpha`` equal, and where a module's rank differs from ``r`` its
``rank_pattern`` and ``alpha_pattern`` entries (both the rank), so PEFT reloads every module with its own rank and
scaling 1 (no rsLoRA: ``use_rslora`` is off)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from adapterdoc.adapter import WRAPPER
from adapterdoc.algebra.read import pattern_name
from adapterdoc.formats.peft import CONFIG, WEIGHTS

if TYPE_CHECKING:
    from numpy import ndarray as NDArray

_DROPPED = ("rank_pattern", "alpha_pattern", "use_rslora", "use_dora", "lora_bias", "revision")
"""Config fields the written adapter does not take over from its template (its scaling is folded, its patterns
are its own)."""


@dataclass(frozen=True)
class Planned:
    """A module of the adapter to write as its config and header need it, before its factors exist."""

    name: str
    rank: int
    shape: tuple[int, int]
    """``(out, in)`` of ``b @ a`` (for an embedding, of its stored transpose)."""
    embedding: bool = False


@dataclass(frozen=True)
class OutModule:
    """One module of the written adapter: ``delta = b @ a`` (an embedding's stored transpose, as PEFT keeps it)."""

    name: str
    b: NDArray
    a: NDArray
    embedding: bool = False

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])

    @property
    def planned(self) -> Planned:
        return Planned(self.name, self.rank, (int(self.b.shape[0]), int(self.a.shape[1])), self.embedding)


def plain_config(template: Mapping[str, Any], modules: Sequence[Planned | OutModule]) -> dict[str, Any]:
    """``template``'s fields (targets, task type, base) with ``r = lora_alpha`` the most common rank, and each other
    rank in ``rank_pattern`` / ``alpha_pattern`` under the name PEFT matches them against (the module's full path;
    for LoRA on a parameter, ``module.PARAM``: :func:`~adapterdoc.algebra.read.pattern_name`)."""
    raw = {k: v for k, v in template.items() if k not in _DROPPED}
    counts = Counter(m.rank for m in modules)
    r = max(counts, key=lambda k: (counts[k], k)) if counts else 1
    params = list(template.get("target_parameters") or [])
    pattern = {pattern_name(params, m.name): m.rank for m in modules if m.rank != r}
    raw.update(
        r=r, lora_alpha=r, use_rslora=False, use_dora=False, rank_pattern=pattern, alpha_pattern=dict(pattern)
    )
    raw["peft_type"] = "LORA"
    return raw


def tensor_names(m: Planned | OutModule) -> tuple[str, str]:
    """The saved names of ``m``'s A and B factors."""
    if m.embedding:
        return f"{WRAPPER}{m.name}.lora_embedding_A", f"{WRAPPER}{m.name}.lora_embedding_B"
    return f"{WRAPPER}{m.name}.lora_A.weight", f"{WRAPPER}{m.name}.lora_B.weight"


def write_adapter(
    out: str,
    template: Mapping[str, Any],
    modules: list[OutModule],
    full: Mapping[str, NDArray],
    *,
    command: str,
    inputs: Sequence[str],
    force: bool = False,
) -> list[str]:
    """Write the adapter into ``out`` (checked by the output-folder rule, and never one of ``inputs``, the
    command's input folders, or inside or around one; built beside it and renamed into place); ``full``: whole
    saved weights (``modules_to_save``) by tensor name, written as float32. The files written."""
    plan = [m.planned for m in modules]
    return write_stream(out, template, plan, modules, full, command=command, inputs=inputs, force=force)


def check_out(out: str, *, command: str, inputs: Sequence[str], force: bool = False) -> None:
    """Exit 3 unless ``out`` may be written: the output-folder rule, and never one of ``inputs`` or inside or
    around one. :func:`write_stream` checks it before it writes; a command that computes for long first checks it
    before it reads too, so a refused ``--out`` costs no time."""
    from adapterdoc.st.atomic import check_output_folder
    from adapterdoc.st.paths import check_not_an_input

    check_not_an_input(out, out, [("the input", i) for i in inputs], command)
    check_output_folder(out, force=force)


def write_stream(
    out: str,
    template: Mapping[str, Any],
    plan: Sequence[Planned],
    modules: Iterable[OutModule],
    full: Mapping[str, NDArray],
    *,
    command: str,
    inputs: Sequence[str],
    force: bool = False,
) -> list[str]:
    """:func:`write_adapter` with the modules written as ``modules`` yields them (each as soon as it comes, so the
    writing overlaps their computing): the config and header come from ``plan``, which the modules must follow in
    order, rank and shape."""
    from adapterdoc.formats.peft import METADATA, config_bytes
    from adapterdoc.st.atomic import atomic_folder, write_marker
    from adapterdoc.st.compose import Spec, compose

    check_out(out, command=command, inputs=inputs, force=force)
    specs: list[Spec] = []
    for p in plan:
        a_name, b_name = tensor_names(p)
        specs += [Spec(a_name, "F32", (p.rank, p.shape[1])), Spec(b_name, "F32", (p.shape[0], p.rank))]
    saved = sorted(full.items())
    specs += [Spec(name, "F32", tuple(int(d) for d in arr.shape)) for name, arr in saved]

    def pieces() -> Iterator[memoryview]:
        done = 0
        for m in modules:
            if done == len(plan) or m.planned != plan[done]:
                raise AssertionError(f"module {m.name} written out of its plan")
            done += 1
            yield _float32_bytes(m.a)
            yield _float32_bytes(m.b)
        if done != len(plan):
            raise AssertionError(f"{done} of {len(plan)} planned modules written")
        for _, arr in saved:
            yield _float32_bytes(arr)

    config = plain_config(template, plan)
    with atomic_folder(out, force=force) as tmp:
        with open(os.path.join(tmp, CONFIG), "wb") as f:
            f.write(config_bytes(config))
        compose(os.path.join(tmp, WEIGHTS), specs, pieces(), metadata=dict(METADATA))
        write_marker(tmp, command)
    return [os.path.join(out, CONFIG), os.path.join(out, WEIGHTS)]


def _float32_bytes(arr: NDArray) -> memoryview:
    """``arr``'s values as little-endian float32 bytes (no copy when it is one already)."""
    import numpy as np

    return np.ascontiguousarray(arr, dtype="<f4").reshape(-1).view(np.uint8).data


__all__ = ["OutModule", "Planned", "plain_config", "tensor_names", "write_adapter", "write_stream"]
