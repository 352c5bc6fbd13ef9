"""`adapterdoc inspect`: what a checkpoint or adapter holds, from headers alone, and what looks wrong."""

from __future__ import annotations

import os
from typing import Any

from adapterdoc.checkpoint import Checkpoint, open_checkpoint
from adapterdoc.facts import header_facts
from adapterdoc.report.inspect_report import FileSummary, InspectReport, LoraSummary

__all__ = ["FileSummary", "InspectReport", "LoraSummary", "inspect", "inspect_checkpoint"]


def inspect(spec: str | os.PathLike[str]) -> InspectReport:
    """Open ``spec`` header-only and describe it; an adapter in another runtime's format (MLX, GGUF) is described
    through its format module (:mod:`adapterdoc.formats.hooks`)."""
    from adapterdoc.formats.hooks import foreign

    found = foreign(os.fspath(spec))
    if found is not None:
        return _inspect_foreign(os.fspath(spec), *found)
    return inspect_checkpoint(open_checkpoint(spec))


def _inspect_foreign(spec: str, found: Any, mod: Any) -> InspectReport:
    from pathlib import Path

    from adapterdoc.layouts import Detection
    from adapterdoc.report.findings import sort_findings

    path = Path(os.path.expanduser(spec))
    tensors_file = getattr(mod, "tensors_file", None)
    file = tensors_file(path) if tensors_file else None
    describe = getattr(mod, "describe", None)
    facts = dict(describe(path)) if describe else {}
    if file is not None:
        report = inspect_checkpoint(open_checkpoint(os.fspath(file)))
        report.spec = spec
    else:
        size = os.path.getsize(path) if path.is_file() else 0
        report = InspectReport(
            spec=spec,
            kind=found.format,
            files=[FileSummary(os.fspath(path), size, 0, int(facts.get("tensors") or 0))],
            tensors=int(facts.get("tensors") or 0),
            parameters=int(facts.get("parameters") or 0),
            bytes=size,
            dtypes=dict(facts.get("dtypes") or {}),
            metadata=None,
            layout=Detection("unknown", (f"a {found.format} adapter",)),
            lora=None,
            findings=[],
            weights_format=found.format,
        )
    report.kind = found.format
    report.format = {"name": found.format, "evidence": list(found.evidence), **facts}
    check = getattr(mod, "check", None)
    if check is not None:
        report.findings = sort_findings([*report.findings, *check(path, None)])
    return report


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
