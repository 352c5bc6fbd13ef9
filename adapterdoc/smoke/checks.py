"""The doctor checks of a train-smoke run, in :data:`CHECKS` order, each a small function of the run
(:class:`~adapterdoc.smoke.compare.Ctx`) that records which implementation it used, so library-backed and
direct-PEFT checks can be told apart and swapped."""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from adapterdoc.layouts import get_layout
from adapterdoc.report.smoke_report import CheckResult
from adapterdoc.smoke.compare import (
    IDENTICAL,
    MERGE_TOLERANCE,
    Ctx,
    counterpart_outputs,
    fresh_saved_base,
    max_diff,
    outputs,
)
from adapterdoc.train import lora
from adapterdoc.train import models as M
from adapterdoc.train.objectives import CAUSAL, MASKED

if TYPE_CHECKING:
    import torch
    from torch import nn

    from adapterdoc.adapter import AdapterConfig


def check_loss(ctx: Ctx) -> CheckResult:
    r = ctx.result
    before, after = r.train_before.loss, r.train_after.loss
    return CheckResult(
        "loss",
        after < before,
        f"train loss {before:.4f} -> {after:.4f}",
        "adapterdoc.train.loop (token-weighted, gathered)",
        value=after - before,
        code="AD603",
    )


def check_towers(ctx: Ctx) -> CheckResult:

    model = ctx.model
    lay = get_layout(ctx.layout)
    segments = lora.tower_segments(lay)
    towers = [n for n, _ in model.named_parameters() if any(s in segments for s in n.split("."))]
    leaked = lora.trainable_tower_parameters(model, lay)
    detail = (
        f"{len(towers)} tower parameter(s), none trainable"
        if not leaked
        else f"{len(leaked)} trainable tower parameter(s), e.g. {leaked[0]}"
    )
    if not towers:
        detail = "no tower parameters in this model"
    return CheckResult("towers", not leaked, detail, "adapterdoc.train.lora", value=len(leaked), code="AD601")


def check_inspect(ctx: Ctx) -> CheckResult:
    from adapterdoc.inspection import inspect

    report = inspect(ctx.result.adapter_dir)
    errors = [f.code for f in report.findings if f.severity == "error"]
    got = report.layout.name
    ok = got == ctx.saved_layout and not errors
    detail = f"detected {got}" + ("" if got == ctx.saved_layout else f", expected {ctx.saved_layout}")
    if errors:
        detail += f"; error findings {', '.join(errors)}"
    return CheckResult("inspect", ok, detail, "adapterdoc.inspection", code="AD604")


def check_reload(ctx: Ctx) -> CheckResult:
    """A fresh base from the same seed + the saved adapter (and head) reproduces the trained outputs."""
    s = ctx.result.settings
    base = fresh_saved_base(ctx)
    model, missing = lora.load_peft(base, ctx.result.adapter_dir)
    head = M.load_head(ctx.result.head_dir) if ctx.result.head_dir else None
    got = outputs(model, ctx.batch, ctx.objective, head=head)
    diff, _, names = max_diff(ctx.reference, got, ctx.batch["attention_mask"])
    ok = not missing and diff <= IDENTICAL
    detail = f"fresh tiny:{ctx.saved_layout} (seed {s.base_seed}) + saved adapter: max |Δ{'/'.join(names)}| = {diff:.3g}"
    if missing:
        detail += f"; PEFT: {missing[0][:200]}"
    return CheckResult("reload", ok, detail, "peft.PeftModel.from_pretrained", value=diff, code="AD605")


def check_verify(ctx: Ctx) -> CheckResult:
    """``adapterdoc.verify`` against ``tiny:LAYOUT``: every key expected, none missing or unexpected, no error."""
    from adapterdoc.verify import verify

    base = f"tiny:{ctx.saved_layout}"
    run = verify([ctx.result.adapter_dir], base=base)
    r = run.adapters[0]
    ctx.verify_report = r
    errors = sorted({f.code for f in r.findings if f.severity == "error"})
    ok = r.ok and not (r.missing or r.unexpected or r.shape_mismatch)
    detail = (
        f"against {base}: {len(r.missing)} missing, {len(r.unexpected)} unexpected, "
        f"{len(r.shape_mismatch)} shape mismatch(es)"
    )
    if r.error:
        detail += f"; {r.error}"
    if errors:
        detail += f"; error findings {', '.join(errors)}"
    return CheckResult("verify", ok, detail, "adapterdoc.verify", code="AD610")


def check_lora_b(ctx: Ctx) -> CheckResult:
    """Every saved ``lora_B`` has a non-zero entry (read from the file, not from memory)."""
    r = ctx.verify_report
    if r is not None and r.error is None and r.lora_b.get("total"):
        nonzero, total = r.lora_b["nonzero"], r.lora_b["total"]
        impl = "adapterdoc.verify (lora_B scan)"
    else:
        nonzero, total = _scan_lora_b(os.path.join(ctx.result.adapter_dir, "adapter_model.safetensors"))
        impl = "safetensors.safe_open"
    ok = total > 0 and nonzero == total
    return CheckResult(
        "lora_b", ok, f"{nonzero}/{total} lora_B tensors non-zero", impl, value=nonzero, code="AD606"
    )


def _scan_lora_b(path: str) -> tuple[int, int]:
    from safetensors import safe_open

    nonzero = total = 0
    with safe_open(path, "pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            if ".lora_B." in key or key.endswith(".lora_embedding_B"):
                total += 1
                nonzero += bool(f.get_tensor(key).any())
    return nonzero, total


def check_remap(ctx: Ctx) -> CheckResult:
    """Remap to the text-only counterpart with ``adapterdoc.remap`` and load it on a counterpart base there."""
    from adapterdoc.ml.tiny import build_counterpart, build_tiny
    from adapterdoc.remap import remap

    src = ctx.saved_layout
    dst = get_layout(src).text_counterpart
    impl = "adapterdoc.remap + peft.PeftModel.from_pretrained"
    if dst is None:
        return CheckResult("remap", None, f"{src} has no text-only counterpart", impl)
    out = os.path.join(ctx.result.out_dir, f"adapter-{dst}")
    report = remap(ctx.result.adapter_dir, to=dst, source=src, out=out)
    if not report.ok:
        codes = ", ".join(f.code for f in report.findings if f.severity == "error")
        return CheckResult("remap", False, f"remap {src} -> {dst} refused: {codes}", impl, code="AD607")
    s = ctx.result.settings
    base = build_counterpart(build_tiny(src, s.base_seed), src, dst)
    model, missing = lora.load_peft(base, out)
    head = M.load_head(ctx.result.head_dir) if ctx.result.head_dir else None
    if ctx.objective == CAUSAL:
        got = outputs(model, ctx.batch, ctx.objective)
    else:
        got = counterpart_outputs(model, ctx.batch, ctx.objective, head)
    diff, _, names = max_diff(ctx.reference, got, ctx.batch["attention_mask"])
    ok = not missing and diff <= IDENTICAL and bool(names)
    detail = f"{src} -> {dst}: {report.renamed} keys renamed ({report.strategy}); max |Δ{'/'.join(names)}| = {diff:.3g}"
    if missing:
        detail += f"; PEFT: {missing[0][:200]}"
    return CheckResult("remap", ok, detail, impl, value=diff, code="AD607")


def check_merge(ctx: Ctx) -> CheckResult:
    """The merged model's outputs equal the unmerged trained model's, to float rounding.

    With ``adapterdoc.merge``: the tiny base is saved with ``save_pretrained`` (on-disk names, as a user's base),
    merged by streaming into a new folder, and that folder is loaded with ``from_pretrained``. Without it, PEFT's
    ``merge_and_unload`` on a reloaded copy.
    """
    try:
        from adapterdoc.merge import merge
    except ModuleNotFoundError as e:
        if e.name != "adapterdoc.merge":
            raise
        return _merge_in_memory(ctx)
    from adapterdoc.ml.tiny import model_class

    base_dir = os.path.join(ctx.result.out_dir, "base")
    merged_dir = os.path.join(ctx.result.out_dir, "merged")
    fresh_saved_base(ctx).save_pretrained(base_dir)
    umask_modes(base_dir)
    report = merge(ctx.result.adapter_dir, base_dir, merged_dir)
    impl = "adapterdoc.merge (streamed, on disk) + from_pretrained"
    if not report.ok or report.unused:
        codes = ", ".join(sorted({f.code for f in report.findings if f.severity == "error"}))
        return CheckResult(
            "merge",
            False,
            f"merge refused ({codes}); {len(report.unused)} unused module(s)",
            impl,
            code="AD608",
        )
    merged = model_class(ctx.saved_layout).from_pretrained(merged_dir, dtype=_float32())
    merged.eval()  # type: ignore[no-untyped-call]  # unannotated in transformers
    if ctx.saved_layout == ctx.layout:
        M.route_forward(merged, ctx.layout)
    return _compare_merged(ctx, merged, impl, f"{len(report.applied)} module(s) merged on disk; ")


def _float32() -> torch.dtype:
    import torch

    return torch.float32


def _merge_in_memory(ctx: Ctx) -> CheckResult:
    model, _ = lora.load_peft(fresh_saved_base(ctx), ctx.result.adapter_dir)
    merged = model.merge_and_unload().eval()
    return _compare_merged(ctx, merged, "peft merge_and_unload (in memory)", "")


def _compare_merged(ctx: Ctx, merged: nn.Module, impl: str, prefix: str) -> CheckResult:
    head = M.load_head(ctx.result.head_dir) if ctx.result.head_dir else None
    if ctx.objective == MASKED:
        got = outputs(merged, ctx.batch, ctx.objective)
    else:
        got = outputs(merged, ctx.batch, ctx.objective, head=head)
    diff, scale, names = max_diff(ctx.reference, got, ctx.batch["attention_mask"])
    leftover = sum(1 for n, _ in merged.named_parameters() if "lora_" in n)
    ok = diff <= MERGE_TOLERANCE * max(1.0, scale) and not leftover and bool(names)
    detail = f"{prefix}merged vs unmerged: max |Δ{'/'.join(names)}| = {diff:.3g} (scale {scale:.3g})"
    if leftover:
        detail += f"; {leftover} LoRA parameter(s) left after merging"
    return CheckResult("merge", ok, detail, impl, value=diff, code="AD608")


def check_experts(ctx: Ctx) -> CheckResult:
    """The trained adapter's expert picture: every MoE block of the model carries LoRA on every expert, for each
    expert projection the smoke's LoRA config targets (``target_parameters`` fused, ``target_modules`` per expert)."""
    from adapterdoc.adapter.expert_picture import expert_picture
    from adapterdoc.checkpoint import open_checkpoint

    impl = "adapterdoc.adapter.expert_picture.expert_picture"
    if get_layout(ctx.saved_layout).experts is None:
        return CheckResult("experts", None, f"{ctx.saved_layout} has no routed experts", impl)
    blocks, n = _model_experts(ctx.model)
    ckpt = open_checkpoint(ctx.result.adapter_dir)
    config = ckpt.adapter_config
    pic = expert_picture({k: t.shape for k, t in ckpt.tensors.items()}, config=config, num_experts=n)
    want = _targeted_expert_projections(config)
    cov = pic.coverage()
    full = blocks * n if n else None
    ok = (
        bool(want)
        and pic.layout in ("fused", "per-expert")
        and len(pic.routed) == blocks
        and not pic.one_sided
        and all(cov.get(p, {}).get("experts") == full and cov[p].get("of") == full for p in want)
    )
    got = ", ".join(f"{p} {c['experts']}/{c['of']}" for p, c in cov.items()) or "none"
    detail = (
        f"{pic.layout or 'no expert LoRA'}: {len(pic.routed)}/{blocks} MoE blocks × {n} experts; "
        f"coverage {got}; targeted {', '.join(want) or 'none'}"
    )
    return CheckResult("experts", ok, detail, impl, value=len(pic.routed), code="AD611")


def _model_experts(model: nn.Module) -> tuple[int, int | None]:
    """(MoE blocks of the trained model, routed experts per block): its transformers ``*Experts`` modules."""
    found = [m for _, m in model.named_modules() if type(m).__name__.endswith("Experts")]
    return len(found), max((getattr(m, "num_experts", 0) for m in found), default=None) or None


def _targeted_expert_projections(config: AdapterConfig | None) -> list[str]:
    from adapterdoc.adapter.expert_picture import FUSED_PROJECTIONS, PROJECTIONS

    params = {p.rpartition(".")[2] for p in getattr(config, "target_parameters", None) or ()}
    fused = [p for p in FUSED_PROJECTIONS if f"{p}_proj" in params]
    if fused:  # the experts are 3-D parameters: gate_proj/up_proj in target_modules are the shared expert's
        return fused
    modules = getattr(config, "target_modules", None) or ()
    modules = {modules} if isinstance(modules, str) else set(modules)
    return [p for p in PROJECTIONS if f"{p}_proj" in modules]


def check_experts_trip(ctx: Ctx) -> CheckResult:
    """``remap --experts`` to the other expert layout and back (:func:`adapterdoc.roundtrip.expert_trip`: names,
    exact tensors), each loaded with PEFT on a fresh tiny base: outputs identical to the trained model's."""
    from adapterdoc.roundtrip import (
        TripFailed,
        TripSkipped,
        expert_trip,
        peft_drops_note,
        peft_has_expert_lora,
    )

    impl = "adapterdoc.remap (experts=) + peft.PeftModel.from_pretrained"
    if get_layout(ctx.saved_layout).experts is None:
        return CheckResult("experts_trip", None, f"{ctx.saved_layout} has no routed experts", impl)
    work = os.path.join(ctx.result.out_dir, "experts-trip")
    os.makedirs(work, exist_ok=True)
    try:
        trip = expert_trip(ctx.result.adapter_dir, work)
    except TripSkipped as e:
        return CheckResult("experts_trip", False, f"not moved: {e}", impl, code="AD612")
    except TripFailed as e:
        return CheckResult("experts_trip", False, str(e), impl, code="AD612")
    head = M.load_head(ctx.result.head_dir) if ctx.result.head_dir else None
    worst, parts, missing = 0.0, [], []
    for label, folder in ((f"as {trip['other']}", trip["there"]), ("back", trip["back"])):
        model, miss = lora.load_peft(fresh_saved_base(ctx), folder)
        missing += miss
        if folder == trip["there"] and trip["other"] == "per-expert" and not peft_has_expert_lora(model):
            parts.append(peft_drops_note(model.get_base_model(), trip["other"]))
            continue
        diff, _, names = max_diff(
            ctx.reference, outputs(model, ctx.batch, ctx.objective, head=head), ctx.batch["attention_mask"]
        )
        worst = max(worst, diff if names else float("inf"))
        parts.append(f"{label} max |Δ{'/'.join(names)}| = {diff:.3g}")
    ok = not missing and worst <= IDENTICAL
    detail = f"{trip['path']}: " + "; ".join(parts) + "; " + trip["detail"].partition(": ")[2]
    if missing:
        detail += f"; PEFT: {missing[0][:200]}"
    return CheckResult("experts_trip", ok, detail, impl, value=worst, code="AD612")


Check = Callable[[Ctx], CheckResult]
CHECKS: list[Check] = [
    check_loss,
    check_towers,
    check_inspect,
    check_verify,
    check_reload,
    check_lora_b,
    check_remap,
    check_merge,
    check_experts,
    check_experts_trip,
]
"""The doctor checks, in order. Which implementation each uses is in its result's ``implementation``."""


def run_check(check: Check, ctx: Ctx) -> CheckResult:
    name = check.__name__.removeprefix("check_")
    t0 = time.perf_counter()
    try:
        res = check(ctx)
    except Exception as e:  # a crashed check is a failed check, reported, never a traceback
        if os.environ.get("ADAPTERDOC_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        res = CheckResult(name, False, f"crashed: {type(e).__name__}: {one_line(e)}", "-", code="AD609")
    return dataclasses.replace(res, seconds=time.perf_counter() - t0)


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def umask_modes(folder: str) -> None:
    """Give the files ``save_pretrained`` wrote the mode every other output gets (``0666 & ~umask``):
    safetensors' ``save_file`` creates its file 0600 whatever the umask."""
    from adapterdoc.st.atomic import new_file_mode

    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and not os.path.islink(path):
            os.chmod(path, new_file_mode())
