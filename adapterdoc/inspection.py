"""`adapterdoc inspect`: what a checkpoint or adapter holds, from headers alone, and what looks wrong."""

from __future__ import annotations

import os

from adapterdoc.checkpoint import Checkpoint, open_checkpoint
from adapterdoc.facts import header_facts
from adapterdoc.report.inspect_report import FileSummary, InspectReport, LoraSummary

__all__ = ["FileSummary", "InspectReport", "LoraSummary", "inspect", "inspect_checkpoint"]


def inspect(spec: str | os.PathLike[str]) -> InspectReport:
    """Open ``spec`` header-only and describe it."""
    return inspect_checkpoint(open_checkpoint(spec))


def inspect_checkpoint(ckpt: Checkpoint) -> InspectReport:
    facts = header_facts(ckpt)
    files = _file_summaries(ckpt)
    return InspectReport(
        spec=ckpt.spec,
        kind=ckpt.kind,
        files=files,
        tensors=len(ckpt.tensors),
        parameters=facts.parameters,
        bytes=sum(f.bytes for f in files),
        dtypes=facts.dtypes,
        metadata=ckpt.metadata,
        layout=facts.layout,
        lora=facts.lora,
        findings=facts.findings,
        experts=facts.experts,
        weights_format=ckpt.weights_format,
        bytes_received=ckpt.bytes_received if ckpt.spec.startswith("hf://") else None,
    )


def _file_summaries(ckpt: Checkpoint) -> list[FileSummary]:
    if ckpt.headers:
        return [FileSummary(h.path, h.file_size, 8 + h.header_len, len(h.tensors)) for h in ckpt.headers]
    p = ckpt.weights_path or ckpt.root
    return [FileSummary(p, os.path.getsize(p), 0, len(ckpt.tensors))]
