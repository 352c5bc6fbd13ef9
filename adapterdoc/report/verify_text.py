"""Human rendering of a :class:`~adapterdoc.verify.VerifyRun` (rich; honours NO_COLOR and non-terminals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapterdoc.report.render import capture_console, findings_table

if TYPE_CHECKING:
    from adapterdoc.verify import VerifyReport, VerifyRun


def render_verify(run: VerifyRun, *, width: int | None = None) -> str:
    console, buf = capture_console(width)
    o = run.options
    b = run.base_info
    about = ", ".join(
        p for p in (b.get("model_type"), f"layout {b['layout']}" if b.get("layout") else None) if p
    )
    profile = (
        f"vllm {run.to_dict()['vllm_version']} (max LoRA rank {o.max_lora_rank})"
        if o.profile == "vllm"
        else "peft"
    )
    console.print(f"[bold]adapterdoc verify[/]  base [bold]{run.base}[/] ({about})")
    console.print(f"profile {profile}")
    for report in run.adapters:
        console.print()
        _render_one(console, report)
    failed = sum(1 for a in run.adapters if not a.ok)
    console.print()
    verdict = "[bold red]FAIL[/]" if failed else "[bold green]OK[/]"
    console.print(f"{verdict}  {len(run.adapters) - failed} of {len(run.adapters)} adapter(s) passed")
    return buf.getvalue()


def _render_one(console, r: VerifyReport) -> None:  # type: ignore[no-untyped-def]
    if r.error:
        console.print(f"[bold red]✗[/] [bold]{r.adapter}[/]  cannot be examined: {r.error}")
        return
    counts = {s: sum(1 for f in r.findings if f.severity == s) for s in ("error", "warning", "info")}
    mark = "[bold green]✓[/]" if r.ok else "[bold red]✗[/]"
    console.print(
        f"{mark} [bold]{r.adapter}[/]  layout {r.layout} → base {r.base_layout or 'unknown'}   "
        f"{counts['error']} error(s), {counts['warning']} warning(s)"
    )
    dt = ", ".join(f"{d} × {n}" for d, n in r.dtypes.items()) or "none"
    cfg = r.config
    console.print(
        f"  keys: {len(r.missing)} missing · {len(r.unexpected)} unexpected · {len(r.shape_mismatch)} shape "
        f"mismatch(es) ({cfg.get('expected_keys', 0)} expected)"
    )
    served = f" · served as: {r.served_as}" if r.served_as else ""
    console.print(f"  lora_B non-zero: {r.lora_b['nonzero']}/{r.lora_b['total']} · dtypes: {dt}{served}")
    if r.move:
        console.print(f"  move: {r.move['description']}")
        console.print(f"  fix:  [bold]{r.move['command']}[/]")
    if r.load:
        ld = r.load
        if ld.get("skipped"):
            console.print(f"  load: skipped ({ld['skipped']})")
        else:
            console.print(
                f"  load: {ld['lora_modules']} LoRA module(s), {len(ld['missing'])} missing, "
                f"{len(ld['unexpected'])} unexpected, max |Δ output| {ld['max_abs_diff']:.3g}"
            )
    if r.findings:
        console.print(findings_table(r.findings))
