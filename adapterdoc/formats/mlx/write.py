"""The MLX format's writers (:mod:`adapterdoc.formats.mlx` plans): tensors streamed one at a time through
:func:`adapterdoc.st.compose.compose` (memory: the largest tensor), the folder swapped in atomically."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from adapterdoc.errors import RefusedError, UnsupportedInputError
from adapterdoc.formats import Converted
from adapterdoc.st.compose import Spec, element_bytes, transpose

if TYPE_CHECKING:
    from adapterdoc.formats.mlx.folder import MlxAdapter
    from adapterdoc.formats.mlx.plan import Factor, Plan, Target
    from adapterdoc.formats.peft import PeftAdapter
    from adapterdoc.st.tensors import TensorSource

Buffer = bytes | bytearray | memoryview

EMBEDDINGS = ("embed_tokens", "embed_in")
"""The token embeddings' module names (transformers' ``embed_tokens``; GPT-NeoX's ``embed_in``): an mlx-lm
``LoRAEmbedding``, PEFT's ``lora_embedding_A`` / ``lora_embedding_B``."""


def _dtype(dtypes: set[str], where: str, what: str) -> str:
    if len(dtypes) != 1:
        raise UnsupportedInputError(
            where, f"{what} mixes dtypes {sorted(dtypes)}; pass --outtype to make them one"
        )
    return next(iter(dtypes))


def _dense(t: Target) -> Factor:
    """The one factor of a target the plan made dense jobs (``a``, ``b``, ``m``) for."""
    assert t.dense is not None
    return t.dense


def write_mlx(plan: Plan, adapter: PeftAdapter, out: Path, outtype: str | None) -> Converted:
    """Write ``plan`` (PEFT → MLX) as ``out``: ``adapter_config.json`` + ``adapters.safetensors``."""
    from adapterdoc.formats.cast import cast_bytes, target_dtype
    from adapterdoc.formats.mlx.folder import CONFIG, WEIGHTS
    from adapterdoc.st.atomic import atomic_folder
    from adapterdoc.st.compose import compose
    from adapterdoc.st.tensor_edits import is_power_of_two, pad, scale_bytes
    from adapterdoc.st.tensors import TensorSource

    header = adapter.header
    where = adapter.folder
    R, scale = plan.rank, plan.scale
    specs: list[Spec] = []
    jobs: list[tuple[Spec, str, Target]] = []  # (spec, kind, target)
    for t in sorted(plan.targets, key=lambda t: t.path):
        fs = [t.dense] if t.dense is not None else list(t.experts.values())
        din, dout = {f.din for f in fs}, {f.dout for f in fs}
        if len(din) != 1 or len(dout) != 1:
            raise UnsupportedInputError(where, f"`{t.path}`: its experts' LoRA shapes differ")
        i, o = din.pop(), dout.pop()
        da = _dtype({header.tensors[f.a].dtype for f in fs}, where, f"`{t.path}` lora_A")
        db = _dtype({header.tensors[f.b].dtype for f in fs}, where, f"`{t.path}` lora_B")
        da, db = target_dtype(da, outtype, what=t.path), target_dtype(db, outtype, what=t.path)
        if t.dense is not None:
            jobs.append((Spec(f"{t.path}.lora_a", da, (i, R)), "a", t))
            jobs.append((Spec(f"{t.path}.lora_b", db, (R, o)), "b", t))
            if t.dense.m is not None:
                dm = target_dtype(header.tensors[t.dense.m].dtype, outtype, what=t.path)
                jobs.append((Spec(f"{t.path}.m", dm, (o,)), "m", t))
        else:
            assert (
                plan.experts is not None
            )  # a target without a dense factor holds experts: the plan counted them
            jobs.append((Spec(f"{t.path}.lora_a", da, (plan.experts, R, i)), "ea", t))
            jobs.append((Spec(f"{t.path}.lora_b", db, (plan.experts, o, R)), "eb", t))
    specs = [j[0] for j in sorted(jobs, key=lambda j: j[0].name)]
    order = {s.name: n for n, s in enumerate(specs)}
    jobs.sort(key=lambda j: order[j[0].name])
    stats = {"rounding": 0.0, "scaled": 0, "inexact": 0, "cast": 0.0}

    def factor_of(scaling: float) -> float | None:
        ratio = scaling / scale
        return None if math.isclose(ratio, 1.0, rel_tol=1e-12) else ratio

    def b_bytes(src: TensorSource, f: Factor, out_dtype: str) -> Buffer:
        info = header.tensors[f.b]
        buf: bytes | bytearray = src.read(f.b)
        k = factor_of(f.scaling)
        if k is not None:
            buf, err = scale_bytes(buf, info.dtype, k)
            stats["rounding"] = max(stats["rounding"], err)
            stats["scaled"] += 1
            stats["inexact"] += not (is_power_of_two(k) or err == 0.0)
        if f.rank < R:
            buf = pad(buf, Spec(f.b, info.dtype, info.shape), 1, R)
        return recast(buf, info.dtype, out_dtype)

    def a_bytes(src: TensorSource, f: Factor, out_dtype: str) -> Buffer:
        info = header.tensors[f.a]
        buf: bytes | bytearray = src.read(f.a)
        if f.rank < R:
            buf = pad(buf, Spec(f.a, info.dtype, info.shape), 0, R)
        return recast(buf, info.dtype, out_dtype)

    def recast(buf: Buffer, src_dtype: str, dst: str) -> Buffer:
        if src_dtype == dst:
            return buf
        data, err = cast_bytes(buf, src_dtype, dst)
        stats["cast"] = max(stats["cast"], err)
        return data

    def pieces() -> Iterator[Buffer]:
        with TensorSource(header) as src:
            for spec, kind, t in jobs:
                w = element_bytes(spec.dtype)
                if kind == "a":  # [R, in] → [in, R]
                    yield transpose(a_bytes(src, _dense(t), spec.dtype), w, R, spec.shape[0])
                elif kind == "b":  # [out, R] → [R, out]
                    yield transpose(b_bytes(src, _dense(t), spec.dtype), w, spec.shape[1], R)
                elif kind == "m":
                    m = _dense(t).m
                    assert m is not None  # an "m" job is made for a factor with a magnitude only
                    yield recast(src.read(m), header.tensors[m].dtype, spec.dtype)
                else:  # stacked experts: each expert's PEFT factor as it is ([R, in], [out, R])
                    size = math.prod(spec.shape[1:]) * w
                    for e in range(spec.shape[0]):
                        f = t.experts.get(e)
                        if f is None:
                            yield bytes(size)
                        else:
                            yield a_bytes(src, f, spec.dtype) if kind == "ea" else b_bytes(src, f, spec.dtype)

    with atomic_folder(os.fspath(out)) as tmp:
        with open(os.path.join(tmp, CONFIG), "w", encoding="utf-8") as fh:
            json.dump(plan.config, fh, indent=4)
            fh.write("\n")
        compose(os.path.join(tmp, WEIGHTS), specs, pieces(), metadata={"format": "mlx"})
    notes = list(plan.notes)
    if stats["scaled"]:
        exact = (
            "exact (power-of-two ratios)"
            if not stats["inexact"]
            else (f"rounded once per element, largest relative rounding {stats['rounding']:.3g}")
        )
        text = f"{stats['scaled']} lora_B tensors carry their module's own scaling (scale {scale:g}): {exact}"
        notes.append(f"AD806: {text}" if stats["inexact"] else text)
    if outtype and stats["cast"]:
        notes.append(f"re-cast to {outtype}: largest relative rounding {stats['cast']:.3g}")
    return Converted("peft", "mlx", Path(out), len(specs), tuple(notes))


# ------------------------------------------------------------------------------------------------ MLX → PEFT


def write_peft(
    adapter: MlxAdapter, out: Path, *, base: str | None, outtype: str | None, fused: bool = False
) -> Converted:
    """mlx-lm adapter ``adapter`` → PEFT folder ``out``; ``fused``: stacked experts in PEFT's fused form at their
    own rank (:mod:`adapterdoc.formats.mlx.fused`; the caller checked that gate and up share ``lora_a``), else
    one LoRA per expert."""
    from adapterdoc.formats.cast import cast_bytes, target_dtype
    from adapterdoc.formats.mlx.folder import LEAVES, lora_parameters
    from adapterdoc.formats.mlx.names import (
        base_facts,
        default_from_layout,
        family_of,
        from_mlx,
        split_layer,
        wrapped,
    )
    from adapterdoc.formats.peft import CONFIG, METADATA, NAME, WEIGHTS, config_bytes
    from adapterdoc.st.atomic import atomic_folder
    from adapterdoc.st.compose import compose
    from adapterdoc.st.tensors import TensorSource

    where = adapter.folder
    kind, rank, scale, dropout, num_layers = lora_parameters(adapter)
    header = adapter.header
    notes: list[str] = []
    groups: dict[str, dict[str, str]] = {}
    for name in header.tensors:
        module, _, leaf = name.rpartition(".")
        if leaf not in LEAVES or not module:
            raise RefusedError(where, f"`{name}` is not an adapter parameter (lora_a, lora_b, m)")
        groups.setdefault(module, {})[leaf] = name
    layout = None
    facts = base_facts(base) if base else None
    if facts is not None:
        layout = facts.layout
    stash = adapter.raw.get("adapterdoc")
    if layout is None and isinstance(stash, dict) and isinstance(stash.get("layout"), str):
        layout = stash["layout"]
    if layout is None and wrapped(list(groups)):
        layout = default_from_layout()
        notes.append(
            "mlx-lm's `language_model.model.` paths written as the VL class's `model.language_model.`; for the "
            "text class give --base or run `adapterdoc remap --vl` on the result"
        )
    family = family_of(facts, layout, list(groups))[1]
    if family is None and isinstance(stash, dict) and isinstance(stash.get("mlx_model"), str):
        family = stash["mlx_model"]
    jobs: list[tuple[Spec, str, int | None, str]] = []  # (spec, mlx tensor, expert, role)
    modules: list[str] = []
    owners: dict[str, dict[str, tuple[str, str]]] = {}  # fused: PEFT experts owner → projection → (a, b)
    dtypes: dict[str, str] = {}
    for path, got in sorted(groups.items()):
        embedding = path.rsplit(".", 1)[-1] in EMBEDDINGS
        if embedding and (facts is None or facts.tied is not False or "m" in got):
            raise RefusedError(
                where,
                f"`{path}` is embedding LoRA: it converts only onto a base --base shows untied "
                "(tie_word_embeddings false; on a tied one mlx-lm also applies it to the logits, PEFT does not), "
                "and without DoRA (AD804)",
            )
        a, b = got.get("lora_a"), got.get("lora_b")
        if a is None or b is None:
            raise UnsupportedInputError(where, f"`{path}` lacks its lora_a or lora_b")
        sa, sb = header.tensors[a].shape, header.tensors[b].shape
        peft = from_mlx(path, layout, where, family)
        da = target_dtype(header.tensors[a].dtype, outtype, what=a)
        db = target_dtype(header.tensors[b].dtype, outtype, what=b)
        if len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0]:
            r = sa[1]
            _check_rank(r, rank, path, where)
            key = f"base_model.model.{peft}"
            ka, kb = (
                ("lora_embedding_A", "lora_embedding_B") if embedding else ("lora_A.weight", "lora_B.weight")
            )
            jobs.append((Spec(f"{key}.{ka}", da, (r, sa[0])), a, None, "a"))
            jobs.append((Spec(f"{key}.{kb}", db, (sb[1], r)), b, None, "b"))
            if "m" in got:
                m = got["m"]
                dm = target_dtype(header.tensors[m].dtype, outtype, what=m)
                jobs.append((Spec(f"{key}.lora_magnitude_vector", dm, header.tensors[m].shape), m, None, "m"))
            modules.append(peft)
        elif len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0] and sa[1] == sb[2] and "{e}" in peft:
            r = sa[1]
            _check_rank(r, rank, path, where)
            if "m" in got:
                raise RefusedError(where, f"`{path}`: DoRA on stacked experts (AD803)")
            if fused:
                owner, _, proj = peft.rpartition(".")
                owners.setdefault(owner.removesuffix(".{e}"), {})[proj] = (a, b)
                dtypes[a], dtypes[b] = da, db
                continue
            for e in range(sa[0]):
                key = "base_model.model." + peft.format(e=e)
                jobs.append((Spec(f"{key}.lora_A.weight", da, (r, sa[2])), a, e, "ea"))
                jobs.append((Spec(f"{key}.lora_B.weight", db, (sb[1], r)), b, e, "eb"))
                modules.append(peft.format(e=e))
        else:
            raise UnsupportedInputError(
                where, f"`{path}`: lora_a {list(sa)} and lora_b {list(sb)} do not pair"
            )
    if kind == "dora" and not all("m" in g for g in groups.values()):
        raise UnsupportedInputError(where, "fine_tune_type is dora but some modules have no `m`")
    from adapterdoc.formats.mlx.fused import fused_bytes, fused_jobs

    fjobs, params = fused_jobs(header, owners, dtypes)
    by_name = {j.spec.name: j for j in fjobs}
    jobs += [(j.spec, j.sources[0], None, "fused") for j in fjobs]
    jobs.sort(key=lambda j: j[0].name)
    alpha: float | int = scale * rank
    if float(alpha).is_integer():
        alpha = int(alpha)
    if alpha / rank != scale:
        notes.append(
            f"lora_alpha {alpha!r} / r {rank} is {alpha / rank!r}, scale was {scale!r} (float rounding)"
        )
    raw: dict[str, object] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": _targets(modules),
        "use_dora": kind == "dora",
        "use_rslora": False,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "base_model_name_or_path": adapter.raw.get("model")
        if isinstance(adapter.raw.get("model"), str)
        else None,
    }
    if params:
        raw["target_parameters"] = params
    cast = [0.0]

    def pieces() -> Iterator[Buffer]:
        with TensorSource(header) as src:
            for spec, name, e, role in jobs:
                info = header.tensors[name]
                w = element_bytes(info.dtype)
                buf: Buffer
                if role == "fused":
                    buf = fused_bytes(src, header, by_name[spec.name])
                elif e is None:
                    buf = src.read(name)
                else:
                    size = math.prod(info.shape[1:]) * w
                    begin = header.data_start + info.begin + e * size
                    buf = src._pread(size, begin)
                if role in ("a", "b"):  # lora_a [in, r] → [r, in]; lora_b [r, out] → [out, r]
                    buf = transpose(buf, w, info.shape[0], info.shape[1])
                if spec.dtype != info.dtype:
                    buf, err = cast_bytes(buf, info.dtype, spec.dtype)
                    cast[0] = max(cast[0], err)
                yield buf

    layers = {split_layer(m)[0] for m in modules}
    with atomic_folder(os.fspath(out)) as tmp:
        with open(os.path.join(tmp, CONFIG), "wb") as fh:
            fh.write(config_bytes(raw))
        compose(os.path.join(tmp, WEIGHTS), [j[0] for j in jobs], pieces(), metadata=dict(METADATA))
    if num_layers not in (-1, 0) and None not in layers and len(layers) > num_layers:
        notes.append(f"the tensors cover {len(layers)} layers, num_layers says {num_layers}")
    if any(e is not None for _, _, e, _ in jobs):
        notes.append(
            "stacked experts written per expert (`adapterdoc remap --experts fused` gives PEFT's fused form)"
        )
    if outtype and cast[0]:
        notes.append(f"re-cast to {outtype}: largest relative rounding {cast[0]:.3g}")
    return Converted("mlx", NAME, Path(out), len(jobs), tuple(notes))


def _check_rank(r: int, rank: int, path: str, where: str) -> None:
    if r != rank:
        raise UnsupportedInputError(
            where,
            f"`{path}` has rank {r}, lora_parameters.rank is {rank}: mlx-lm's load_adapters refuses the shape "
            "(AD814)",
        )


def _targets(modules: list[str]) -> list[str] | str:
    """PEFT's ``target_modules``: the leaf names when every layer from 0 holds the same modules (what PEFT
    selects by name is then what the adapter has), else every module path."""
    from adapterdoc.formats.mlx.names import split_layer

    by_layer: dict[int | None, set[str]] = {}
    for m in modules:
        layer, key = split_layer(m)
        by_layer.setdefault(layer, set()).add(key)
    layers = sorted(n for n in by_layer if n is not None)
    uniform = (
        None not in by_layer
        and layers == list(range(len(layers)))
        and len({frozenset(v) for v in by_layer.values()}) == 1
    )
    stacks = {m[: m.index(".layers.")] for m in modules if ".layers." in m}
    if uniform and stacks in ({"model"}, set()):
        return sorted({m.rsplit(".", 1)[-1] for m in modules})
    if (
        uniform and len(stacks) == 1
    ):  # a wrapped language model (VL): the leaf names would match tower modules
        import re

        keys = sorted({split_layer(m)[1] for m in modules})
        return rf"{re.escape(stacks.pop())}\.layers\.\d+\.({'|'.join(re.escape(k) for k in keys)})"
    return sorted(modules)
