"""Which quantization a base model is stored in, torch-free: read off ``config.json``'s ``quantization_config`` and
the safetensors headers (tensor names, dtypes, shapes), plus the few bytes of two kinds of small tensors
(compressed-tensors' ``weight_shape``, bitsandbytes' ``quant_state`` JSON).

The on-disk forms, per quantized linear ``P`` (facts from the libraries' own output, tests/quant):

- block FP8 (``quant_method: fp8``): ``P.weight`` F8_E4M3 ``[out, in]``, ``P.weight_scale_inv`` ``[⌈out/b⌉, ⌈in/b⌉]``
- compressed-tensors ``float-quantized``: ``P.weight`` F8_E4M3, ``P.weight_scale`` (block, channel or tensor grid)
- compressed-tensors ``pack-quantized``: ``P.weight_packed`` I32 ``[out, in·bits/32]``, ``P.weight_scale``,
  ``P.weight_shape`` (two integers: out, in)
- compressed-tensors ``nvfp4-pack-quantized``: ``P.weight_packed`` U8 ``[out, in/2]``, ``P.weight_scale`` F8
  ``[out, in/16]``, ``P.weight_global_scale``
- GPTQ: ``P.qweight`` I32 ``[in·bits/32, out]``, ``P.qzeros``, ``P.scales`` ``[groups, out]``, ``P.g_idx`` ``[in]``
- AWQ (GEMM): ``P.qweight`` I32 ``[in, out·bits/32]``, ``P.qzeros``, ``P.scales`` ``[groups, out]``
- bitsandbytes 4-bit: ``P.weight`` U8 ``[out·in/2, 1]``, ``P.weight.absmax``, ``P.weight.quant_map``, (double quant)
  ``P.weight.nested_absmax`` / ``nested_quant_map``, ``P.weight.quant_state.bitsandbytes__nf4`` (JSON with ``shape``)
- bitsandbytes int8: ``P.weight`` I8 ``[out, in]``, ``P.SCB`` ``[out]``, ``P.weight_format``
- MXFP4 (expert parameters): ``P_blocks`` U8 ``[E, out, in/32, 16]``, ``P_scales`` U8 ``[E, out, in/32]``

Odd but valid input (a config naming a method whose tensors are missing, quantized tensors without a config) is
described in :attr:`Quantization.notes`; a malformed ``quantization_config`` raises :class:`ConfigError`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from adapterdoc.errors import ConfigError, InputNotFoundError
from adapterdoc.st.header import Header, TensorInfo, read_header
from adapterdoc.st.tensors import TensorSource

if TYPE_CHECKING:
    from adapterdoc.bases import BaseSpec

from adapterdoc.quant.config import ConfigView, Group, read_config
from adapterdoc.quant.schemes import (
    AWQ,
    BNB_FP4,
    BNB_INT8,
    BNB_NF4,
    CT_FP8,
    CT_NVFP4,
    CT_W4A16,
    FLOAT_WEIGHT_DTYPES,
    FP8_BLOCK,
    FP8_DTYPES,
    GPTQ,
    MIXED,
    MXFP4,
    NONE,
    SMALL_READ_LIMIT,
    UNKNOWN,
    Geometry,
    Quantization,
    QuantizedModule,
)

# ------------------------------------------------------------------------------------------------ the tensors


@dataclass
class _Tensors:
    """Every tensor of the base by name, with the header (file) holding it, and the small reads done on them."""

    infos: dict[str, TensorInfo]
    files: dict[str, Header]
    sources: contextlib.ExitStack
    bits: int | None = None
    """The config's bits, when one geometry covers every module (how GPTQ codes are packed without ``g_idx``)."""
    opened: dict[str, TensorSource] = field(default_factory=dict)

    def get(self, name: str) -> TensorInfo | None:
        return self.infos.get(name)

    def read_small(self, name: str) -> bytes | None:
        """The bytes of a small tensor, or None when it is larger than :data:`SMALL_READ_LIMIT`."""
        info = self.infos[name]
        if info.nbytes > SMALL_READ_LIMIT:
            return None
        header = self.files[name]
        src = self.opened.get(header.path)
        if src is None:
            src = self.sources.enter_context(TensorSource(header))
            self.opened[header.path] = src
        return src.read(name)


class _Notes:
    """Notes gathered while reading modules: one line per kind, with a count and the first module named."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._by_kind: dict[str, list[str]] = {}

    def add(self, line: str) -> None:
        self.lines.append(line)

    def per_module(self, kind: str, path: str) -> None:
        self._by_kind.setdefault(kind, []).append(path)

    def render(self) -> tuple[str, ...]:
        grouped = [
            f"{kind}: {paths[0]}" if len(paths) == 1 else f"{kind}: {len(paths)} modules, e.g. {paths[0]}"
            for kind, paths in self._by_kind.items()
        ]
        return (*self.lines, *grouped)


def _codes(t: _Tensors, path: str, suffix: str) -> tuple[TensorInfo, str] | None:
    name = path + suffix
    info = t.get(name)
    return None if info is None else (info, name)


def _with(t: _Tensors, path: str, suffixes: Iterable[str]) -> dict[str, str]:
    """Suffix → name for each of ``suffixes`` the base stores under ``path``."""
    return {s: path + s for s in suffixes if path + s in t.infos}


def _matrix(shape: tuple[int, ...]) -> tuple[tuple[int, int] | None, int | None]:
    """(out, in) and the expert count of a 2-D or stacked 3-D weight."""
    if len(shape) == 2:
        return (shape[0], shape[1]), None
    if len(shape) == 3:
        return (shape[1], shape[2]), shape[0]
    return None, None


def _fp8_block_module(path: str, t: _Tensors, notes: _Notes) -> QuantizedModule | None:
    """``P.weight`` + ``P.weight_scale_inv`` (a module), or ``X`` + ``X_scale_inv`` (a stacked expert parameter)."""
    if path.endswith(".weight"):
        path, weight, scale = path[: -len(".weight")], ".weight", ".weight_scale_inv"
    else:
        weight, scale = "", "_scale_inv"
    found = _codes(t, path, weight)
    if found is None:
        notes.per_module("a weight scale without its weight", path)
        return None
    info, _ = found
    if info.dtype not in FP8_DTYPES:
        notes.per_module(f"`weight_scale_inv` beside a {info.dtype} weight (not FP8)", path)
    shape, experts = _matrix(info.shape)
    return QuantizedModule(
        path, FP8_BLOCK, _with(t, path, (weight, scale, ".input_scale")), info.dtype, shape, experts
    )


def _ct_packed_module(path: str, t: _Tensors, notes: _Notes) -> QuantizedModule | None:
    """``P.weight_packed`` with ``P.weight_global_scale`` (NVFP4) or ``P.weight_shape`` (pack-quantized)."""
    info = t.infos[path + ".weight_packed"]
    suffixes = (
        ".weight_packed",
        ".weight_scale",
        ".weight_zero_point",
        ".weight_global_scale",
        ".weight_shape",
        ".input_global_scale",
        ".input_scale",
    )
    tensors = _with(t, path, suffixes)
    rows = info.shape[0] if info.shape else 0
    experts = None
    if len(info.shape) == 3:
        experts, rows = info.shape[0], info.shape[1]
    if ".weight_global_scale" in tensors and info.dtype == "U8":
        cols = info.shape[-1] * 2 if info.shape else 0
        return QuantizedModule(path, CT_NVFP4, tensors, info.dtype, (rows, cols), experts)
    if info.dtype == "I32":
        return QuantizedModule(
            path, CT_W4A16, tensors, info.dtype, _ct_logical_shape(path, t, notes), experts
        )
    notes.per_module(f"a {info.dtype} `weight_packed` this version does not read (an MX format?)", path)
    return QuantizedModule(path, UNKNOWN, tensors, info.dtype, None, experts)


def _ct_logical_shape(path: str, t: _Tensors, notes: _Notes) -> tuple[int, int] | None:
    """The (out, in) a pack-quantized module's ``weight_shape`` holds (two integers), or None."""
    name = path + ".weight_shape"
    info = t.get(name)
    if info is None:
        notes.per_module("a packed weight without `weight_shape` (in_features not recorded)", path)
        return None
    width = {"I64": "q", "I32": "i"}.get(info.dtype)
    data = t.read_small(name) if width is not None and info.numel == 2 else None
    if data is None or width is None:
        notes.per_module(f"`weight_shape` is not two integers ({info.dtype} {list(info.shape)})", path)
        return None
    out, inn = struct.unpack(f"<2{width}", data)
    if out <= 0 or inn <= 0:
        notes.per_module(f"`weight_shape` holds {[out, inn]}", path)
        return None
    return out, inn


def _ct_fp8_module(path: str, t: _Tensors, notes: _Notes) -> QuantizedModule | None:
    """``P.weight`` in an 8-bit float with ``P.weight_scale`` (compressed-tensors float-quantized)."""
    if path + ".weight_packed" in t.infos:
        return None  # the packed form, read from its own anchor
    found = _codes(t, path, ".weight")
    if found is None:
        return None  # a scale beside no weight: nothing quantized here
    info, _ = found
    tensors = _with(
        t, path, (".weight", ".weight_scale", ".weight_zero_point", ".input_scale", ".input_zero_point")
    )
    shape, experts = _matrix(info.shape)
    if info.dtype in FP8_DTYPES:
        return QuantizedModule(path, CT_FP8, tensors, info.dtype, shape, experts)
    if info.dtype in ("I8", "U8"):
        notes.per_module(
            f"{info.dtype} weights with `weight_scale` (an integer format this version does not read)", path
        )
        return QuantizedModule(path, UNKNOWN, tensors, info.dtype, shape, experts)
    return None  # a float weight with a scale beside it: not a quantized layout


def _packed_int_module(path: str, t: _Tensors, notes: _Notes) -> QuantizedModule | None:
    """``P.qweight`` / ``P.qzeros`` / ``P.scales`` (/ ``P.g_idx``): GPTQ packs along in, AWQ along out."""
    q = t.infos[path + ".qweight"]
    scales = t.get(path + ".scales")
    g_idx = t.get(path + ".g_idx")
    tensors = _with(t, path, (".qweight", ".qzeros", ".scales", ".g_idx"))
    if len(q.shape) != 2 or scales is None or len(scales.shape) != 2:
        notes.per_module("`qweight` without 2-D `scales` (layout not read)", path)
        return QuantizedModule(path, UNKNOWN, tensors, q.dtype, None)
    if q.shape[1] == scales.shape[1]:  # GPTQ: qweight [in·bits/32, out], scales [groups, out]
        inn = g_idx.shape[0] if g_idx is not None and len(g_idx.shape) == 1 else None
        if inn is None:
            bits = t.bits or 4
            notes.per_module(f"GPTQ `qweight` without `g_idx` (in_features from {bits}-bit packing)", path)
            inn = q.shape[0] * 32 // bits
        return QuantizedModule(path, GPTQ, tensors, q.dtype, (q.shape[1], inn))
    # AWQ: qweight [in, out·bits/32], scales [groups, out]
    return QuantizedModule(path, AWQ, tensors, q.dtype, (scales.shape[1], q.shape[0]))


def _bnb_int8_module(path: str, t: _Tensors, notes: _Notes) -> QuantizedModule | None:
    """``P.weight`` I8 with its row scales ``P.SCB``."""
    found = _codes(t, path, ".weight")
    if found is None:
        notes.per_module("`SCB` without its weight", path)
        return None
    info, _ = found
    if info.dtype != "I8":
        notes.per_module(f"`SCB` beside a {info.dtype} weight (int8 expected)", path)
    shape, experts = _matrix(info.shape)
    return QuantizedModule(
        path, BNB_INT8, _with(t, path, (".weight", ".SCB", ".weight_format")), info.dtype, shape, experts
    )


_BNB_4BIT_STATE = ".weight.quant_state.bitsandbytes__"


def _bnb_4bit_module(path: str, t: _Tensors, notes: _Notes) -> QuantizedModule | None:
    """``P.weight`` U8 with ``.absmax``, ``.quant_map`` (``.nested_*``) and the JSON ``quant_state``."""
    kind = next(k for k in ("nf4", "fp4") if path + _BNB_4BIT_STATE + k in t.infos)
    found = _codes(t, path, ".weight")
    if found is None:
        notes.per_module("a bitsandbytes quant_state without its weight", path)
        return None
    info, _ = found
    suffixes = (
        ".weight",
        ".weight.absmax",
        ".weight.quant_map",
        ".weight.nested_absmax",
        ".weight.nested_quant_map",
    )
    tensors = _with(t, path, (*suffixes, _BNB_4BIT_STATE + kind))
    state = _bnb_state(path + _BNB_4BIT_STATE + kind, t)
    shape = _bnb_shape(state)
    if shape is None:
        notes.per_module("a bitsandbytes quant_state whose JSON has no 2-D `shape`", path)
    elif math.ceil(shape[0] * shape[1] / 2) != info.numel:
        notes.per_module(
            "a bitsandbytes quant_state `shape` that does not match the packed weight's size", path
        )
    scheme = BNB_NF4 if kind == "nf4" else BNB_FP4
    return QuantizedModule(path, scheme, tensors, info.dtype, shape)


def _bnb_state(name: str, t: _Tensors) -> dict[str, object] | None:
    data = t.read_small(name)
    if data is None:
        return None
    try:
        state = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _bnb_shape(state: Mapping[str, object] | None) -> tuple[int, int] | None:
    shape = None if state is None else state.get("shape")
    if not isinstance(shape, list) or len(shape) != 2:
        return None
    out, inn = shape
    if type(out) is not int or type(inn) is not int or out <= 0 or inn <= 0:
        return None
    return out, inn


def _mxfp4_module(path: str, t: _Tensors, notes: _Notes) -> QuantizedModule | None:
    """``X_blocks`` U8 ``[(E,) out, in/32, 16]`` with ``X_scales`` ``[(E,) out, in/32]``."""
    if path + "_scales" not in t.infos:
        return None
    info = t.infos[path + "_blocks"]
    tensors = _with(t, path, ("_blocks", "_scales", "_bias"))
    if len(info.shape) not in (3, 4):
        notes.per_module(f"MXFP4 `_blocks` of shape {list(info.shape)} (3-D or 4-D expected)", path)
        return QuantizedModule(path, MXFP4, tensors, info.dtype, None)
    experts = info.shape[0] if len(info.shape) == 4 else None
    out, groups, per = info.shape[-3:]
    return QuantizedModule(path, MXFP4, tensors, info.dtype, (out, groups * per * 2), experts)


_ANCHORS: tuple[tuple[str, Callable[[str, _Tensors, _Notes], QuantizedModule | None], str], ...] = (
    (".weight_scale_inv", _fp8_block_module, ".weight"),
    ("_scale_inv", _fp8_block_module, ""),
    (".weight_packed", _ct_packed_module, ""),
    (".weight_scale", _ct_fp8_module, ""),
    (".qweight", _packed_int_module, ""),
    (".SCB", _bnb_int8_module, ""),
    (_BNB_4BIT_STATE + "nf4", _bnb_4bit_module, ""),
    (_BNB_4BIT_STATE + "fp4", _bnb_4bit_module, ""),
    ("_blocks", _mxfp4_module, ""),
)
"""(the tensor-name ending that marks a quantized module, its reader, what to append to the stripped name before
reading): the first ending a name has decides; the reader gets the module path."""


def _find_modules(t: _Tensors, notes: _Notes) -> list[QuantizedModule]:
    found: dict[str, QuantizedModule] = {}
    for name in t.infos:
        for ending, reader, keep in _ANCHORS:
            if name.endswith(ending):
                path = name[: -len(ending)] + keep
                module = reader(path, t, notes)
                if module is not None and module.path not in found:
                    found[module.path] = module
                break
    return sorted(found.values(), key=lambda m: _natural(m.path))


def _natural(path: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key: numeric path segments in number order (``layers.2`` before ``layers.10``)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split("."))


# --------------------------------------------------------------------------------------------- the checks


def _check_geometry(m: QuantizedModule, t: _Tensors, notes: _Notes) -> None:
    """Note a module whose scale shapes do not fit its geometry (one rule per scheme)."""
    geo, shape = m.geometry, m.shape
    if geo is None or shape is None:
        return
    out, inn = shape
    scale = _scale_info(m, t)
    if m.scheme in (FP8_BLOCK, CT_FP8) and geo.block_size is not None and scale is not None:
        want = (math.ceil(out / geo.block_size[0]), math.ceil(inn / geo.block_size[1]))
        if scale.shape[-2:] != want:
            notes.per_module(
                f"a block scale grid that is not ⌈shape/block⌉ (scale {list(scale.shape)})", m.path
            )
        elif out % geo.block_size[0] or inn % geo.block_size[1]:
            notes.per_module(
                "a weight not a whole number of blocks (partial last block, ceil-divided grid)", m.path
            )
    elif m.scheme == CT_FP8 and geo.strategy == "channel" and scale is not None:
        if scale.shape[-2:] != (out, 1):
            notes.per_module(f"a channel scale of shape {list(scale.shape)} (expected [out, 1])", m.path)
    elif m.scheme in (GPTQ, AWQ, CT_W4A16, CT_NVFP4) and geo.group_size and scale is not None:
        groups = math.ceil(inn / geo.group_size)
        want = (groups, out) if m.scheme in (GPTQ, AWQ) else (out, groups)
        if scale.shape[-2:] != want:
            notes.per_module(f"group scales of shape {list(scale.shape)}, not {list(want)}", m.path)
    if m.scheme in (GPTQ, AWQ, CT_W4A16) and geo.bits:
        _check_packing(m, t, notes, geo.bits)


def _scale_info(m: QuantizedModule, t: _Tensors) -> TensorInfo | None:
    for suffix in (".weight_scale_inv", "_scale_inv", ".weight_scale", ".scales"):
        if suffix in m.tensors:
            return t.infos[m.tensors[suffix]]
    return None


def _check_packing(m: QuantizedModule, t: _Tensors, notes: _Notes, bits: int) -> None:
    assert m.shape is not None
    out, inn = m.shape
    suffix = ".qweight" if ".qweight" in m.tensors else ".weight_packed"
    packed = t.infos[m.tensors[suffix]].shape
    if m.scheme == GPTQ:
        want = (math.ceil(inn * bits / 32), out)
    elif m.scheme == AWQ:
        want = (inn, math.ceil(out * bits / 32))
    else:
        want = (out, math.ceil(inn * bits / 32))
    if packed[-2:] != want:
        notes.per_module(f"{bits}-bit codes packed as {list(packed)} (expected {list(want)})", m.path)


def _group_for(path: str, scheme: str, view: ConfigView) -> Group | None:
    """The config group a module belongs to: the one whose ``re:`` or exact-name target matches it, else the one
    group of its scheme (a class-name target such as ``Linear`` cannot be checked without the model)."""
    if len(view.groups) == 1:
        return view.groups[0]
    for g in view.groups:
        if any(_ct_match(path, target) for target in g.targets):
            return g
    return next((g for g in view.groups if g.scheme == scheme), None)


def _ct_match(path: str, pattern: str) -> bool:
    """compressed-tensors' name match: ``re:REGEX`` (``re.match``) or the exact module name."""
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], path) is not None
        except re.error:
            return False
    return pattern == path


def _transformers_match(path: str, pattern: str) -> bool:
    """transformers' ``should_convert_module``: ``pattern`` as a regex from the start up to a module boundary, or
    as a suffix of the name."""
    if path.endswith(pattern):
        return True
    try:
        return re.match(rf"(?:{pattern})(?:(?<=\.)|(?=\.|$))", path) is not None
    except re.error:
        return path == pattern or path.startswith(pattern + ".")


def _excluded(path: str, view: ConfigView) -> bool:
    match = _ct_match if view.ct_matching else _transformers_match
    return any(match(path, p) for p in view.ignore)


def _layer_of(path: str) -> str | None:
    """The repeated block a module lives in (the path up to its first numeric segment), or None."""
    parts = path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return None


def _unquantized(t: _Tensors, quantized: set[str]) -> list[str]:
    paths = []
    for name, info in t.infos.items():
        if name.endswith(".weight") and info.dtype in FLOAT_WEIGHT_DTYPES and len(info.shape) >= 2:
            path = name[: -len(".weight")]
            if path not in quantized:
                paths.append(path)
    return sorted(paths, key=_natural)


def _consistency(
    view: ConfigView,
    modules: list[QuantizedModule],
    unquantized: list[str],
    notes: _Notes,
    has_weights: bool,
) -> None:
    """Notes where the config and the tensors disagree."""
    schemes = sorted({m.scheme for m in modules})
    if view.method is None and modules:
        notes.add(
            f"the tensors are quantized ({', '.join(schemes)}) but config.json has no quantization_config"
        )
    if view.method is not None and not modules and has_weights:
        notes.add(f"config.json says {view.method} ({view.scheme}) but no tensor stores a quantized module")
    if not has_weights and view.method is not None:
        notes.add("no safetensors weights were read: the quantized modules are not known")
    expected = {g.scheme for g in view.groups} - {UNKNOWN}
    for m in modules:
        if expected and m.scheme not in expected:
            notes.per_module(
                f"stored as {m.scheme} though the config says {'/'.join(sorted(expected))}", m.path
            )
        if _excluded(m.path, view):
            notes.per_module("stored quantized though the config's ignore list names it", m.path)
    layers = {_layer_of(m.path) for m in modules} - {None}
    for path in unquantized:
        if _layer_of(path) in layers and not _excluded(path, view):
            notes.per_module(
                "stored unquantized in a quantized layer, and the config does not exclude it", path
            )


# ------------------------------------------------------------------------------------------------- the API


def detect(config: Mapping[str, object] | None, headers: Iterable[Header]) -> Quantization:
    """The quantization of a base whose ``config.json`` is ``config`` (None when there is none) and whose weights'
    headers are ``headers`` (every shard; none when only the config is known)."""
    qc = _quantization_config(config)
    view = read_config(qc)
    headers = list(headers)
    infos: dict[str, TensorInfo] = {}
    files: dict[str, Header] = {}
    for h in headers:
        for name, info in h.tensors.items():
            if name not in infos:
                infos[name] = info
                files[name] = h
    notes = _Notes()
    for line in view.notes:
        notes.add(line)
    bits = {g.geometry.bits for g in view.groups}
    with contextlib.ExitStack() as stack:
        t = _Tensors(infos, files, stack, bits.pop() if len(bits) == 1 else None)
        modules = [replace(m, geometry=_module_geometry(m, t, view)) for m in _find_modules(t, notes)]
        for m in modules:
            _check_geometry(m, t, notes)
    unquantized = _unquantized(t, {m.path for m in modules})
    _consistency(view, modules, unquantized, notes, bool(headers))
    return Quantization(
        scheme=_overall_scheme(view, modules),
        method=view.method,
        format=view.format,
        geometry=_shared_geometry(modules, view),
        modules=tuple(modules),
        unquantized=tuple(unquantized),
        ignore=view.ignore,
        notes=notes.render(),
        config=None if qc is None else dict(qc),
    )


def detect_folder(folder: str | os.PathLike[str]) -> Quantization:
    """:func:`detect` on a model folder: its ``config.json`` (optional) and its safetensors weights (the shards an
    index names, else every ``*.safetensors`` file in it)."""
    root = os.fspath(folder)
    if not os.path.isdir(root):
        raise InputNotFoundError(root, "is not a model folder")
    cfg_path = os.path.join(root, "config.json")
    config = _read_json_object(cfg_path) if os.path.isfile(cfg_path) else None
    return detect(config, [read_header(p) for p in weight_files(root)])


def detect_base(base: BaseSpec) -> Quantization:
    """:func:`detect` on a resolved ``--base``: its config and, when it has weights, their headers (a tiny
    reference base is plain)."""
    if base.config_path is None or base.root is None:
        return detect(None, [])
    config = _read_json_object(base.config_path)
    return detect(config, [read_header(p) for p in weight_files(base.root)] if base.has_weights else [])


def weight_files(root: str) -> list[str]:
    """The safetensors files of a model folder: those ``model.safetensors.index.json`` names, in the index's order,
    else every ``*.safetensors`` file, sorted."""
    index = os.path.join(root, "model.safetensors.index.json")
    if not os.path.isfile(index):
        return sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".safetensors"))
    weight_map = _read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConfigError(index, "`weight_map` must be an object of tensor name → file name")
    files: list[str] = []
    for shard in weight_map.values():
        if os.path.basename(shard) != shard or shard in ("", ".", ".."):
            raise ConfigError(index, f"shard {shard!r} is not a file name in the model folder")
        if shard not in files:
            files.append(shard)
    return [os.path.join(root, f) for f in files]


def _read_json_object(path: str) -> dict[str, object]:
    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(path, f"cannot read: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(path, "must be a JSON object")
    return raw


def _quantization_config(config: Mapping[str, object] | None) -> Mapping[str, object] | None:
    if config is None:
        return None
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ConfigError(
            None, f"config.json `quantization_config` must be an object, not {type(qc).__name__}"
        )
    return qc


def _module_geometry(m: QuantizedModule, t: _Tensors, view: ConfigView) -> Geometry | None:
    group = _group_for(m.path, m.scheme, view)
    if group is None:
        return None
    geo = group.geometry
    if m.scheme in (BNB_NF4, BNB_FP4) and geo.group_size is None:  # the block size is in each quant_state
        kind = "nf4" if m.scheme == BNB_NF4 else "fp4"
        state = _bnb_state(m.tensors[_BNB_4BIT_STATE + kind], t)
        size = None if state is None else state.get("blocksize")
        if isinstance(size, int) and not isinstance(size, bool):
            geo = replace(geo, group_size=size)
    if m.scheme == GPTQ and geo.bits is None and m.shape is not None:
        geo = replace(geo, bits=t.infos[m.tensors[".qweight"]].shape[0] * 32 // m.shape[1])
    return geo


def _overall_scheme(view: ConfigView, modules: list[QuantizedModule]) -> str:
    if view.method is not None:
        return view.scheme
    schemes = {m.scheme for m in modules}
    if not schemes:
        return NONE
    return schemes.pop() if len(schemes) == 1 else MIXED


def _shared_geometry(modules: list[QuantizedModule], view: ConfigView) -> Geometry | None:
    geos = {m.geometry for m in modules if m.geometry is not None}
    if not modules:
        geos = {g.geometry for g in view.groups}
    return geos.pop() if len(geos) == 1 else None
