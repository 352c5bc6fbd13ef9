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

MAGIC = b"GGUF"
PROVENANCE = "adapterdoc.peft.source"
"""A string KV (JSON) that ``convert --to gguf`` writes: the PEFT adapter_config.json text, the safetensors metadata,
the module paths of each pair and the base hyperparameters the permutations need, so GGUF → PEFT restores the
adapter exactly. llama.cpp reads it as one more metadata string; a GGUF without it (``convert_lora_to_gguf.py``'s)
is read through llama.cpp's name map instead."""
DEFAULT_ALIGNMENT = 32
MAX_STRING = 1 << 30
"""``GGUF_MAX_STRING_LENGTH``: gguf.cpp refuses a longer string (and one longer than the rest of the file)."""
MAX_ARRAY = 1 << 30
"""``GGUF_MAX_ARRAY_ELEMENTS``."""
MAX_DIMS = 4
"""``GGML_MAX_DIMS``."""
MAX_NAME = 64
"""``GGML_MAX_NAME``: a tensor name needs fewer bytes (the C string's NUL takes the last one)."""
TYPE_COUNT = 43
"""``GGML_TYPE_COUNT`` of llama.cpp 0.3.36 (ggml.h): a tensor type id must be in ``[0, 43)``."""
INT64_MAX = (1 << 63) - 1
SIZE_MAX = (1 << 64) - 1
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

# ggml tensor types: id → (name, elements per block, bytes per block): ggml.c's type_traits (the ids ggml removed,
# 4, 5, 31-33 and 36-38, have block size 0 there: gguf_init refuses them like an id past the end)
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
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}


@dataclass(frozen=True)
class GgufTensor:
    """One tensor info: ``shape`` is ggml's ``ne`` as the file states it (innermost first: numpy's shape reversed;
    ``n_dims`` entries, any of them possibly negative in a hostile file)."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int
    """Relative to the data section."""

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, (f"type {self.type_id}", 0, 0))[0]

    @property
    def ne(self) -> tuple[int, int, int, int]:
        """ggml's four ``ne`` (the dimensions the file omits are 1)."""
        padded = (*self.shape, 1, 1, 1, 1)
        return padded[0], padded[1], padded[2], padded[3]

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int | None:
        """Bytes of the data (ggml_nbytes), or ``None`` where gguf_init refuses the tensor info."""
        if tensor_info_problem(self) is not None:
            return None
        _, block, size = GGML_TYPES[self.type_id]
        return self.numel // block * size

    @property
    def np_shape(self) -> tuple[int, ...]:
        """numpy's / torch's shape (outermost first)."""
        return tuple(reversed(self.shape))


@dataclass(frozen=True)
class GgufProblem:
    """A rule of ggml's ``gguf_init`` that a readable header breaks: llama.cpp refuses the file."""

    code: str
    key: str | None
    message: str


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
    """Each key's GGUF type name (``ARRAY`` for arrays)."""
    array_types: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Each array key's element type name and length."""
    problems: list[GgufProblem] = field(default_factory=list)
    """What gguf_init refuses in a header this reader could read (:func:`read_header`); empty for a valid file."""
    table: list[GgufTensor] = field(default_factory=list)
    """Every tensor info in file order, a repeated name included (``tensors`` keeps the first)."""

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

    def remaining(self) -> int:
        return self.size - self.f.tell()

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise HeaderError(self.path, f"truncated GGUF header at byte {self.f.tell()}")
        return b

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def raw_string(self) -> bytes:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise HeaderError(
                self.path,
                f"corrupt GGUF header: a string of {n} bytes at byte {self.f.tell()} (llama.cpp refuses strings "
                f"over {MAX_STRING} bytes)",
            )
        if n > self.remaining():
            raise HeaderError(
                self.path,
                f"truncated GGUF header: a string of {n} bytes at byte {self.f.tell()} past the end",
            )
        return self.take(n)

    def string(self) -> str:
        return _text(self.raw_string())

    def value(self, key: str, vtype: int) -> tuple[Any, tuple[str, int] | None]:
        """The value of ``key`` and, for an array, its element type name and length."""
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype][0]), None
        if vtype == _STRING:
            return self.string(), None
        if vtype != _ARRAY:
            raise HeaderError(self.path, f"corrupt GGUF header: value type {vtype}", key=key)
        etype, n = self.unpack("<i"), self.unpack("<Q")
        if etype == _ARRAY or (etype != _STRING and etype not in _SCALARS):
            what = "an array of arrays" if etype == _ARRAY else f"an array of value type {etype}"
            raise HeaderError(self.path, f"{what}: llama.cpp refuses the file ('invalid GGUF type')", key=key)
        width = 8 if etype == _STRING else struct.calcsize(_SCALARS[etype][0])  # a string's length prefix
        if n > MAX_ARRAY or n * width > self.remaining():
            raise HeaderError(self.path, f"corrupt GGUF header: an array of {n} elements", key=key)
        kind = type_name(etype)
        if n > ARRAY_KEEP and etype != _STRING:
            self.f.seek(n * width, os.SEEK_CUR)
            return ("array", kind, n), (kind, n)
        items = [self.value(key, etype)[0] for _ in range(n)]
        return (items if n <= ARRAY_KEEP else ("array", kind, n)), (kind, n)


def _text(raw: bytes) -> str:
    """A GGUF string: bytes to llama.cpp, UTF-8 here where it is (others keep their bytes as ``\\xNN``)."""
    return raw.decode("utf-8", errors="backslashreplace")


def _name(raw: bytes) -> str:
    """A key or tensor name: :func:`_text` with control characters escaped (``\\n``), so that every message
    naming it stays one line."""
    text = _text(raw)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def type_name(vtype: int) -> str:
    if vtype in _SCALARS:
        return _SCALARS[vtype][1]
    return {_STRING: "STRING", _ARRAY: "ARRAY"}.get(vtype, f"type {vtype}")


def read_header(path: str | os.PathLike[str]) -> GgufHeader:
    """The header of the GGUF file at ``path``, read as ggml's ``gguf_init_from_file`` reads it.

    A header that cannot be read (no magic, a version llama.cpp does not read, counts or lengths past the end of the
    file, an array of arrays, more than 4 dimensions) is a :class:`HeaderError` (exit 3) naming what is wrong. A
    header that can be read but breaks one of gguf_init's other rules (keys, tensor names, shapes, types, offsets,
    ``general.alignment``) is returned with those in ``problems``: llama.cpp refuses the file."""
    spath = os.fspath(path)
    try:
        with open(spath, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return _read(f, spath, size)
    except IsADirectoryError as e:
        raise HeaderError(spath, "is a directory, not a GGUF file") from e
    except OSError as e:
        raise HeaderError(spath, f"cannot read: {e.strerror or e}") from e


def _read(f: BinaryIO, spath: str, size: int) -> GgufHeader:
    r = _Reader(f, spath, size)
    if f.read(4) != MAGIC:
        raise HeaderError(spath, "not a GGUF file (no GGUF magic)")
    version = _version(spath, r.unpack("<I"))
    n_tensors, n_kv = r.unpack("<q"), r.unpack("<q")
    if n_tensors < 0 or n_kv < 0 or n_tensors > size or n_kv > size:
        raise HeaderError(spath, f"corrupt GGUF header: {n_tensors} tensors, {n_kv} keys announced")
    header = GgufHeader(spath, version, {}, {}, 0, size)
    for _ in range(n_kv):
        _read_kv(r, header)
    align = _alignment(header)
    for _ in range(n_tensors):
        _read_tensor_info(r, header)
    pos = f.tell()
    header.data_start = (pos + align - 1) // align * align
    if n_tensors > 0 and header.data_start > size:
        header.problems.append(
            GgufProblem(
                "AD859",
                None,
                f"the file ends at byte {size}, before its data section (byte {header.data_start}): llama.cpp "
                "refuses it ('failed to seek to beginning of data section')",
            )
        )
    header.problems += _tensor_problems(header, align)
    return header


def _version(spath: str, version: int) -> int:
    """gguf.cpp's version rules: 2 and 3 are read; 0, 1, a byte-swapped one and anything newer are refused."""
    if version in (2, 3):
        return version
    if version != 0 and version & 0xFFFF == 0:
        why = f"GGUF version {version:#x}: a big-endian file (llama.cpp reads little-endian GGUF)"
    elif version == 1:
        why = "GGUF version 1 is no longer supported by llama.cpp (2 and 3 are)"
    else:
        why = f"GGUF version {version} is not supported (2 and 3 are)"
    raise HeaderError(spath, why)


def _read_kv(r: _Reader, header: GgufHeader) -> None:
    raw = r.raw_string()
    key = _name(raw)
    vtype = r.unpack("<i")
    value, array = r.value(key, vtype)
    if not raw:
        header.problems.append(
            GgufProblem("AD863", key, "a metadata key is empty: llama.cpp refuses the file")
        )
        return
    if key in header.kv_types:
        header.problems.append(
            GgufProblem(
                "AD863",
                key,
                f"metadata key `{key}` appears twice: llama.cpp refuses the file ('duplicate key')",
            )
        )
        return
    header.kv[key] = value
    header.kv_types[key] = type_name(vtype)
    if array is not None:
        header.array_types[key] = array


def _alignment(header: GgufHeader) -> int:
    """``general.alignment`` where gguf_init accepts it (a UINT32 power of two), else the default (and a problem)."""
    key = "general.alignment"
    if key not in header.kv_types:
        return DEFAULT_ALIGNMENT
    value, kind = header.kv[key], header.kv_types[key]
    if kind != "UINT32":
        header.problems.append(
            GgufProblem("AD863", key, f"{key} is a {kind}, not a UINT32: llama.cpp refuses the file")
        )
    elif value == 0 or value & (value - 1):
        header.problems.append(
            GgufProblem("AD863", key, f"{key} is {value}, not a power of 2: llama.cpp refuses the file")
        )
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0 and not value & (value - 1)
    return value if ok else DEFAULT_ALIGNMENT


def _read_tensor_info(r: _Reader, header: GgufHeader) -> None:
    raw = r.raw_string()
    name = _name(raw)
    n_dims = r.unpack("<I")
    if n_dims > MAX_DIMS:
        raise HeaderError(
            header.path,
            f"{n_dims} dimensions: llama.cpp refuses the file (at most {MAX_DIMS})",
            key=name,
        )
    shape = tuple(r.unpack("<q") for _ in range(n_dims))
    type_id, offset = r.unpack("<i"), r.unpack("<Q")
    if len(raw) >= MAX_NAME:
        header.problems.append(
            GgufProblem(
                "AD864",
                name,
                f"tensor name `{name}` is {len(raw)} bytes: llama.cpp refuses the file (names are under "
                f"{MAX_NAME} bytes, GGML_MAX_NAME)",
            )
        )
    tensor = GgufTensor(name, shape, type_id, offset)
    header.table.append(tensor)
    if name in header.tensors:
        header.problems.append(
            GgufProblem(
                "AD864",
                name,
                f"tensor `{name}` appears twice: llama.cpp refuses the file ('duplicate tensor name')",
            )
        )
        return
    header.tensors[name] = tensor


def tensor_info_problem(t: GgufTensor) -> str | None:
    """What gguf_init refuses in one tensor info (shape, type, size), or ``None``: gguf.cpp's checks in order."""
    ne = t.ne
    for j, d in enumerate(ne):
        if d < 0:
            return f"dimension {j} has {d} elements"
    n = ne[0]
    for d in ne[1:]:
        if d > 1 and INT64_MAX // d < n:
            return f"ne {list(t.shape)}: more than INT64_MAX elements"
        n *= d
    if not 0 <= t.type_id < TYPE_COUNT or t.type_id not in GGML_TYPES:
        if not 0 <= t.type_id < TYPE_COUNT:
            return f"ggml type {t.type_id} does not exist (llama.cpp knows [0, {TYPE_COUNT}))"
        return f"ggml type {t.type_id} was removed from ggml (block size 0)"
    name, block, size = GGML_TYPES[t.type_id]
    if ne[0] % block:
        return f"{name} rows of {ne[0]} elements, not a multiple of its block size {block}"
    if n // block > SIZE_MAX // size:
        return f"{name} of ne {list(t.shape)}: more bytes than SIZE_MAX"
    return None


def _tensor_problems(header: GgufHeader, align: int) -> list[GgufProblem]:
    """gguf_init's rules on each tensor info, then on the offsets: each tensor's offset must be the padded end of
    the one before (the first at 0), in the order of the tensor table."""
    out = []
    for t in header.table:
        why = tensor_info_problem(t)
        if why is not None:
            out.append(GgufProblem("AD864", t.name, f"tensor `{t.name}`: {why}: llama.cpp refuses the file"))
    if out:
        return out
    expected = 0
    for t in header.table:
        if t.offset != expected:
            return [
                GgufProblem(
                    "AD865",
                    t.name,
                    f"tensor `{t.name}` has offset {t.offset}, expected {expected} (each tensor's data must start "
                    f"where the one before ends, padded to {align}): llama.cpp refuses the file",
                )
            ]
        expected += (t.nbytes or 0) + (-(t.nbytes or 0)) % align
        if expected > SIZE_MAX:
            return [GgufProblem("AD865", t.name, f"tensor `{t.name}`: the data section passes SIZE_MAX")]
    return []


def out_of_bounds(header: GgufHeader) -> list[str]:
    """LoRA tensors whose data would end past the end of the file (llama.cpp checks the ``.lora_a``/``.lora_b`` it
    loads: "data is not within the file bounds"; the norms it skips are never read)."""
    bad: list[str] = []
    if header.data_start > header.file_size:
        return bad  # no data section at all: one problem (AD859) in ``problems``, not one per tensor
    for t in header.tensors.values():
        n = t.nbytes
        lora = t.name.endswith((".lora_a", ".lora_b"))
        if lora and n is not None and header.data_start + t.offset + n > header.file_size:
            bad.append(t.name)
    return bad


def is_model(header: GgufHeader) -> bool:
    """Whether the GGUF file is a model, not an adapter: neither ``general.type = adapter`` nor any ``.lora_a`` /
    ``.lora_b`` tensor (a model's ``general.type`` is ``model``, or absent in older files). A file with LoRA
    tensors is an adapter whatever its ``general.type`` says (verify's AD850 names a wrong one)."""
    return header.get_str("general.type") != "adapter" and not lora_pairs(header)


def lora_pairs(header: GgufHeader) -> dict[str, dict[str, Any]]:
    """``base tensor name`` → ``{"a": GgufTensor | None, "b": ...}`` for every ``.lora_a`` / ``.lora_b`` tensor.
    The base name is llama.cpp's: the name with every ``.lora_a`` (or ``.lora_b``) removed (``replace_all``)."""
    pairs: dict[str, dict[str, Any]] = {}
    for t in header.tensors.values():
        for suffix, side in ((".lora_a", "a"), (".lora_b", "b")):
            if t.name.endswith(suffix):
                pairs.setdefault(t.name.replace(suffix, ""), {"a": None, "b": None})[side] = t
                break
    return pairs


# ----------------------------------------------------- metadata as llama.cpp reads it (gguf_get_val_*)


def llama_str(a: GgufHeader, key: str) -> tuple[str, str | None]:
    """``key`` as llama.cpp's ``gguf_get_val_str`` reads it: ``""`` when missing; a STRING, or an array of exactly
    one STRING (ggml checks the element type and the count); anything else aborts (the message)."""
    if key not in a.kv_types:
        return "", None
    if gguf_kind(a, key) in ("STRING", "ARRAY of 1 STRING"):
        return str(_one(a, key)), None
    return "", _aborts(a, key, "STRING", "gguf_get_val_str")


def llama_f32(a: GgufHeader, key: str) -> tuple[float, str | None]:
    """``key`` as llama.cpp's ``gguf_get_val_f32`` reads it: 0 when missing; a FLOAT32, or an array of exactly one;
    anything else aborts (the message)."""
    if key not in a.kv_types:
        return 0.0, None
    if gguf_kind(a, key) in ("FLOAT32", "ARRAY of 1 FLOAT32"):
        value = _one(a, key)
        assert isinstance(value, (int, float))  # a FLOAT32 is read as a number
        return float(value), None
    return 0.0, _aborts(a, key, "FLOAT32", "gguf_get_val_f32")


def _one(a: GgufHeader, key: str) -> object:
    value = a.kv[key]
    return value[0] if isinstance(value, list) else value


def gguf_kind(a: GgufHeader, key: str) -> str:
    kind = a.kv_types[key]
    if kind != "ARRAY":
        return kind
    element, n = a.array_types[key]
    return f"ARRAY of {n} {element}"


def _aborts(a: GgufHeader, key: str, want: str, getter: str) -> str:
    return (
        f"{key} is a {gguf_kind(a, key)}, not a {want}: llama.cpp aborts the process at load "
        f"({getter}: 'GGML_ASSERT(type_to_gguf_type<T>::value == type) failed')"
    )
