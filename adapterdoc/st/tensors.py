"""Read selected tensors of a safetensors file one at a time, through bounded mmap windows, without torch.

The scans work on the raw bits, so every float format is handled the same way (F64 … BF16, the FP8 family):
a value is zero when its bits, less the sign bit, are zero; it is NaN or ±Inf when its exponent bits are all
ones (IEEE-like formats) or when it hits the format's NaN pattern (E4M3FN, the FNUZ formats, E8M0). numpy
is used when installed; otherwise a pure-Python path gives the same answers, more slowly.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

from adapterdoc.errors import HeaderError
from adapterdoc.st.header import Header, TensorInfo

CHUNK_BYTES = 16 * 1024 * 1024
"""Bytes mapped at a time; the memory a scan needs does not grow with the tensor."""


@dataclass(frozen=True)
class _Bits:
    """How to read one dtype's elements as unsigned integers."""

    width: int
    """Bytes per element word (complex types are scanned as their float halves)."""
    sign: int
    """The sign-bit mask (0 for integer types)."""
    exp: int
    """Exponent mask: all ones means NaN/Inf. 0 when the format uses explicit NaN codes instead."""
    nan_codes: tuple[int, ...] = ()
    """Explicit NaN bit patterns (``bits & ~sign`` for E4M3FN, whole word for the FNUZ formats and E8M0)."""
    signed_zero: bool = True
    """Whether ``-0`` exists (FNUZ formats use 0x80 as NaN, so only 0x00 is zero)."""
    never_zero: bool = False
    """E8M0 (a pure exponent) has no zero."""


_FLOAT_BITS: dict[str, _Bits] = {
    "F64": _Bits(8, 1 << 63, 0x7FF0000000000000),
    "C64": _Bits(4, 1 << 31, 0x7F800000),
    "F32": _Bits(4, 1 << 31, 0x7F800000),
    "F16": _Bits(2, 1 << 15, 0x7C00),
    "BF16": _Bits(2, 1 << 15, 0x7F80),
    "F8_E5M2": _Bits(1, 0x80, 0x7C),
    "F8_E4M3": _Bits(1, 0x80, 0, nan_codes=(0x7F,)),
    "F8_E4M3FNUZ": _Bits(1, 0x80, 0, nan_codes=(0x80,), signed_zero=False),
    "F8_E5M2FNUZ": _Bits(1, 0x80, 0, nan_codes=(0x80,), signed_zero=False),
    "F8_E8M0": _Bits(1, 0, 0, nan_codes=(0xFF,), never_zero=True),
}
_INT_WIDTH = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8}
SCANNABLE = frozenset(_FLOAT_BITS) | frozenset(_INT_WIDTH) | {"F4"}
"""dtypes the scanner reads; the sub-byte F6 formats are reported as not scanned."""


@dataclass(frozen=True)
class TensorScan:
    """What one pass over a tensor found."""

    name: str
    dtype: str
    numel: int
    first_nonzero: int | None
    """Index (in element words) of the first non-zero element; ``None`` when every element is zero."""
    nonfinite: int | None
    """How many elements are NaN or ±Inf; ``None`` when not checked (or the dtype has no such values)."""
    bytes_read: int
    scanned: bool = True
    """False when the dtype is not one the scanner understands (nothing else is meaningful then)."""

    @property
    def all_zero(self) -> bool:
        return self.scanned and self.first_nonzero is None


def scan_tensor(
    header: Header, name: str, *, zeros: bool = True, finite: bool = True, stop_at_nonzero: bool = False
) -> TensorScan:
    """Scan tensor ``name`` of the file ``header`` describes.

    ``zeros`` finds the first non-zero element; ``finite`` counts NaN/±Inf. With ``stop_at_nonzero`` (and
    ``finite`` off) the scan ends at the first chunk holding a non-zero element.
    """
    info = header.tensors[name]
    if info.dtype not in SCANNABLE:
        return TensorScan(name, info.dtype, info.numel, None, None, 0, scanned=False)
    bits = _FLOAT_BITS.get(info.dtype)
    first: int | None = None
    bad = 0
    read = 0
    width = bits.width if bits else _INT_WIDTH.get(info.dtype, 1)
    for offset, buf in _windows(header, info):
        read += len(buf)
        base = offset // width
        if zeros and first is None:
            idx = _first_nonzero(buf, info.dtype, bits)
            if idx is not None:
                first = base + idx
        if finite and bits is not None:
            bad += _count_nonfinite(buf, bits)
        if stop_at_nonzero and not finite and (first is not None or not zeros):
            break
    check_finite = finite and bits is not None
    return TensorScan(name, info.dtype, info.numel, first, bad if check_finite else None, read)


def scan_bytes(data: bytes, dtype: str, *, finite: bool = True) -> tuple[bool, int | None, int]:
    """(scanned, first non-zero element or ``None``, NaN/Inf count) of one tensor held in memory (a ``.bin``'s,
    read by :mod:`adapterdoc.st.pickled`): the scan :func:`scan_tensor` makes of a file's window."""
    if dtype not in SCANNABLE:
        return False, None, 0
    bits = _FLOAT_BITS.get(dtype)
    buf = memoryview(data)
    bad = _count_nonfinite(buf, bits) if finite and bits is not None else 0
    return True, _first_nonzero(buf, dtype, bits), bad


def read_tensor_bytes(header: Header, name: str) -> bytes:
    """The raw bytes of one tensor (for small tensors and tests)."""
    with TensorSource(header) as src:
        return src.read(name)


class TensorSource:
    """One open file for many tensor reads (``remap --experts`` reads tens of thousands of small tensors).

    Reads are positioned reads (``os.pread``) on one descriptor into fresh buffers: nothing is mapped, so the
    resident memory is what the caller keeps, and one file stays open for the whole pass. Use as a context manager.
    """

    def __init__(self, header: Header) -> None:
        self.header = header
        try:
            self._f = open(header.path, "rb", buffering=0)  # noqa: SIM115  (closed in close())
        except OSError as e:
            raise HeaderError(header.path, f"cannot read: {e.strerror or e}") from e
        self._fd = self._f.fileno()
        self._size = os.fstat(self._fd).st_size

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._f.close()

    def _span(self, name: str) -> tuple[int, int]:
        info = self.header.tensors[name]
        begin, end = self.header.data_start + info.begin, self.header.data_start + info.end
        if self._size < end:
            raise HeaderError(
                self.header.path,
                "file is shorter than its header says (changed since it was read?)",
                key=name,
            )
        return begin, end

    def _pread(self, n: int, pos: int) -> bytes:
        if hasattr(os, "pread"):
            data = os.pread(self._fd, n, pos)
        else:  # pragma: no cover - hosts without pread (Windows)
            self._f.seek(pos)
            data = self._f.read(n)
        while len(data) < n:  # a short read: go on from where it stopped
            more = (
                os.pread(self._fd, n - len(data), pos + len(data))
                if hasattr(os, "pread")
                else self._f.read(n - len(data))
            )
            if not more:
                raise HeaderError(self.header.path, "file ended early (changed since it was read?)")
            data += more
        return data

    def read(self, name: str) -> bytes:
        """The raw bytes of tensor ``name``."""
        begin, end = self._span(name)
        return self._pread(end - begin, begin) if end > begin else b""

    def read_many(self, names: Iterable[str], *, gap: int = 1 << 16) -> dict[str, memoryview]:
        """The raw bytes of each of ``names``, read in as few positioned reads as the file's order allows: tensors
        lying at most ``gap`` bytes apart are read together, in runs of at most :data:`CHUNK_BYTES` (plus one
        tensor), so memory is what the names hold, plus the small gaps."""
        spans = sorted((self._span(n), n) for n in set(names))
        out: dict[str, memoryview] = {}
        i = 0
        while i < len(spans):
            (start, end), _ = spans[i]
            j = i + 1
            while j < len(spans) and spans[j][0][0] - end <= gap and spans[j][0][1] - start <= CHUNK_BYTES:
                end = max(end, spans[j][0][1])
                j += 1
            run = memoryview(self._pread(end - start, start) if end > start else b"")
            for (b, e), n in spans[i:j]:
                out[n] = run[b - start : e - start]
            i = j
        return out

    def windows_into(self, name: str, buf: bytearray) -> Iterator[tuple[int, memoryview]]:
        """(byte offset inside the tensor, bytes) windows over tensor ``name``, each read into ``buf`` (reused: a
        view is valid only until the next one is taken), at most ``len(buf)`` bytes and a whole number of elements.
        No mapping and no fresh buffer: a small ``buf`` stays in cache for the caller's pass over it."""
        info = self.header.tensors[name]
        if info.nbytes == 0:
            return
        begin, end = self._span(name)
        chunk = len(buf) - len(buf) % _element_width(info.dtype)
        if chunk <= 0:
            raise ValueError(f"a {len(buf)}-byte buffer holds no {info.dtype} element")
        whole = memoryview(buf)
        pos = begin
        while pos < end:
            n = min(chunk, end - pos)
            view = whole[:n]
            got = self._preadv(view, pos)
            while got < n:  # a short read: go on from where it stopped
                more = self._preadv(view[got:], pos + got)
                if not more:
                    raise HeaderError(self.header.path, "file ended early (changed since it was read?)")
                got += more
            yield pos - begin, view
            pos += n

    def _preadv(self, view: memoryview, pos: int) -> int:
        if hasattr(os, "preadv"):
            return os.preadv(self._fd, [view], pos)
        self._f.seek(pos)  # pragma: no cover - hosts without preadv (Windows)
        return self._f.readinto(view) or 0  # pragma: no cover

    def chunks(self, name: str, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The bytes of tensor ``name`` in pieces of at most ``chunk`` bytes (memory bounded by ``chunk``)."""
        begin, end = self._span(name)
        pos = begin
        while pos < end:
            n = min(chunk, end - pos)
            yield self._pread(n, pos)
            pos += n


SAME_BYTES_CHUNK = 1024 * 1024
"""Bytes compared at a time by :func:`same_bytes` (two such chunks live at once: small beside the tensors)."""


def same_bytes(ha: Header, ta: TensorInfo, hb: Header, tb: TensorInfo) -> bool:
    """Whether tensor ``ta`` of ``ha``'s file and ``tb`` of ``hb``'s hold the same bytes (read a chunk at a time,
    nothing decoded; the dtypes are the caller's to compare)."""
    if ta.nbytes != tb.nbytes:
        return False
    with open(ha.path, "rb") as fa, open(hb.path, "rb") as fb:
        fa.seek(ha.data_start + ta.begin)
        fb.seek(hb.data_start + tb.begin)
        left = ta.nbytes
        while left > 0:
            n = min(SAME_BYTES_CHUNK, left)
            if fa.read(n) != fb.read(n):
                return False
            left -= n
    return True


def tensor_windows(header: Header, name: str) -> Iterator[tuple[int, memoryview]]:
    """(byte offset inside the tensor, bytes) windows over tensor ``name``, at most :data:`CHUNK_BYTES` each and
    a whole number of elements; each view is valid only until the next one is taken (release what you derive)."""
    return _windows(header, header.tensors[name])


def _windows(header: Header, info: TensorInfo, chunk: int | None = None) -> Iterator[tuple[int, memoryview]]:
    """(byte offset inside the tensor, bytes) windows over one tensor, each through its own short-lived mmap."""
    if info.nbytes == 0:
        return
    begin = header.data_start + info.begin
    end = header.data_start + info.end
    width = _element_width(info.dtype)
    chunk = chunk or CHUNK_BYTES
    chunk = max(width, chunk - chunk % width)
    gran = mmap.ALLOCATIONGRANULARITY
    try:
        fd = os.open(header.path, os.O_RDONLY)
    except OSError as e:
        raise HeaderError(header.path, f"cannot read: {e.strerror or e}") from e
    try:
        size = os.fstat(fd).st_size
        if size < end:
            raise HeaderError(
                header.path,
                "file is shorter than its header says (changed since it was read?)",
                key=info.name,
            )
        pos = begin
        while pos < end:
            stop = min(end, pos + chunk)
            start = pos - pos % gran
            mm = mmap.mmap(fd, stop - start, access=mmap.ACCESS_READ, offset=start)
            try:
                view = memoryview(mm)[pos - start : stop - start]
                try:
                    yield pos - begin, view
                finally:
                    view.release()
            finally:
                mm.close()
            pos = stop
    finally:
        os.close(fd)


def _element_width(dtype: str) -> int:
    """Bytes per element word (1 for the sub-byte formats: windows are whole bytes)."""
    return max(1, _FLOAT_BITS[dtype].width if dtype in _FLOAT_BITS else _INT_WIDTH.get(dtype, 1))


def _np() -> ModuleType | None:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy ships with torch; the fallback is tested directly
        return None
    return numpy


_UINT = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}
_PROBE = 4096
"""Elements checked before a whole window is searched for its first non-zero element."""


def _first_nonzero(buf: memoryview, dtype: str, bits: _Bits | None) -> int | None:
    if dtype == "F4":  # two E2M1 values per byte; the sign is bit 3 of each nibble
        return _first_nonzero_f4(buf)
    width = bits.width if bits else _INT_WIDTH[dtype]
    if bits is not None and bits.never_zero:
        return 0 if len(buf) else None
    mask = ((1 << (8 * width)) - 1) & ~(bits.sign if bits is not None and bits.signed_zero else 0)
    np = _np()
    if np is not None:
        arr = np.frombuffer(buf, dtype=_UINT[width])
        if (
            len(arr) > _PROBE
        ):  # a non-zero tensor usually shows it at once: look at a prefix before the window
            head = _first_nonzero(buf[: _PROBE * width], dtype, bits)
            if head is not None:
                return head
        hits = (
            np.flatnonzero(arr & np.array(mask, dtype=arr.dtype))
            if mask != (1 << 8 * width) - 1
            else np.flatnonzero(arr)
        )
        return int(hits[0]) if hits.size else None
    for i, v in enumerate(_words(buf, width)):
        if v & mask:
            return i
    return None


def _first_nonzero_f4(buf: memoryview) -> int | None:
    for i, b in enumerate(bytes(buf)):
        if b & 0x07:
            return 2 * i
        if b & 0x70:
            return 2 * i + 1
    return None


def _count_nonfinite(buf: memoryview, bits: _Bits) -> int:
    width = bits.width
    np = _np()
    if np is not None:
        arr = np.frombuffer(buf, dtype=_UINT[width])
        if bits.exp:
            e = np.array(bits.exp, dtype=arr.dtype)
            return int(np.count_nonzero((arr & e) == e))
        if bits.signed_zero and bits.sign:
            low = arr & np.array(((1 << 8 * width) - 1) & ~bits.sign, dtype=arr.dtype)
            return int(np.isin(low, np.array(bits.nan_codes, dtype=arr.dtype)).sum())
        return int(np.isin(arr, np.array(bits.nan_codes, dtype=arr.dtype)).sum())
    n = 0
    for v in _words(buf, width):
        if bits.exp:
            n += (v & bits.exp) == bits.exp
        elif bits.signed_zero and bits.sign:
            n += (v & ~bits.sign) in bits.nan_codes
        else:
            n += v in bits.nan_codes
    return n


_WORD_FORMATS: dict[int, Literal["B", "H", "I", "Q"]] = {1: "B", 2: "H", 4: "I", 8: "Q"}
"""The unsigned struct format of each element width."""


def _words(buf: memoryview, width: int) -> Iterator[int]:
    fmt = _WORD_FORMATS[width]
    if sys.byteorder == "little":
        yield from buf.cast(fmt)
        return
    data = bytes(buf)  # pragma: no cover - big-endian hosts
    for i in range(0, len(data), width):  # pragma: no cover
        yield int.from_bytes(data[i : i + width], "little")
