"""The ``merge`` entry point: open both inputs, refuse an ``--out`` that overlaps them, plan, and write."""

from __future__ import annotations

import os
import time
from dataclasses import replace

from adapterdoc.checkpoint import Checkpoint, open_checkpoint
from adapterdoc.errors import MissingExtraError, RefusedError, UnsupportedInputError
from adapterdoc.merge.delta import NotFinite
from adapterdoc.merge.edits import Plan
from adapterdoc.merge.header_plan import Unvouched, header_plan
from adapterdoc.merge.output import COMPUTE_THREADS, Progress, return_freed_memory, write
from adapterdoc.merge.plan import make_plan
from adapterdoc.merge.quantized import (
    decoded_dtype,
    decoded_finding,
    decoded_view,
    read_quantization,
    refused_plan,
    stored_plan,
    undecodable_finding,
)
from adapterdoc.merge.survival import Survival, survival, survival_findings, with_encoded_shapes
from adapterdoc.quant.text import scheme_text
from adapterdoc.report.findings import has_errors, make
from adapterdoc.report.merge_report import MergeReport
from adapterdoc.st.atomic import check_output_folder
from adapterdoc.st.dtypes import CAST_DTYPES
from adapterdoc.st.paths import inside


def merge(
    adapter: str | os.PathLike[str],
    base: str | os.PathLike[str],
    out: str | os.PathLike[str] | None,
    *,
    dtype: str = "auto",
    force: bool = False,
    progress: Progress | None = None,
    dry_run: bool = False,
    requantize: bool = False,
) -> MergeReport:
    """Merge ``adapter`` into the checkpoint folder ``base`` and write the result to the folder ``out``.

    A quantized base is decoded exactly and written as ``dtype`` (bf16 by default), or with ``requantize`` in its
    own format, refused where the update would not survive. ``dry_run`` plans (and, on a quantized base, measures
    what survives requantization) and writes nothing; ``out`` may then be None.

    Raises :class:`~adapterdoc.errors.AdapterdocError` for unusable inputs or a refused ``out``; returns a report
    whose ``findings`` hold any error that stopped the merge (then nothing is written and ``out`` is ``None``).
    """
    started = time.perf_counter()
    if dtype != "auto" and dtype not in CAST_DTYPES:
        raise UnsupportedInputError(
            None, f"--dtype must be auto or one of {', '.join(CAST_DTYPES)}, got {dtype!r}"
        )
    if out is None and not dry_run:
        raise UnsupportedInputError(None, "--out is needed unless --dry-run")
    aspec, bspec = (os.path.expanduser(os.fspath(p)) for p in (adapter, base))
    _require_torch(aspec)
    adapter_ckpt = _open_adapter(aspec)
    base_ckpt = _open_base(bspec)
    out_path = None
    if out is not None and not dry_run:
        out_path = _check_out(os.path.expanduser(os.fspath(out)), base_ckpt, adapter_ckpt, force=force)
    plan = choose_plan(adapter_ckpt, base_ckpt, dtype, requantize=requantize)
    findings = list(plan.findings)
    rows: list[Survival] = []
    written: tuple[int, int, int] | None = None
    try:
        if plan.quantization is not None and (dry_run or requantize) and not has_errors(findings):
            rows = measure_survival(plan)
            findings.extend(survival_findings(rows, requantize=requantize))
            plan = with_encoded_shapes(plan, rows)
        if out_path is not None and not has_errors(findings):
            written = write(plan, out_path, dtype, force=force, progress=progress)
    except NotFinite as e:
        findings.append(
            make(
                "AD506", f"merging gives non-finite values in `{e.tensor}`; nothing was written", key=e.tensor
            )
        )
    tensors, merged_tensors, bytes_written = written or (0, 0, 0)
    return MergeReport(
        adapter=aspec,
        base=bspec,
        out=out_path if written is not None else None,
        dtype=dtype,
        applied=plan.applied,
        unused=plan.unused,
        findings=findings,
        model_class=plan.model_class,
        tensors=tensors,
        merged_tensors=merged_tensors,
        bytes_written=bytes_written,
        seconds=time.perf_counter() - started,
        plan=plan.planner,
        plan_fallback=plan.fallback,
        quantization=scheme_text(plan.quantization) if plan.quantization is not None else None,
        requantize=requantize,
        dry_run=dry_run,
        survival=[r.to_dict() for r in rows],
    )


def _require_torch(what: str) -> None:
    """Merging computes with torch (the plan may not): without it, one exit-3 line naming the extra."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise MissingExtraError(what, "torch") from e


def measure_survival(plan: Plan) -> list[Survival]:
    """:func:`~adapterdoc.merge.survival.survival` of ``plan`` with the adapter tensors it needs."""
    from adapterdoc.merge.delta import AdapterTensors
    from adapterdoc.train.runtime import torch_threads

    return_freed_memory()
    with torch_threads(COMPUTE_THREADS):
        return survival(plan, AdapterTensors(plan.adapter, experts=plan.experts))


def choose_plan(adapter: Checkpoint, base: Checkpoint, dtype: str, *, requantize: bool = False) -> Plan:
    """The header plan where it can vouch for the merge (no transformers, no peft), else the meta-model plan; on a
    quantized base, either made on its decoded view (:mod:`adapterdoc.merge.quantized`), or a refusal (AD520)."""
    q, config = read_quantization(base)
    if not q.quantized:
        if requantize:
            raise UnsupportedInputError(
                base.spec, "--requantize needs a quantized base; this one is not quantized"
            )
        return _plan(adapter, base, dtype, None)
    refusal = undecodable_finding(base, q)
    if refusal is not None:
        return refused_plan(adapter, base, refusal)
    view = decoded_view(base, q, config, dtype)
    plan = stored_plan(_plan(adapter, view.checkpoint, dtype, view.config), base, view, q, requantize)
    info = decoded_finding(base, q, decoded_dtype(config, dtype), requantize)
    return replace(plan, findings=[*plan.findings, info])


def _plan(adapter: Checkpoint, base: Checkpoint, dtype: str, config: dict[str, object] | None) -> Plan:
    try:
        return header_plan(adapter, base, dtype, config=config)
    except Unvouched as e:
        return replace(make_plan(adapter, base, dtype), fallback=str(e))


def _open_adapter(spec: str) -> Checkpoint:
    ckpt = open_checkpoint(spec)
    if ckpt.adapter_config is None:
        raise UnsupportedInputError(
            spec, "is not a PEFT adapter folder (adapter_config.json is needed to merge)"
        )
    return _as_peft_reads_it(ckpt)


def _as_peft_reads_it(ckpt: Checkpoint) -> Checkpoint:
    """Rename keys the way PEFT's loader reads them (wrapper added, ``default`` adapter name removed), so an
    adapter PEFT loads is one merge can merge. ``original_names`` maps back for reading a ``.bin``."""
    from adapterdoc.adapter import peft_load_name

    renamed = {peft_load_name(k): k for k in ckpt.tensors}
    if len(renamed) != len(ckpt.tensors):
        raise UnsupportedInputError(
            ckpt.spec, "two tensors name the same LoRA weight once normalised as PEFT reads them"
        )
    if all(new == old for new, old in renamed.items()):
        return ckpt
    ckpt.tensors = {new: ckpt.tensors[old] for new, old in renamed.items()}
    ckpt.tensor_file = {new: ckpt.tensor_file[old] for new, old in renamed.items()}
    ckpt.original_names = renamed
    return ckpt


def _open_base(spec: str) -> Checkpoint:
    if spec.startswith("tiny:"):
        raise UnsupportedInputError(
            spec,
            "merge needs the base's real weights, and tiny:LAYOUT is a config only; pass the model folder "
            "(config.json and its safetensors shards, e.g. one written by save_pretrained)",
        )
    ckpt = open_checkpoint(spec)
    if ckpt.adapter_config is not None or ckpt.kind == "adapter":
        raise UnsupportedInputError(spec, "is an adapter, not a base model folder")
    if not os.path.isdir(ckpt.root):
        raise UnsupportedInputError(
            spec, "--base must be the model folder (config.json and its safetensors shards)"
        )
    if ckpt.weights_format != "safetensors" or not ckpt.headers:
        raise UnsupportedInputError(spec, "merge reads safetensors checkpoints only")
    return ckpt


def _check_out(out: str, base: Checkpoint, adapter: Checkpoint, *, force: bool) -> str:
    """Refuse an --out that overlaps an input or that merge may not replace (see :mod:`adapterdoc.st.atomic`)."""
    if not os.path.islink(os.path.abspath(out)):
        for label, ckpt in (("base", base), ("adapter", adapter)):
            root = ckpt.root if os.path.isdir(ckpt.root) else os.path.dirname(ckpt.root)
            if inside(out, root) or inside(root, out):
                raise RefusedError(
                    out, f"overlaps the {label} folder {ckpt.root}; the merge never writes there"
                )
    return check_output_folder(out, force=force)
