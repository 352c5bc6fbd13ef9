"""The tensor rewrites of ``remap --for``: a LoRA module's rank padded with zeros (rows of ``lora_A``, columns of
``lora_B``: ``B' A' = B A`` exactly, in every dtype) and ``lora_B`` multiplied by a constant (when an engine reads
one scaling for all modules: exact only when the factor is a power of two, else rounded once per element, measured
and reported). Both act on the ``(specs, producer)`` groups :func:`adapterdoc.st.compose.compose` streams: one
tensor in memory at a time, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from adapterdoc.adapter import LoraKey
from adapterdoc.st.compose import Spec
from adapterdoc.st.header import Header
from adapterdoc.st.tensor_edits import pad, scale_bytes
from adapterdoc.st.tensors import read_tensor_bytes, tensor_windows

Piece = "bytes | bytearray | memoryview"
Producer = Callable[[], Iterator["bytes | bytearray | memoryview"]]
Group = tuple[list[Spec], Producer]

RANK_AXIS = {"lora_A": 0, "lora_embedding_A": 0, "lora_B": 1, "lora_embedding_B": 1}
"""Where the rank sits in each factor: ``lora_A`` ``[r, in]`` and ``lora_embedding_A`` ``[r, num]`` (rows),
``lora_B`` ``[out, r]`` and ``lora_embedding_B`` ``[dim, r]`` (columns)."""


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


def rounding_of(header: Header, name: str, dtype: str, factor: float) -> float:
    """The rounding :func:`scale_bytes` makes on tensor ``name`` (read once, at plan time, so that ``--dry-run``
    and ``--json`` can say it before anything is written)."""
    return scale_bytes(read_tensor_bytes(header, name), dtype, factor)[1]
