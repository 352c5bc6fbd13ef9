"""The dtype tables: every safetensors dtype with its width, the floating-point ones a merge computes in, and the
``--dtype`` choices with the safetensors dtype and the ``config.json`` spelling each one means."""

from __future__ import annotations

DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
"""Every dtype the reference reader knows (case-sensitive), with its size in bits."""

FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
"""The floating-point dtypes a merge reads, updates and may cast (the others are copied as they are)."""

CAST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
"""``--dtype`` choices (besides ``auto``) → safetensors dtype."""

CONFIG_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
"""``--dtype`` choices → the ``dtype`` / ``torch_dtype`` value written into ``config.json``."""
