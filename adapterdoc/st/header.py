"""Read and validate a safetensors header with the standard library only (no tensor data is read).

The rules follow the reference reader (safetensors 0.8, see shared/SAFETENSORS.md) with one deliberate
difference: duplicate tensor names are rejected (the spec forbids them; the reference keeps the last).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple, NoReturn, cast

from adapterdoc.errors import HeaderError
from adapterdoc.st.dtypes import DTYPE_BITS

MAX_HEADER_SIZE = 100_000_000
"""Largest header length the reference reader accepts (inclusive)."""

METADATA_KEY = "__metadata__"

_U64_MAX = 2**64 - 1
_JSON_WS = " \t\n\r"
_MAX_DEPTH = 128
"""serde_json's nesting limit: the reference refuses a header with 128 nested arrays/objects."""
_F64_MAX = 1.7976931348623157e308
_NEGATIVE_ZERO = re.compile(r"-0(?![.\deE])")
"""``-0``: a float for serde_json (no shape or offset accepts it), an int for Python's json."""
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A surrogate escape: a lone one is refused by the reference, read by Python's json."""


class TensorInfo(NamedTuple):
    """One tensor entry of a safetensors header (a named tuple: a million of them build quickly)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    """Start offset, relative to the data section."""
    end: int
    """End offset (exclusive), relative to the data section."""

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Header:
    """A validated safetensors header."""

    path: str
    file_size: int
    header_len: int
    """N, the length of the JSON header in bytes (including any padding)."""
    metadata: dict[str, str] | None
    tensors: dict[str, TensorInfo]
    """Tensors in the order the header lists them."""
    raw: bytes = field(default=b"", repr=False, compare=False)
    """The N header bytes as read (padding included), so a rewrite renames them without reading the file again."""
    data_start: int = field(init=False)
    """Absolute file offset of the data section (8 + N)."""

    def __post_init__(self) -> None:
        self.data_start = 8 + self.header_len

    @property
    def data_bytes(self) -> int:
        return self.file_size - self.data_start


def _fail(path: str, reason: str, key: str | None = None) -> HeaderError:
    return HeaderError(path, reason, key=key)


def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and validate the header of the safetensors file at ``path``.

    Reads 8 bytes, checks the announced length against the limit and the file size, then reads exactly
    the header. Raises :class:`HeaderError` (with the path and a precise reason) on any violation.
    """
    spath = os.fspath(path)
    try:
        pre = os.stat(spath)
        if not stat.S_ISREG(pre.st_mode) and not os.path.isdir(spath):
            raise _fail(spath, "not a regular file")  # checked before open(): opening a FIFO blocks
        with open(spath, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise _fail(spath, "not a regular file")
            size = st.st_size
            n = _check_length(spath, f.read(8), size)
            raw = f.read(n)
    except IsADirectoryError as e:
        raise _fail(spath, "is a directory, not a safetensors file") from e
    except HeaderError:
        raise
    except OSError as e:
        raise _fail(spath, f"cannot read: {e.strerror or e}") from e
    if len(raw) != n:
        raise _fail(spath, f"file shrank while reading: header of {n} bytes announced, {len(raw)} read")
    return parse_header(spath, raw, size)


def _check_length(path: str, prefix: bytes, size: int) -> int:
    if len(prefix) < 8:
        raise _fail(path, f"header too small: file is {size} bytes, a safetensors file starts with 8")
    n = int.from_bytes(prefix, "little")
    if n > MAX_HEADER_SIZE:
        raise _fail(
            path,
            f"header too large: {n} bytes announced, the limit is {MAX_HEADER_SIZE} (not a safetensors file: "
            "it starts with a header length, then the JSON header)",
        )
    if n + 8 > size:
        raise _fail(
            path, f"invalid header length: {n} bytes announced but the file has {size - 8} after the prefix"
        )
    return n


def parse_header(path: str, raw: bytes, file_size: int) -> Header:
    """Validate the JSON header bytes ``raw`` of a file of ``file_size`` bytes.

    The checks run in the reference's order (the JSON, then each entry as the text lists them, then the offsets
    in data order) and the first violation raises :class:`HeaderError` naming it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(path, f"invalid UTF-8 in header at byte {e.start}") from e
    if text.startswith("\ufeff"):
        raise _fail(path, "invalid JSON in header: starts with a byte order mark")
    metadata, entries = _split_entries(path, _load_json(path, text))
    tensors = _build_tensors(path, entries)
    _check_offsets(path, tensors, file_size - 8 - len(raw))
    return Header(
        path=path, file_size=file_size, header_len=len(raw), metadata=metadata, tensors=tensors, raw=raw
    )


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON constant {name}")


def _load_json(path: str, text: str) -> _Object:
    """Parse the header. Every JSON object is read as the tuple of its (key, value) pairs, in order (the
    C scanner builds them; repeated keys stay visible), every array as a list."""
    stripped = text.strip(_JSON_WS)
    if not stripped.startswith("{"):
        kind = "empty" if not stripped else "not a JSON object"
        raise _fail(path, f"invalid JSON in header: {kind}")
    negative_zero = _NEGATIVE_ZERO.search(text) is not None
    try:
        top = json.loads(
            text,
            object_pairs_hook=tuple,
            parse_constant=_reject_constant,
            parse_int=_parse_int if negative_zero else None,
        )
    except (ValueError, RecursionError) as e:
        raise _fail(path, f"invalid JSON in header: {_json_reason(e)}") from e
    if _SURROGATE_ESCAPE.search(text) is not None:
        _check_surrogates(path, top)
    return cast(_Object, top)


_Object = tuple[tuple[str, object], ...]
"""A JSON object as :func:`_load_json` reads it: its (key, value) pairs in order."""


def _parse_int(s: str) -> int | float:
    if s == "-0":
        return -0.0  # serde_json reads `-0` as a float, which no shape or offset accepts
    return int(s)


def _check_surrogates(path: str, top: _Object) -> None:
    """Refuse a lone surrogate escape (``"\\ud800"``) anywhere, as the reference does."""
    stack: list[object] = [top]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _fail(path, "invalid JSON in header: lone surrogate in a \\u escape") from e
        elif isinstance(v, (list, tuple)):  # an array, an object or one of its (key, value) pairs
            stack.extend(v)


def _check_ignored(path: str, name: str, value: object) -> None:
    """Extra fields of a tensor entry are ignored by the reference but must still be JSON it can read:
    nesting below serde_json's limit and numbers within f64 range."""
    stack: list[tuple[object, int]] = [(value, 3)]  # top object, entry object, this value
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (tuple, list)):
            if depth >= _MAX_DEPTH:
                raise _fail(path, f"invalid JSON in header: nested {_MAX_DEPTH} levels deep", name)
            children = [c for _, c in v] if isinstance(v, tuple) else v
            stack.extend((c, depth + 1) for c in children)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > _F64_MAX:
            raise _fail(path, "invalid JSON in header: number out of range", name)


def _json_reason(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at char {e.pos}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e)


def _split_entries(path: str, top: _Object) -> tuple[dict[str, str] | None, dict[str, object]]:
    """The metadata and the tensor entries by name; a repeated tensor name or ``__metadata__`` is refused."""
    metadata: dict[str, str] | None = None
    seen_metadata = False
    entries: dict[str, object] = {}
    for key, value in top:
        if key == METADATA_KEY:
            if seen_metadata:
                raise _fail(path, "invalid JSON in header: duplicate field `__metadata__`")
            seen_metadata = True
            metadata = _check_metadata(path, value)
        elif key in entries:
            raise _fail(
                path, "duplicate tensor name (the format forbids it; other readers keep the last)", key
            )
        else:
            entries[key] = value
    return metadata, entries


def _check_metadata(path: str, value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, tuple):
        raise _fail(path, f"invalid `__metadata__`: expected an object of strings, got {_kind(value)}")
    out: dict[str, str] = {}
    for k, v in value:
        if not isinstance(v, str):
            raise _fail(path, f"invalid `__metadata__`: value of `{k}` is {_kind(v)}, expected a string")
        out[k] = v  # duplicate metadata keys: last wins, as in the reference
    return out


def _kind(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a float"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    return "an object"


def _uint_list(values: list[object]) -> bool:
    """Every value an integer (not a bool) in ``[0, 2^64)``."""
    for v in values:  # noqa: SIM110 (a loop takes half the time of all() over a generator)
        if type(v) is not int or v < 0 or v > _U64_MAX:
            return False
    return True


def _build_tensors(path: str, entries: dict[str, object]) -> dict[str, TensorInfo]:
    return {name: _tensor_info(path, name, entry) for name, entry in entries.items()}


def _tensor_info(path: str, name: str, entry: object) -> TensorInfo:
    dtype, shape, offsets = _entry_fields(path, name, entry)
    if not isinstance(dtype, str):
        raise _fail(path, f"invalid dtype: expected a string, got {_kind(dtype)}", name)
    if dtype not in DTYPE_BITS:
        raise _fail(path, f"unknown dtype {dtype!r} (dtypes are case-sensitive)", name)
    if type(shape) is not list or not _uint_list(shape):
        raise _fail(path, "invalid shape: expected a list of non-negative integers", name)
    if type(offsets) is not list or len(offsets) != 2 or not _uint_list(offsets):
        raise _fail(path, "invalid data_offsets: expected [begin, end] of non-negative integers", name)
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])


def _entry_fields(path: str, name: str, entry: object) -> tuple[object, object, object]:
    """The dtype, shape and data_offsets of one tensor entry: an object, or the ``[dtype, shape, data_offsets]``
    list serde (the reference) also reads the entry struct from."""
    if isinstance(entry, tuple):
        match entry:  # the three fields in the order every writer uses: read without building a dict
            case (("dtype", dtype), ("shape", shape), ("data_offsets", offsets)):
                return dtype, shape, offsets
        fields = dict(entry)
        _check_fields(path, name, entry, fields)
        return fields["dtype"], fields["shape"], fields["data_offsets"]
    if isinstance(entry, list) and len(entry) == 3:
        return entry[0], entry[1], entry[2]
    raise _fail(path, f"invalid tensor entry: expected an object, got {_kind(entry)}", name)


_FIELDS = ("dtype", "shape", "data_offsets")
"""The fields of a tensor entry, in the order a missing one is named."""


def _check_fields(path: str, name: str, entry: _Object, fields: dict[str, object]) -> None:
    """No field repeated, none missing, the others (which the reference ignores) JSON it can read."""
    if len(fields) != len(entry):
        raise _fail(path, "invalid tensor entry: duplicate field", name)
    for fld in _FIELDS:
        if fld not in fields:
            raise _fail(path, f"invalid tensor entry: missing field `{fld}`", name)
    for fld, extra in fields.items():
        if fld not in _FIELDS:
            _check_ignored(path, name, extra)


def _check_offsets(path: str, tensors: dict[str, TensorInfo], data_bytes: int) -> None:
    """The entries, in data order, tile the data section exactly, each spanning its shape and dtype's bytes."""
    position = 0
    for name, dtype, shape, begin, end in sorted(tensors.values(), key=_SPAN):
        if begin != position:
            what = "a hole before" if begin > position else "overlapping offsets for"
            raise _fail(
                path, f"invalid offset: {what} this tensor (starts at {begin}, expected {position})", name
            )
        if end < begin:
            raise _fail(path, f"invalid offset: end {end} is before begin {begin}", name)
        bits = _numel(path, name, shape) * DTYPE_BITS[dtype]
        if bits > _U64_MAX:
            raise _fail(path, "overflow computing the byte size from shape and dtype", name)
        if bits % 8:
            raise _fail(path, f"shape {list(shape)} of {dtype} does not end on a byte boundary", name)
        if end - begin != bits // 8:
            raise _fail(
                path,
                f"invalid shape, dtype or offsets: {list(shape)} {dtype} needs {bits // 8} bytes, "
                f"offsets span {end - begin}",
                name,
            )
        position = end
    if position != data_bytes:
        if position < data_bytes:
            raise _fail(path, f"file not fully covered: {data_bytes - position} bytes after the last tensor")
        raise _fail(path, f"file truncated: tensors need {position} data bytes, the file has {data_bytes}")


_SPAN = attrgetter("begin", "end")


def _numel(path: str, name: str, shape: tuple[int, ...]) -> int:
    """The element count, refused where the reference's checked multiplication (dimension by dimension, in
    64 bits) overflows: with no zero dimension every partial product is at most the whole one."""
    numel = math.prod(shape)
    if numel > _U64_MAX or (numel == 0 and _partial_product_overflows(shape)):
        raise _fail(path, "overflow computing the byte size from shape and dtype", name)
    return numel


def _partial_product_overflows(shape: tuple[int, ...]) -> bool:
    product = 1
    for d in shape:
        product *= d
        if product > _U64_MAX:
            return True
    return False


def serialize_header(
    metadata: dict[str, str] | None, tensors: list[TensorInfo] | dict[str, TensorInfo]
) -> bytes:
    """Compact JSON for a header, ``__metadata__`` first, tensors in the given order (no padding)."""
    items = tensors.values() if isinstance(tensors, dict) else tensors
    obj: dict[str, object] = {}
    if metadata is not None:
        obj[METADATA_KEY] = metadata
    for t in items:
        obj[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [t.begin, t.end]}
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
