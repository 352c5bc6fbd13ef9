"""What a ``config.json``'s ``quantization_config`` says, per method (fp8, gptq, awq, bitsandbytes, mxfp4,
compressed-tensors): the scheme, its geometry, the groups it targets and the modules it leaves out. A malformed
config raises :class:`~adapterdoc.errors.ConfigError`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from adapterdoc.errors import ConfigError
from adapterdoc.quant.schemes import (
    AWQ,
    BNB_FP4,
    BNB_INT8,
    BNB_NF4,
    CT_FP8,
    CT_NVFP4,
    CT_W4A16,
    FP8_BLOCK,
    GPTQ,
    MIXED,
    MXFP4,
    NONE,
    UNKNOWN,
    Geometry,
)


@dataclass(frozen=True)
class Group:
    """One compressed-tensors config group (or the whole config for other methods)."""

    scheme: str
    geometry: Geometry
    targets: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConfigView:
    """What the ``quantization_config`` says."""

    scheme: str
    method: str | None
    format: str | None
    groups: tuple[Group, ...]
    ignore: tuple[str, ...]
    ct_matching: bool
    """compressed-tensors matching (``re:`` regexes, exact names) instead of transformers' module patterns."""
    notes: tuple[str, ...] = ()


_NO_CONFIG = ConfigView(NONE, None, None, (), (), False)


def read_config(qc: Mapping[str, object] | None) -> ConfigView:
    if qc is None:
        return _NO_CONFIG
    method = _str(qc, "quant_method")
    if method is None and ("load_in_4bit" in qc or "load_in_8bit" in qc):
        method = "bitsandbytes"
    reader = _CONFIG_READERS.get(method or "")
    if reader is None:
        why = (
            "has no `quant_method`"
            if method is None
            else f"`quant_method` {method!r} is not one adapterdoc reads"
        )
        return ConfigView(UNKNOWN, method, None, (), _ignore(qc), False, (f"quantization_config {why}",))
    return reader(qc, method or "")


def _fp8_config(qc: Mapping[str, object], method: str) -> ConfigView:
    block = _int_pair(qc, "weight_block_size")
    notes = () if block else ("the fp8 config has no `weight_block_size`: one scale per tensor",)
    geo = Geometry(bits=8, block_size=block, strategy="block" if block else "tensor", symmetric=True)
    return ConfigView(FP8_BLOCK, method, _str(qc, "fmt"), (Group(FP8_BLOCK, geo),), _ignore(qc), False, notes)


def _gptq_config(qc: Mapping[str, object], method: str) -> ConfigView:
    group = _int(qc, "group_size")
    geo = Geometry(
        bits=_int(qc, "bits"),
        group_size=group if group is not None and group > 0 else None,
        strategy="channel" if group == -1 else "group",
        symmetric=_bool(qc, "sym"),
        desc_act=_bool(qc, "desc_act"),
    )
    fmt = _str(qc, "checkpoint_format") or _str(qc, "format")
    return ConfigView(GPTQ, method, fmt, (Group(GPTQ, geo),), _ignore(qc), False)


def _awq_config(qc: Mapping[str, object], method: str) -> ConfigView:
    bits = _int(qc, "bits") if "bits" in qc else _int(qc, "w_bit")
    group = _int(qc, "group_size") if "group_size" in qc else _int(qc, "q_group_size")
    zero_point = _bool(qc, "zero_point")
    geo = Geometry(
        bits=bits,
        group_size=group if group is not None and group > 0 else None,
        strategy="channel" if group == -1 else "group",
        symmetric=None if zero_point is None else not zero_point,
    )
    fmt = _str(qc, "version") or _str(qc, "format")
    notes = () if fmt in (None, "gemm") else (f"AWQ version {fmt!r}: only the GEMM layout's shapes are read",)
    return ConfigView(AWQ, method, fmt, (Group(AWQ, geo),), _ignore(qc), False, notes)


def _bnb_config(qc: Mapping[str, object], method: str) -> ConfigView:
    four = _bool(qc, "load_in_4bit") or _bool(qc, "_load_in_4bit")
    eight = _bool(qc, "load_in_8bit") or _bool(qc, "_load_in_8bit")
    if four and eight:
        raise ConfigError(None, "quantization_config sets both `load_in_4bit` and `load_in_8bit`")
    if eight:  # an int8 config also carries the 4-bit defaults (`bnb_4bit_quant_type: fp4`): not read
        geo = Geometry(bits=8, strategy="channel", symmetric=True)
        return ConfigView(BNB_INT8, method, None, (Group(BNB_INT8, geo),), _ignore(qc), False)
    if not four:
        note = "the bitsandbytes config sets neither `load_in_4bit` nor `load_in_8bit`"
        return ConfigView(UNKNOWN, method, None, (), _ignore(qc), False, (note,))
    kind = _str(qc, "bnb_4bit_quant_type") or "fp4"  # bitsandbytes' default
    scheme = {"nf4": BNB_NF4, "fp4": BNB_FP4}.get(kind)
    if scheme is None:
        raise ConfigError(None, f"quantization_config `bnb_4bit_quant_type` is {kind!r}, not nf4 or fp4")
    geo = Geometry(bits=4, strategy="block", double_quant=bool(_bool(qc, "bnb_4bit_use_double_quant")))
    return ConfigView(scheme, method, None, (Group(scheme, geo),), _ignore(qc), False)


def _mxfp4_config(qc: Mapping[str, object], method: str) -> ConfigView:
    geo = Geometry(bits=4, group_size=32, strategy="group", symmetric=True)
    return ConfigView(MXFP4, method, None, (Group(MXFP4, geo),), _ignore(qc), False)


_CT_FORMATS = {
    "float-quantized": CT_FP8,
    "naive-quantized": CT_FP8,
    "pack-quantized": CT_W4A16,
    "nvfp4-pack-quantized": CT_NVFP4,
}
"""compressed-tensors formats adapterdoc reads → scheme (``naive-quantized`` only for 8-bit float weights)."""


def _ct_config(qc: Mapping[str, object], method: str) -> ConfigView:
    top = _str(qc, "format")
    raw_groups = qc.get("config_groups")
    if raw_groups is None:
        raw_groups = {}
    if not isinstance(raw_groups, dict):
        raise ConfigError(None, "quantization_config `config_groups` must be an object")
    groups: list[Group] = []
    notes: list[str] = []
    for name, raw in raw_groups.items():
        if not isinstance(raw, dict):
            raise ConfigError(None, f"quantization_config config group {name!r} must be an object")
        group, note = _ct_group(name, raw, top)
        groups.append(group)
        if note:
            notes.append(note)
    if not groups:
        notes.append("the compressed-tensors config has no `config_groups`")
    schemes = {g.scheme for g in groups}
    scheme = UNKNOWN if not schemes else schemes.pop() if len(schemes) == 1 else MIXED
    return ConfigView(scheme, method, top, tuple(groups), _ignore(qc), True, tuple(notes))


def _ct_group(name: str, raw: Mapping[str, object], top: str | None) -> tuple[Group, str | None]:
    fmt = _str(raw, "format") or top
    weights = raw.get("weights")
    if weights is None:
        return Group(UNKNOWN, Geometry(), _targets(raw)), f"config group {name!r} quantizes no weights"
    if not isinstance(weights, dict):
        raise ConfigError(None, f"quantization_config config group {name!r}: `weights` must be an object")
    bits = _int(weights, "num_bits")
    kind = _str(weights, "type")
    geo = Geometry(
        bits=bits,
        group_size=_int(weights, "group_size"),
        block_size=_block_structure(weights),
        strategy=_str(weights, "strategy"),
        symmetric=_bool(weights, "symmetric"),
    )
    scheme = _CT_FORMATS.get(fmt or "", UNKNOWN)
    if scheme == CT_FP8 and (kind not in (None, "float") or bits not in (None, 8)):
        scheme = UNKNOWN
    note = None
    if scheme == UNKNOWN:
        note = f"config group {name!r}: compressed-tensors format {fmt!r} ({kind} {bits}-bit) is not one adapterdoc reads"
    return Group(scheme, geo, _targets(raw)), note


_CONFIG_READERS = {
    "fp8": _fp8_config,
    "compressed-tensors": _ct_config,
    "gptq": _gptq_config,
    "awq": _awq_config,
    "bitsandbytes": _bnb_config,
    "mxfp4": _mxfp4_config,
}
"""``quant_method`` → its reader."""


def _targets(raw: Mapping[str, object]) -> tuple[str, ...]:
    return _str_list(raw, "targets")


def _ignore(qc: Mapping[str, object]) -> tuple[str, ...]:
    out: list[str] = []
    for key in ("ignore", "modules_to_not_convert", "llm_int8_skip_modules"):
        out.extend(_str_list(qc, key))
    return tuple(out)


def _block_structure(weights: Mapping[str, object]) -> tuple[int, int] | None:
    raw = weights.get("block_structure")
    if isinstance(raw, str):  # older compressed-tensors spelled it "128x128"
        m = re.fullmatch(r"(\d+)x(\d+)", raw)
        if m is None:
            raise ConfigError(None, f"quantization_config `block_structure` {raw!r} is not ROWSxCOLS")
        return int(m[1]), int(m[2])
    return _int_pair(weights, "block_structure")


# the typed reads of config values: absent or null is None, a wrong type is a ConfigError naming the key


def _str(d: Mapping[str, object], key: str) -> str | None:
    v = d.get(key)
    if v is None or isinstance(v, str):
        return v
    raise ConfigError(None, f"quantization_config `{key}` must be a string, not {type(v).__name__}")


def _int(d: Mapping[str, object], key: str) -> int | None:
    v = d.get(key)
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    raise ConfigError(None, f"quantization_config `{key}` must be an integer, not {type(v).__name__}")


def _bool(d: Mapping[str, object], key: str) -> bool | None:
    v = d.get(key)
    if v is None or isinstance(v, bool):
        return v
    raise ConfigError(None, f"quantization_config `{key}` must be true or false, not {type(v).__name__}")


def _int_pair(d: Mapping[str, object], key: str) -> tuple[int, int] | None:
    v = d.get(key)
    if v is None:
        return None
    if (
        isinstance(v, list)
        and len(v) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v)
    ):
        return int(v[0]), int(v[1])
    raise ConfigError(None, f"quantization_config `{key}` must be two positive integers, not {v!r}")


def _str_list(d: Mapping[str, object], key: str) -> tuple[str, ...]:
    v = d.get(key)
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return tuple(str(x) for x in v)
    raise ConfigError(None, f"quantization_config `{key}` must be a list of strings")
