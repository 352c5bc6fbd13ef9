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

from adapterdoc.st.atomic import atomic_writer
from adapterdoc.st.dtypes import DTYPE_BITS
from adapterdoc.st.header import TensorInfo, serialize_header
from adapterdoc.st.rewrite import aligned_length, padded

_FORMAT = {1: "B", 2: "H", 4: "I", 8: "Q"}


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
    with atomic_writer(dest, mode=mode, link=link) as f:
        f.write(prefix)
        for piece in pieces:
            f.write(piece)
            written += len(piece)
            if progress is not None:
                progress(len(piece))
        if written != pos:
            raise AssertionError(f"tensor data of {written} bytes written for a header of {pos}")
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
