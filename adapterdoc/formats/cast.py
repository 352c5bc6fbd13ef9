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
        import numpy  # noqa: F401  (the values are decoded and rounded with numpy)
    except ImportError:
        raise MissingExtraError("convert --outtype", "numpy", extra="weights") from None
    from adapterdoc.st.tensor_edits import float_values, round_values

    return round_values(float_values(buf, src), dst)
