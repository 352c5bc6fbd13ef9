"""Human rendering of a :class:`~adapterdoc.merge.MergeReport`: what was written, counts of applied and unused
modules with one example each, findings grouped by code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.report.registry import one_group, register
from adapterdoc.report.render import (
    KEEP,
    MORE,
    Span,
    Writer,
    columns,
    count_line,
    human_bytes,
    plural,
    write_findings,
)

if TYPE_CHECKING:
    from adapterdoc.report.merge_report import MergeReport


@register("MergeReport", view=one_group("merge", "adapter"))
def render_merge(report: MergeReport, *, width: int | None = None) -> str:
    w = Writer(width)
    cls = f"({report.model_class})" if report.model_class else ""
    w.para(("merge", "bold"), report.adapter, "→", report.base, cls, hang=2)
    if report.quantization:
        how = "re-encoded in its format" if report.requantize else "decoded exactly"
        w.para("base quantized:", (report.quantization, "bold"), f"({how})", indent=2, hang=4)
    if report.dry_run:
        w.para(("dry run: nothing written", "bold"), indent=2)
    elif report.out:
        w.para(
            "wrote",
            (f"{report.out}:", "bold"),
            f"{report.tensors:,} tensors ({report.merged_tensors:,} merged), "
            f"{human_bytes(report.bytes_written)}, dtype {report.dtype}, {report.seconds:.1f} s",
            indent=2,
        )
    else:
        w.para(("nothing written", "bold red"), indent=2)
    _modules(w, "applied", report.applied)
    if report.unused:  # each one is also an AD501 finding, listed below with an example
        w.para((f"unused: {plural(len(report.unused), 'module')}", "bold red"), indent=2)
    if report.survival:
        _survival(w, report.survival)
    write_findings(w, report.findings, context=(report.adapter,))
    w.para(count_line(report.findings))
    return w.getvalue()


def _modules(w: Writer, label: str, names: list[str]) -> None:
    w.para(f"{label}: {plural(len(names), 'module')}", indent=2)
    if len(names) == 1:
        w.para((names[0], KEEP), indent=4)
    elif names:
        w.para((f"e.g. {names[0]}", KEEP), f"and {len(names) - 1:,} more;", (MORE, KEEP), indent=4, hang=4)


def _survival(w: Writer, rows: list[dict[str, object]]) -> None:
    """Per module group, what quantizing the merged weights again keeps (means over the group's modules)."""
    from adapterdoc.merge.survival import group_of

    groups: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        groups.setdefault(group_of(str(r["module"])), []).append(r)
    short = _short_names(list(groups))
    table: list[list[Span]] = [
        ["requantized", "modules", "codes changed", "update kept", "cosine", "Δ/step", ""]
    ]
    for group, members in groups.items():
        ok = all(r["survives"] for r in members)
        verdict = ("survives", "green") if ok else ("lost", "bold red")
        if any(r["not_encodable"] for r in members):
            table.append([short[group], str(len(members)), "-", "-", "-", "-", ("not encodable", "bold red")])
            continue
        table.append(
            [
                short[group],
                str(len(members)),
                f"{_mean(members, 'codes_changed'):.3f}",
                f"{_mean(members, 'delta_kept'):.1%}",
                f"{_mean(members, 'cosine'):.2f}",
                f"{_mean(members, 'delta_rms_steps'):.2g}",
                verdict,
            ]
        )
    for row in columns(table, right=range(1, 6)):
        w.line(*row, indent=2)
    lost = sum(1 for r in rows if not r["survives"])
    w.para(f"{lost:,} of {plural(len(rows), 'quantized module')} would not survive requantization", indent=2)


def _mean(rows: list[dict[str, object]], key: str) -> float:
    values = [float(v) for r in rows if isinstance(v := r[key], (int, float))]
    return sum(values) / len(values) if values else float("nan")


def _short_names(groups: list[str]) -> dict[str, str]:
    """Each group by its last two name parts (``self_attn.q_proj``) when those are unique, else whole."""
    tails = {g: ".".join(g.split(".")[-2:]) for g in groups}
    unique = len(set(tails.values())) == len(tails)
    return {g: tails[g] if unique else g for g in groups}
