"""`adapterdoc train-smoke`'s runs: per layout, train the tiny base into its own folder (the training core,
:func:`adapterdoc.train.loop.train`), then run every doctor check (:mod:`adapterdoc.smoke.checks`) on the output."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

from adapterdoc.errors import AdapterdocError, RefusedError, raise_if_interrupted
from adapterdoc.layouts import forward_layout, smoke_layouts, tiny_layouts
from adapterdoc.report.findings import Finding, make, sort_findings
from adapterdoc.report.smoke_report import CheckResult, LayoutRun, SmokeReport
from adapterdoc.smoke.checks import CHECKS, one_line, run_check
from adapterdoc.smoke.compare import Ctx, outputs

if TYPE_CHECKING:
    from adapterdoc.train.data import DataSource
    from adapterdoc.train.settings import TrainSettings

SMOKE_LAYOUTS = smoke_layouts()
"""``--layout all``: every VL/wrapper layout and both encoders of the registry."""

_MARKER = "progress.jsonl"

OnEvent = Callable[[dict[str, object]], None]


def resolve_layouts(spec: str) -> list[str]:
    """``all``, one layout name, or a comma-separated list; raises ``KeyError`` for names without a tiny model."""
    tiny = tiny_layouts()
    if spec == "all":
        return list(SMOKE_LAYOUTS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in tiny]
    if bad or not names:
        raise KeyError(
            f"no tiny reference model for {', '.join(bad) or repr(spec)}; choose all or one of: "
            + ", ".join(tiny)
        )
    return names


def _prepare_folder(path: str) -> None:
    """Make ``path`` an empty folder; replace it only if an earlier train-smoke made it (its progress.jsonl)."""
    from adapterdoc.st.atomic import is_our_output, prepare_output_folder

    prepare_output_folder(
        path, ours=lambda p: is_our_output(p) or os.path.isfile(os.path.join(p, _MARKER)), mark=_MARKER
    )


def run_layout(
    layout: str,
    work: str,
    settings: TrainSettings | None,
    on_event: OnEvent | None = None,
    *,
    data: DataSource | None = None,
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
    layout: str,
    work: str,
    settings: TrainSettings | None,
    on_event: OnEvent | None,
    *,
    data: DataSource | None,
    prepared: list[bool],
) -> LayoutRun:
    from adapterdoc.train import data as D
    from adapterdoc.train import loop

    t0 = time.perf_counter()
    emit = on_event or (lambda e: None)
    try:
        _prepare_folder(work)
        prepared.append(True)
        result = loop.train(
            layout, work, settings, data=D.DEFAULT_DATA if data is None else data, on_event=on_event
        )
    except AdapterdocError as e:
        code = {"TowerLeakError": "AD601", "EmptyAdapterStateError": "AD602"}.get(type(e).__name__, "AD609")
        if isinstance(e, RefusedError):
            raise
        found = make(code, f"{layout}: training refused: {e.reason}", path=work)
        return _failed(layout, work, str(e), found, t0)
    except Exception as e:
        from adapterdoc.st.atomic import is_write_refusal, not_writable

        if isinstance(e, OSError) and is_write_refusal(
            e
        ):  # the output folder cannot be written: one exit-3 line, not a finding per layout
            raise not_writable(work, e) from e
        if os.environ.get("ADAPTERDOC_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        error = f"{type(e).__name__}: {one_line(e)}"
        return _failed(
            layout, work, error, make("AD609", f"{layout}: training crashed: {error}", path=work), t0
        )
    saved = forward_layout(layout) if result.settings.unwrap_forward else layout
    ctx = Ctx(layout, result, work, saved)
    ctx.reference = outputs(ctx.model, ctx.batch, result.objective)
    checks: list[CheckResult] = []
    findings: list[Finding] = []
    for check in CHECKS:
        emit({"event": "check_start", "layout": layout, "check": check.__name__.removeprefix("check_")})
        res = run_check(check, ctx)
        checks.append(res)
        emit({"event": "check", "layout": layout, "check": res.name, "ok": res.ok, "detail": res.detail})
        if res.ok is False:
            findings.append(make(res.code or "AD609", f"{layout}: {res.name}: {res.detail}", path=work))
    val = (result.val_before, result.val_after) if result.val_before and result.val_after else None
    return LayoutRun(
        layout,
        objective=result.objective,
        train_loss_before=result.train_before.loss,
        train_loss_after=result.train_after.loss,
        val_loss_before=val[0].loss if val else None,
        val_loss_after=val[1].loss if val else None,
        accuracy_before=val[0].accuracy if val else None,
        accuracy_after=val[1].accuracy if val else None,
        checks=tuple(checks),
        seconds=time.perf_counter() - t0,
        train_seconds=result.seconds,
        out=work,
        adapter_dir=result.adapter_dir,
        findings=tuple(findings),
    )


def _failed(layout: str, work: str, error: str, finding: Finding, t0: float) -> LayoutRun:
    """The run of a layout whose training did not finish: its error and the one finding that says so."""
    return LayoutRun(layout, out=work, error=error, findings=(finding,), seconds=time.perf_counter() - t0)


def run_smoke(
    layouts: list[str] | tuple[str, ...] = SMOKE_LAYOUTS,
    *,
    steps: int | None = None,
    out: str | os.PathLike[str] | None = None,
    settings: TrainSettings | None = None,
    on_event: OnEvent | None = None,
    data: DataSource | None = None,
) -> SmokeReport:
    """Run :func:`run_layout` for each layout into ``out/<layout>`` (a temporary folder when ``out`` is None).

    ``data`` (a JSONL file; default the rows bundled with the package) is read and validated once, before any
    training: a missing or malformed file raises one :class:`AdapterdocError`, not one finding per layout."""
    from adapterdoc.train import data as D

    t0 = time.perf_counter()
    data = D.DEFAULT_DATA if data is None else data
    D.load_dataset(data)
    tmp = None
    if out is None:
        tmp = tempfile.mkdtemp(prefix="adapterdoc-smoke-")
        root = tmp
    else:  # a refused --out is said before the seconds of importing torch, transformers and peft
        from adapterdoc.st.atomic import ensure_folder

        root = ensure_folder(os.fspath(out))
    try:
        import_seconds = _import_ml()
    except BaseException:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    from adapterdoc.train.settings import TrainSettings

    s = settings or TrainSettings()
    if steps is not None:
        s = dataclasses.replace(s, steps=steps)
    emit = on_event or (lambda e: None)
    runs: list[LayoutRun] = []
    from adapterdoc.train.runtime import quiet_libraries, torch_threads

    try:
        with torch_threads(s.threads), quiet_libraries():
            for i, layout in enumerate(layouts):
                raise_if_interrupted()  # a Ctrl-C swallowed in a finaliser during the last layout's checks
                emit({"event": "layout_start", "layout": layout, "index": i, "total": len(layouts)})
                run = run_layout(layout, os.path.join(root, layout), s, on_event, data=data)
                if tmp:  # the folder is gone with the temporary root: say so rather than name it
                    run = dataclasses.replace(run, out=None, adapter_dir=None)
                runs.append(run)
                emit({"event": "layout_done", "layout": layout, "ok": run.ok, "seconds": run.seconds})
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    findings = sort_findings([f for r in runs for f in r.findings])
    return SmokeReport(
        runs=tuple(runs),
        steps=s.steps,
        out=None if tmp else root,
        seconds=time.perf_counter() - t0,
        import_seconds=import_seconds,
        findings=findings,
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
