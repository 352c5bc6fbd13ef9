"""The survival table (``merge --dry-run``, ``merge --requantize``, ``inspect --weights --base``): per module group,
what quantizing the merged weights again keeps."""

from __future__ import annotations

from adapterdoc.report.render import Span, Writer, columns, plural


def write_survival(w: Writer, rows: list[dict[str, object]]) -> None:
    """Per module group, what quantizing the merged weights again keeps (means over the group's modules)."""
    groups: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        groups.setdefault(str(r["group"]), []).append(r)
    short = _short_names(list(groups))
    table: list[list[Span]] = [
        ["requantized", "modules", "codes changed", "update kept", "cosine", "Δ/step", "verdict"]
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
