"""Loading a quantized base for real (``verify --load``, roundtrip): which library each quantization needs, the
``quantization_config`` that makes transformers dequantize it on the CPU, and one-line errors for what cannot load.

The route is chosen torch-free from :func:`adapterdoc.quant.detect_base`, before anything heavy is imported. What
transformers 5.25 needs per ``quant_method`` (its ``quantizers/quantizer_*.py`` ``validate_environment``):

- ``compressed-tensors``: the ``compressed-tensors`` package; kept compressed unless ``dequantize=True``
- ``bitsandbytes``: ``bitsandbytes`` (and accelerate, part of the ML extra); runs on the CPU as 4-bit / int8 layers
- ``gptq``: ``optimum`` and ``gptqmodel``; ``awq``: ``gptqmodel``
- ``fp8`` (FineGrainedFP8) and ``mxfp4``: transformers itself; dequantized to floating point with ``dequantize=True``
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.errors import UnsupportedInputError

if TYPE_CHECKING:
    from transformers.utils.quantization_config import QuantizationConfigMixin

    from adapterdoc.bases import BaseSpec
    from adapterdoc.quant import Quantization


@dataclass(frozen=True)
class QuantRoute:
    """How transformers loads one ``quant_method``."""

    library: str
    """What does the loading, in words (named in error lines)."""
    modules: tuple[str, ...] = ()
    """Import names that must be installed."""
    install: str = ""
    """The pip command that installs them."""
    config_class: str | None = None
    """The transformers ``quantization_config`` class that is passed with ``dequantize=True``; None: load as saved."""


ROUTES = {
    "compressed-tensors": QuantRoute(
        "compressed-tensors",
        ("compressed_tensors",),
        "pip install 'compressed-tensors>=0.15.0'",
        "CompressedTensorsConfig",
    ),
    "bitsandbytes": QuantRoute("bitsandbytes", ("bitsandbytes",), "pip install 'bitsandbytes>=0.46.1'"),
    "gptq": QuantRoute("gptqmodel", ("optimum", "gptqmodel"), "pip install optimum gptqmodel"),
    "awq": QuantRoute("gptqmodel", ("gptqmodel",), "pip install gptqmodel"),
    "fp8": QuantRoute("transformers (FineGrainedFP8)", config_class="FineGrainedFP8Config"),
    "mxfp4": QuantRoute("transformers (Mxfp4)", config_class="Mxfp4Config"),
}
"""``quant_method`` → its route (transformers 5.25)."""
OTHER = QuantRoute("transformers")
"""The route of a method adapterdoc has no entry for (or quantized tensors without a config): load as saved."""


@dataclass(frozen=True)
class QuantizedBase:
    """A quantized base about to be loaded: what it is and how it loads."""

    spec: str
    quantization: Quantization
    route: QuantRoute

    @property
    def described(self) -> str:
        """``ct-nvfp4, 4-bit group 16`` or ``bnb-nf4``: the scheme and its geometry, in words."""
        from adapterdoc.quant.text import scheme_text

        return scheme_text(self.quantization)


def quantized_base(base: BaseSpec) -> QuantizedBase | None:
    """The base's quantization and loading route (torch-free), or None for a floating-point or tiny base."""
    if base.kind == "tiny" or base.root is None:
        return None
    from adapterdoc.quant import detect_base

    q = detect_base(base)
    if not q.quantized:
        return None
    return QuantizedBase(base.spec, q, ROUTES.get(q.method or "", OTHER))


def require_libraries(qb: QuantizedBase) -> None:
    """Raise one exit-3 line naming the scheme and the pip install when a library the route needs is missing."""
    missing = [m for m in qb.route.modules if importlib.util.find_spec(m) is None]
    if missing:
        names = ", ".join(f"`{m}`" for m in missing)
        raise UnsupportedInputError(
            qb.spec,
            f"the base is quantized: {qb.described}; loading it needs {names} (not installed): "
            f"{qb.route.install}",
        )


def loading_config(qb: QuantizedBase) -> QuantizationConfigMixin | None:
    """The ``quantization_config`` to pass to ``from_pretrained`` (the saved one with ``dequantize=True``), or None."""
    if qb.route.config_class is None or qb.quantization.config is None:
        return None
    from transformers.utils import quantization_config as qcm

    cls: type[QuantizationConfigMixin] = getattr(qcm, qb.route.config_class)
    cfg: QuantizationConfigMixin = cls.from_dict(dict(qb.quantization.config))  # type: ignore[no-untyped-call]  # unannotated in transformers
    cfg.dequantize = True  # type: ignore[attr-defined]  # every config_class of ROUTES has it
    return cfg


def library_failure(qb: QuantizedBase, error: BaseException) -> UnsupportedInputError:
    """The exit-3 line for a load the library could not do: the scheme and the library's first line."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    reason = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return UnsupportedInputError(
        qb.spec, f"the base is quantized: {qb.described}; {qb.route.library} could not load it: {reason}"
    )


__all__ = [
    "OTHER",
    "ROUTES",
    "QuantRoute",
    "QuantizedBase",
    "library_failure",
    "loading_config",
    "quantized_base",
    "require_libraries",
]
