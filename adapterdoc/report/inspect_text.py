"""Human rendering of an :class:`~adapterdoc.report.inspect_report.InspectReport`: a few lines, a file list
only for several files, findings grouped by code."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from adapterdoc.report.registry import one_group, register
from adapterdoc.report.render import (
    KEEP,
    Span,
    Writer,
    columns,
    count_line,
    human_bytes,
    plural,
    write_findings,
)

if TYPE_CHECKING:
    from adapterdoc.adapter.expert_picture import ExpertPicture
    from adapterdoc.quant import Quantization
    from adapterdoc.report.inspect_report import InspectReport

UNQUANTIZED_SHOWN = 6
"""How many unquantized module paths the text names (``--json`` lists them all)."""


@register("InspectReport", view=one_group("inspect", "spec"))
def render_inspect(report: InspectReport, *, width: int | None = None) -> str:
    w = Writer(width)
    kind = report.kind if report.kind == report.weights_format else f"{report.kind}, {report.weights_format}"
    w.para((report.spec, "bold"), f"({kind})", hang=2)
    _files(w, report)
    dt = ", ".join(f"{d} ×{n:,}" for d, n in report.dtypes.items()) or "none"
    w.para(
        f"{plural(report.tensors, 'tensor')}, {plural(report.parameters, 'parameter')}, dtypes {dt}",
        indent=2,
    )
    if report.metadata is not None:
        w.para("__metadata__:", _mapping(report.metadata), indent=2)
    if report.format is not None:
        _render_format(w, report.format)
    if report.bytes_received is not None:
        w.para(f"received {human_bytes(report.bytes_received)} over HTTP (headers only)", indent=2)
    lay = report.layout
    also = f"(also: {', '.join(lay.candidates)})" if lay.candidates else ""
    w.para("layout", (lay.name, "bold"), also, hang=2)
    for ev in lay.evidence:
        w.para("•", ev, indent=2)
    if report.lora:
        _render_lora(w, report)
    if report.experts is not None:
        _render_experts(w, report.experts)
    if report.quantization is not None:
        _render_quantization(w, report.quantization)
    if report.weights is not None:  # inspect --weights
        from adapterdoc.report.audit_text import write_audit

        write_audit(w, report.weights)
    if report.requantized is not None:  # inspect --weights --base
        _render_requantized(w, report.requantized)
    write_findings(w, report.findings, context=(report.spec,))
    w.para(count_line(report.findings))
    return w.getvalue()


def _render_requantized(w: Writer, r: dict[str, object]) -> None:
    """What survives merging into the quantized base and quantizing again (``merge --dry-run``'s table)."""
    from adapterdoc.report.survival_text import write_survival

    if r["quantization"] is None:
        w.para("requantized", (str(r["base"]), "bold"), "is not quantized: nothing to requantize", hang=2)
        return
    w.para("requantized on", (str(r["base"]), "bold"), f"({r['quantization']})", hang=2)
    modules = r["modules"]
    if isinstance(modules, list) and modules:
        write_survival(w, modules)


def _render_quantization(w: Writer, q: Quantization) -> None:
    """A quantized base: the scheme and geometry, its quantized modules and the tensors that store them, what is
    stored unquantized, and the detection's notes."""
    from adapterdoc.quant.text import scheme_text

    fmt = f", {q.format}" if q.format and q.format != q.method else ""
    via = f"({q.method}{fmt})" if q.method else "(no quantization_config)"
    w.para("quantization", (scheme_text(q), "bold"), via, hang=2)
    tensors = ", ".join(sorted({suffix for m in q.modules for suffix in m.tensors}))
    w.para(f"{plural(len(q.modules), 'quantized module')}: {tensors}", indent=2)
    if q.unquantized:
        shown = ", ".join(q.unquantized[:UNQUANTIZED_SHOWN])
        more = len(q.unquantized) - UNQUANTIZED_SHOWN
        w.para("stored unquantized:", shown + (f" and {more} more" if more > 0 else ""), hang=2, indent=2)
    for note in q.notes:
        w.para("note:", note, hang=2, indent=2)


def _files(w: Writer, report: InspectReport) -> None:
    """One line for a single file; a borderless table for shards, named relative to their folder."""
    paths = [f.path for f in report.files]
    if not paths:
        return
    prefix = report.spec.rstrip("/") + "/"
    if all(p.startswith(prefix) for p in paths):
        names = [p[len(prefix) :] for p in paths]
    else:
        folder = os.path.commonpath([os.path.dirname(p) for p in paths]) if paths else ""
        if folder and folder != report.spec and len(paths) > 1:
            w.para("in", (folder, KEEP), indent=2)
        names = [os.path.relpath(p, folder) if folder else p for p in paths] if len(paths) > 1 else paths
        if len(paths) == 1 and paths[0] == report.spec:
            names = [os.path.basename(paths[0])]
    if len(report.files) == 1:
        f = report.files[0]
        w.para(f"{names[0]}:", f"{human_bytes(f.bytes)}, header {f.header_bytes:,} bytes", indent=2)
        return
    rows: list[list[Span]] = [["file", "bytes", "header", "tensors"]]
    rows += [
        [name, human_bytes(f.bytes), f"{f.header_bytes:,}", f"{f.tensors:,}"]
        for name, f in zip(names, report.files)
    ]
    for row in columns(rows, right=(1, 2, 3)):
        w.line(*row, indent=2)


def _render_lora(w: Writer, report: InspectReport) -> None:
    lo = report.lora
    assert lo is not None
    ranks = ", ".join(f"r={r} ×{n:,}" for r, n in lo.ranks.items()) or "no ranks"
    scaling = (
        "n/a"
        if lo.scaling is None
        else f"{lo.scaling:g}" + (" (rsLoRA: alpha/sqrt(r))" if lo.use_rslora else "")
    )
    alpha = f"{lo.alpha:g}" if isinstance(lo.alpha, float) else str(lo.alpha)
    w.para(
        "LoRA:",
        f"{plural(lo.modules, 'module')}, {ranks} (config r {lo.config_r}), alpha {alpha},",
        f"scaling {scaling}, DoRA {'yes' if lo.use_dora else 'no'}",
        hang=2,
    )
    if lo.fused_expert_modules:
        w.para(
            f"fused-expert LoRA modules: {lo.fused_expert_modules} (rank dimension is r × experts)", indent=2
        )
    for label, value in (
        ("target_modules", lo.target_modules),
        ("exclude_modules", lo.exclude_modules),
        ("target_parameters", lo.target_parameters),
        ("modules_to_save", lo.modules_to_save),
        ("rank_pattern", lo.rank_pattern),
        ("alpha_pattern", lo.alpha_pattern),
    ):
        if value:
            w.para(f"{label}:", *_value(value), indent=2)
    if lo.per_prefix:
        w.para("modules per prefix:", *_items(f"{k} {v:,}" for k, v in lo.per_prefix.items()), indent=2)
    if lo.per_leaf:
        w.para("modules per leaf:", *_items(f"{k} {v:,}" for k, v in lo.per_leaf.items()), indent=2)


def _render_experts(w: Writer, pic: ExpertPicture) -> None:
    """One or two lines: the expert layout, count and coverage per projection."""
    if not pic.routed:
        shared_note = f"; shared expert {plural(len(pic.shared), 'module')}" if pic.shared else ""
        w.para("experts:", f"no routed-expert LoRA{shared_note}", hang=2, indent=2)
        return
    n = f"{pic.experts} experts ({pic.experts_from})" if pic.experts else "experts count unknown"
    cov = [
        f"{p} {c['experts']}/{c['of']}" if c["of"] is not None else f"{p} {c['blocks']} blocks"
        for p, c in pic.coverage().items()
    ]
    shared = [f"shared expert {plural(len(pic.shared), 'module')}"] if pic.shared else []
    w.para(
        "experts:",
        f"{pic.layout}, {plural(len(pic.routed), 'block')} × {n};",
        *_items([*cov, *shared]),
        hang=2,
        indent=2,
    )


def _items(items: Iterable[str]) -> list[Span]:
    """``a, b, c`` as spans that wrap between items, never inside one."""
    items = list(items)
    return [(x + ("," if i < len(items) - 1 else ""), KEEP) for i, x in enumerate(items)]


def _mapping(d: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) or "{}"


def _value(v: object) -> list[Span]:
    if isinstance(v, dict):
        return _items(f"{k}={x}" for k, x in v.items())
    if isinstance(v, (list, tuple, set)):
        return _items(str(x) for x in v)
    return [(str(v), KEEP)]


def _fact(v: object) -> str:
    """A format fact as text: a mapping as ``k: v`` pairs, a list comma-separated."""
    if isinstance(v, dict):
        return ", ".join(f"{k}: {x}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(map(str, v))
    return str(v)


def _render_format(w: Writer, fmt: Mapping[str, object]) -> None:
    """An adapter in another runtime's format: its name, the evidence, and its own facts."""
    w.para("format", (str(fmt.get("name")), "bold"), hang=2)
    evidence = fmt.get("evidence", [])
    assert isinstance(evidence, list)  # inspection writes it as a list
    for ev in evidence:
        w.para("•", str(ev), indent=2)
    shown = (
        "name",
        "evidence",
        "format",
        "path",
        "weights",
        "tensors",
        "parameters",
        "dtypes",
        "header_bytes",
    )
    facts = [
        f"{k} {_fact(v)}"
        for k, v in fmt.items()
        if k not in shown  # the counts are on the lines above
        and v not in (None, [], {})
        and not (isinstance(v, (list, dict)) and (len(v) > 8 or any(isinstance(x, (dict, list)) for x in v)))
    ]  # the long and nested facts are in the JSON
    if facts:
        w.para(", ".join(facts), indent=2, hang=4)
