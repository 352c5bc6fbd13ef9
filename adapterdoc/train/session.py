"""`adapterdoc train` and `adapterdoc eval` on a user's own base: open the base and its tokenizer, encode the
rows, run the shared loop (:func:`adapterdoc.train.loop.run`), then the doctor on what was written.

A base is a model folder (weights + tokenizer), a cached repo id (offline) or ``tiny:LAYOUT`` (a tokenizer is
trained on the rows and saved with the adapter). The layout comes from the base's config through the registry.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from adapterdoc.errors import AdapterdocError, ConfigError, RefusedError, UnsupportedInputError
from adapterdoc.report.findings import Finding, has_errors, make, sort_findings
from adapterdoc.train import loop
from adapterdoc.train import rows as R

DTYPES = ("auto", "bfloat16", "float16", "float32")
PLOT = "loss_curve.png"
_MARKER = "progress.jsonl"


# --------------------------------------------------------------------------------------------------- the base


@dataclass
class Base:
    """A resolved ``--base``: its layout, how to build it, and its tokenizer."""

    spec: str
    name: str
    """What the adapter config records as ``base_model_name_or_path`` (and verify reads back)."""
    layout: str
    kind: str
    root: str | None
    model_class: Any
    tokenizer: Any


def open_base(spec: str, train_texts: list[str] | None = None, tokenizer_dir: str | None = None) -> Base:
    """Resolve ``spec``; the tokenizer is ``tokenizer_dir``'s when given (an adapter saved with one), else the
    base's own, else (``tiny:``) one trained on ``train_texts``."""
    from adapterdoc.ml import meta as M

    M.require_ml(spec)
    bs = M.resolve_base(spec)
    config = M.load_config(bs)
    cls = M.model_class_for(config, bs)
    if bs.kind == "tiny":
        layout = bs.tiny_layout or ""
        name = spec
    else:
        if not bs.has_weights:
            raise UnsupportedInputError(
                spec, "training needs the base's weights; this folder has only config.json"
            )
        layout = M.base_layout(M.build_meta_model(bs, config)) or ""
        name = spec if bs.kind == "repo" else os.path.abspath(bs.root or spec)
    from adapterdoc.layouts import LAYOUTS

    if layout not in LAYOUTS:
        raise UnsupportedInputError(
            spec, f"{cls.__name__} is not a layout of the registry, so its LoRA targets are unknown"
        )
    tok_root = tokenizer_dir or bs.root
    if tok_root and _has_tokenizer(tok_root):
        tok = _load_tokenizer(tok_root)
    elif bs.kind == "tiny":
        from adapterdoc.train.tokenizer import chat_tokenizer

        tok = chat_tokenizer(train_texts or ["a"])
    else:
        raise UnsupportedInputError(
            spec, "has no tokenizer (tokenizer.json / tokenizer_config.json) to encode rows"
        )
    return Base(spec, name, layout, bs.kind, bs.root, cls, tok)


def _has_tokenizer(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json"))


def _load_tokenizer(folder: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UnsupportedInputError(
            folder, f"transformers cannot load its tokenizer: {_first_line(e)}"
        ) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def torch_dtype(name: str) -> Any:
    import torch

    if name == "auto":
        return "auto"
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def load_model(base: Base, dtype: str = "float32", seed: int = 0) -> Any:
    """The base's weights (a tiny base from its fixed seed), forward routed (the Omni wrapper to its thinker)."""
    if base.kind == "tiny":
        from adapterdoc.ml.tiny import build_tiny

        dt = torch_dtype(dtype)
        model = build_tiny(base.layout, seed, dtype=None if dt == "auto" else dt)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = base.model_class.from_pretrained(
                base.root, dtype=torch_dtype(dtype), local_files_only=True
            )
    if loop.routes_through_thinker(base.layout):
        model.forward = model.thinker.forward
    return model


# --------------------------------------------------------------------------------------------------- the data


@dataclass
class Encoded:
    train: list[Any]
    val: list[Any]
    classes: list[str]
    kind: str


def encode_data(
    objective: str,
    tok: Any,
    data: str,
    *,
    val_data: str | None,
    val_split: float,
    max_length: int | None,
    seed: int,
    classes: list[str] | None = None,
) -> Encoded:
    rows = R.read_rows(data)
    if val_data:
        train_rows, val_rows = rows, R.read_rows(val_data)
    else:
        train_rows, val_rows = R.split_rows(rows, val_split, seed)
    cls = classes if classes is not None else (R.classes_of(train_rows) if objective == loop.POOLED else [])
    kw = dict(max_length=max_length, seed=seed, classes=cls)
    train = R.encode(objective, tok, train_rows, data, **kw)
    val = R.encode(objective, tok, val_rows, val_data or data, **kw) if val_rows else []
    return Encoded(train, val, cls, rows[0].kind)


# --------------------------------------------------------------------------------------------------- train


@dataclass
class TrainReport:
    base: str
    layout: str
    out: str
    adapter: str | None = None
    steps: int = 0
    train_loss: dict[str, float | None] = field(default_factory=dict)
    val_loss: dict[str, float | None] | None = None
    verify: dict[str, Any] = field(default_factory=dict)
    num_processes: int = 1
    seconds: float = 0.0
    tokens_per_s: float | None = None
    findings: list[Finding] = field(default_factory=list)
    is_main: bool = True

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "adapter": self.adapter,
            "steps": self.steps,
            "train_loss": self.train_loss,
            "val_loss": self.val_loss,
            "verify": self.verify,
            "base": self.base,
            "layout": self.layout,
            "out": self.out,
            "num_processes": self.num_processes,
            "tokens_per_s": self.tokens_per_s,
            "seconds": round(self.seconds, 3),
        }


def default_out(base: str) -> str:
    stem = os.path.basename(os.path.normpath(base.replace("tiny:", "tiny-").replace("/", "--"))) or "base"
    return os.path.abspath(f"adapterdoc-train-{stem}")


def prepare_out(out: str, resume: bool) -> None:
    """``out`` must be new, empty, or (with ``--resume``) an earlier run of ours."""
    if os.path.islink(out) or (os.path.exists(out) and not os.path.isdir(out)):
        raise RefusedError(out, "exists and is not a folder; choose another --out")
    if os.path.isdir(out) and os.listdir(out):
        ours = os.path.isfile(os.path.join(out, _MARKER))
        if not ours:
            raise RefusedError(
                out, "is a non-empty folder that adapterdoc train did not write; choose another --out"
            )
        if not resume:
            raise RefusedError(
                out, "holds an earlier run; pass --resume to continue it, or choose another --out"
            )


def train_on_base(
    base_spec: str,
    data: str,
    out: str | None,
    settings: loop.TrainSettings,
    *,
    val_data: str | None = None,
    val_split: float = 0.0,
    on_event: loop.OnEvent | None = None,
) -> TrainReport:
    """Train a LoRA adapter on ``base_spec`` from ``data``; see the module docstring. Nothing is written before
    the base, the tokenizer and every row were found usable."""
    t0 = time.time()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = R.read_rows(data)  # a malformed row fails here, before anything is loaded or written
    if val_data is not None:
        R.read_rows(val_data)
    base = open_base(base_spec, R.texts(rows))
    objective = loop.objective_for(base.layout)
    enc = encode_data(
        objective,
        base.tokenizer,
        data,
        val_data=val_data,
        val_split=val_split,
        max_length=settings.max_length,
        seed=settings.seed,
    )
    if settings.dropout and get_target_parameters(base.layout) and not settings.targets:
        raise ConfigError(
            "--dropout", "PEFT's fused-expert wrapper refuses lora_dropout != 0 for this layout; use 0"
        )
    target = os.path.abspath(out or default_out(base_spec))
    prepare_out(target, settings.resume)  # on every process, before any of them joins the group
    plan = loop.Plan(
        layout=base.layout,
        objective=objective,
        base_name=base.name,
        build_model=lambda: load_model(base, settings.dtype, settings.base_seed),
        train=enc.train,
        val=enc.val,
        classes=enc.classes,
        data=os.path.abspath(data),
        vocab_size=len(base.tokenizer),
        extra={
            "rows": enc.kind,
            "chat_mask": R.chat_mask_method(base.tokenizer) if enc.kind == R.MESSAGES else None,
            "val_data": os.path.abspath(val_data) if val_data else None,
            "val_split": val_split,
        },
    )
    result = loop.run(plan, target, settings, on_event=on_event)
    report = TrainReport(
        base=base.name,
        layout=base.layout,
        out=target,
        adapter=result.adapter_dir,
        steps=result.settings.steps,
        train_loss={"before": result.train_before.loss, "after": result.train_after.loss},
        val_loss=(
            {"before": result.val_before.loss, "after": result.val_after.loss}
            if result.val_before and result.val_after
            else None
        ),
        num_processes=result.num_processes,
        is_main=result.is_main,
    )
    speeds = [h["tokens_per_s"] for h in result.history if h.get("tokens_per_s")]
    report.tokens_per_s = round(sum(speeds) / len(speeds), 1) if speeds else None
    if not result.is_main:
        return report
    _save_tokenizer(base.tokenizer, result.adapter_dir)
    report.verify, findings = doctor(result, base)
    if result.train_after.loss >= result.train_before.loss:
        findings.append(
            make(
                "AD623",
                f"train loss {result.train_before.loss:.4f} -> {result.train_after.loss:.4f}",
                path=result.adapter_dir,
            )
        )
    sections = [verdict_section(report.verify)]
    picture = write_loss_curve(result.history, os.path.join(target, PLOT))
    if picture:
        sections.append(f"## Loss curve\n\n![loss curve]({PLOT})")
    else:
        sections.append("## Loss curve\n\nSkipped: matplotlib is not installed (`pip install matplotlib`).")
        findings.append(make("AD626", "loss curve skipped: matplotlib is not installed", path=target))
    sections.append(weights_heatmap_section(result.adapter_dir, target))
    from adapterdoc.st.atomic import atomic_write_bytes

    atomic_write_bytes(os.path.join(target, "RUN_REPORT.md"), loop.run_report(result, sections).encode())
    report.findings = sort_findings(findings)
    report.seconds = time.time() - t0
    return report


def get_target_parameters(layout: str) -> tuple[str, ...]:
    from adapterdoc.layouts import get_layout

    return get_layout(layout).target_parameters


def _save_tokenizer(tok: Any, folder: str) -> None:
    """The tokenizer beside the adapter (as TRL leaves it), each file written atomically."""
    from adapterdoc.st.atomic import atomic_write_bytes

    tmp = tempfile.mkdtemp(prefix=".adapterdoc-tok-", dir=folder)
    try:
        tok.save_pretrained(tmp)
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as f:
                atomic_write_bytes(os.path.join(folder, name), f.read())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def doctor(result: Any, base: Base) -> tuple[dict[str, Any], list[Finding]]:
    """Verify the written adapter against the same base; lora_B non-zero; no LoRA on a tower."""
    from adapterdoc.adapter import parse_key
    from adapterdoc.layouts import tower_segment
    from adapterdoc.verify import verify

    adapter = result.adapter_dir
    run = verify([adapter], base=base.spec)
    r = run.adapters[0]
    towers = [k for k in result.saved_keys if tower_segment(parse_key(k).module) is not None]
    findings: list[Finding] = []
    verdict = {
        "ok": r.ok and not (r.missing or r.unexpected or r.shape_mismatch),
        "base": base.spec,
        "layout": r.layout,
        "missing": len(r.missing),
        "unexpected": len(r.unexpected),
        "shape_mismatch": len(r.shape_mismatch),
        "lora_b": dict(r.lora_b),
        "tower_lora": len(towers),
        "error": r.error,
        "findings": [f.to_dict() for f in r.findings],
    }
    if not verdict["ok"]:
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
    verdict["ok"] = verdict["ok"] and not findings
    return verdict, findings


def verdict_section(v: dict[str, Any]) -> str:
    mark = "passed" if v["ok"] else "FAILED"
    lines = [
        "## The doctor's verdict",
        "",
        f"- verify against `{v['base']}`: {mark} (layout {v['layout']}; {v['missing']} missing, "
        f"{v['unexpected']} unexpected, {v['shape_mismatch']} mis-shaped)",
        f"- lora_B non-zero: {v['lora_b'].get('nonzero', 0)}/{v['lora_b'].get('total', 0)}",
        f"- towers untouched: {'yes' if not v['tower_lora'] else 'NO, ' + str(v['tower_lora']) + ' tower tensors'}",
    ]
    if v.get("error"):
        lines.append(f"- error: {v['error']}")
    for f in v["findings"]:
        lines.append(f"- {f['code']} ({f['severity']}): {f['message']}")
    return "\n".join(lines)


def write_loss_curve(history: list[dict[str, Any]], path: str) -> bool:
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
        [h["step"] for h in history], [h["loss"] for h in history], marker="." if len(history) < 50 else None
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


# --------------------------------------------------------------------------------------------------- eval


@dataclass
class EvalReport:
    adapter: str
    base_spec: str
    base: dict[str, float] = field(default_factory=dict)
    adapted: dict[str, float] = field(default_factory=dict)
    rows: int = 0
    improvement: float | None = None
    min_improvement: float | None = None
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [f.to_dict() for f in self.findings],
            "base": self.base,
            "adapter": self.adapted,
            "adapter_path": self.adapter,
            "base_model": self.base_spec,
            "rows": self.rows,
            "improvement": self.improvement,
            "min_improvement": self.min_improvement,
        }


def _metrics_dict(m: loop.Metrics) -> dict[str, float]:
    return {"loss": m.loss, "accuracy": m.accuracy, "tokens": m.count}


def eval_on_base(
    adapter: str,
    base_spec: str,
    data: str,
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    seed: int = 0,
    dtype: str = "float32",
    min_improvement: float | None = None,
) -> EvalReport:
    """Loss and token accuracy of the base and of base + adapter on every row of ``data`` (training's label rules)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = R.read_rows(data)
    if not os.path.isdir(adapter) or not os.path.isfile(os.path.join(adapter, "adapter_config.json")):
        raise UnsupportedInputError(
            adapter, "eval needs a PEFT adapter folder (adapter_config.json + weights)"
        )
    tok_dir = adapter if _has_tokenizer(adapter) else None
    base = open_base(base_spec, R.texts(rows), tokenizer_dir=tok_dir)
    objective = loop.objective_for(base.layout)
    head_dir = os.path.join(os.path.dirname(os.path.abspath(adapter)), "head")
    classes = None
    head = None
    if objective == loop.POOLED:
        if not os.path.isfile(os.path.join(head_dir, loop.HEAD_CONFIG)):
            raise UnsupportedInputError(adapter, "a pooled-head adapter needs its head/ folder beside it")
        head = loop.load_head(head_dir)
        import json

        with open(os.path.join(head_dir, loop.HEAD_CONFIG), encoding="utf-8") as f:
            classes = list(json.load(f)["classes"])
    enc = encode_data(
        objective,
        base.tokenizer,
        data,
        val_data=None,
        val_split=0.0,
        max_length=max_length,
        seed=seed,
        classes=classes,
    )
    report = EvalReport(adapter, base_spec, rows=len(rows), min_improvement=min_improvement)
    with loop.torch_threads(1), loop.quiet_libraries():
        acc = loop.accelerator_for(loop.TrainSettings(cpu=True))
        model = load_model(base, dtype).eval()
        loss_fn = loop.LOSSES[objective]

        def score(m: Any) -> loop.Metrics:
            module = m
            if objective == loop.POOLED:
                module = loop.pooled_module_class()(m, head.in_features, len(classes or []))
                module.head.load_state_dict(head.state_dict())
            out_head = None if objective == loop.POOLED else loop.output_head(m)
            return loop.evaluate(
                acc, module, enc.train, lambda a, b, h: loss_fn(a, b, h), out_head, batch_size
            )

        report.base = _metrics_dict(score(model))
        from adapterdoc.train.lora import load_peft

        peft_model, missing = load_peft(model, adapter)
        if missing:
            report.findings.append(make("AD624", missing[0][:300], path=adapter))
        report.adapted = _metrics_dict(score(peft_model))
    report.improvement = report.base["loss"] - report.adapted["loss"]
    if min_improvement is not None and not report.improvement >= min_improvement:
        report.findings.append(
            make(
                "AD625",
                f"loss {report.base['loss']:.4f} -> {report.adapted['loss']:.4f}: improvement "
                f"{report.improvement:.4f} < --min-improvement {min_improvement}",
                path=adapter,
            )
        )
    report.findings = sort_findings(report.findings)
    return report


def check_dtype(name: str) -> str:
    if name not in DTYPES:
        raise AdapterdocError("--dtype", f"must be one of {', '.join(DTYPES)}")
    return name
