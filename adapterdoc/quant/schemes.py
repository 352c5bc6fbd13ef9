"""The quantization schemes adapterdoc reads, and what it knows of a quantized base: :class:`Geometry`,
:class:`QuantizedModule`, :class:`Quantization` (read by :mod:`adapterdoc.quant.detect`)."""

from __future__ import annotations

from dataclasses import dataclass, field

FP8_BLOCK = "fp8-block"
"""Block-scaled FP8 as transformers' FineGrainedFP8 and the DeepSeek reference write it (``weight_scale_inv``)."""
CT_FP8 = "ct-fp8"
"""compressed-tensors ``float-quantized`` FP8 (block, channel or tensor scales in ``weight_scale``)."""
CT_W4A16 = "ct-w4a16"
"""compressed-tensors ``pack-quantized`` integer weights (4 bits as W4A16 writes them; the bits are in the geometry)."""
CT_NVFP4 = "ct-nvfp4"
"""compressed-tensors ``nvfp4-pack-quantized``."""
GPTQ = "gptq"
AWQ = "awq"
BNB_NF4 = "bnb-nf4"
BNB_FP4 = "bnb-fp4"
BNB_INT8 = "bnb-int8"
MXFP4 = "mxfp4"
"""MXFP4 expert parameters (``_blocks`` / ``_scales``)."""
NONE = "none"
UNKNOWN = "unknown"
MIXED = "mixed"
"""Modules stored in more than one scheme (compressed-tensors ``mixed-precision``, or tensors without a config)."""
SCHEMES = (
    FP8_BLOCK,
    CT_FP8,
    CT_W4A16,
    CT_NVFP4,
    GPTQ,
    AWQ,
    BNB_NF4,
    BNB_FP4,
    BNB_INT8,
    MXFP4,
    NONE,
    UNKNOWN,
    MIXED,
)

FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
FLOAT_WEIGHT_DTYPES = ("F16", "BF16", "F32", "F64")
SMALL_READ_LIMIT = 1 << 16
"""Largest ``weight_shape`` / ``quant_state`` tensor read (bytes); a larger one is described, not read."""


@dataclass(frozen=True)
class Geometry:
    """How the codes are grouped under their scales."""

    bits: int | None = None
    """Bits per weight code."""
    group_size: int | None = None
    """Weights per scale along the input dimension (GPTQ/AWQ/compressed-tensors groups, NVFP4 16, MXFP4 32,
    bitsandbytes 4-bit blocks), when scales are grouped that way."""
    block_size: tuple[int, int] | None = None
    """(rows, columns) covered by one scale (block FP8)."""
    strategy: str | None = None
    """The scale layout: ``block``, ``channel``, ``group``, ``tensor_group`` or ``tensor``."""
    symmetric: bool | None = None
    desc_act: bool | None = None
    """GPTQ activation order (``g_idx`` permutes the groups)."""
    double_quant: bool | None = None
    """bitsandbytes 4-bit: the absmax values are themselves quantized."""


@dataclass(frozen=True)
class QuantizedModule:
    """One quantized linear module (or stacked expert parameter) and the tensors that hold it."""

    path: str
    """The module path, e.g. ``model.layers.0.self_attn.q_proj`` (for an expert parameter stored as ``X_blocks``,
    the parameter path ``X``)."""
    scheme: str
    """The scheme its tensors show (one of :data:`SCHEMES`)."""
    tensors: dict[str, str]
    """Suffix → tensor name (``path + suffix``), e.g. ``{".weight": ..., ".weight_scale_inv": ...}``."""
    dtype: str
    """The dtype the codes are stored in (``F8_E4M3``, ``I32``, ``U8``, ``I8``)."""
    shape: tuple[int, int] | None
    """The logical ``(out_features, in_features)``, recovered from the packed shapes; None when it cannot be."""
    experts: int | None = None
    """The leading expert count of a stacked 3-D (or 4-D MXFP4) parameter."""
    geometry: Geometry | None = None
    """From the config (for compressed-tensors, the group whose targets match this module)."""


@dataclass(frozen=True)
class Quantization:
    """A base model's quantization, as its config and headers describe it."""

    scheme: str
    """One of :data:`SCHEMES`: the config's scheme, or (without a config) the tensors'."""
    method: str | None
    """``quant_method`` as the config writes it; None without a ``quantization_config``."""
    format: str | None
    """compressed-tensors ``format``, GPTQ ``checkpoint_format``, AWQ ``version``, when given."""
    geometry: Geometry | None
    """The geometry every quantized module shares (None when none is known or groups differ)."""
    modules: tuple[QuantizedModule, ...]
    """The quantized modules, in name order."""
    unquantized: tuple[str, ...]
    """Module paths of floating-point ``.weight`` matrices stored unquantized (embeddings, ``lm_head``, ignored
    layers), in name order."""
    ignore: tuple[str, ...]
    """The config's exclusion patterns as written (``ignore``, ``modules_to_not_convert``, ``llm_int8_skip_modules``)."""
    notes: tuple[str, ...] = ()
    """Inconsistencies and limits, one sentence each."""
    config: dict[str, object] | None = field(default=None, repr=False)
    """The raw ``quantization_config``."""

    @property
    def quantized(self) -> bool:
        return self.scheme != NONE

    def module(self, path: str) -> QuantizedModule | None:
        """The quantized module at ``path``, or None."""
        return next((m for m in self.modules if m.path == path), None)
