"""``--outtype``: a tensor's bytes re-cast between float32, float16 and bfloat16 (numpy, round to nearest even),
with the largest relative rounding it made (0.0: exact, e.g. any widening cast)."""

from __future__ import annotations

from adapterdoc.errors import MissingExtraError, UnsupportedInputError

OUTTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}
"""``--outtype`` → safetensors dtype."""

FLOATS = ("F32", "F16", "BF16")


def target_dtype(dtype: str, outtype: str | None, *, what: str) -> str:
    """The dtype a tensor of ``dtype`` is written in under ``outtype`` (``None``: kept)."""
    if outtype is None or dtype == OUTTYPES[outtype]:
        return dtype
    if dtype not in FLOATS:
        raise UnsupportedInputError(what, f"is {dtype}; --outtype re-casts only {', '.join(FLOATS)} tensors")
    return OUTTYPES[outtype]


def cast_bytes(buf: bytes | bytearray | memoryview, src: str, dst: str) -> tuple[bytes, float]:
    """``buf`` (``src`` elements) as ``dst`` elements, and the largest relative rounding of one element."""
    if src == dst:
        return bytes(buf), 0.0
    try:
        import numpy as np
    except ImportError:
        raise MissingExtraError("convert --outtype", "numpy", extra="weights") from None
    if src == "BF16":
        x = (np.frombuffer(buf, "<u2").astype("<u4") << 16).view("<f4")
    else:
        x = np.frombuffer(buf, {"F32": "<f4", "F16": "<f2"}[src])
    if dst == "BF16":
        f = x.astype("<f4").view("<u4")
        out = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype("<u2")
        nan = np.isnan(x)
        out[nan] = ((f[nan] >> 16) | 0x40).astype("<u2")
        back = (out.astype("<u4") << 16).view("<f4").astype("<f8")
        data = out.tobytes()
    else:
        typed = x.astype({"F32": "<f4", "F16": "<f2"}[dst])
        back = typed.astype("<f8")
        data = typed.tobytes()
    exact = x.astype("<f8")
    finite = np.isfinite(exact) & (exact != 0)
    err = float(np.max(np.abs(back[finite] - exact[finite]) / np.abs(exact[finite]))) if finite.any() else 0.0
    return data, err
