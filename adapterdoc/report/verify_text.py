"""Human rendering of a :class:`~adapterdoc.report.verify_report.VerifyRun`: a block per adapter, findings grouped by code, and
a pytest-like summary line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.report.registry import Group, View, register
from adapterdoc.report.render import (
    Writer,
    count_line,
    plural,
    write_findings,
    write_fix,
)

if TYPE_CHECKING:
    from adapterdoc.report.verify_report import VerifyReport, VerifyRun


def _view(run: VerifyRun) -> View:
    """One group per adapter (an unusable one carries its error); the run's base and serving profile."""
    props = [("base", run.base), ("profile", run.options.profile), *run.options.profile_fields().items()]
    groups = [Group(a.adapter, a.findings, path=a.path, error=a.error) for a in run.adapters]
    return View("verify", groups, unit="adapter", properties=props)


@register("VerifyRun", view=_view)
def render_verify(run: VerifyRun, *, width: int | None = None) -> str:
    w = Writer(width)
    _header(w, run)
    for report in run.adapters:
        w.blank()
        _render_one(w, report)
    w.blank()
    w.para(*_summary(run), hang=2)
    return w.getvalue()


def _header(w: Writer, run: VerifyRun) -> None:
    from adapterdoc.report.verify_report import OWN_BASE

    o = run.options
    b = run.base_info
    w.para(("adapterdoc verify", "bold"))
    if run.base == OWN_BASE:
        w.para("base: each adapter's own (its base_model_name_or_path)", indent=2)
    else:
        parts = [p for p in (b.get("model_type"), f"layout {b['layout']}" if b.get("layout") else None) if p]
        w.para("base:", (run.base, "bold"), f"({', '.join(parts)})" if parts else "", indent=2)
    w.para(f"profile: {o.profile_label()}", indent=2)


def _source(r: VerifyReport) -> str:
    """Which path decided the expected keys."""
    if r.expected_keys_from == "registry":
        return " (from the layout registry)"
    if r.expected_keys_from == "meta-device":
        return " (from PEFT on the meta device)"
    return ""


def _layouts(r: VerifyReport) -> str:
    """The adapter's layout and the base's; a base PEFT built on the meta device outside the layout registry (a
    Llama, a Mistral) is said to be so, not "unknown"; no base model at all (a GGUF model file) is said too."""
    if r.expected_keys_from == "none":
        return f"layout {r.layout} → no Hugging Face base model"
    if r.base_layout is None and r.expected_keys_from == "meta-device":
        if r.layout in ("unknown", "ambiguous"):
            return "a family outside the layout registry"
        return f"layout {r.layout} → base outside the layout registry"
    return f"layout {r.layout} → base {r.base_layout or 'unknown'}"


def _render_one(w: Writer, r: VerifyReport) -> None:
    if r.error:
        w.para(("✗", "bold red"), (r.adapter, "bold"), hang=4)
        w.para("cannot be examined:", r.error, indent=2)
        return
    mark = ("✓", "bold green") if r.ok else ("✗", "bold red")
    layouts = _layouts(r)
    if 2 + len(r.adapter) + 2 + len(layouts) <= w.width:
        w.line(mark, " ", (r.adapter, "bold"), "  ", layouts)
    else:
        w.para(mark, (r.adapter, "bold"), hang=4)
        w.para(layouts, indent=2)
    cfg = r.config
    keys = [f"{cfg.get('expected_keys', 0):,} expected{_source(r)}"]
    for n, word, many in (
        (len(r.missing), "missing", "missing"),
        (len(r.unexpected), "unexpected", "unexpected"),
        (len(r.shape_mismatch), "shape mismatch", "shape mismatches"),
    ):
        if n:
            keys.append(plural(n, word, many))
    if len(keys) == 1:
        keys.append("all present")
    if r.expected_keys_from == "none":
        keys = ["compared by the format's own rules against the base file (below)"]
    w.para("keys:", ", ".join(keys), indent=2)
    dt = ", ".join(f"{d} ×{n:,}" for d, n in r.dtypes.items()) or "none"
    extra = f"; served as {r.served_as}" if r.served_as else ""
    unread = r.config.get("peft_view")  # a file its format's rules refuse, which could not be read as PEFT
    if unread:
        w.para(f"weights: {unread}", indent=2)
    else:
        w.para(f"lora_B non-zero {r.lora_b['nonzero']}/{r.lora_b['total']}; dtypes {dt}{extra}", indent=2)
    if r.load:
        ld = r.load
        if ld.get("skipped"):
            w.para(f"load: skipped ({ld['skipped']})", indent=2)
        else:
            w.para(
                f"load: {plural(ld['lora_modules'], 'LoRA module')}, {len(ld['missing'])} missing, "
                f"{len(ld['unexpected'])} unexpected, max |Δ output| {ld['max_abs_diff']:.3g}",
                indent=2,
            )
    command = r.move["command"] if r.move else None
    write_findings(
        w, r.findings, indent=2, context=(r.adapter, r.path), shown_hints={command} if command else None
    )
    if command:
        write_fix(w, command, indent=2)


def _summary(run: VerifyRun) -> list[tuple[str, str] | str]:
    n = len(run.adapters)
    unusable = sum(1 for a in run.adapters if a.error)
    failed = sum(1 for a in run.adapters if not a.ok and not a.error)
    passed = n - failed - unusable
    verdict = ("FAIL", "bold red") if failed or unusable else ("OK", "bold green")
    parts = [plural(failed, "failed", "failed")] if failed else []
    if unusable:
        parts.append(f"{unusable} unusable")
    detail = f" ({', '.join(parts)})" if parts else ""
    return [verdict, f"{passed} of {plural(n, 'adapter')} passed{detail};", count_line(run.findings)]
