"""What each serving engine does with LoRA on a quantized base (``verify --base Q --profile NAME``), as read from
the engines' own source; every rule here names the file and function it was read from in its code's ``why``
(:mod:`adapterdoc.codes.serving`, AD480-AD483). At most one finding per engine and scheme family."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from adapterdoc.engines.base import engine_finding

if TYPE_CHECKING:
    from adapterdoc.quant import Quantization, QuantizedModule
    from adapterdoc.report.findings import Finding

PEFT_VERSION = "0.21.2"
"""The PEFT release whose ``tuners/lora/bnb.py`` AD483 describes."""

VLLM_QUANTIZATION_METHODS = (
    "awq",
    "auto_awq",
    "fp8",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "auto_gptq",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "humming",
    "compressed-tensors",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "gpt_oss_mxfp4",
    "deepseek_v4_fp8",
    "online",
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
    "mxfp8",
)
"""vLLM 0.33.0's ``QuantizationMethods`` (vllm/model_executor/layers/quantization/__init__.py): the
``quant_method`` values ``ModelConfig._verify_quantization`` accepts (vllm/config/model.py)."""

BNB_SCHEMES = ("bnb-nf4", "bnb-fp4", "bnb-int8")


def vllm_findings(
    spec: str, q: Quantization, quantized: Sequence[QuantizedModule], version: str
) -> list[Finding]:
    """AD481 when vLLM does not read the base's ``quant_method`` at all; else AD480 when the adapter targets a
    quantized module (applied unmerged beside the quantized kernel)."""
    engine = f"vLLM {version}"
    if q.method is not None and q.method not in VLLM_QUANTIZATION_METHODS:
        return [
            engine_finding(
                engine,
                "AD481",
                spec,
                f"the base's quant_method {q.method!r} is not one vLLM reads: it refuses to start the base "
                '("Unknown quantization method")',
                hint="serve the unquantized base (or an FP8 / GPTQ / AWQ / compressed-tensors one) with the adapter "
                "unmerged",
            )
        ]
    if not quantized:
        return []
    return [
        engine_finding(
            engine,
            "AD480",
            spec,
            f"applies the adapter unmerged beside the {q.scheme} kernels of {_count(quantized)}: exact, the "
            "quantized weights are not changed",
        )
    ]


def sglang_findings(
    spec: str, q: Quantization, quantized: Sequence[QuantizedModule], version: str
) -> list[Finding]:
    """AD482 when the adapter targets a quantized module: SGLang applies LoRA unmerged, whatever the method."""
    if not quantized:
        return []
    return [
        engine_finding(
            f"SGLang {version}",
            "AD482",
            spec,
            f"applies the adapter unmerged beside the {q.scheme} kernels of {_count(quantized)}; its LoRA code "
            "refuses no quantization method",
        )
    ]


def peft_findings(spec: str, q: Quantization, quantized: Sequence[QuantizedModule]) -> list[Finding]:
    """AD483 when the adapter targets a bitsandbytes module: applied unmerged, and PEFT's merge re-quantizes."""
    bnb = [m for m in quantized if m.scheme in BNB_SCHEMES]
    if not bnb:
        return []
    return [
        engine_finding(
            f"PEFT {PEFT_VERSION}",
            "AD483",
            spec,
            f"applies the adapter unmerged on the {bnb[0].scheme} layers of {_count(bnb)}; its merge "
            "(merge_and_unload) re-quantizes W + BA and can erase the delta",
            hint="serve it unmerged, or merge into a bf16 copy of the base (adapterdoc merge)",
        )
    ]


def _count(modules: Sequence[QuantizedModule]) -> str:
    n = len(modules)
    return f"{n} targeted module{'s' if n != 1 else ''}"
