"""Exact edits of one tensor's raw bytes, without torch: a 2-D tensor zero-padded along an axis (the rank of a LoRA
factor: ``B' A' = B A`` exactly, in every dtype), and values multiplied by a constant, rounded once per element in
the tensor's dtype with the largest relative error measured (exact when the factor is a power of two). Used by
``remap --for`` and the format writers (MLX, GGUF)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from adapterdoc.errors import MissingExtraError, UnsupportedInputError
from adapterdoc.st.compose import Spec, element_bytes, gather, scatter

if TYPE_CHECKING:
    import numpy as np

SCALABLE = ("F64", "F32", "F16", "BF16")
"""The dtypes whose values ``lora_B`` scaling can multiply."""


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
        import numpy  # noqa: F401  (the values are decoded and rounded with numpy)
    except ImportError:
        raise MissingExtraError("remap --for (scaling lora_B)", "numpy") from None
    exact = float_values(buf, dtype) * factor
    if dtype == "F64":
        return exact.tobytes(), 0.0 if is_power_of_two(factor) else 2.0**-53
    return round_values(exact, dtype)


def float_values(buf: bytes | bytearray | memoryview, dtype: str) -> np.ndarray:
    """The values of ``buf`` (``F64``, ``F32``, ``F16`` or ``BF16`` elements) as float64, exactly. Needs numpy."""
    import numpy as np

    if dtype == "BF16":  # bfloat16 is the top half of a float32
        return (np.frombuffer(buf, "<u2").astype("<u4") << 16).view("<f4").astype("<f8")
    values: np.ndarray = np.frombuffer(buf, {"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dtype]).astype("<f8")
    return values


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
