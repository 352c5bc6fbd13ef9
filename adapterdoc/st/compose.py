"""Write a new safetensors file from tensors produced one at a time (standard library only).

The header is built first from the shapes the caller promises; the data then streams from an iterator of byte
pieces, so memory stays at the largest piece the caller makes, not the file. Every write goes through
:func:`adapterdoc.st.atomic.atomic_writer` (temp file beside the target, fsync, rename). Also the element moves the
expert remap needs, on raw bytes: a strided gather (every E-th element) and its inverse scatter, which are pure
permutations, so every dtype with whole-byte elements is moved bit for bit.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

from adapterdoc.st.atomic import atomic_writer
from adapterdoc.st.dtypes import DTYPE_BITS
from adapterdoc.st.header import TensorInfo, serialize_header
from adapterdoc.st.rewrite import aligned_length, padded

_FORMAT: dict[int, Literal["B", "H", "I", "Q"]] = {1: "B", 2: "H", 4: "I", 8: "Q"}
WRITE_BYTES = 8 * 1024 * 1024
"""Pieces smaller than this are gathered and written together (fewer, larger writes)."""
NUMPY_FROM = 1 << 16
""":func:`transpose` of at least this many elements uses numpy when it is installed (its import costs more than a
small transpose); below it, and without numpy, the standard-library path. Both give the same bytes."""
_BAND = 1024


@dataclass(frozen=True)
class Spec:
    """One tensor of the file to write."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = element_bytes(self.dtype)
        for d in self.shape:
            n *= d
        return n


def element_bytes(dtype: str) -> int:
    """Bytes per element; a sub-byte dtype (F4, F6) raises ``ValueError`` (its elements cannot be moved alone)."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None or bits % 8 or bits // 8 not in _FORMAT:
        raise ValueError(f"dtype {dtype} has no whole-byte elements")
    return bits // 8


def compose(
    dest: str | os.PathLike[str],
    specs: list[Spec],
    pieces: Iterable[bytes | bytearray | memoryview],
    *,
    metadata: dict[str, str] | None,
    mode: int | None = None,
    link: str = "follow",
    progress: Callable[[int], None] | None = None,
) -> int:
    """Write ``dest`` atomically: a header for ``specs`` (in that order, padded as safetensors pads), then the
    bytes ``pieces`` yields, which must add up to each tensor in turn. Returns the bytes written."""
    infos: list[TensorInfo] = []
    pos = 0
    for s in specs:
        infos.append(TensorInfo(s.name, s.dtype, s.shape, pos, pos + s.nbytes))
        pos += s.nbytes
    body = serialize_header(metadata, infos)
    n = aligned_length(body)
    prefix = struct.pack("<Q", n) + padded(body, n)
    written = 0
    buf = bytearray(WRITE_BYTES)  # small pieces gathered into large sequential writes (one reused buffer)
    view = memoryview(buf)
    fill = 0
    try:
        with atomic_writer(dest, mode=mode, link=link) as f:
            f.write(prefix)
            for piece in pieces:
                n = len(piece)
                if fill and fill + n > WRITE_BYTES:
                    f.write(view[:fill])
                    fill = 0
                if n >= WRITE_BYTES:
                    f.write(piece)
                else:
                    buf[fill : fill + n] = piece
                    fill += n
                written += n
                if progress is not None:
                    progress(n)
            if fill:
                f.write(view[:fill])
            if written != pos:
                raise AssertionError(f"tensor data of {written} bytes written for a header of {pos}")
    finally:
        view.release()
    return len(prefix) + pos


def gather(buf: bytes | bytearray | memoryview, width: int, start: int, step: int) -> bytes:
    """Elements ``start, start + step, …`` of ``buf`` (``width`` bytes each), as bytes."""
    view = memoryview(buf).cast("B").cast(_FORMAT[width])
    try:
        return view[start::step].tobytes()
    finally:
        view.release()


def scatter(out: bytearray, width: int, start: int, step: int, data: bytes | memoryview, count: int) -> None:
    """Put the first ``count`` elements of ``data`` at elements ``start, start + step, …`` of ``out``."""
    dst = memoryview(out).cast(_FORMAT[width])
    src = memoryview(data).cast("B").cast(_FORMAT[width])
    try:
        dst[start : start + step * count : step] = src[:count]
    finally:
        src.release()
        dst.release()


def transpose(
    buf: bytes | bytearray | memoryview, width: int, rows: int, cols: int
) -> bytes | bytearray | memoryview:
    """The ``[rows, cols]`` matrix of ``width``-byte elements in ``buf``, transposed to ``[cols, rows]``."""
    if rows * cols * width != len(buf):
        raise ValueError(f"{len(buf)} bytes are not a [{rows}, {cols}] matrix of {width}-byte elements")
    if rows * cols >= NUMPY_FROM:
        np = _numpy()
        if np is not None:
            arr = np.frombuffer(buf, dtype=f"<u{width}").reshape(rows, cols)
            out = np.empty((cols, rows), dtype=arr.dtype)
            if rows >= cols:  # in bands along the long side: several times faster than one strided copy
                for i in range(0, rows, _BAND):
                    out[:, i : i + _BAND] = arr[i : i + _BAND].T
            else:
                for j in range(0, cols, _BAND):
                    out[j : j + _BAND] = arr[:, j : j + _BAND].T
            return memoryview(out).cast("B")
    if cols <= rows:  # one strided gather per output row
        return b"".join(gather(buf, width, c, cols) for c in range(cols))
    out = bytearray(len(buf))  # one strided scatter per input row
    src = memoryview(buf).cast("B")
    try:
        for r in range(rows):
            scatter(out, width, r, rows, src[r * cols * width : (r + 1) * cols * width], cols)
    finally:
        src.release()
    return out


def _numpy() -> ModuleType | None:
    try:
        import numpy
    except ImportError:  # pragma: no cover - the standard-library path is tested directly
        return None
    return numpy
