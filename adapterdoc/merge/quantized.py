"""Merge into a quantized base: refused with one finding (AD520) before any plan, until an exact dequantize-merge
exists. Torch-free: the quantization is read off the base's config and headers (:mod:`adapterdoc.quant`)."""

from __future__ import annotations

from adapterdoc.checkpoint import Checkpoint
from adapterdoc.merge.edits import HEADERS, Plan
from adapterdoc.quant import detect_folder
from adapterdoc.quant.text import scheme_text
from adapterdoc.report.findings import Finding, make


def quantized_base_finding(base: Checkpoint) -> Finding | None:
    """AD520 when ``base`` (a model folder) is stored quantized, else None."""
    q = detect_folder(base.root)
    if not q.quantized:
        return None
    return make(
        "AD520",
        f"the base is quantized: {scheme_text(q)}, {len(q.modules)} quantized module(s); merging W + BA and "
        "quantizing again can erase the delta; adapterdoc does not merge into quantized bases yet: serve the "
        "adapter unmerged, or merge into the unquantized base",
        path=base.spec,
    )


def refused_plan(adapter: Checkpoint, base: Checkpoint, finding: Finding) -> Plan:
    """A plan that writes nothing and holds only ``finding``."""
    return Plan(
        base=base,
        adapter=adapter,
        shards=[],
        applied=[],
        unused=[],
        findings=[finding],
        pieces={},
        untie=False,
        model_class="",
        planner=HEADERS,
    )
