"""`adapterdoc inspect`: what a checkpoint or adapter holds, from headers alone, and what looks wrong; with
``weights`` (or ``plot``), the weights audit of its LoRA tensors too. The report is built from the header facts,
the format's own facts and the audit, each read once; nothing fills it afterwards."""

from __future__ import annotations

import os
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING

from adapterdoc.checkpoint import Checkpoint, open_checkpoint
from adapterdoc.errors import AdapterdocError, MissingExtraError
from adapterdoc.facts import header_facts
from adapterdoc.report.findings import has_errors, sort_findings
from adapterdoc.report.inspect_report import FileSummary, InspectReport, LoraSummary

if TYPE_CHECKING:
    from adapterdoc.formats import Detection as Detected
    from adapterdoc.quant import Quantization
    from adapterdoc.report.audit_report import Audit
    from adapterdoc.report.merge_report import MergeReport

__all__ = ["FileSummary", "InspectReport", "LoraSummary", "inspect", "inspect_checkpoint"]


def inspect(
    spec: str | os.PathLike[str],
    *,
    weights: bool = False,
    plot: str | None = None,
    base: str | os.PathLike[str] | None = None,
) -> InspectReport:
    """Open ``spec`` header-only and describe it; an adapter in another runtime's format (MLX, GGUF) is described
    through its format module (:mod:`adapterdoc.formats.foreign`).

    ``weights``: also run the weights audit (torch is imported only for .bin adapters); ``plot`` (implies it): draw
    the audit's heat map there (``.png`` or ``.html``). A missing plot extra or an unwritable ``plot`` fails before
    any tensor is read. ``base`` (implies ``weights``): a quantized base folder, on which each quantized module the
    adapter changes is merged and quantized again to measure what survives (``merge --dry-run``'s table)."""
    from adapterdoc.formats.foreign import detect_local, foreign_of

    weights = weights or base is not None

    detected = detect_local(os.fspath(spec))
    found = foreign_of(detected)
    if found is None:
        from adapterdoc.formats.foreign import refuse_model_gguf

        refuse_model_gguf(os.fspath(spec))
        header = detected.header if detected is not None else None  # a PEFT file's: parsed once
        ckpt = open_checkpoint(spec, header=header)
        report = inspect_checkpoint(ckpt)
        if not (weights or plot):
            return report
        audit = _audit(ckpt, plot)
        survival = _survival(ckpt.spec, base) if base is not None else None
    else:
        report = _inspect_foreign(os.fspath(spec), *found)
        if not (weights or plot):
            return report
        # the audit of the PEFT view: the same tensors, as PEFT holds them
        from pathlib import Path

        from adapterdoc.formats.foreign import peft_view

        _audit_prerequisites(plot)
        try:
            with peft_view(Path(os.path.expanduser(report.spec)), found[1], None) as view:
                audit = _audit(open_checkpoint(os.fspath(view)), plot)
                audit = _relocated(audit, os.fspath(view), report.spec)
                survival = _survival(os.fspath(view), base) if base is not None else None
        except MissingExtraError:
            raise
        except AdapterdocError:
            if has_errors(
                report.findings
            ):  # the container rules already fail it: their verdict, as without --weights
                return report
            raise
    findings = [*report.findings, *audit.findings]
    requantized: dict[str, object] | None = None
    if survival is not None:
        findings.extend(f for f in survival.findings if f.code != "AD521")
        requantized = {
            "base": survival.base,
            "quantization": survival.quantization,
            "modules": survival.survival,
        }
    return replace(report, weights=audit, requantized=requantized, findings=sort_findings(findings))


def _survival(adapter: str, base: str | os.PathLike[str]) -> MergeReport:
    """What survives merging ``adapter`` into the quantized ``base`` and quantizing again (a merge dry run)."""
    from adapterdoc.merge import merge

    return merge(adapter, base, None, dry_run=True)


def _audit_prerequisites(plot: str | None) -> None:
    """Fail on a missing extra or an unwritable ``plot`` before reading any tensor."""
    if plot:
        from adapterdoc.report.heatmap import require_matplotlib
        from adapterdoc.st.atomic import resolve_output

        require_matplotlib(plot)
        resolve_output(plot)


def _audit(ckpt: Checkpoint, plot: str | None) -> Audit:
    """The weights audit of ``ckpt``, drawn at ``plot`` when asked (its extra and path checked first)."""
    from adapterdoc.audit import audit_checkpoint, render_heatmap

    _audit_prerequisites(plot)
    audit = audit_checkpoint(ckpt)
    if plot:
        render_heatmap(audit, plot)
    return audit


def _relocated(audit: Audit, view: str, spec: str) -> Audit:
    """The audit of a temporary PEFT view, said of ``spec``."""
    findings = [
        replace(
            f, path=spec, message=f.message.replace(view, spec), hint=f.hint and f.hint.replace(view, spec)
        )
        for f in audit.findings
    ]
    return replace(audit, path=spec, findings=findings)


def _inspect_foreign(spec: str, found: Detected, mod: ModuleType) -> InspectReport:
    from pathlib import Path

    from adapterdoc.layouts import Detection

    path = Path(os.path.expanduser(spec))
    tensors_file = getattr(mod, "tensors_file", None)
    file = tensors_file(path) if tensors_file else None
    describe = getattr(mod, "describe", None)
    facts = dict(describe(path)) if describe else {}
    inner = inspect_checkpoint(open_checkpoint(os.fspath(file))) if file is not None else None
    check = getattr(mod, "check", None)
    extra = list(check(path, None)) if check is not None else []
    fmt = {"name": found.format, "evidence": list(found.evidence), **facts}
    if inner is not None:
        findings = sort_findings([*inner.findings, *extra]) if check is not None else inner.findings
        return replace(inner, spec=spec, kind=found.format, format=fmt, findings=findings)
    size = os.path.getsize(path) if path.is_file() else 0
    count = int(facts.get("tensors") or 0)
    return InspectReport(
        spec=spec,
        kind=found.format,
        files=[FileSummary(os.fspath(path), size, int(facts.get("header_bytes") or 0), count)],
        tensors=count,
        parameters=int(facts.get("parameters") or 0),
        bytes=size,
        dtypes=dict(facts.get("dtypes") or {}),
        metadata=None,
        layout=Detection("unknown", (f"a {found.format} adapter",)),
        lora=None,
        findings=sort_findings(extra) if check is not None else [],
        weights_format=found.format,
        format=fmt,
    )


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
        quantization=None if facts.lora is not None else _quantization(ckpt),
    )


def _quantization(ckpt: Checkpoint) -> Quantization | None:
    """How a local base model's safetensors are quantized (the ``config.json`` in its folder, or beside the file,
    when there is one); ``None`` when they are not, for an adapter, a remote input, or a config whose
    ``quantization_config`` cannot be read (torch-free: :func:`adapterdoc.quant.detect`)."""
    from adapterdoc.quant import detect

    if ckpt.is_adapter or not ckpt.headers or ckpt.spec.startswith("hf://"):
        return None
    folder = ckpt.root if os.path.isdir(ckpt.root) else os.path.dirname(ckpt.root)
    try:
        q = detect(_config(os.path.join(folder, "config.json")), ckpt.headers)
    except AdapterdocError:
        return None
    return None if q.scheme == "none" else q


def _config(path: str) -> dict[str, object] | None:
    """The JSON object in ``path``, or ``None`` when there is none (or it is not one)."""
    import json

    try:
        with open(path, "rb") as f:
            raw = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def _file_summaries(ckpt: Checkpoint) -> list[FileSummary]:
    if ckpt.headers:
        return [FileSummary(h.path, h.file_size, 8 + h.header_len, len(h.tensors)) for h in ckpt.headers]
    p = ckpt.weights_path or ckpt.root
    return [FileSummary(p, os.path.getsize(p), 0, len(ckpt.tensors))]
