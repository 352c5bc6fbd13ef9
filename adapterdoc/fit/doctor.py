"""The doctor on what `adapterdoc train` wrote (verify against the same base, every lora_B non-zero, no LoRA on a
tower), and the sections of RUN_REPORT.md around it: the verdict, the loss curve, the weights audit."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from adapterdoc.report.base import pick
from adapterdoc.report.findings import Finding, make
from adapterdoc.train.base_model import Base
from adapterdoc.train.records import TrainResult, run_report

PLOT = "loss_curve.png"


@dataclass(frozen=True)
class Verdict:
    """The doctor's verdict on the written adapter: verify against the same base, lora_B, towers (the JSON
    ``verify`` object of `adapterdoc train`, :meth:`to_dict`)."""

    ok: bool
    base: str
    layout: str
    missing: int
    unexpected: int
    shape_mismatch: int
    lora_b: Mapping[str, int]
    tower_lora: int
    error: str | None
    findings: tuple[Finding, ...]

    def to_dict(self) -> dict[str, object]:
        d = pick(self, (f.name for f in fields(self)))
        return {**d, "lora_b": dict(self.lora_b), "findings": [f.to_dict() for f in self.findings]}


def examine(result: TrainResult, base: Base, target: str) -> tuple[Verdict, list[Finding]]:
    """The doctor's verdict and findings on the run (a loss that did not fall is AD623), and RUN_REPORT.md
    with the verdict, the loss curve (AD626 without matplotlib) and the weights audit."""
    verdict, findings = doctor(result, base)
    if result.train_after.loss >= result.train_before.loss:
        findings.append(
            make(
                "AD623",
                f"train loss {result.train_before.loss:.4f} -> {result.train_after.loss:.4f}",
                path=result.adapter_dir,
            )
        )
    sections = [verdict_section(verdict)]
    if not base.known:
        section, finding = outside_registry(result, base)
        sections.append(section)
        findings.append(finding)
    picture = write_loss_curve(result.history, os.path.join(target, PLOT))
    if picture:
        sections.append(f"## Loss curve\n\n![loss curve]({PLOT})")
    else:
        sections.append("## Loss curve\n\nSkipped: matplotlib is not installed (`pip install matplotlib`).")
        findings.append(make("AD626", "loss curve skipped: matplotlib is not installed", path=target))
    sections.append(weights_heatmap_section(result.adapter_dir, target))
    from adapterdoc.report.run_report import write_run_report

    # once, here: the loop was told not to write it (Plan.writes_run_report)
    write_run_report(target, run_report(result, sections))
    return verdict, findings


def doctor(result: TrainResult, base: Base) -> tuple[Verdict, list[Finding]]:
    """Verify the written adapter against the same base; lora_B non-zero; no LoRA on a tower."""
    from adapterdoc.adapter import parse_key
    from adapterdoc.layouts import tower_segment
    from adapterdoc.verify import verify

    adapter = result.adapter_dir
    run = verify([adapter], base=base.spec)
    r = run.adapters[0]
    towers = [k for k in result.saved_keys if tower_segment(parse_key(k).module) is not None]
    findings: list[Finding] = []
    verified = r.ok and not (r.missing or r.unexpected or r.shape_mismatch)
    if not verified:
        detail = r.error or (
            f"{len(r.missing)} missing, {len(r.unexpected)} unexpected, {len(r.shape_mismatch)} mis-shaped; "
            + ", ".join(sorted({f.code for f in r.findings if f.severity == "error"}))
        )
        findings.append(make("AD620", f"verify against {base.spec}: {detail}", path=adapter))
    nz, total = r.lora_b.get("nonzero", 0), r.lora_b.get("total", 0)
    if total == 0 or nz != total:
        findings.append(make("AD622", f"{total - nz}/{total} lora_B tensors are all zero", path=adapter))
    if towers:
        findings.append(
            make("AD621", f"{len(towers)} LoRA tensor(s) on a tower", path=adapter, key=towers[0])
        )
    verdict = Verdict(
        ok=verified and not findings,
        base=base.spec,
        layout=r.layout,
        missing=len(r.missing),
        unexpected=len(r.unexpected),
        shape_mismatch=len(r.shape_mismatch),
        lora_b=dict(r.lora_b),
        tower_lora=len(towers),
        error=r.error,
        findings=tuple(r.findings),
    )
    return verdict, findings


def outside_registry(result: TrainResult, base: Base) -> tuple[str, Finding]:
    """For a base the registry does not know: which rule chose the targets, and that no tower was excluded
    (RUN_REPORT.md's section and the AD627 finding)."""
    from adapterdoc.adapter import parse_key

    leaves = sorted({parse_key(k).module.rsplit(".", 1)[-1] for k in result.saved_keys})
    modules = len({parse_key(k).module for k in result.saved_keys})
    rule = (
        "--targets"
        if result.settings.targets
        else "PEFT's all-linear rule (every linear layer but the output head)"
    )
    cls = base.model_class.__name__
    message = (
        f"{cls} is not a layout of the registry: LoRA from {rule} on {modules} modules ({', '.join(leaves)}); "
        "no towers are known for it, so none were excluded"
    )
    section = "\n".join(
        [
            "## LoRA targets",
            "",
            f"- {cls} is not a layout of the registry: the targets come from {rule}.",
            f"- {modules} modules: {', '.join(leaves)}.",
            "- Towers: none known for this model, so none were excluded; if it has a vision or audio tower, name the "
            "language-model leaves with `--targets`.",
        ]
    )
    return section, make("AD627", message, path=result.adapter_dir)


def verdict_section(v: Verdict) -> str:
    mark = "passed" if v.ok else "FAILED"
    lines = [
        "## The doctor's verdict",
        "",
        f"- verify against `{v.base}`: {mark} (layout {v.layout}; {v.missing} missing, "
        f"{v.unexpected} unexpected, {v.shape_mismatch} mis-shaped)",
        f"- lora_B non-zero: {v.lora_b.get('nonzero', 0)}/{v.lora_b.get('total', 0)}",
        f"- towers untouched: {'yes' if not v.tower_lora else 'NO, ' + str(v.tower_lora) + ' tower tensors'}",
    ]
    if v.error:
        lines.append(f"- error: {v.error}")
    for f in v.findings:
        lines.append(f"- {f.code} ({f.severity}): {f.message}")
    return "\n".join(lines)


def history_numbers(history: Sequence[Mapping[str, object]], key: str) -> list[float]:
    """``key`` of each history row that holds a number there (the rows are JSON objects)."""
    return [float(v) for h in history if isinstance(v := h.get(key), (int, float))]


def write_loss_curve(history: Sequence[Mapping[str, object]], path: str) -> bool:
    """The per-step loss as a PNG (atomically); False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    import io

    from adapterdoc.st.atomic import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    ax.plot(
        history_numbers(history, "step"),
        history_numbers(history, "loss"),
        marker="." if len(history) < 50 else None,
    )
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return True


def weights_heatmap_section(adapter_dir: str, out: str) -> str:
    """The weights audit's totals and findings, and its heat map (``delta_heatmap.png``), for RUN_REPORT.md."""
    from adapterdoc.audit import report_section

    return report_section(adapter_dir, out).rstrip("\n")
