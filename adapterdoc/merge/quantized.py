"""Merge into a quantized base, planned torch-free: the plan is made on the base's *decoded view* (every quantized
module's stored tensors replaced by the one float weight they decode to, named and shaped as an unquantized
checkpoint stores it, under a config without ``quantization_config``), so both planners and every rule of a plain
merge apply unchanged. The plan's outputs are then pointed back at the stored tensors: the decoded weight is
computed from them (:mod:`adapterdoc.merge.decoded`), and with ``--requantize`` the module's stored tensors are
written again in their own format (only those the adapter changes; every other tensor is copied byte for byte)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from adapterdoc.checkpoint import Checkpoint
from adapterdoc.merge.edits import HEADERS, Output, Plan
from adapterdoc.quant import detect
from adapterdoc.quant.schemes import (
    CT_FP8,
    FP8_BLOCK,
    MXFP4,
    UNKNOWN,
    Quantization,
    QuantizedModule,
)
from adapterdoc.quant.text import scheme_text
from adapterdoc.report.findings import Finding, make
from adapterdoc.st.dtypes import CAST_DTYPES, CONFIG_DTYPES
from adapterdoc.st.header import Header, TensorInfo

CODE_SUFFIXES = ("", ".weight", ".weight_packed", ".qweight", "_blocks")
"""The suffix of the tensor holding a module's codes, by preference (the decoded weight takes its place)."""
KEPT_SUFFIXES = ("_bias", ".bias")
"""Suffixes :mod:`adapterdoc.quant.detect` lists with a module that are not quantization tensors (kept as they are)."""
_FROM_CONFIG = {v: k for k, v in CONFIG_DTYPES.items()}


@dataclass(frozen=True)
class DecodedView:
    """The base as the planners see it."""

    checkpoint: Checkpoint
    """The base with every quantized module's tensors replaced by its decoded weight."""
    config: dict[str, object]
    """``config.json`` without ``quantization_config``."""
    modules: dict[str, QuantizedModule]
    """Decoded weight name → its module."""


def read_quantization(base: Checkpoint) -> tuple[Quantization, dict[str, object] | None]:
    """The base's quantization from the headers already read, and its ``config.json`` (None without one)."""
    path = os.path.join(base.root, "config.json")
    config: dict[str, object] | None = None
    if os.path.isfile(path):
        with open(path, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
        config = raw if isinstance(raw, dict) else None
    return detect(config, base.headers), config


def undecodable_finding(base: Checkpoint, q: Quantization) -> Finding | None:
    """AD520 when some quantized module cannot be decoded (a method or layout adapterdoc does not read)."""
    bad = [m.path for m in q.modules if m.scheme == UNKNOWN or _decoded_shape(m, None) is None]
    if q.scheme != UNKNOWN and not bad:
        return None
    where = f"; e.g. `{bad[0]}` ({len(bad)} module(s))" if bad else ""
    return make(
        "AD520",
        f"the base is quantized as {scheme_text(q)}, which adapterdoc cannot decode{where}; nothing was written",
        path=base.spec,
    )


def decoded_name(m: QuantizedModule) -> str:
    """The name an unquantized checkpoint gives the module's weight: ``q_proj.weight``; an expert parameter's
    own path (``experts.gate_up_proj``)."""
    return m.path if m.scheme == MXFP4 or "" in m.tensors else m.path + ".weight"


def code_suffix(m: QuantizedModule) -> str:
    return next(s for s in CODE_SUFFIXES if s in m.tensors)


def quant_suffixes(m: QuantizedModule) -> list[str]:
    """The module's quantization tensors (codes, scales, zeros, state), in the order detection lists them."""
    return [s for s in m.tensors if s not in KEPT_SUFFIXES]


def _decoded_shape(m: QuantizedModule, codes: TensorInfo | None) -> tuple[int, ...] | None:
    if m.scheme in (FP8_BLOCK, CT_FP8) and codes is not None:
        return tuple(codes.shape)
    if m.shape is None:
        return None
    out, inp = m.shape
    if m.scheme == MXFP4:  # stored [E, out, in/32, 16]; a bf16 checkpoint stores the parameter [E, in, out]
        return (m.experts, inp, out) if m.experts is not None else (inp, out)
    return (m.experts, out, inp) if m.experts is not None else (out, inp)


def decoded_dtype(config: dict[str, object] | None, dtype: str) -> str:
    """The dtype of decoded weights: ``--dtype``, else the config's ``dtype``/``torch_dtype`` when it is a float
    dtype, else BF16."""
    if dtype != "auto":
        return CAST_DTYPES[dtype]
    for key in ("dtype", "torch_dtype"):
        value = (config or {}).get(key)
        if isinstance(value, str) and value in _FROM_CONFIG:
            return CAST_DTYPES[_FROM_CONFIG[value]]
    return "BF16"


def decoded_view(
    base: Checkpoint, q: Quantization, config: dict[str, object] | None, dtype: str
) -> DecodedView:
    """``base`` as an unquantized checkpoint of the same model stores it (decoded weights in ``dtype``)."""
    by_tensor: dict[str, tuple[QuantizedModule, str]] = {}
    for m in q.modules:
        for suffix in quant_suffixes(m):
            by_tensor[m.tensors[suffix]] = (m, suffix)
    out_dtype = decoded_dtype(config, dtype)
    headers: list[Header] = []
    tensors: dict[str, TensorInfo] = {}
    tensor_file: dict[str, str] = {}
    modules: dict[str, QuantizedModule] = {}
    for h in base.headers:
        kept: dict[str, TensorInfo] = {}
        for name, info in h.tensors.items():
            owner = by_tensor.get(name)
            if owner is None:
                kept[name] = info
                continue
            m, suffix = owner
            if suffix != code_suffix(m):
                continue
            shape = _decoded_shape(m, info)
            assert shape is not None  # undecodable_finding refused it first
            name = decoded_name(m)
            kept[name] = TensorInfo(name, out_dtype, shape, info.begin, info.end)
            modules[name] = m
        headers.append(replace(h, tensors=kept))
        for name, info in kept.items():
            tensors.setdefault(name, info)
            tensor_file.setdefault(name, h.path)
    view = replace(base, headers=headers, tensors=tensors, tensor_file=tensor_file)
    plain = {k: v for k, v in (config or {}).items() if k != "quantization_config"}
    return DecodedView(view, plain, modules)


def stored_plan(plan: Plan, base: Checkpoint, view: DecodedView, q: Quantization, requantize: bool) -> Plan:
    """The plan made on ``view`` pointed back at ``base``'s stored tensors: a decoded weight is computed from its
    module's tensors; with ``requantize`` a module keeps its stored tensors (re-encoded where the adapter changes
    it, copied where it does not)."""
    shards: list[tuple[str, Header, list[Output]]] = []
    originals = {h.path: h for h in base.headers}
    for rel, header, outs in plan.shards:
        new: list[Output] = []
        for o in outs:
            m = view.modules.get(o.name) if o.source is not None else None
            if m is None:
                new.append(o)
                continue
            codes = base.tensors[m.tensors[code_suffix(m)]]
            if not requantize:
                new.append(replace(o, source=codes, source_file=base.tensor_file[codes.name], quantized=m))
                continue
            for suffix in quant_suffixes(m):
                info = base.tensors[m.tensors[suffix]]
                src = base.tensor_file[info.name]
                new.append(
                    Output(info.name, info.dtype, info.shape, info, src, o.edits, m if o.edits else None)
                )
        shards.append((rel, originals[header.path], new))
    return replace(plan, base=base, shards=shards, quantization=q, requantize=requantize)


def decoded_finding(base: Checkpoint, q: Quantization, dtype: str, requantize: bool) -> Finding:
    """AD521: what a merge into a quantized base writes."""
    n = len(q.modules)
    if requantize:
        how = f"merged weights encoded again as {q.scheme}, every other tensor copied byte for byte"
    else:
        how = f"written as {dtype.lower()}, quantization_config dropped"
    return make(
        "AD521",
        f"the base is quantized ({scheme_text(q)}, {n} module(s)): each weight the adapter changes is decoded "
        f"exactly and merged in float32; {how}",
        path=base.spec,
    )


def refused_plan(adapter: Checkpoint, base: Checkpoint, finding: Finding) -> Plan:
    """A plan that writes nothing and holds only ``finding``."""
    return Plan(
        base=base,
        adapter=adapter,
        shards=[],
        applied=[],
        unused=[],
        findings=[finding],
        pieces={},
        untie=False,
        model_class="",
        planner=HEADERS,
    )
