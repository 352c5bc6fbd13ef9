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
    epochs: float | None = None
    """When set, ``steps`` is derived: epochs x optimizer steps per pass over the training rows."""
    warmup: int = 0
    """Linear warmup over this many optimizer steps, then the constant ``lr``."""
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None
    """LoRA ``target_modules`` instead of the layout's language-model leaves (towers stay excluded)."""
    max_length: int | None = None
    dtype: str = "float32"
    """The base's dtype: ``auto`` (the checkpoint's), ``bfloat16``, ``float16`` or ``float32``."""
    gradient_checkpointing: bool = False
    save_steps: int = 0
    """A checkpoint every this many steps (0: none) in ``OUT/checkpoints/step-N/``."""
    resume: bool = False
    """Continue from the last complete checkpoint in ``OUT``."""
    cpu: bool = True
    """Train on the CPU even where an accelerator is present (the tiny reference runs)."""


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
    base_name: str = ""
    is_main: bool = True

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("model", "val_batch", "is_main")}
        return d


@dataclass
class Plan:
    """What one run trains: built by train-smoke for a tiny base, and by ``adapterdoc train`` for a user's base."""

    layout: str
    objective: str
    base_name: str
    """``base_model_name_or_path`` in the saved adapter config (and the base the doctor verifies against)."""
    build_model: Callable[[], Any]
    """Returns the base model, forward routed (the Omni wrapper to its thinker), gradients off."""
    train: list[D.Example]
    val: list[D.Example]
    classes: list[str] = field(default_factory=list)
    data: str | None = None
    vocab_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    """More for training_metadata.json (the chat-mask method, the tokenizer, ...)."""


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


def pooled_module_class() -> Any:
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
        return pooled_module_class()(encoder, in_features, classes)
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
def supervised_projection(head: Any, select: Any) -> Iterator[dict[str, bool]]:
    """While active, ``head`` sees only the hidden states at ``select`` (a bool ``[batch, seq]`` mask), gathered
    into one ``[1, N, hidden]`` row: only the supervised positions become vocabulary logits.

    The yielded dict's ``hit`` tells whether the head was called on a ``[batch, seq, hidden]`` input (otherwise
    the model projected differently and the caller selects from its full logits).
    """
    state = {"hit": False}

    def gather(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        h = args[0]
        if state["hit"] or h.dim() != 3 or tuple(h.shape[:2]) != tuple(select.shape):
            return None
        state["hit"] = True
        return (h[select].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield state
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


def _token_tally(picked: Any, target: Any, w: Any) -> Tally:
    """Weighted CE and accuracy of ``[N, vocab]`` logits against ``[N]`` targets."""
    import torch
    import torch.nn.functional as F

    picked = picked.float()
    ce = F.cross_entropy(picked, target, reduction="none") if target.numel() else picked.sum(-1)
    correct = (picked.argmax(-1) == target).float() if target.numel() else torch.zeros(0)
    return Tally((ce * w).sum(), (correct * w).sum().detach(), w.sum().detach())


def _selected_loss(
    model: Any, batch: dict[str, Any], head: Any, select: Any, target: Any, tail_only: bool
) -> Tally:
    """Run the model; project ``select`` positions (only those, with ``tail_only``) and score them."""
    w = batch["weights"][:, None].expand_as(select)[select]
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if tail_only:
        with supervised_projection(head, select) as state:
            logits = model(input_ids=ids, attention_mask=mask).logits
        picked = logits[0] if state["hit"] else logits[select]
    else:
        picked = model(input_ids=ids, attention_mask=mask).logits[select]
    return _token_tally(picked, target, w)


def answer_token_loss(model: Any, batch: dict[str, Any], head: Any, *, tail_only: bool = True) -> Tally:
    """Next-token cross-entropy over the supervised (answer) tokens only.

    With ``tail_only`` the hidden states are computed for the whole sequence, the positions that predict a
    supervised token are selected, and only those go through the output head: the prompt never becomes
    vocabulary logits, and the loss is the full projection's.
    """
    import torch

    labels = batch["labels"]
    nxt = labels[:, 1:]
    supervised = nxt != D.IGNORE
    select = torch.zeros_like(labels, dtype=torch.bool)
    select[:, :-1] = supervised
    return _selected_loss(model, batch, head, select, nxt[supervised], tail_only)


def masked_token_loss(model: Any, batch: dict[str, Any], head: Any, *, tail_only: bool = True) -> Tally:
    """Cross-entropy on the masked answer tokens; the decoder projects only the masked positions."""
    labels = batch["labels"]
    select = labels != D.IGNORE
    return _selected_loss(model, batch, head, select, labels[select], tail_only)


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

    def __init__(
        self, path: str | None, on_event: OnEvent | None, layout: str, *, append: bool = False
    ) -> None:
        self.path, self.on_event, self.layout, self.t0 = path, on_event, layout, time.time()
        if path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a" if append else "w", encoding="utf-8"):
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


def run_report(result: TrainResult, sections: list[str] | None = None) -> str:
    """RUN_REPORT.md: the run's settings and losses, then ``sections`` (the doctor's verdict, pictures)."""

    def m(x: Metrics | None) -> str:
        return "n/a" if x is None else f"{x.loss:.4f} (accuracy {x.accuracy:.3f}, n={x.count:g})"

    s = result.settings
    lines = [
        f"# Training run: {result.base_name or result.layout}",
        "",
        f"- Objective: {result.objective}"
        + (
            " (output head projects only the supervised tail: the selected answer positions)"
            if s.tail_only and result.objective != POOLED
            else ""
        ),
        f"- Base: {result.base_name} (layout {result.layout}"
        + (f", seed {s.base_seed}" if result.base_name.startswith("tiny:") else "")
        + f"); LoRA r={s.r}, alpha={s.alpha or 2 * s.r}, dropout {s.dropout}, seed {s.seed}",
        f"- Steps: {s.steps} x batch {s.batch_size} x accumulation {s.grad_accum} x {result.num_processes} "
        f"process(es); AdamW lr {s.lr}, clip {s.max_grad_norm}",
        f"- Train loss: {m(result.train_before)} -> {m(result.train_after)}",
        f"- Validation loss: {m(result.val_before)} -> {m(result.val_after)}",
        f"- Adapter: `{result.adapter_dir}` ({len(result.saved_keys)} tensors)",
    ]
    if result.head_dir:
        lines.append(f"- Pooled head: `{result.head_dir}`")
    lines += ["", "Only LoRA (and the pooled head) were trained; the base weights stayed frozen.", ""]
    for section in sections or []:
        lines += [section.rstrip("\n"), ""]
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


def accelerator_for(settings: TrainSettings) -> Any:
    """The run's accelerator; the tiny reference runs pin the CPU (gloo between processes) so that they never
    depend on a GPU being present. FSDP/DeepSpeed come from ``accelerate launch``'s own config."""
    import torch
    from accelerate import Accelerator

    # without an accelerator, cpu=False under torchrun gives N independent single-process runs: pin the CPU
    cpu = settings.cpu or not (torch.cuda.is_available() or torch.backends.mps.is_available())
    acc = Accelerator(cpu=cpu, gradient_accumulation_steps=settings.grad_accum)
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if acc.num_processes != launched:
        raise AdapterdocError(
            "accelerate",
            f"the launcher started {launched} processes but they joined a group of {acc.num_processes}",
        )
    return acc


def evaluate(
    accelerator: Any, model: Any, examples: list[D.Example], loss_fn: Any, head: Any, size: int
) -> Metrics:
    """Token-weighted loss and accuracy over ``examples`` on this process, summed over all processes."""
    import torch

    was_training = model.training
    model.eval()
    total = torch.zeros(3, dtype=torch.float64)
    device = accelerator.device
    with torch.no_grad():
        for batch in batches(examples, size):
            t = loss_fn(model, _to(batch, device), head)
            total += torch.stack([t.loss_sum.double(), t.correct.double(), t.count.double()]).cpu()
    total = accelerator.reduce(total.to(device), reduction="sum").cpu()
    model.train(was_training)
    n = float(total[2])
    return Metrics(float(total[0] / n) if n else math.nan, float(total[1] / n) if n else math.nan, n)


def _to(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    return {k: v.to(device) for k, v in batch.items()}


def train(
    layout: str,
    out_dir: str | os.PathLike[str],
    settings: TrainSettings | None = None,
    *,
    data: str | os.PathLike[str] = D.DEFAULT_DATA,
    on_event: OnEvent | None = None,
) -> TrainResult:
    """The reference run of ``layout``: its tiny base, the bundled rows, the smoke tokenizer; see :func:`run`."""
    s = settings or TrainSettings()
    return run(tiny_plan(layout, data, s), out_dir, s, on_event=on_event)


def tiny_plan(layout: str, data: str | os.PathLike[str], s: TrainSettings) -> Plan:
    """The plan of a reference run: the tiny base of ``layout`` and the smoke rows' own encodings."""
    objective = objective_for(layout)
    ds = D.load_dataset(data)
    tok = D.build_tokenizer(ds.train + ds.val)
    return Plan(
        layout=layout,
        objective=objective,
        base_name=f"tiny:{layout}",
        build_model=lambda: build_base(layout, s.base_seed),
        train=encode_rows(objective, tok, ds.train, ds.classes, s.seed),
        val=encode_rows(objective, tok, ds.val, ds.classes, s.seed),
        classes=ds.classes,
        data=os.path.abspath(os.fspath(data)),
        vocab_size=tok.get_vocab_size(),
    )


def run(
    plan: Plan,
    out_dir: str | os.PathLike[str],
    settings: TrainSettings | None = None,
    *,
    on_event: OnEvent | None = None,
) -> TrainResult:
    """Inject LoRA into the plan's base, train, evaluate before and after, and save the adapter.

    Writes ``adapter/``, ``head/`` (pooled objective), ``progress.jsonl``, ``training_metadata.json``,
    ``RUN_REPORT.md`` and, every ``save_steps``, ``checkpoints/step-N/`` into ``out_dir`` (main process only).
    """
    s = settings or TrainSettings()
    with torch_threads(s.threads), quiet_libraries():
        return _run(plan, out_dir, s, on_event)


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


def steps_for(s: TrainSettings, rows: int, world: int) -> int:
    """``s.steps``, or with ``s.epochs`` the optimizer steps that pass over ``rows`` that many times."""
    if s.epochs is None:
        return s.steps
    per_step = s.batch_size * s.grad_accum * world
    return max(1, math.ceil(s.epochs * rows / per_step))


def lr_at(s: TrainSettings, step: int) -> float:
    """Linear warmup over ``s.warmup`` steps, then constant."""
    if s.warmup and step <= s.warmup:
        return s.lr * step / (s.warmup + 1)
    return s.lr


def plan_lora_config(plan: Plan, s: TrainSettings) -> Any:
    """The registry's LoRA config for the plan's layout, with the run's rank, alpha, dropout and targets."""
    lay = get_layout(plan.layout)
    extra: dict[str, Any] = {}
    if s.targets:
        params = [t for t in s.targets if t in lay.target_parameters]
        extra["target_modules"] = [t for t in s.targets if t not in params] or None
        extra["target_parameters"] = params or None
        if not extra["target_modules"] and not params:
            raise AdapterdocError("--targets", "no target given")
    return L.lora_config(lay, r=s.r, alpha=s.alpha, dropout=s.dropout, **extra)


def _run(
    plan: Plan,
    out_dir: str | os.PathLike[str],
    s: TrainSettings,
    on_event: OnEvent | None,
) -> TrainResult:
    import dataclasses

    import torch

    t0 = time.time()
    out = os.path.abspath(os.fspath(out_dir))
    acc = accelerator_for(s)
    main = acc.is_main_process
    rank, world = acc.process_index, acc.num_processes
    s = dataclasses.replace(s, steps=steps_for(s, len(plan.train), world))
    ckpt = last_checkpoint(out) if s.resume else None
    if s.resume and ckpt is None:
        raise AdapterdocError(out, "--resume: no complete checkpoint in this folder (checkpoints/step-N/)")
    resumed = _read_checkpoint_state(ckpt) if ckpt else None
    log = RunLog(
        os.path.join(out, "progress.jsonl") if main else None,
        on_event if main else None,
        plan.layout,
        append=resumed is not None,
    )
    layout, objective = plan.layout, plan.objective
    my_val = D.shard(plan.val, rank, world)
    my_train_eval = D.shard(plan.train, rank, world)
    log(
        "setup",
        objective=objective,
        base=plan.base_name,
        num_processes=world,
        train_rows=len(plan.train),
        val_rows=len(plan.val),
        rows_per_process=len(my_train_eval),
        tokenizer_vocab=plan.vocab_size,
        steps=s.steps,
        resumed_from=ckpt,
        settings=asdict(s),
    )

    torch.manual_seed(s.seed)
    base = plan.build_model()
    if s.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(base.config, "use_cache"):
            base.config.use_cache = False
    lora_cfg = plan_lora_config(plan, s)
    try:
        peft_model = L.inject(base, layout, seed=s.seed, config=lora_cfg)
    except ValueError as e:  # PEFT: no module matched the targets
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AdapterdocError(
            "--targets" if s.targets else plan.base_name, f"PEFT refused: {first}"
        ) from None
    n_lora = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    if objective == POOLED:
        model = pooled_classifier(peft_model, encoder_width(peft_model), len(plan.classes), s.seed)
    else:
        model = peft_model
    model.to(acc.device)
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

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.lr, weight_decay=s.weight_decay)
    history: list[dict[str, Any]] = []
    start = 0
    if resumed is not None:
        assert ckpt is not None
        start, history = int(resumed["step"]), list(resumed["history"])
        train_before = Metrics(**resumed["train_before"])
        val_before = Metrics(**resumed["val_before"]) if resumed.get("val_before") else None
        _load_checkpoint(ckpt, model, optimizer)
        log("resume", step=start, checkpoint=ckpt)
    else:
        train_before = _eval(model, my_train_eval)
        val_before = _eval(model, my_val)
        assert train_before is not None
        log("eval", when="before", train=asdict(train_before), val=asdict(val_before) if val_before else None)

    model, optimizer = acc.prepare(model, optimizer)
    model.train()
    stream = _cycle(plan.train, random.Random(s.seed))
    for _ in range(start * s.grad_accum * world * s.batch_size):  # the same order as an uninterrupted run
        next(stream)
    step = start
    try:
        for step in range(start + 1, s.steps + 1):
            t_step = time.time()
            lr = lr_at(s, step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            step_loss, grad_norm, tokens = 0.0, None, 0
            for _ in range(s.grad_accum):
                with acc.accumulate(model):
                    drawn = [next(stream) for _ in range(world * s.batch_size)]
                    mine = drawn[rank * s.batch_size : (rank + 1) * s.batch_size]
                    batch = _to(D.collate([_unit_weight(e) for e in mine]), acc.device)
                    tally = loss_fn(model, batch, head, tail_only=s.tail_only)
                    stats = torch.stack(
                        [
                            tally.loss_sum.detach().double(),
                            tally.count.double(),
                            batch["attention_mask"].sum().double(),
                        ]
                    )
                    if world > 1:
                        stats = acc.reduce(stats, reduction="sum")
                    # normalised by the global token count: N processes give one process's gradient
                    loss = tally.loss_sum * (world / stats[1].clamp(min=1e-12)).to(tally.loss_sum.dtype)
                    acc.backward(loss)
                    if acc.sync_gradients:
                        grad_norm = float(acc.clip_grad_norm_(model.parameters(), s.max_grad_norm))
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    step_loss += float(stats[0] / stats[1].clamp(min=1e-12)) / s.grad_accum
                    tokens += int(stats[2])
            dt = max(time.time() - t_step, 1e-9)
            row = {
                "step": step,
                "loss": step_loss,
                "grad_norm": grad_norm,
                "lr": lr,
                "tokens": tokens,
                "tokens_per_s": round(tokens / dt, 2),
                "step_s": round(dt, 4),
            }
            history.append(row)
            log("step", **row, total=s.steps)
            if s.save_steps and step % s.save_steps == 0:
                state = {
                    "step": step,
                    "history": history,
                    "train_before": asdict(train_before),
                    "val_before": asdict(val_before) if val_before else None,
                    "settings": asdict(s),
                    "base": plan.base_name,
                }
                path = save_checkpoint(acc, model, optimizer, out, state)
                if main:
                    log("checkpoint", step=step, path=path)
    except KeyboardInterrupt:
        log("interrupted", step=step, last_checkpoint=last_checkpoint(out) if main else None)
        raise

    unwrapped = acc.unwrap_model(model)
    train_after = _eval(unwrapped, my_train_eval)
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
            target, state, adapter_dir, base_name=plan.base_name, unwrap_thinker=s.unwrap_thinker
        )
        if head_dir:
            save_head(
                unwrapped.head,
                head_dir,
                {
                    "in_features": unwrapped.head.in_features,
                    "classes": plan.classes,
                    "pooling": "mean over attention_mask",
                    "input": "last_hidden_state",
                    "base": plan.base_name,
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
        val_batch=D.collate(plan.val[: s.eval_batch_size] or plan.train[: s.eval_batch_size]),
        base_name=plan.base_name,
        is_main=main,
    )
    if main:
        meta = result.to_dict()
        meta.update(
            data=plan.data,
            classes=plan.classes if objective == POOLED else None,
            lora=peft_model.peft_config["default"].to_dict(),
            trainable_parameters=n_lora,
            replica_checksums=sums,
            loss="answer-token cross-entropy" if objective == CAUSAL else objective,
            resumed_from=ckpt,
            **plan.extra,
        )
        write_json(os.path.join(out, "training_metadata.json"), meta)
        from adapterdoc.audit import report_section
        from adapterdoc.st.atomic import atomic_write_bytes

        text = run_report(result, [report_section(adapter_dir, out)])
        atomic_write_bytes(os.path.join(out, "RUN_REPORT.md"), text.encode())
        log("complete", seconds=round(result.seconds, 3))
    return result


# ---------------------------------------------------------------------------------------------- checkpoints

CHECKPOINTS = "checkpoints"
_STATE = "trainer_state.json"


def last_checkpoint(out: str) -> str | None:
    """The newest complete ``OUT/checkpoints/step-N/`` (its ``trainer_state.json`` is written last)."""
    root = os.path.join(out, CHECKPOINTS)
    try:
        names = os.listdir(root)
    except OSError:
        return None
    done = [
        (int(n[5:]), os.path.join(root, n))
        for n in names
        if n.startswith("step-") and n[5:].isdigit() and os.path.isfile(os.path.join(root, n, _STATE))
    ]
    return max(done)[1] if done else None


def save_checkpoint(acc: Any, model: Any, optimizer: Any, out: str, state: dict[str, Any]) -> str:
    """The trainable tensors, the optimizer and the trainer state, each file atomic, the state last (main only)."""
    import io

    import torch
    from safetensors.torch import save as st_save

    from adapterdoc.st.atomic import atomic_write_bytes

    folder = os.path.join(out, CHECKPOINTS, f"step-{state['step']:06d}")
    unwrapped = acc.unwrap_model(model)
    tensors = {
        n: p.detach().to("cpu", copy=True).contiguous()
        for n, p in unwrapped.named_parameters()
        if p.requires_grad
    }
    opt_state = optimizer.state_dict()
    if acc.is_main_process:
        os.makedirs(folder, exist_ok=True)
        atomic_write_bytes(os.path.join(folder, "trainable.safetensors"), st_save(tensors))
        buf = io.BytesIO()
        torch.save({"optimizer": opt_state, "torch_rng": torch.get_rng_state()}, buf)
        atomic_write_bytes(os.path.join(folder, "optimizer.pt"), buf.getvalue())
        write_json(os.path.join(folder, _STATE), state)
    acc.wait_for_everyone()
    return folder


def _read_checkpoint_state(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, _STATE), encoding="utf-8") as f:
        return json.load(f)


def _load_checkpoint(folder: str, model: Any, optimizer: Any) -> None:
    import torch
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(folder, "trainable.safetensors"))
    own = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(own) != set(tensors):
        raise AdapterdocError(
            folder, "the checkpoint's trainable tensors do not match this run's LoRA settings"
        )
    with torch.no_grad():
        for n, p in own.items():
            p.copy_(tensors[n])
    blob = torch.load(os.path.join(folder, "optimizer.pt"), weights_only=True)
    optimizer.load_state_dict(blob["optimizer"])
    torch.set_rng_state(blob["torch_rng"])


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
