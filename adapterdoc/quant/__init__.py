"""A base model's quantization, read torch-free from its config and safetensors headers."""

from __future__ import annotations

from adapterdoc.quant.detect import (
    SCHEMES,
    Geometry,
    Quantization,
    QuantizedModule,
    detect,
    detect_base,
    detect_folder,
    weight_files,
)

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
