"""Read and validate a safetensors header with the standard library only (no tensor data is read).

The rules follow the reference reader (safetensors 0.8, see shared/SAFETENSORS.md) with one deliberate
difference: duplicate tensor names are rejected (the spec forbids them; the reference keeps the last).
"""

from __future__ import annotations

import gc
import json
import math
import os
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import and_, itemgetter, mul, rshift, sub
from typing import BinaryIO, NamedTuple, NoReturn

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
_ODD_JSON = re.compile(r"\\u[dD][89a-fA-F]|-0(?![.\deE])")
"""Cheap pre-scan for the rare spellings Python's json reads differently from serde_json:
surrogate escapes (a lone one is refused by the reference) and ``-0`` (a float there, an int here)."""


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
        if not _is_regular(pre.st_mode) and not os.path.isdir(spath):
            raise _fail(spath, "not a regular file")  # checked before open(): opening a FIFO blocks
        with open(spath, "rb") as f:
            st = os.fstat(f.fileno())
            if not _is_regular(st.st_mode):
                raise _fail(spath, "not a regular file")
            size = st.st_size
            prefix = f.read(8)
            n = _check_length(spath, prefix, size)
            seen = _PARSED.get((spath, size))
            if seen is not None and len(seen.raw) == n and _reads_as(f, seen.raw):  # the same bytes: copies
                meta = None if seen.metadata is None else dict(seen.metadata)
                return Header(spath, size, n, meta, dict(seen.tensors), seen.raw)
            raw = f.read(n)
    except IsADirectoryError as e:
        raise _fail(spath, "is a directory, not a safetensors file") from e
    except HeaderError:
        raise
    except OSError as e:
        raise _fail(spath, f"cannot read: {e.strerror or e}") from e
    if len(raw) != n:
        raise _fail(spath, f"file shrank while reading: header of {n} bytes announced, {len(raw)} read")
    header = parse_header(spath, raw, size)
    if len(_PARSED) >= _PARSED_MAX:
        _PARSED.pop(next(iter(_PARSED)))
    meta = None if header.metadata is None else dict(header.metadata)
    _PARSED[(spath, size)] = Header(
        spath, size, len(raw), meta, dict(header.tensors), raw
    )  # the caller's may change
    return header


_CHUNK = 1 << 16


def _reads_as(f: BinaryIO, raw: bytes) -> bool:
    """Whether ``f``'s next ``len(raw)`` bytes are ``raw``, read in 64 KiB pieces into one small buffer (a header
    read again is not allocated again: at 4096 tensors that is 140 fresh pages). Either way ``f`` is left at the
    position it had, for the full read that follows a difference (or a short read, which that read reports)."""
    start = f.tell()
    view = memoryview(bytearray(min(_CHUNK, len(raw))))
    at = 0
    try:
        while at < len(raw):
            k = f.readinto(view[: min(_CHUNK, len(raw) - at)])
            if not k or not raw.startswith(view[:k], at):  # startswith: one memcmp, no copy
                return False
            at += k
        return True
    finally:
        f.seek(start)


_PARSED: dict[tuple[str, int], Header] = {}
"""The last few headers :func:`read_header` parsed, by (path, file size). A command often reads one file's
header twice (format detection, then the checkpoint); when the header bytes read again are the same, the result
is a copy of the first parse (validation is a function of those bytes and the file size alone)."""
_PARSED_MAX = 8


def forget_parsed_headers() -> None:
    """Empty :func:`read_header`'s memo (benchmarks timing the parse itself call this first)."""
    _PARSED.clear()


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


def _check_length(path: str, prefix: bytes, size: int) -> int:
    if len(prefix) < 8:
        raise _fail(path, f"header too small: file is {size} bytes, a safetensors file starts with 8")
    (n,) = struct.unpack("<Q", prefix)
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

    The cyclic garbage collector is paused meanwhile: parsing allocates tens of thousands of containers, none in
    a cycle, and each collection it would trigger walks them all (a third of the time at 4096 tensors)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _parse_header(path, raw, file_size)
    finally:
        if collecting:
            gc.enable()


def _parse_header(path: str, raw: bytes, file_size: int) -> Header:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(path, f"invalid UTF-8 in header at byte {e.start}") from e
    if text.startswith("\ufeff"):
        raise _fail(path, "invalid JSON in header: starts with a byte order mark")
    data_bytes = file_size - 8 - len(raw)
    parsed = _load_json_fast(text)
    fast = _fast_header(parsed, data_bytes) if parsed is not None else None
    if fast is not None:
        metadata, tensors = fast
    else:  # the exact parse and checks, in the reference's order, find the first violation and name it
        obj = _load_json(path, text)
        metadata, entries = _split_entries(path, obj)
        tensors = _build_tensors(path, entries)
        _check_offsets(path, tensors, data_bytes)
    return Header(
        path=path, file_size=file_size, header_len=len(raw), metadata=metadata, tensors=tensors, raw=raw
    )


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON constant {name}")


def _load_json(path: str, text: str) -> list[tuple[str, object]]:
    """Parse the header; the top level is returned as ordered (key, value) pairs so duplicates stay visible."""
    stripped = text.strip(_JSON_WS)
    if not stripped.startswith("{"):
        kind = "empty" if not stripped else "not a JSON object"
        raise _fail(path, f"invalid JSON in header: {kind}")
    # substring tests first: both odd spellings need a backslash or "-0", and most headers have neither
    odd = ("\\" in text or ("-" in text and "-0" in text)) and _ODD_JSON.search(text) is not None
    top: list[tuple[str, object]] | None = None

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        nonlocal top
        top = pairs  # the outermost object is the last one completed
        d = dict(pairs)
        # Only objects with a repeated key keep their raw pairs (cheap for the common, duplicate-free case).
        return d if len(d) == len(pairs) else _PairsDict(pairs)

    try:
        json.loads(
            text,
            object_pairs_hook=hook,
            parse_constant=_reject_constant,
            parse_int=_parse_int if odd else None,
        )
    except (ValueError, RecursionError) as e:
        raise _fail(path, f"invalid JSON in header: {_json_reason(e)}") from e
    assert top is not None
    if odd:
        _check_surrogates(path, top)
    return top


def _load_json_fast(text: str) -> _Parsed | None:
    """Parse with the C scanner alone (no per-object hook), for :func:`_fast_header` to prove there are no
    repeated keys.

    With no backslash in the text every string is spelled literally between two quotes, so the text holds
    exactly ``2 × (number of strings)`` quote characters. A repeated key drops at least its own key string from
    the parsed result, so when :func:`_fast_header` finds the parsed header well-formed and counts as many strings
    in it (each entry's three field names and its dtype, each metadata key and value, each top-level name) as
    the text spells, no key anywhere was repeated. Anything else returns ``None`` (or fails there) and the
    exact, slower path decides (repeated metadata keys, which are legal, take that route too)."""
    # "-" first: one character is a memchr (4 µs over 571 KB), two are a walk in CPython (0.5 ms)
    if "\\" in text or ("-" in text and "-0" in text and _ODD_JSON.search(text) is not None):
        return None
    try:  # a float anywhere fails here (no field of a well-formed header holds one): no type pass needs to find it
        obj = json.loads(text, parse_constant=_reject_constant, parse_float=_reject_float)
    except (ValueError, RecursionError):
        return None  # the exact path reports the error
    if type(obj) is not dict:
        return None
    return _Parsed(obj, text.count('"'))


class _Parsed(NamedTuple):
    """A header parsed by the C scanner alone, and the number of quote characters its text holds."""

    obj: dict[str, object]
    quotes: int


def _reject_float(s: str) -> NoReturn:
    raise ValueError(f"a float ({s})")


_ONLY_INT = {int}
_ONLY_LIST = {list}


def _fast_header(
    parsed: _Parsed, data_bytes: int
) -> tuple[dict[str, str] | None, dict[str, TensorInfo]] | None:
    """The metadata and tensors of a well-formed header, checked in bulk (C-level ``map``/``set``/list
    comparisons, no per-tensor Python code), or ``None`` when any check might fail: then the exact checks run
    and report the first violation, so every error message stays what it was.

    Well-formed: metadata absent, null or an object of strings; every entry exactly ``dtype`` (a known one),
    ``shape`` and ``data_offsets`` (lists of ints in ``[0, 2^64)``, two offsets; no zero dimension: those take
    the exact route, which replays the reference's checked multiplication), no key repeated anywhere (the
    quote count, see :func:`_load_json_fast`), and the entries tile the data section exactly, each spanning
    ``numel × bits / 8`` bytes below 2^64. Two passes run only where they can fail: the whole-byte one with a
    sub-byte dtype present, the 2^64 one for a data section of 2^61 bytes or more (below it the tiling implies
    the bound; ``tests/st/test_header_fast.py`` pins both); floats fail the parse itself."""
    obj = parsed.obj
    strings = len(obj)  # the top-level names
    names = list(obj)
    entries = list(obj.values())
    metadata: dict[str, str] | None = None
    if METADATA_KEY in obj:
        at = names.index(METADATA_KEY)
        del names[at]
        e = entries.pop(at)
        if e is not None:
            if type(e) is not dict or not _all_str(e.values()):
                return None
            metadata = e
            strings += 2 * len(e)
    n = len(entries)
    if parsed.quotes != 2 * (strings + 4 * n):  # three field names and a dtype string per entry
        return None
    if not n:
        return (metadata, {}) if data_bytes == 0 else None
    # No type or length pass over the entries: an entry that is no object fails the field reads (a list, a
    # string, a number or null cannot be read by a string key), and one with a field more adds its name to
    # the quote count just checked. A list entry (which the reference reads too) takes the exact route.
    try:
        dtypes = list(map(itemgetter("dtype"), entries))
        shape_lists = list(map(itemgetter("shape"), entries))
        offsets = list(map(itemgetter("data_offsets"), entries))
        kinds = set(dtypes)
        if not kinds <= DTYPE_BITS.keys():
            return None
        # begins and ends in one C-level transposition; strict: every offsets list as long as the others, so
        # two rows means two offsets each (an object there is empty or adds quotes, a number fails)
        pair = list(map(list, zip(*offsets, strict=True)))
    except (KeyError, TypeError, ValueError):  # a missing field; an unhashable dtype; uneven offsets
        return None
    if len(pair) != 2 or set(map(type, shape_lists)) != _ONLY_LIST:
        return None
    begins, ends = pair
    shapes = list(map(tuple, shape_lists))
    dims = list(chain.from_iterable(shape_lists))  # one list: passes over it are 2-3x faster than a chain
    # every dimension and offset an int, not a bool (which compares and subtracts like one), a string or null: one
    # C-level pass. No range checks beyond the minimum: each dimension is below the product checked against 2^64
    # next, and offsets that tile [0, data_bytes) with positive sizes (checked last) all lie inside it.
    if set(map(type, chain(dims, begins, ends))) != _ONLY_INT:
        return None
    if min(dims, default=1) < 1:
        return None  # a zero dimension, or a negative one
    sizes = list(map(sub, ends, begins))
    prods = list(map(math.prod, shapes))
    bits: list[int] | None = None
    one_bits = DTYPE_BITS[next(iter(kinds))] if len(kinds) == 1 else 0
    if one_bits and not one_bits & 7:  # one dtype of whole bytes, as most files hold: bytes = numel × width
        if sizes != list(map(mul, prods, repeat(one_bits >> 3))):
            return None
    else:
        bits = list(map(mul, prods, map(DTYPE_BITS.__getitem__, dtypes)))
        # a whole number of bytes: only a sub-byte dtype (F4, F6_*) can miss it, so the pass runs only with one
        if any(DTYPE_BITS[d] & 7 for d in kinds) and any(map(and_, bits, repeat(7))):
            return None
        if sizes != list(map(rshift, bits, repeat(3))):
            return None
    starts = sorted(begins)
    if starts == begins:  # written in data order, as most writers do
        stops = ends
    else:
        order = sorted(range(n), key=begins.__getitem__)
        stops = list(map(ends.__getitem__, order))
    if starts[0] != 0 or starts[1:] != stops[:-1] or stops[-1] != data_bytes:
        return None
    # The reference's bound, bits < 2^64: the entries tile the data section (checked above), so each spans
    # bits >> 3 <= data_bytes bytes and bits <= 8 * data_bytes + 7, below 2^64 unless the section holds 2^61
    # bytes or more; only then is the pass needed.
    if data_bytes > _U64_MAX >> 3:
        if bits is None:
            bits = list(map(mul, prods, repeat(one_bits)))
        if max(bits) > _U64_MAX:
            return None
    infos = map(tuple.__new__, repeat(TensorInfo), zip(names, dtypes, shapes, begins, ends))
    return metadata, dict(zip(names, infos))


def _all_str(values: Iterable[object]) -> bool:
    return set(map(type, values)) <= {str}


def _parse_int(s: str) -> int | float:
    if s == "-0":
        return -0.0  # serde_json reads `-0` as a float, which no shape or offset accepts
    return int(s)


def _check_surrogates(path: str, pairs: list[tuple[str, object]]) -> None:
    """Refuse a lone surrogate escape (``"\\ud800"``) anywhere, as the reference does."""
    stack: list[object] = [pairs]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _fail(path, "invalid JSON in header: lone surrogate in a \\u escape") from e
        elif isinstance(v, _PairsDict):
            stack.append(v.pairs)
        elif isinstance(v, dict):
            stack.extend(v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def _check_ignored(path: str, name: str, value: object) -> None:
    """Extra fields of a tensor entry are ignored by the reference but must still be JSON it can read:
    nesting below serde_json's limit and numbers within f64 range."""
    stack: list[tuple[object, int]] = [(value, 3)]  # top object, entry object, this value
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth >= _MAX_DEPTH:
                raise _fail(path, f"invalid JSON in header: nested {_MAX_DEPTH} levels deep", name)
            children = v.values() if isinstance(v, dict) else v
            stack.extend((c, depth + 1) for c in children)
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > _F64_MAX:
            raise _fail(path, "invalid JSON in header: number out of range", name)


def _json_reason(e: BaseException) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at char {e.pos}"
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e)


class _PairsDict(dict):  # type: ignore[type-arg]
    """A dict that remembers its raw (key, value) pairs, so nested duplicates can be detected."""

    def __init__(self, pairs: list[tuple[str, object]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def _split_entries(
    path: str, pairs: list[tuple[str, object]]
) -> tuple[dict[str, str] | None, list[tuple[str, object]]]:
    metadata: dict[str, str] | None = None
    seen_metadata = False
    seen: set[str] = set()
    entries: list[tuple[str, object]] = []
    for key, value in pairs:
        if key == METADATA_KEY:
            if seen_metadata:
                raise _fail(path, "invalid JSON in header: duplicate field `__metadata__`")
            seen_metadata = True
            metadata = _check_metadata(path, value)
            continue
        if key in seen:
            raise _fail(
                path, "duplicate tensor name (the format forbids it; other readers keep the last)", key
            )
        seen.add(key)
        entries.append((key, value))
    return metadata, entries


def _check_metadata(path: str, value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(path, f"invalid `__metadata__`: expected an object of strings, got {_kind(value)}")
    pairs = value.pairs if isinstance(value, _PairsDict) else list(value.items())
    out: dict[str, str] = {}
    for k, v in pairs:
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


def _is_uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _U64_MAX


def _uint_list(values: list[object]) -> bool:
    for v in values:
        if type(v) is not int or v < 0 or v > _U64_MAX:
            return _all_uint_slow(values)
    return True


def _all_uint_slow(values: list[object]) -> bool:
    return all(_is_uint(v) for v in values)


def _build_tensors(path: str, entries: list[tuple[str, object]]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for name, entry in entries:
        if isinstance(entry, list) and len(entry) == 3:
            # serde (the reference) also reads the entry struct from a [dtype, shape, data_offsets] list
            entry = dict(zip(("dtype", "shape", "data_offsets"), entry))
        if not isinstance(entry, dict):
            raise _fail(path, f"invalid tensor entry: expected an object, got {_kind(entry)}", name)
        if isinstance(entry, _PairsDict) and len(entry.pairs) != len(entry):
            raise _fail(path, "invalid tensor entry: duplicate field", name)
        for fld in ("dtype", "shape", "data_offsets"):
            if fld not in entry:
                raise _fail(path, f"invalid tensor entry: missing field `{fld}`", name)
        if len(entry) > 3:
            for fld, extra in entry.items():
                if fld not in ("dtype", "shape", "data_offsets"):
                    _check_ignored(path, name, extra)
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str):
            raise _fail(path, f"invalid dtype: expected a string, got {_kind(dtype)}", name)
        if dtype not in DTYPE_BITS:
            raise _fail(path, f"unknown dtype {dtype!r} (dtypes are case-sensitive)", name)
        if type(shape) is not list or not _uint_list(shape):
            raise _fail(path, "invalid shape: expected a list of non-negative integers", name)
        if type(offsets) is not list or len(offsets) != 2 or not _uint_list(offsets):
            raise _fail(path, "invalid data_offsets: expected [begin, end] of non-negative integers", name)
        tensors[name] = TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])
    return tensors


def _check_offsets(path: str, tensors: dict[str, TensorInfo], data_bytes: int) -> None:
    position = 0
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != position:
            what = "a hole before" if info.begin > position else "overlapping offsets for"
            raise _fail(
                path,
                f"invalid offset: {what} this tensor (starts at {info.begin}, expected {position})",
                info.name,
            )
        if info.end < info.begin:
            raise _fail(path, f"invalid offset: end {info.end} is before begin {info.begin}", info.name)
        nbits = DTYPE_BITS[info.dtype]
        numel = 1
        for d in info.shape:
            numel *= d
            if numel > _U64_MAX:
                raise _fail(path, "overflow computing the byte size from shape and dtype", info.name)
        bits = numel * nbits
        if bits > _U64_MAX:
            raise _fail(path, "overflow computing the byte size from shape and dtype", info.name)
        if bits % 8:
            raise _fail(
                path, f"shape {list(info.shape)} of {info.dtype} does not end on a byte boundary", info.name
            )
        if info.end - info.begin != bits // 8:
            raise _fail(
                path,
                f"invalid shape, dtype or offsets: {list(info.shape)} {info.dtype} needs {bits // 8} bytes, "
                f"offsets span {info.end - info.begin}",
                info.name,
            )
        position = info.end
    if position != data_bytes:
        if position < data_bytes:
            raise _fail(path, f"file not fully covered: {data_bytes - position} bytes after the last tensor")
        raise _fail(path, f"file truncated: tensors need {position} data bytes, the file has {data_bytes}")


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
