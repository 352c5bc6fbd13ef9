"""The training loop (accelerate): answer-token cross-entropy with a tail-only output projection, AdamW, gradient
accumulation and clipping, sharded data and gathered evaluation, and the run's records.

One process (``train(...)`` from Python or the CLI) or several: ``accelerate launch --multi_gpu --num_processes 2
--num_machines 1 --mixed_precision no -m adapterdoc.train.loop --layout NAME --out DIR --processes 2`` runs two CPU
processes (torchrun; the loop pins the CPU and gloo itself, no GPU is needed). ``accelerate launch --cpu
--num_processes 2`` is NOT that: accelerate 1.x's ``--cpu`` takes its simple launcher, which starts one process
unless ``--mpirun_hostfile`` is given (``--processes 2`` makes the loop refuse such a launch instead of training
alone; tests/test_train_loop.py pins both). Only the main process writes files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from adapterdoc.errors import AdapterdocError
from adapterdoc.layouts import get_layout
from adapterdoc.train import data as D
from adapterdoc.train import lora as L

Event = dict[str, Any]
OnEvent = Callable[[Event], None]

CAUSAL, MASKED, POOLED = "answer-token", "masked-token", "pooled-class"
"""Objectives: next-token CE on the answer (decoders), CE on masked answer tokens (masked-LM encoders),
CE of a small head on mean-pooled hidden states (embedding models)."""

HEAD_WEIGHTS = "pooled_head.safetensors"
HEAD_CONFIG = "pooled_head_config.json"


@dataclass
class TrainSettings:
    """Knobs of one run. The defaults are the reference smoke settings (seconds on two CPU cores)."""

    steps: int = 24
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 5e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    seed: int = 0
    """Seeds LoRA initialisation, the head and the sample order (identical on every process)."""
    base_seed: int = 0
    """The tiny base's seed: ``verify --base tiny:LAYOUT`` rebuilds the same weights from it."""
    r: int = L.DEFAULT_RANK
    alpha: float | None = None
    """``None``: 2 r."""
    tail_only: bool = True
    """Project only the supervised tail through the output head (the loss is the same as with the full projection)."""
    eval_batch_size: int = 8
    unwrap_thinker: bool = False
    """Save an Omni wrapper's adapter in thinker naming (``thinker.`` dropped)."""
    threads: int | None = 1
    """torch intra-op threads while training (``None``: leave as is). Tiny models gain nothing from more, and on a
    busy machine two spinning threads per op were 10-20x slower than one."""


@dataclass
class Metrics:
    """A token-weighted evaluation over a split, summed across processes."""

    loss: float
    accuracy: float
    count: float
    """Supervised tokens (or rows, for the pooled head) counted."""


@dataclass
class TrainResult:
    layout: str
    objective: str
    settings: TrainSettings
    num_processes: int
    train_before: Metrics
    train_after: Metrics
    val_before: Metrics | None
    val_after: Metrics | None
    history: list[dict[str, Any]]
    out_dir: str
    adapter_dir: str
    head_dir: str | None
    seconds: float
    saved_keys: list[str] = field(default_factory=list)
    model: Any = None
    """The trained module (main process; not serialised)."""
    val_batch: Any = None
    """A collated batch of validation rows for output comparisons (not serialised)."""

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("model", "val_batch")}
        return d


# ---------------------------------------------------------------------------------------------- models and heads


def objective_for(layout: str) -> str:
    lay = get_layout(layout)
    if not lay.is_encoder:
        return CAUSAL
    return MASKED if lay.model_class.endswith("ForMaskedLM") else POOLED


def routes_through_thinker(layout: str) -> bool:
    """The Omni wrapper has no forward of its own: train and evaluate through ``.thinker``."""
    return get_layout(layout).model_class == "Qwen3OmniMoeForConditionalGeneration"


def build_base(layout: str, seed: int = 0) -> Any:
    """The tiny base of ``layout``; the Omni wrapper's calls are routed to its thinker."""
    from adapterdoc.ml.tiny import build_tiny

    model = build_tiny(layout, seed)
    if routes_through_thinker(layout):
        model.forward = model.thinker.forward
    return model


def _pooled_module_class() -> Any:
    import torch

    class PooledClassifier(torch.nn.Module):
        """An encoder (the PEFT model) and a linear head on its mask-averaged last hidden state."""

        def __init__(self, encoder: Any, in_features: int, classes: int) -> None:
            super().__init__()
            self.encoder = encoder
            self.head = torch.nn.Linear(in_features, classes)

        def pooled(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return mean_pool(hidden, attention_mask)

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.head(self.pooled(input_ids, attention_mask))

    return PooledClassifier


def pooled_classifier(encoder: Any, in_features: int, classes: int, seed: int = 0) -> Any:
    import torch

    state = torch.random.get_rng_state()
    torch.manual_seed(seed + 1)
    try:
        return _pooled_module_class()(encoder, in_features, classes)
    finally:
        torch.random.set_rng_state(state)


def mean_pool(hidden: Any, mask: Any) -> Any:
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


def encoder_width(model: Any) -> int:
    """The width of the encoder's ``last_hidden_state`` (EmbeddingGemma projects after the norm)."""
    import torch

    with torch.no_grad():
        ids = torch.tensor([[D.BOS, D.EOS]])
        return int(model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.shape[-1])


def output_head(model: Any) -> Any:
    """The module that projects hidden states to vocabulary logits (``lm_head``, the MLM ``decoder``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "thinker"):
        base = base.thinker
    head = base.get_output_embeddings()
    if head is None:
        raise AdapterdocError(type(base).__name__, "has no output projection to restrict to the answer tail")
    return head


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch intra-op threads, then restore the previous count."""
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def tail_projection(head: Any, start: int) -> Iterator[None]:
    """While active, ``head`` sees only positions ``start:`` of its input, so only the tail is projected."""
    if start <= 0:
        yield
        return

    def keep_tail(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0][:, start:], *args[1:])

    handle = head.register_forward_pre_hook(keep_tail)
    try:
        yield
    finally:
        handle.remove()


# ---------------------------------------------------------------------------------------------- losses


@dataclass
class Tally:
    """Weighted sums over supervised positions: ``loss_sum`` keeps its graph; ``loss`` is the mean."""

    loss_sum: Any
    correct: Any
    count: Any

    @property
    def loss(self) -> Any:
        return self.loss_sum / self.count.clamp(min=1e-12)


def _first_supervised(labels: Any) -> int:
    active = (labels != D.IGNORE).any(0).nonzero()
    return int(active[0]) if active.numel() else labels.shape[1]


def _token_tally(logits: Any, labels: Any, row_weights: Any) -> Tally:
    import torch
    import torch.nn.functional as F

    active = labels != D.IGNORE
    w = row_weights[:, None].expand_as(labels)[active]
    picked = logits[active].float()
    target = labels[active]
    ce = F.cross_entropy(picked, target, reduction="none") if target.numel() else picked.sum(-1)
    correct = (picked.argmax(-1) == target).float() if target.numel() else torch.zeros(0)
    return Tally((ce * w).sum(), (correct * w).sum().detach(), w.sum().detach())


def answer_token_loss(model: Any, batch: dict[str, Any], head: Any, *, tail_only: bool = True) -> Tally:
    """Next-token cross-entropy over the answer tokens only.

    With ``tail_only`` the output head projects positions from one before the batch's first supervised label:
    the prompt never becomes vocabulary logits, and the loss is the full projection's.
    """
    labels = batch["labels"]
    start = max(_first_supervised(labels) - 1, 0) if tail_only else 0
    with tail_projection(head, start):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    if logits.shape[1] == labels.shape[1]:  # the head was called without our hook (no tail cut)
        logits = logits[:, start:]
    return _token_tally(logits[:, :-1], labels[:, start + 1 :], batch["weights"])


def masked_token_loss(model: Any, batch: dict[str, Any], head: Any, *, tail_only: bool = True) -> Tally:
    """Cross-entropy on the masked answer tokens; the decoder projects only from the first masked position."""
    labels = batch["labels"]
    start = _first_supervised(labels) if tail_only else 0
    with tail_projection(head, start):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    if logits.shape[1] == labels.shape[1]:
        logits = logits[:, start:]
    return _token_tally(logits, labels[:, start:], batch["weights"])


def pooled_loss(model: Any, batch: dict[str, Any], head: Any = None, *, tail_only: bool = True) -> Tally:
    import torch.nn.functional as F

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    w = batch["weights"]
    ce = F.cross_entropy(logits.float(), batch["targets"], reduction="none")
    correct = (logits.argmax(-1) == batch["targets"]).float()
    return Tally((ce * w).sum(), (correct * w).sum().detach(), w.sum().detach())


LOSSES = {CAUSAL: answer_token_loss, MASKED: masked_token_loss, POOLED: pooled_loss}


def encode_rows(
    objective: str, tok: Any, rows: list[D.Row], classes: list[str], seed: int
) -> list[D.Example]:
    if objective == CAUSAL:
        return [D.encode_chat(tok, r) for r in rows]
    if objective == MASKED:
        return [D.encode_masked(tok, r, seed) for r in rows]
    return [D.encode_pooled(tok, r, classes) for r in rows]


def batches(examples: list[D.Example], size: int) -> Iterator[dict[str, Any]]:
    for i in range(0, len(examples), size):
        yield D.collate(examples[i : i + size])


# ---------------------------------------------------------------------------------------------- records


class RunLog:
    """``progress.jsonl`` (main process only) plus an optional callback for live progress."""

    def __init__(self, path: str | None, on_event: OnEvent | None, layout: str) -> None:
        self.path, self.on_event, self.layout, self.t0 = path, on_event, layout, time.time()
        if path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8"):
                pass

    def __call__(self, event: str, **fields: Any) -> None:
        row = {"event": event, "layout": self.layout, **fields, "elapsed_s": round(time.time() - self.t0, 4)}
        row["timestamp"] = time.time()
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        if self.on_event:
            self.on_event(row)


def write_json(path: str, obj: Any) -> None:
    from adapterdoc.st.atomic import atomic_write_bytes

    text = json.dumps(obj, indent=2, ensure_ascii=False, default=L.jsonable)
    atomic_write_bytes(path, (text + "\n").encode())


def run_report(result: TrainResult) -> str:
    def m(x: Metrics | None) -> str:
        return "n/a" if x is None else f"{x.loss:.4f} (accuracy {x.accuracy:.3f}, n={x.count:g})"

    s = result.settings
    lines = [
        f"# Reference run: {result.layout}",
        "",
        f"- Objective: {result.objective}"
        + (
            " (output head projects only the supervised tail)"
            if s.tail_only and result.objective != POOLED
            else ""
        ),
        f"- Base: tiny:{result.layout} (seed {s.base_seed}); LoRA r={s.r}, alpha={s.alpha or 2 * s.r}, seed {s.seed}",
        f"- Steps: {s.steps} x batch {s.batch_size} x accumulation {s.grad_accum} x {result.num_processes} "
        f"process(es); AdamW lr {s.lr}, clip {s.max_grad_norm}",
        f"- Train loss: {m(result.train_before)} -> {m(result.train_after)}",
        f"- Validation loss: {m(result.val_before)} -> {m(result.val_after)}",
        f"- Adapter: `{result.adapter_dir}` ({len(result.saved_keys)} tensors)",
    ]
    if result.head_dir:
        lines.append(f"- Pooled head: `{result.head_dir}`")
    lines += ["", "Only LoRA (and the pooled head) were trained; the base weights stayed frozen.", ""]
    return "\n".join(lines)


def save_head(head: Any, folder: str, config: dict[str, Any]) -> None:
    """The pooled head as safetensors, and its config as JSON, both written atomically."""
    from safetensors.torch import save as st_save

    from adapterdoc.st.atomic import atomic_write_bytes

    os.makedirs(folder, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()}
    atomic_write_bytes(os.path.join(folder, HEAD_WEIGHTS), st_save(tensors, metadata={"format": "pt"}))
    write_json(os.path.join(folder, HEAD_CONFIG), config)


def load_head(folder: str) -> Any:
    import torch
    from safetensors.torch import load_file

    with open(os.path.join(folder, HEAD_CONFIG), encoding="utf-8") as f:
        cfg = json.load(f)
    head = torch.nn.Linear(cfg["in_features"], len(cfg["classes"]))
    head.load_state_dict(load_file(os.path.join(folder, HEAD_WEIGHTS)), strict=True)
    return head.eval()


# ---------------------------------------------------------------------------------------------- the loop


def _accelerator(settings: TrainSettings) -> Any:
    """Always on the CPU (gloo between processes): the reference runs must not depend on a GPU being present."""
    from accelerate import Accelerator

    return Accelerator(cpu=True, gradient_accumulation_steps=settings.grad_accum)


def evaluate(
    accelerator: Any, model: Any, examples: list[D.Example], loss_fn: Any, head: Any, size: int
) -> Metrics:
    """Token-weighted loss and accuracy over ``examples`` on this process, summed over all processes."""
    import torch

    was_training = model.training
    model.eval()
    total = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for batch in batches(examples, size):
            t = loss_fn(model, batch, head)
            total += torch.stack([t.loss_sum.double(), t.correct.double(), t.count.double()])
    total = accelerator.reduce(total.to(accelerator.device), reduction="sum").cpu()
    model.train(was_training)
    n = float(total[2])
    return Metrics(float(total[0] / n) if n else math.nan, float(total[1] / n) if n else math.nan, n)


def train(
    layout: str,
    out_dir: str | os.PathLike[str],
    settings: TrainSettings | None = None,
    *,
    data: str | os.PathLike[str] = D.DEFAULT_DATA,
    on_event: OnEvent | None = None,
) -> TrainResult:
    """Build the tiny base, inject LoRA, train, evaluate before and after, and save the adapter.

    Writes ``adapter/``, ``head/`` (pooled objective), ``progress.jsonl``, ``training_metadata.json`` and
    ``RUN_REPORT.md`` into ``out_dir``.
    """
    s = settings or TrainSettings()
    with torch_threads(s.threads), quiet_libraries():
        return _train(layout, out_dir, s, data, on_event)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Silence the known, harmless library noise of these runs (kernel-fallback notices, deprecations,
    PEFT's "no modules were excluded" on models without towers); real warnings still show."""
    import warnings

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*exclude_modules.*no modules were excluded.*")
            warnings.filterwarnings(
                "ignore", message=".*target_(modules|parameters).*", category=RuntimeWarning
            )
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _train(
    layout: str,
    out_dir: str | os.PathLike[str],
    s: TrainSettings,
    data: str | os.PathLike[str],
    on_event: OnEvent | None,
) -> TrainResult:
    import torch

    t0 = time.time()
    out = os.path.abspath(os.fspath(out_dir))
    acc = _accelerator(s)
    main = acc.is_main_process
    log = RunLog(os.path.join(out, "progress.jsonl") if main else None, on_event if main else None, layout)
    objective = objective_for(layout)
    ds = D.load_dataset(data)
    tok = D.build_tokenizer(ds.train + ds.val)
    train_ex = encode_rows(objective, tok, ds.train, ds.classes, s.seed)
    val_ex = encode_rows(objective, tok, ds.val, ds.classes, s.seed)
    rank, world = acc.process_index, acc.num_processes
    my_train, my_val = D.shard(train_ex, rank, world), D.shard(val_ex, rank, world)
    log(
        "setup",
        objective=objective,
        num_processes=world,
        train_rows=len(train_ex),
        val_rows=len(val_ex),
        rows_per_process=len(my_train),
        tokenizer_vocab=tok.get_vocab_size(),
        settings=asdict(s),
    )

    torch.manual_seed(s.seed)
    base = build_base(layout, s.base_seed)
    peft_model = L.inject(base, layout, seed=s.seed, r=s.r, alpha=s.alpha)
    n_lora = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    if objective == POOLED:
        model = pooled_classifier(peft_model, encoder_width(peft_model), len(ds.classes), s.seed)
    else:
        model = peft_model
    head = None if objective == POOLED else output_head(peft_model)
    loss_fn = LOSSES[objective]
    log("model_ready", trainable_parameters=n_lora, model_class=type(base).__name__)

    def _eval(mod: Any, examples: list[D.Example]) -> Metrics | None:
        if not examples:
            return None
        return evaluate(
            acc,
            mod,
            examples,
            lambda m, b, h: loss_fn(m, b, h, tail_only=s.tail_only),
            head,
            s.eval_batch_size,
        )

    train_before = _eval(model, my_train)
    val_before = _eval(model, my_val)
    assert train_before is not None
    log("eval", when="before", train=asdict(train_before), val=asdict(val_before) if val_before else None)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay)
    model, optimizer = acc.prepare(model, optimizer)
    model.train()
    order = random.Random(s.seed * 1000 + rank)
    stream = _cycle(my_train, order)
    history: list[dict[str, Any]] = []
    for step in range(1, s.steps + 1):
        step_loss, grad_norm = 0.0, None
        for _ in range(s.grad_accum):
            with acc.accumulate(model):
                batch = D.collate([_unit_weight(next(stream)) for _ in range(s.batch_size)])
                tally = loss_fn(model, batch, head, tail_only=s.tail_only)
                loss = tally.loss
                acc.backward(loss)
                if acc.sync_gradients:
                    grad_norm = float(acc.clip_grad_norm_(model.parameters(), s.max_grad_norm))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step_loss += float(loss.detach()) / s.grad_accum
        row = {"step": step, "loss": step_loss, "grad_norm": grad_norm, "lr": s.lr}
        history.append(row)
        log("step", **row)

    unwrapped = acc.unwrap_model(model)
    train_after = _eval(unwrapped, my_train)
    val_after = _eval(unwrapped, my_val)
    assert train_after is not None
    log("eval", when="after", train=asdict(train_after), val=asdict(val_after) if val_after else None)

    checksum = _lora_checksum(unwrapped)
    sums = acc.gather(torch.tensor([checksum], dtype=torch.float64, device=acc.device)).cpu().tolist()
    full_state = acc.get_state_dict(model)
    adapter_dir = os.path.join(out, "adapter")
    head_dir = os.path.join(out, "head") if objective == POOLED else None
    saved: dict[str, Any] = {}
    if main:
        log("save_start", adapter_dir=adapter_dir)
        within = "encoder." if objective == POOLED else ""
        peft_part = {k[len(within) :]: v for k, v in _strip_all(full_state).items() if k.startswith(within)}
        state = L.adapter_state(peft_part, what=adapter_dir)
        target = unwrapped.encoder if objective == POOLED else unwrapped
        saved = L.save_adapter(
            target, state, adapter_dir, base_name=f"tiny:{layout}", unwrap_thinker=s.unwrap_thinker
        )
        if head_dir:
            save_head(
                unwrapped.head,
                head_dir,
                {
                    "in_features": unwrapped.head.in_features,
                    "classes": ds.classes,
                    "pooling": "mean over attention_mask",
                    "input": "last_hidden_state",
                    "base": f"tiny:{layout}",
                },
            )
        log("save_done", adapter_tensors=len(saved), replica_checksums=sums)
    acc.wait_for_everyone()
    result = TrainResult(
        layout=layout,
        objective=objective,
        settings=s,
        num_processes=world,
        train_before=train_before,
        train_after=train_after,
        val_before=val_before,
        val_after=val_after,
        history=history,
        out_dir=out,
        adapter_dir=adapter_dir,
        head_dir=head_dir,
        seconds=time.time() - t0,
        saved_keys=sorted(saved),
        model=unwrapped.eval(),
        val_batch=D.collate(val_ex[: s.eval_batch_size] or train_ex[: s.eval_batch_size]),
    )
    if main:
        meta = result.to_dict()
        meta.update(
            data=os.path.abspath(os.fspath(data)),
            classes=ds.classes if objective == POOLED else None,
            lora=peft_model.peft_config["default"].to_dict(),
            trainable_parameters=n_lora,
            replica_checksums=sums,
            loss="answer-token cross-entropy" if objective == CAUSAL else objective,
        )
        write_json(os.path.join(out, "training_metadata.json"), meta)
        from adapterdoc.st.atomic import atomic_write_bytes

        atomic_write_bytes(os.path.join(out, "RUN_REPORT.md"), run_report(result).encode())
        log("complete", seconds=round(result.seconds, 3))
    return result


def _cycle(examples: list[D.Example], rng: random.Random) -> Iterator[D.Example]:
    while True:
        order = list(examples)
        rng.shuffle(order)
        yield from order


def _unit_weight(e: D.Example) -> D.Example:
    return e if e.weight == 1.0 else D.Example(e.row_id, e.input_ids, e.labels, e.target, 1.0)


def _strip_all(state: dict[str, Any]) -> dict[str, Any]:
    return {L.strip_wrappers(k): v for k, v in state.items()}


def _lora_checksum(model: Any) -> float:
    """A number every replica must agree on after synchronised training."""
    total = 0.0
    for _name, p in sorted(model.named_parameters(), key=lambda t: t[0]):
        if p.requires_grad:
            total += float(p.detach().double().abs().sum()) + 1e-3 * float(p.detach().double().sum())
    return total


def main(argv: list[str] | None = None) -> int:
    """``python -m adapterdoc.train.loop`` (under ``accelerate launch`` for several processes)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m adapterdoc.train.loop", description=__doc__)
    p.add_argument("--layout", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--data", default=str(D.DEFAULT_DATA))
    d = TrainSettings()
    for name in ("steps", "batch_size", "grad_accum", "seed", "r"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name))
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--full-projection", action="store_true", help="project every position (no tail cut)")
    p.add_argument("--unwrap-thinker", action="store_true")
    p.add_argument(
        "--processes",
        type=int,
        default=None,
        help="fail unless the launcher started exactly this many processes",
    )
    a = p.parse_args(argv)
    if a.processes is not None:
        started = _world_size()
        if started != a.processes:
            print(
                f"adapterdoc: error: {a.processes} processes asked, {started} started: `accelerate launch --cpu` "
                "starts one process unless --mpirun_hostfile is given; on CPU use `accelerate launch --multi_gpu "
                "--num_processes N` (torchrun; the loop itself pins the CPU and gloo)",
                file=sys.stderr,
                flush=True,
            )
            return 3
    settings = TrainSettings(
        steps=a.steps,
        batch_size=a.batch_size,
        grad_accum=a.grad_accum,
        seed=a.seed,
        r=a.r,
        lr=a.lr,
        tail_only=not a.full_projection,
        unwrap_thinker=a.unwrap_thinker,
    )
    try:
        result = train(a.layout, a.out, settings, data=a.data)
    except AdapterdocError as e:
        print(f"adapterdoc: error: {e}", file=sys.stderr, flush=True)
        return 3
    if _is_main():
        print(
            json.dumps(
                {
                    "layout": result.layout,
                    "num_processes": result.num_processes,
                    "train_before": result.train_before.loss,
                    "train_after": result.train_after.loss,
                    "out": result.out_dir,
                }
            )
        )
    return 0


def _world_size() -> int:
    from accelerate import PartialState

    return PartialState(cpu=True).num_processes


def _is_main() -> bool:
    from accelerate import PartialState

    return PartialState().is_main_process


if __name__ == "__main__":
    raise SystemExit(main())
