"""`adapterdoc train-smoke`: a reference run per layout, then the doctor on its own output.

For each layout: build the tiny base, inject LoRA, train, evaluate (loss before and after, answer-token accuracy),
save, and run the checks in :data:`CHECKS`, each a small function of the run. Each check records which
implementation it used (:attr:`CheckResult.implementation`), so library-backed and direct-PEFT checks can be
told apart and swapped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.errors import AdapterdocError, RefusedError
from adapterdoc.layouts import get_layout
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.train import lora

SMOKE_LAYOUTS = (
    "qwen3_5_vl",
    "qwen3_5_moe_vl",
    "qwen3_omni_thinker",
    "qwen3_omni",
    "mistral3_vl",
    "modernbert_mlm",
    "embeddinggemma2",
)
"""``--layout all``: every VL/wrapper layout and both encoders of the registry."""

CHECK_NAMES = ("loss", "towers", "inspect", "verify", "reload", "lora_b", "remap", "merge")
IDENTICAL = 1e-6
"""Max |Δ| for "identical" outputs (same weights, same ops: 0.0 is expected)."""
MERGE_TOLERANCE = 1e-4
"""Max |Δ| relative to max(1, max |output|) for merged vs unmerged (float rounding of W + s·B@A)."""
_MARKER = "progress.jsonl"

OnEvent = Callable[[dict[str, Any]], None]


@dataclass
class CheckResult:
    name: str
    ok: bool | None
    """``None``: skipped (e.g. no text-only counterpart)."""
    detail: str
    implementation: str
    seconds: float = 0.0
    value: float | None = None
    """The measured quantity (max |Δ| of outputs, count of non-zero lora_B, ...)."""
    code: str | None = None
    """The AD6xx code reported when the check fails."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "detail": self.detail,
            "implementation": self.implementation,
            "value": self.value,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class LayoutRun:
    layout: str
    objective: str | None = None
    train_loss_before: float | None = None
    train_loss_after: float | None = None
    val_loss_before: float | None = None
    val_loss_after: float | None = None
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    """Answer-token accuracy (masked tokens for MLM, classes for the pooled head) on the validation rows."""
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    train_seconds: float = 0.0
    out: str | None = None
    adapter_dir: str | None = None
    error: str | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and all(c.ok is not False for c in self.checks)

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "ok": self.ok,
            "objective": self.objective,
            "loss_before": self.train_loss_before,
            "loss_after": self.train_loss_after,
            "val_loss_before": self.val_loss_before,
            "val_loss_after": self.val_loss_after,
            "accuracy_before": self.accuracy_before,
            "accuracy_after": self.accuracy_after,
            "checks": {c.name: c.to_dict() for c in self.checks},
            "seconds": round(self.seconds, 3),
            "train_seconds": round(self.train_seconds, 3),
            "out": self.out,
            "adapter": self.adapter_dir,
            "error": self.error,
        }


@dataclass
class SmokeReport:
    runs: list[LayoutRun]
    steps: int
    out: str | None
    """``None`` when the outputs went to a temporary folder that is gone."""
    seconds: float
    import_seconds: float
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs) and not any(f.severity == "error" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "layouts": [r.to_dict() for r in self.runs],
            "steps": self.steps,
            "out": self.out,
            "seconds": round(self.seconds, 3),
            "import_seconds": round(self.import_seconds, 3),
        }


def resolve_layouts(spec: str) -> list[str]:
    """``all``, one layout name, or a comma-separated list; raises ``KeyError`` for names without a tiny model."""
    from adapterdoc.ml.tiny import TINY_LAYOUTS

    if spec == "all":
        return list(SMOKE_LAYOUTS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in TINY_LAYOUTS]
    if bad or not names:
        raise KeyError(
            f"no tiny reference model for {', '.join(bad) or repr(spec)}; choose all or one of: "
            + ", ".join(TINY_LAYOUTS)
        )
    return names


# ------------------------------------------------------------------------------------------------- the run context


@dataclass
class Ctx:
    """What the checks see: the finished run, its in-memory model, a validation batch and its outputs."""

    layout: str
    result: Any  # loop.TrainResult
    work: str
    saved_layout: str
    """The layout of the saved adapter's keys (the thinker's when an Omni wrapper saved thinker naming)."""
    reference: dict[str, Any] = field(default_factory=dict)
    verify_report: Any = None
    """``adapterdoc.verify``'s report on the saved adapter, once the verify check ran."""

    @property
    def objective(self) -> str:
        return self.result.objective

    @property
    def batch(self) -> dict[str, Any]:
        return self.result.val_batch


def _outputs(module: Any, batch: dict[str, Any], objective: str, head: Any = None) -> dict[str, Any]:
    """Comparable outputs of a trained/reloaded/merged module: logits, and the encoder's hidden states."""
    import torch

    from adapterdoc.train import loop

    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        if objective == loop.POOLED:
            encoder = module.encoder if head is None else module
            head = module.head if head is None else head
            hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            return {"hidden": hidden, "logits": head(loop.mean_pool(hidden, mask))}
        out = {"logits": module(input_ids=ids, attention_mask=mask).logits}
        if objective == loop.MASKED:
            base = module.get_base_model() if hasattr(module, "get_base_model") else module
            out["hidden"] = base.model(input_ids=ids, attention_mask=mask).last_hidden_state
        return out


def _counterpart_outputs(module: Any, batch: dict[str, Any], objective: str, head: Any) -> dict[str, Any]:
    import torch

    from adapterdoc.train import loop

    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        out = module(input_ids=ids, attention_mask=mask)
        if objective == loop.CAUSAL:
            return {"logits": out.logits}
        res = {"hidden": out.last_hidden_state}
        if objective == loop.POOLED:
            res["logits"] = head(loop.mean_pool(out.last_hidden_state, mask))
        return res


def _max_diff(a: dict[str, Any], b: dict[str, Any], mask: Any) -> tuple[float, float, list[str]]:
    """(max |Δ| over real tokens of the shared outputs, max |reference|, names compared)."""
    names = [k for k in a if k in b]
    worst, scale = 0.0, 0.0
    for k in names:
        x, y = a[k].float(), b[k].float()
        if x.shape != y.shape:
            return float("inf"), 0.0, names
        if x.dim() >= 2 and x.shape[:2] == mask.shape:
            keep = mask.bool()
            x, y = x[keep], y[keep]
        worst = max(worst, float((x - y).abs().max()))
        scale = max(scale, float(x.abs().max()))
    return worst, scale, names


# ------------------------------------------------------------------------------------------------------- the checks


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

    model = ctx.result.model
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
    from adapterdoc.inspect import inspect

    report = inspect(ctx.result.adapter_dir)
    errors = [f.code for f in report.findings if f.severity == "error"]
    got = report.layout.name
    ok = got == ctx.saved_layout and not errors
    detail = f"detected {got}" + ("" if got == ctx.saved_layout else f", expected {ctx.saved_layout}")
    if errors:
        detail += f"; error findings {', '.join(errors)}"
    return CheckResult("inspect", ok, detail, "adapterdoc.inspect", code="AD604")


def check_reload(ctx: Ctx) -> CheckResult:
    """A fresh base from the same seed + the saved adapter (and head) reproduces the trained outputs."""
    from adapterdoc.train import loop

    s = ctx.result.settings
    base = _fresh_saved_base(ctx)
    model, missing = lora.load_peft(base, ctx.result.adapter_dir)
    head = loop.load_head(ctx.result.head_dir) if ctx.result.head_dir else None
    got = _outputs(model, ctx.batch, ctx.objective, head=head)
    diff, _, names = _max_diff(ctx.reference, got, ctx.batch["attention_mask"])
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
    from adapterdoc.train import loop

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
    head = loop.load_head(ctx.result.head_dir) if ctx.result.head_dir else None
    if ctx.objective == loop.CAUSAL:
        got = _outputs(model, ctx.batch, ctx.objective)
    else:
        got = _counterpart_outputs(model, ctx.batch, ctx.objective, head)
    diff, _, names = _max_diff(ctx.reference, got, ctx.batch["attention_mask"])
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
    _fresh_saved_base(ctx).save_pretrained(base_dir)
    _umask_modes(base_dir)
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
    merged = model_class(ctx.saved_layout).from_pretrained(merged_dir, dtype=_float32()).eval()
    if ctx.saved_layout == ctx.layout and hasattr(merged, "thinker"):
        merged.forward = merged.thinker.forward
    return _compare_merged(ctx, merged, impl, f"{len(report.applied)} module(s) merged on disk; ")


def _float32() -> Any:
    import torch

    return torch.float32


def _merge_in_memory(ctx: Ctx) -> CheckResult:
    model, _ = lora.load_peft(_fresh_saved_base(ctx), ctx.result.adapter_dir)
    merged = model.merge_and_unload().eval()
    return _compare_merged(ctx, merged, "peft merge_and_unload (in memory)", "")


def _compare_merged(ctx: Ctx, merged: Any, impl: str, prefix: str) -> CheckResult:
    from adapterdoc.train import loop

    head = loop.load_head(ctx.result.head_dir) if ctx.result.head_dir else None
    if ctx.objective == loop.MASKED:
        got = _outputs(merged, ctx.batch, ctx.objective)
    else:
        got = _outputs(merged, ctx.batch, ctx.objective, head=head)
    diff, scale, names = _max_diff(ctx.reference, got, ctx.batch["attention_mask"])
    leftover = sum(1 for n, _ in merged.named_parameters() if "lora_" in n)
    ok = diff <= MERGE_TOLERANCE * max(1.0, scale) and not leftover and bool(names)
    detail = f"{prefix}merged vs unmerged: max |Δ{'/'.join(names)}| = {diff:.3g} (scale {scale:.3g})"
    if leftover:
        detail += f"; {leftover} LoRA parameter(s) left after merging"
    return CheckResult("merge", ok, detail, impl, value=diff, code="AD608")


def _fresh_saved_base(ctx: Ctx) -> Any:
    """A fresh base of the saved adapter's layout, from the run's base seed."""
    from adapterdoc.train import loop

    seed = ctx.result.settings.base_seed
    if ctx.saved_layout == ctx.layout:
        return loop.build_base(ctx.layout, seed)
    return loop.build_base(ctx.layout, seed).thinker  # an Omni wrapper saved in thinker naming


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
        res = CheckResult(name, False, f"crashed: {type(e).__name__}: {_one_line(e)}", "-", code="AD609")
    res.seconds = time.perf_counter() - t0
    return res


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


# ------------------------------------------------------------------------------------------------------- the runs


def _prepare_folder(path: str) -> None:
    """Make ``path`` an empty folder; replace it only if an earlier train-smoke made it (its progress.jsonl)."""
    from adapterdoc.st.atomic import is_our_output, prepare_output_folder

    prepare_output_folder(
        path, ours=lambda p: is_our_output(p) or os.path.isfile(os.path.join(p, _MARKER)), mark=_MARKER
    )


def _umask_modes(folder: str) -> None:
    """Give the files ``save_pretrained`` wrote the mode every other output gets (``0666 & ~umask``):
    safetensors' ``save_file`` creates its file 0600 whatever the umask."""
    from adapterdoc.st.atomic import new_file_mode

    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and not os.path.islink(path):
            os.chmod(path, new_file_mode())


def run_layout(
    layout: str, work: str, settings: Any, on_event: OnEvent | None = None, *, data: Any = None
) -> LayoutRun:
    """Train ``layout`` into ``work`` (on ``data``, default the bundled rows) and run every check on the output.

    Interrupted (Ctrl-C) after ``work`` was made ours, the half-made layout folder is removed: nothing
    half-written is left behind (CLI.md, exit 130)."""
    prepared: list[bool] = []
    try:
        return _run_layout(layout, work, settings, on_event, data=data, prepared=prepared)
    except KeyboardInterrupt:
        if prepared:
            shutil.rmtree(work, ignore_errors=True)
        raise


def _run_layout(
    layout: str, work: str, settings: Any, on_event: OnEvent | None, *, data: Any, prepared: list[bool]
) -> LayoutRun:
    from adapterdoc.train import data as D
    from adapterdoc.train import loop

    t0 = time.perf_counter()
    run = LayoutRun(layout, out=work)
    emit = on_event or (lambda e: None)
    try:
        _prepare_folder(work)
        prepared.append(True)
        result = loop.train(
            layout, work, settings, data=D.DEFAULT_DATA if data is None else data, on_event=on_event
        )
    except AdapterdocError as e:
        run.error = str(e)
        code = {"TowerLeakError": "AD601", "EmptyAdapterStateError": "AD602"}.get(type(e).__name__, "AD609")
        if isinstance(e, RefusedError):
            raise
        run.findings.append(make(code, f"{layout}: training refused: {e.reason}", path=work))
        run.seconds = time.perf_counter() - t0
        return run
    except Exception as e:
        from adapterdoc.st.atomic import is_write_refusal, not_writable

        if is_write_refusal(
            e
        ):  # the output folder cannot be written: one exit-3 line, not a finding per layout
            raise not_writable(work, e) from e
        if os.environ.get("ADAPTERDOC_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        run.error = f"{type(e).__name__}: {_one_line(e)}"
        run.findings.append(make("AD609", f"{layout}: training crashed: {run.error}", path=work))
        run.seconds = time.perf_counter() - t0
        return run
    run.train_seconds = result.seconds
    run.objective = result.objective
    run.adapter_dir = result.adapter_dir
    run.train_loss_before, run.train_loss_after = result.train_before.loss, result.train_after.loss
    if result.val_before and result.val_after:
        run.val_loss_before, run.val_loss_after = result.val_before.loss, result.val_after.loss
        run.accuracy_before, run.accuracy_after = result.val_before.accuracy, result.val_after.accuracy
    saved = (
        "qwen3_omni_thinker" if settings.unwrap_thinker and loop.routes_through_thinker(layout) else layout
    )
    ctx = Ctx(layout, result, work, saved)
    ctx.reference = _outputs(result.model, result.val_batch, result.objective)
    for check in CHECKS:
        emit({"event": "check_start", "layout": layout, "check": check.__name__.removeprefix("check_")})
        res = run_check(check, ctx)
        run.checks.append(res)
        emit({"event": "check", "layout": layout, "check": res.name, "ok": res.ok, "detail": res.detail})
        if res.ok is False:
            run.findings.append(make(res.code or "AD609", f"{layout}: {res.name}: {res.detail}", path=work))
    run.seconds = time.perf_counter() - t0
    return run


def run_smoke(
    layouts: list[str] | tuple[str, ...] = SMOKE_LAYOUTS,
    *,
    steps: int | None = None,
    out: str | os.PathLike[str] | None = None,
    settings: Any = None,
    on_event: OnEvent | None = None,
    data: Any = None,
) -> SmokeReport:
    """Run :func:`run_layout` for each layout into ``out/<layout>`` (a temporary folder when ``out`` is None).

    ``data`` (a JSONL file; default the rows bundled with the package) is read and validated once, before any
    training: a missing or malformed file raises one :class:`AdapterdocError`, not one finding per layout."""
    from adapterdoc.train import data as D

    t0 = time.perf_counter()
    data = D.DEFAULT_DATA if data is None else data
    D.load_dataset(data)
    import_seconds = _import_ml()
    from adapterdoc.train.loop import TrainSettings

    s = settings or TrainSettings()
    if steps is not None:
        s.steps = steps
    emit = on_event or (lambda e: None)
    tmp = None
    if out is None:
        tmp = tempfile.mkdtemp(prefix="adapterdoc-smoke-")
        root = tmp
    else:
        from adapterdoc.st.atomic import ensure_folder

        root = ensure_folder(os.fspath(out))
    runs: list[LayoutRun] = []
    from adapterdoc.train.loop import quiet_libraries, torch_threads

    try:
        with torch_threads(s.threads), quiet_libraries():
            for i, layout in enumerate(layouts):
                emit({"event": "layout_start", "layout": layout, "index": i, "total": len(layouts)})
                run = run_layout(layout, os.path.join(root, layout), s, on_event, data=data)
                if tmp:
                    run.out = run.adapter_dir = None
                runs.append(run)
                emit({"event": "layout_done", "layout": layout, "ok": run.ok, "seconds": run.seconds})
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    findings = sort_findings([f for r in runs for f in r.findings])
    return SmokeReport(
        runs, s.steps, None if tmp else root, time.perf_counter() - t0, import_seconds, findings
    )


def _import_ml() -> float:
    """Import the ML stack (timed: on a cold process this is most of a short smoke run)."""
    import importlib.util

    from adapterdoc.errors import MissingExtraError

    for pkg in ("torch", "transformers", "peft", "accelerate", "tokenizers"):
        if importlib.util.find_spec(pkg) is None:
            raise MissingExtraError("train-smoke", pkg)
    t0 = time.perf_counter()
    import accelerate  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    return time.perf_counter() - t0
