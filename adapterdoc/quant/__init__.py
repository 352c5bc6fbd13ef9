"""A base model's quantization, read torch-free from its config and safetensors headers; its weights decoded and
encoded as each format's library does by :mod:`adapterdoc.quant.codec` (torch, imported only by the ML paths)."""

from __future__ import annotations

from adapterdoc.quant.detect import detect, detect_base, detect_folder, weight_files
from adapterdoc.quant.schemes import SCHEMES, Geometry, Quantization, QuantizedModule

__all__ = [
    "SCHEMES",
    "Geometry",
    "Quantization",
    "QuantizedModule",
    "detect",
    "detect_base",
    "detect_folder",
    "weight_files",
]
