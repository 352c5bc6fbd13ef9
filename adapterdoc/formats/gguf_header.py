"""Read a GGUF file's header (metadata and tensor table) with the standard library only: no numpy, no ``gguf``.

``detect``, ``inspect`` and ``verify`` of GGUF files run in the light install; the ``gguf`` package (numpy, yaml,
requests, tqdm) is needed only to convert (the ``gguf`` extra). The layout follows ``gguf-py``'s ``GGUFReader`` and
ggml's ``gguf.cpp``: magic ``GGUF``, version 2 or 3, little-endian, then key/value pairs and tensor infos; tensor
data starts at the next multiple of ``general.alignment`` (32).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from adapterdoc.errors import HeaderError
from adapterdoc.records import frozen_dataclass

MAGIC = b"GGUF"
PROVENANCE = "adapterdoc.peft.source"
"""A string KV (JSON) that ``convert --to gguf`` writes: the PEFT adapter_config.json text, the safetensors metadata,
the module paths of each pair and the base hyperparameters the permutations need, so GGUF → PEFT restores the
adapter exactly. llama.cpp reads it as one more metadata string; a GGUF without it (``convert_lora_to_gguf.py``'s)
is read through llama.cpp's name map instead."""
DEFAULT_ALIGNMENT = 32
MAX_STRING = 1 << 26
"""Longest string read from a header (64 MiB): a larger announced length is corruption, not a tokenizer."""
MAX_DIMS = 4
ARRAY_KEEP = 64
"""Arrays longer than this are summarised (type and length), not kept: a base's 150k-token vocabulary is skipped."""

# GGUF value types (gguf.GGUFValueType)
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "UINT8"),
    1: ("<b", "INT8"),
    2: ("<H", "UINT16"),
    3: ("<h", "INT16"),
    4: ("<I", "UINT32"),
    5: ("<i", "INT32"),
    6: ("<f", "FLOAT32"),
    7: ("<?", "BOOL"),
    10: ("<Q", "UINT64"),
    11: ("<q", "INT64"),
    12: ("<d", "FLOAT64"),
}
_STRING, _ARRAY = 8, 9

# ggml tensor types: id → (name, elements per block, bytes per block) (gguf.GGML_QUANT_SIZES)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    30: ("BF16", 1, 2),
}


@frozen_dataclass
class GgufTensor:
    """One tensor info: ``shape`` is ggml's ``ne`` (innermost first: numpy's shape reversed)."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int
    """Relative to the data section."""

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, (f"type {self.type_id}", 0, 0))[0]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int | None:
        """Bytes of the data, or ``None`` for a type this reader does not size."""
        info = GGML_TYPES.get(self.type_id)
        if info is None or info[1] == 0 or self.numel % info[1]:
            return None
        return self.numel // info[1] * info[2]

    @property
    def np_shape(self) -> tuple[int, ...]:
        """numpy's / torch's shape (outermost first)."""
        return tuple(reversed(self.shape))


@dataclass
class GgufHeader:
    """A GGUF file's header: version, key-value metadata and tensor table (no tensor data read)."""

    path: str
    version: int
    kv: dict[str, Any]
    """Scalars and strings as Python values; short arrays as lists; long arrays as ``("array", type, length)``."""
    tensors: dict[str, GgufTensor]
    data_start: int
    file_size: int
    kv_types: dict[str, str] = field(default_factory=dict)

    def get_str(self, key: str) -> str | None:
        v = self.kv.get(key)
        return v if isinstance(v, str) else None


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file that starts with the GGUF magic (never raises)."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


class _Reader:
    def __init__(self, f: BinaryIO, path: str, size: int) -> None:
        self.f, self.path, self.size = f, path, size

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise HeaderError(self.path, f"truncated GGUF header at byte {self.f.tell()}")
        return b

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise HeaderError(
                self.path, f"corrupt GGUF header: a string of {n} bytes at byte {self.f.tell()}"
            )
        if self.f.tell() + n > self.size:
            raise HeaderError(self.path, f"truncated GGUF header at byte {self.f.tell()}")
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise HeaderError(self.path, f"corrupt GGUF header: a string is not UTF-8 ({e.reason})") from e

    def value(self, vtype: int, keep: bool = True) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype][0])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.unpack("<I")
            n = self.unpack("<Q")
            if n > self.size:
                raise HeaderError(self.path, f"corrupt GGUF header: an array of {n} elements")
            small = n <= ARRAY_KEEP
            if etype in _SCALARS and not small:
                width = struct.calcsize(_SCALARS[etype][0])
                if self.f.tell() + n * width > self.size:
                    raise HeaderError(self.path, "truncated GGUF header inside an array")
                self.f.seek(n * width, os.SEEK_CUR)
                return ("array", type_name(etype), n)
            items = [self.value(etype, keep=small) for _ in range(n)]
            return items if small else ("array", type_name(etype), n)
        raise HeaderError(self.path, f"corrupt GGUF header: unknown value type {vtype}")


def type_name(vtype: int) -> str:
    if vtype in _SCALARS:
        return _SCALARS[vtype][1]
    return {_STRING: "STRING", _ARRAY: "ARRAY"}.get(vtype, f"type {vtype}")


def read_header(path: str | os.PathLike[str]) -> GgufHeader:
    """The header of the GGUF file at ``path``; a :class:`HeaderError` (exit 3) names what is wrong."""
    spath = os.fspath(path)
    try:
        with open(spath, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            r = _Reader(f, spath, size)
            if f.read(4) != MAGIC:
                raise HeaderError(spath, "not a GGUF file (no GGUF magic)")
            version = r.unpack("<I")
            if version not in (2, 3):
                raise HeaderError(spath, f"GGUF version {version} is not supported (2 and 3 are)")
            n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
            if n_tensors > size or n_kv > size:
                raise HeaderError(spath, f"corrupt GGUF header: {n_tensors} tensors, {n_kv} keys announced")
            kv: dict[str, Any] = {}
            kv_types: dict[str, str] = {}
            for _ in range(n_kv):
                key = r.string()
                vtype = r.unpack("<I")
                kv[key] = r.value(vtype)
                kv_types[key] = type_name(vtype)
            tensors: dict[str, GgufTensor] = {}
            for _ in range(n_tensors):
                name = r.string()
                n_dims = r.unpack("<I")
                if n_dims > MAX_DIMS:
                    raise HeaderError(spath, f"corrupt GGUF header: {n_dims} dimensions", key=name)
                shape = tuple(r.unpack("<Q") for _ in range(n_dims))
                type_id, offset = r.unpack("<I"), r.unpack("<Q")
                if name in tensors:
                    raise HeaderError(spath, "duplicate tensor name in the GGUF header", key=name)
                tensors[name] = GgufTensor(name, shape, type_id, offset)
            align = kv.get("general.alignment", DEFAULT_ALIGNMENT)
            if not isinstance(align, int) or align <= 0 or align & (align - 1):
                raise HeaderError(spath, f"corrupt GGUF header: general.alignment = {align!r}")
            pos = f.tell()
    except IsADirectoryError as e:
        raise HeaderError(spath, "is a directory, not a GGUF file") from e
    except OSError as e:
        raise HeaderError(spath, f"cannot read: {e.strerror or e}") from e
    data_start = (pos + align - 1) // align * align
    return GgufHeader(spath, version, kv, tensors, data_start, size, kv_types)


def out_of_bounds(header: GgufHeader) -> list[str]:
    """Tensors whose data would end past the end of the file (llama.cpp: "data is not within the file bounds")."""
    bad = []
    for t in header.tensors.values():
        n = t.nbytes
        if n is not None and header.data_start + t.offset + n > header.file_size:
            bad.append(t.name)
    return bad


def lora_pairs(header: GgufHeader) -> dict[str, dict[str, Any]]:
    """``base tensor name`` → ``{"a": GgufTensor | None, "b": ...}`` for every ``.lora_a`` / ``.lora_b`` tensor."""
    pairs: dict[str, dict[str, Any]] = {}
    for t in header.tensors.values():
        for suffix, side in ((".lora_a", "a"), (".lora_b", "b")):
            if t.name.endswith(suffix):
                pairs.setdefault(t.name[: -len(suffix)], {"a": None, "b": None})[side] = t
    return pairs
