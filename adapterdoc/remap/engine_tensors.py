"""The tensor rewrites of ``remap --for``: a LoRA module's rank padded with zeros (rows of ``lora_A``, columns of
``lora_B``: ``B' A' = B A`` exactly, in every dtype) and ``lora_B`` multiplied by a constant (when an engine reads
one scaling for all modules: exact only when the factor is a power of two, else rounded once per element, measured
and reported). Both act on the ``(specs, producer)`` groups :func:`adapterdoc.st.compose.compose` streams: one
tensor in memory at a time, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.adapter import LoraKey
from adapterdoc.errors import MissingExtraError, UnsupportedInputError
from adapterdoc.st.compose import Spec, element_bytes, gather, scatter
from adapterdoc.st.header import Header
from adapterdoc.st.tensors import read_tensor_bytes, tensor_windows

if TYPE_CHECKING:
    import numpy as np

Piece = "bytes | bytearray | memoryview"
Producer = Callable[[], Iterator["bytes | bytearray | memoryview"]]
Group = tuple[list[Spec], Producer]

RANK_AXIS = {"lora_A": 0, "lora_embedding_A": 0, "lora_B": 1, "lora_embedding_B": 1}
"""Where the rank sits in each factor: ``lora_A`` ``[r, in]`` and ``lora_embedding_A`` ``[r, num]`` (rows),
``lora_B`` ``[out, r]`` and ``lora_embedding_B`` ``[dim, r]`` (columns)."""

SCALABLE = ("F64", "F32", "F16", "BF16")
"""The dtypes whose values ``lora_B`` scaling can multiply."""


@dataclass(frozen=True)
class Change:
    """What happens to one tensor: its rank padded to ``rank`` and/or its values multiplied by ``factor``."""

    rank: int | None = None
    axis: int = 0
    factor: float | None = None


def rank_of(info: LoraKey, shape: tuple[int, ...]) -> int | None:
    """The rank a LoRA factor carries, or ``None`` for a tensor without one (a bias, a full weight, 3-D)."""
    axis = RANK_AXIS.get(info.role)
    if axis is None or len(shape) != 2 or info.key.endswith(".bias"):
        return None
    return shape[axis]


def identity_groups(header: Header) -> list[Group]:
    """Every tensor of ``header`` copied as it is, one group each, in file order."""
    return [([Spec(name, t.dtype, t.shape)], _windows(header, name)) for name, t in header.tensors.items()]


def _windows(header: Header, name: str) -> Producer:
    def produce() -> Iterator[bytes | bytearray | memoryview]:
        for _, view in tensor_windows(header, name):
            yield view

    return produce


def new_spec(spec: Spec, change: Change | None) -> Spec:
    if change is None or change.rank is None:
        return spec
    shape = list(spec.shape)
    shape[change.axis] = change.rank
    return Spec(spec.name, spec.dtype, tuple(shape))


def transform(groups: list[Group], changes: dict[str, Change]) -> list[Group]:
    """The groups with every tensor named in ``changes`` rewritten (the others stream through untouched)."""
    out: list[Group] = []
    for specs, produce in groups:
        if not any(s.name in changes for s in specs):
            out.append((specs, produce))
            continue
        out.append(([new_spec(s, changes.get(s.name)) for s in specs], _rewriting(specs, produce, changes)))
    return out


def _rewriting(specs: list[Spec], produce: Producer, changes: dict[str, Change]) -> Producer:
    def run() -> Iterator[bytes | bytearray | memoryview]:
        pieces = iter(produce())
        cur = memoryview(b"")
        pos = 0
        try:
            for spec in specs:
                need = spec.nbytes
                change = changes.get(spec.name)
                buf = bytearray() if change is not None else None
                while need:
                    if pos == len(cur):
                        cur.release()  # the window's mmap closes only when no view of it is left
                        cur, pos = memoryview(next(pieces)).cast("B"), 0
                    take = cur[pos : pos + need]
                    pos += len(take)
                    need -= len(take)
                    if buf is None:
                        yield take
                    else:
                        buf += take
                    take.release()
                if buf is not None and change is not None:
                    yield apply(buf, spec, change)[0]
        finally:
            cur.release()

    return run


def apply(buf: bytes | bytearray, spec: Spec, change: Change) -> tuple[bytes | bytearray, float]:
    """One tensor's bytes after ``change``, and the largest relative rounding the scaling made (0.0: exact)."""
    err = 0.0
    if change.factor is not None and change.factor != 1.0:
        buf, err = scale_bytes(buf, spec.dtype, change.factor)
    if change.rank is not None and change.rank != spec.shape[change.axis]:
        buf = pad(buf, spec, change.axis, change.rank)
    return buf, err


def pad(buf: bytes | bytearray, spec: Spec, axis: int, rank: int) -> bytearray:
    """Zero-pad a 2-D tensor's ``axis`` (0: rows appended, 1: columns appended) from its size to ``rank``."""
    w = element_bytes(spec.dtype)
    rows, cols = spec.shape
    if axis == 0:
        return bytearray(buf) + bytes((rank - rows) * cols * w)
    out = bytearray(rows * rank * w)
    for k in range(cols):  # column k of the input is every cols-th element; it lands on every rank-th
        scatter(out, w, k, rank, gather(buf, w, k, cols), rows)
    return out


def is_power_of_two(x: float) -> bool:
    return x > 0 and math.frexp(x)[0] == 0.5


def scale_bytes(buf: bytes | bytearray, dtype: str, factor: float) -> tuple[bytes, float]:
    """``buf``'s values times ``factor``, rounded to nearest (even) in ``dtype``; with the largest relative error
    of one element against the exact product (float64; for F64 itself, the bound 2^-53 unless the factor is a
    power of two). Needs numpy (the ``weights`` extra)."""
    if dtype not in SCALABLE:
        raise UnsupportedInputError(dtype, f"cannot scale {dtype} values; only {', '.join(SCALABLE)}")
    try:
        import numpy as np
    except ImportError:
        raise MissingExtraError("remap --for (scaling lora_B)", "numpy") from None
    if dtype == "BF16":
        bits = np.frombuffer(buf, "<u2").astype("<u4") << 16
        x = bits.view("<f4").astype("<f8")
    else:
        x = np.frombuffer(buf, {"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dtype]).astype("<f8")
    exact = x * factor
    if dtype == "F64":
        return exact.tobytes(), 0.0 if is_power_of_two(factor) else 2.0**-53
    return round_values(exact, dtype)


def round_values(exact: np.ndarray, dtype: str) -> tuple[bytes, float]:
    """float64 values rounded to nearest (even) in ``dtype`` (``BF16``, ``F16`` or ``F32``) as raw bytes, with the
    largest relative error of one finite, non-zero element (0.0: every value kept exactly). Needs numpy."""
    import numpy as np

    if dtype == "BF16":
        f = exact.astype("<f4").view("<u4")
        rounded = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype("<u2")
        nan = np.isnan(exact)
        rounded[nan] = ((f[nan] >> 16) | 0x40).astype("<u2")
        back = (rounded.astype("<u4") << 16).view("<f4").astype("<f8")
        data = rounded.tobytes()
    else:
        typed = exact.astype("<f4" if dtype == "F32" else "<f2")
        back = typed.astype("<f8")
        data = typed.tobytes()
    finite = np.isfinite(exact) & (exact != 0)
    err = float(np.max(np.abs(back[finite] - exact[finite]) / np.abs(exact[finite]))) if finite.any() else 0.0
    return data, err


def rounding_of(header: Header, name: str, dtype: str, factor: float) -> float:
    """The rounding :func:`scale_bytes` makes on tensor ``name`` (read once, at plan time, so that ``--dry-run``
    and ``--json`` can say it before anything is written)."""
    return scale_bytes(read_tensor_bytes(header, name), dtype, factor)[1]
