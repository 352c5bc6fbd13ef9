"""The weights audit as a picture: a layer × module heat map of delta norms (PNG, or HTML with the PNG and the table).

matplotlib is the optional ``plot`` extra; it is imported here only, with the headless Agg canvas (no pyplot, no
display). One colour scale (0 to the largest delta) is shared by every panel so that panels compare; inert
modules are grey with a mark, modules the adapter does not have are white. Experts get their own panels
(layer × expert, one per expert projection); modules outside the layer stacks (embeddings, heads) one row.
"""

from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.report.audit_report import Audit, ModuleDelta

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap, Normalize

PLOT_SUFFIXES = (".png", ".html", ".htm")
INERT_RGBA = (0.78, 0.78, 0.78, 1.0)
ABSENT_RGBA = (1.0, 1.0, 1.0, 1.0)
_ANNOTATE_MAX_CELLS = 600
"""Cells per panel up to which each cell is labelled with its value."""


@dataclass(frozen=True)
class Panel:
    """One heat-map panel: a grid of audit entries with its row and column labels."""

    title: str
    rows: list[str]
    cols: list[str]
    cells: dict[tuple[int, int], ModuleDelta] = field(default_factory=dict)
    """(row, col) → the entry (a ModuleDelta); absent cells are missing."""
    xlabel: str = "module"
    ylabel: str = "layer"


def panels(audit: Audit) -> list[Panel]:
    """Arrange the audit's entries: one panel per layer stack, one per expert projection, one for the rest."""
    stacks: dict[str, list[tuple[int, ModuleDelta]]] = {}  # group → (layer, entry)
    experts: dict[tuple[str, str], list[tuple[int, int, ModuleDelta]]] = {}  # → (layer, expert, entry)
    other: list[ModuleDelta] = []
    for m in audit.modules:
        if m.expert is not None and m.layer is not None:
            experts.setdefault((m.group, m.leaf), []).append((m.layer, m.expert, m))
        elif m.layer is not None:
            stacks.setdefault(m.group, []).append((m.layer, m))
        else:
            other.append(m)
    out: list[Panel] = []
    spans: dict[str, list[int]] = {}
    for m in audit.modules:
        if m.layer is not None:
            spans.setdefault(m.group, []).append(m.layer)
    for group, placed in stacks.items():
        layers = _layer_range(spans[group])
        cols = list(dict.fromkeys(m.leaf for _, m in placed))
        cells = {(layers.index(layer), cols.index(m.leaf)): m for layer, m in placed}
        out.append(Panel(f"{group}.N", [str(i) for i in layers], cols, cells))
    for (group, leaf), by_expert in experts.items():
        layers = _layer_range(spans[group])
        n = max(e for _, e, _ in by_expert) + 1
        cells = {(layers.index(layer), e): m for layer, e, m in by_expert}
        title = f"{group}.N.{leaf}, per expert"
        out.append(Panel(title, [str(i) for i in layers], [str(e) for e in range(n)], cells, xlabel="expert"))
    if other:
        cols = [m.leaf for m in other]
        out.append(
            Panel("outside the layer stacks", [""], cols, {(0, i): m for i, m in enumerate(other)}, ylabel="")
        )
    return out


def _layer_range(layers: list[int]) -> list[int]:
    present = sorted(set(layers))
    return list(range(present[0], present[-1] + 1))


def render_png(audit: Audit, *, title: str | None = None) -> bytes:
    """The heat map as PNG bytes."""
    plt = require_matplotlib(audit.path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    ps = panels(audit)
    top = max((m.delta_norm for m in audit.modules if m.delta_norm is not None), default=0.0) or 1.0
    norm = Normalize(vmin=0.0, vmax=top)
    cmap = plt.colormaps["viridis"]
    widest = max((len(p.cols) for p in ps), default=1)
    heights = [max(1.2, 0.32 * len(p.rows) + 1.1) for p in ps] or [1.0]
    fig = Figure(
        figsize=(min(40.0, max(7.0, 2.8 + 0.62 * widest)), sum(heights) + 1.6), dpi=110, layout="constrained"
    )
    FigureCanvasAgg(fig)
    n, inert = len(audit.measured), audit.inert_count
    head = title or f"LoRA delta ‖scaling·B A‖_F per module: {_short(audit.path)}"
    sub = f"{n} module(s), {inert} inert ({audit.inert_share:.0%}), total ‖ΔW‖_F = {audit.total_norm:.4g}"
    if n and inert == n:
        sub = "ALL MODULES INERT: the adapter changes nothing.  " + sub
    fig.suptitle(f"{head}\n{sub}", fontsize=10)
    if not ps:
        fig.text(0.5, 0.5, "no LoRA modules measured", ha="center")
    else:
        axes = fig.subplots(len(ps), 1, squeeze=False, height_ratios=heights)[:, 0]
        for ax, p in zip(axes, ps):
            _draw(ax, p, norm, cmap)
        fig.colorbar(
            ScalarMappable(norm=norm, cmap=cmap),
            ax=list(axes),
            shrink=min(1.0, 4.0 / sum(heights) + 0.3),
            label="delta norm",
        )
        fig.legend(
            handles=[
                Patch(facecolor=INERT_RGBA, edgecolor="0.4", label="inert (≈0)"),
                Patch(facecolor=ABSENT_RGBA, edgecolor="0.4", label="no LoRA"),
                Patch(facecolor=(1.0, 0.0, 0.0, 1.0), edgecolor="0.4", label="NaN/Inf"),
            ],
            loc="outside lower center",
            fontsize=8,
            ncols=3,
            frameon=False,
        )
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _draw(ax: Axes, p: Panel, norm: Normalize, cmap: Colormap) -> None:
    import numpy as np

    img = np.empty((len(p.rows), len(p.cols), 4))
    img[:, :] = ABSENT_RGBA
    for (r, c), m in p.cells.items():
        if m.delta_norm is None:
            img[r, c] = (1.0, 0.0, 0.0, 1.0)  # NaN/Inf: red, whatever the scale
        elif m.inert:
            img[r, c] = INERT_RGBA
        else:
            img[r, c] = cmap(norm(m.delta_norm))
    ax.imshow(img, aspect="auto", interpolation="nearest")
    ax.set_title(p.title, fontsize=9, loc="left")
    ax.set_xticks(range(len(p.cols)))
    tilt = len(p.cols) > 3 and max(len(c) for c in p.cols) > 4
    ax.set_xticklabels(p.cols, rotation=30 if tilt else 0, ha="right" if tilt else "center", fontsize=8)
    ax.set_yticks(range(len(p.rows)))
    ax.set_yticklabels(p.rows, fontsize=7)
    ax.set_xlabel(p.xlabel, fontsize=8)
    ax.set_ylabel(p.ylabel, fontsize=8)
    ax.set_xticks([x - 0.5 for x in range(1, len(p.cols))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(p.rows))], minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="minor", length=0)
    if len(p.cells) <= _ANNOTATE_MAX_CELLS:
        for (r, c), m in p.cells.items():
            if m.delta_norm is None:
                label, dark = "NaN", True
            elif m.inert:
                label, dark = ("0" if m.delta_norm == 0 else "≈0"), False
            else:
                rgba = cmap(norm(m.delta_norm))
                dark = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] < 0.5
                v = m.delta_norm
                label = f"{v:.0f}" if 100 <= v < 1e5 else f"{v:.2g}"
            ax.text(c, r, label, ha="center", va="center", fontsize=6, color="white" if dark else "black")


def render_html(audit: Audit, png: bytes) -> str:
    """A self-contained page: the PNG (base64) and the per-module table."""
    esc = html.escape
    rows = []
    for m in audit.modules:
        cells = [
            m.module,
            "" if m.expert is None else str(m.expert),
            str(m.rank),
            _num(m.scaling),
            _num(m.delta_norm),
            "" if m.share is None else f"{m.share:.2%}",
            "" if m.effective_rank is None else str(m.effective_rank),
            "yes" if m.inert else "",
        ]
        cls = ' class="inert"' if m.inert else ""
        rows.append(f"<tr{cls}>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    heads = ("module", "expert", "rank", "scaling", "delta norm", "share", "effective rank", "inert")
    notes = "".join(f"<p>{esc(n)}</p>" for n in audit.notes)
    findings = "".join(
        f"<li>{esc(f.code)} ({esc(f.severity)}): {esc(f.message)}</li>" for f in audit.findings
    )
    title = esc(f"adapterdoc weights audit: {audit.path}")
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>'
        + title
        + "</title><style>body{font-family:sans-serif}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child{text-align:left}"
        "tr.inert{background:#ddd}</style></head><body>\n"
        f"<h1>{title}</h1>\n"
        f"<p>{len(audit.measured)} module(s), {audit.inert_count} inert ({audit.inert_share:.0%}), "
        f"total ‖ΔW‖<sub>F</sub> = {audit.total_norm:.6g}</p>{notes}\n"
        + (f"<ul>{findings}</ul>\n" if findings else "")
        + f'<img alt="LoRA delta norm heat map" src="data:image/png;base64,{base64.b64encode(png).decode()}">\n'
        + "<table><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in heads)
        + "</tr></thead><tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table></body></html>\n"
    )


def _short(path: str) -> str:
    parts = os.path.normpath(path).split(os.sep)
    return os.sep.join(parts[-2:])


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def render_heatmap(audit: Audit, path: str | os.PathLike[str]) -> str:
    """Write the heat map to ``path`` (``.png``, or ``.html``/``.htm`` with the table) atomically; return the path."""
    from adapterdoc.st.atomic import atomic_write_bytes

    spath = os.fspath(path)
    suffix = os.path.splitext(spath)[1].lower()
    if suffix not in PLOT_SUFFIXES:
        raise UnsupportedInputError(spath, "--plot writes .png or .html files")
    png = render_png(audit)
    data = png if suffix == ".png" else render_html(audit, png).encode("utf-8")
    atomic_write_bytes(spath, data)
    return spath


def require_matplotlib(what: str) -> ModuleType:
    try:
        import matplotlib as mpl
    except ImportError:
        raise UnsupportedInputError(
            what, "--plot needs matplotlib, which is not installed: pip install 'adapterdoc[plot]'"
        ) from None
    return mpl
