"""The training loop (accelerate): inject LoRA into a plan's base, evaluate, train with AdamW (gradient accumulation
and clipping, sharded data), evaluate again and save; one named step each.

``python -m adapterdoc.train.loop`` (under ``accelerate launch`` for several processes) runs the entry of
:mod:`adapterdoc.train.launch`, kept under this name for the launch commands already written down.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from adapterdoc.errors import AdapterdocError, raise_if_interrupted
from adapterdoc.train import checkpoints as C
from adapterdoc.train import data as D
from adapterdoc.train import lora as L
from adapterdoc.train import sharding as SH
from adapterdoc.train.models import (
    build_base,
    encoder_width,
    output_head,
    plan_lora_config,
    pooled_classifier,
)
from adapterdoc.train.objectives import (
    LOSSES,
    POOLED,
    Metrics,
    encode_rows,
    evaluate,
    objective_for,
    to_device,
)
from adapterdoc.train.outputs import save_outputs, write_records
from adapterdoc.train.records import RunLog, TrainResult
from adapterdoc.train.runtime import accelerator_for, quiet_libraries, torch_threads
from adapterdoc.train.settings import OnEvent, Plan, TrainSettings, lr_at, steps_for

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator
    from torch import nn


def train(
    layout: str,
    out_dir: str | os.PathLike[str],
    settings: TrainSettings | None = None,
    *,
    data: D.DataSource = D.DEFAULT_DATA,
    on_event: OnEvent | None = None,
) -> TrainResult:
    """The reference run of ``layout``: its tiny base, the bundled rows, the smoke tokenizer; see :func:`run`."""
    s = settings or TrainSettings()
    return run(tiny_plan(layout, data, s), out_dir, s, on_event=on_event)


def tiny_plan(layout: str, data: D.DataSource, s: TrainSettings) -> Plan:
    """The plan of a reference run: the tiny base of ``layout`` and the smoke rows' own encodings."""
    objective = objective_for(layout)
    ds = D.load_dataset(data)
    tok = D.build_tokenizer(ds.train + ds.val)
    assert isinstance(
        data, (str, os.PathLike)
    )  # a file: the bundled rows are a pathlib.Path (D.DEFAULT_DATA)
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


# ---------------------------------------------------------------------------------------------- one run, in steps


@dataclass
class _Run:
    """One run in progress: what :func:`_start` set up, and what the later steps fill in."""

    plan: Plan
    s: TrainSettings
    out: str
    acc: Accelerator
    log: RunLog
    ckpt: str | None
    resumed: C.CheckpointState | None
    my_train_eval: list[D.Example]
    my_val: list[D.Example]
    t0: float
    sharding: str | None = None
    """``accelerate`` or ``fully_shard`` under FSDP (:mod:`adapterdoc.train.sharding`), else ``None``."""
    peft_model: Any = None
    model: Any = None
    head: Any = None
    n_lora: int = 0
    start: int = 0
    history: list[dict[str, object]] = field(default_factory=list)
    train_before: Metrics | None = None
    val_before: Metrics | None = None

    @property
    def main(self) -> bool:
        main: bool = self.acc.is_main_process
        return main

    @property
    def rank(self) -> int:
        rank: int = self.acc.process_index
        return rank

    @property
    def world(self) -> int:
        world: int = self.acc.num_processes
        return world

    def evaluate(self, mod: nn.Module, examples: list[D.Example]) -> Metrics | None:
        if not examples:
            return None
        loss_fn = LOSSES[self.plan.objective]
        return evaluate(
            self.acc,
            mod,
            examples,
            lambda m, b, h: loss_fn(m, b, h, tail_only=self.s.tail_only),
            self.head,
            self.s.eval_batch_size,
        )


def _run(
    plan: Plan,
    out_dir: str | os.PathLike[str],
    s: TrainSettings,
    on_event: OnEvent | None,
) -> TrainResult:
    import torch

    r = _start(plan, out_dir, s, on_event)
    _build(r)
    if r.sharding == SH.OWN:  # CPU processes: accelerate would run plain data parallel, so shard here
        r.model = SH.shard(r.model, r.acc)
    params = [p for p in r.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=r.s.lr, weight_decay=r.s.weight_decay)
    if r.sharding != SH.OWN:
        r.model, optimizer = r.acc.prepare(r.model, optimizer)
    _baseline(r, optimizer)  # after prepare: under FSDP the model is whole only once it is sharded
    _fit(r, optimizer)
    return _finish(r)


def _start(plan: Plan, out_dir: str | os.PathLike[str], s: TrainSettings, on_event: OnEvent | None) -> _Run:
    """The accelerator, the step count, the checkpoint to resume from, the log, this process's rows; ``setup``."""
    t0 = time.time()
    out = os.path.abspath(os.fspath(out_dir))
    acc = accelerator_for(s)
    sharding = SH.mode(acc)
    if sharding and plan.objective == POOLED:
        raise AdapterdocError(
            "FSDP", "the pooled-head objective is trained data-parallel only; launch without FSDP"
        )
    main = acc.is_main_process
    rank, world = acc.process_index, acc.num_processes
    s = replace(s, steps=steps_for(s, len(plan.train), world))
    if s.fresh:
        if main:
            C.clear_run(out)
        acc.wait_for_everyone()
    ckpt = C.last_checkpoint(out) if s.resume else None
    if s.resume and ckpt is None:
        raise AdapterdocError(out, "--resume: no complete checkpoint in this folder (checkpoints/step-N/)")
    resumed = C.read_checkpoint_state(ckpt) if ckpt else None
    log = RunLog(
        os.path.join(out, "progress.jsonl") if main else None,
        on_event if main else None,
        plan.layout,
        append=resumed is not None,
    )
    my_val = D.shard(plan.val, rank, world)
    my_train_eval = D.shard(plan.train, rank, world)
    log(
        "setup",
        objective=plan.objective,
        base=plan.base_name,
        num_processes=world,
        sharding=sharding,
        train_rows=len(plan.train),
        val_rows=len(plan.val),
        rows_per_process=len(my_train_eval),
        tokenizer_vocab=plan.vocab_size,
        steps=s.steps,
        resumed_from=ckpt,
        settings=asdict(s),
    )
    return _Run(plan, s, out, acc, log, ckpt, resumed, my_train_eval, my_val, t0, sharding)


def _build(r: _Run) -> None:
    """The base (seeded), LoRA injected, the pooled head around it where the objective has one; ``model_ready``."""
    import torch

    s, plan = r.s, r.plan
    torch.manual_seed(s.seed)
    base = plan.build_model()
    if s.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[no-untyped-call]  # unannotated in transformers
        if hasattr(base.config, "use_cache"):
            base.config.use_cache = False
    lora_cfg = plan_lora_config(plan, s)
    try:
        peft_model = L.inject(base, plan.layout, seed=s.seed, config=lora_cfg)
    except ValueError as e:  # PEFT: no module matched the targets
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise AdapterdocError(
            "--targets" if s.targets else plan.base_name, f"PEFT refused: {first}"
        ) from None
    r.n_lora = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    if plan.objective == POOLED:
        model = pooled_classifier(peft_model, encoder_width(peft_model), len(plan.classes), s.seed)
    else:
        model = peft_model
    if r.sharding is None:  # accelerate's FSDP moves each shard to its device itself
        model.to(r.acc.device)
    r.peft_model, r.model = peft_model, model
    r.head = None if plan.objective == POOLED else output_head(peft_model)
    r.log("model_ready", trainable_parameters=r.n_lora, model_class=type(base).__name__)


def _baseline(r: _Run, optimizer: torch.optim.Optimizer) -> None:
    """Where training starts: a checkpoint's step, history and first evaluation, or a fresh evaluation."""
    if r.resumed is not None:
        assert r.ckpt is not None
        r.start, r.history = int(r.resumed["step"]), list(r.resumed["history"])
        r.train_before = Metrics(**r.resumed["train_before"])
        val_before = r.resumed.get("val_before")
        r.val_before = Metrics(**val_before) if val_before else None
        C.load_checkpoint(r.ckpt, r.acc.unwrap_model(r.model), optimizer, sharded=r.sharding is not None)
        r.log("resume", step=r.start, checkpoint=r.ckpt)
    else:
        unwrapped = r.acc.unwrap_model(r.model)
        r.train_before = r.evaluate(unwrapped, r.my_train_eval)
        r.val_before = r.evaluate(unwrapped, r.my_val)
        assert r.train_before is not None
        val = asdict(r.val_before) if r.val_before else None
        r.log("eval", when="before", train=asdict(r.train_before), val=val)


def _fit(r: _Run, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer steps from ``r.start`` to ``s.steps``: one ``step`` event each, a checkpoint every
    ``save_steps``; Ctrl-C logs ``interrupted`` and re-raises."""
    s = r.s
    r.model.train()
    stream = _cycle(r.plan.train, random.Random(s.seed))
    for _ in range(r.start * s.grad_accum * r.world * s.batch_size):  # the same order as an uninterrupted run
        next(stream)
    step = r.start
    try:
        for step in range(r.start + 1, s.steps + 1):
            row = _optimizer_step(r, optimizer, stream, step)
            r.history.append(row)
            r.log("step", **row, total=s.steps)
            if s.save_steps and step % s.save_steps == 0:
                _save_checkpoint(r, optimizer, step)
            raise_if_interrupted()  # a Ctrl-C that Python swallowed inside a finaliser during the step
    except KeyboardInterrupt:
        r.log("interrupted", step=step, last_checkpoint=C.last_checkpoint(r.out) if r.main else None)
        raise
    except Exception as e:
        # a full disk, a failed collective: say where the run stopped, if the log still can
        with contextlib.suppress(Exception):
            r.log("failed", step=step, error=f"{type(e).__name__}: {e}"[:300])
        raise


def _optimizer_step(
    r: _Run, optimizer: torch.optim.Optimizer, stream: Iterator[D.Example], step: int
) -> dict[str, object]:
    """One optimizer step of ``grad_accum`` micro-steps; its history row (loss, grad norm, lr, tokens, speed)."""
    import torch

    s, acc, model, world = r.s, r.acc, r.model, r.world
    loss_fn = LOSSES[r.plan.objective]
    t_step = time.time()
    lr = lr_at(s, step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    step_loss, grad_norm, tokens = 0.0, None, 0
    for _ in range(s.grad_accum):
        with acc.accumulate(model):
            drawn = [next(stream) for _ in range(world * s.batch_size)]
            mine = drawn[r.rank * s.batch_size : (r.rank + 1) * s.batch_size]
            batch = to_device(D.collate([_unit_weight(e) for e in mine]), acc.device)
            tally = loss_fn(model, batch, r.head, tail_only=s.tail_only)
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
                grad_norm = float(SH.full(acc.clip_grad_norm_(model.parameters(), s.max_grad_norm)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step_loss += float(stats[0] / stats[1].clamp(min=1e-12)) / s.grad_accum
            tokens += int(stats[2])
    dt = max(time.time() - t_step, 1e-9)
    return {
        "step": step,
        "loss": step_loss,
        "grad_norm": grad_norm,
        "lr": lr,
        "tokens": tokens,
        "tokens_per_s": round(tokens / dt, 2),
        "step_s": round(dt, 4),
    }


def _save_checkpoint(r: _Run, optimizer: torch.optim.Optimizer, step: int) -> None:
    assert r.train_before is not None
    state: C.CheckpointState = {
        "step": step,
        "history": r.history,
        "train_before": asdict(r.train_before),
        "val_before": asdict(r.val_before) if r.val_before else None,
        "settings": asdict(r.s),
        "base": r.plan.base_name,
    }
    path = C.save_checkpoint(r.acc, r.model, optimizer, r.out, state, sharded=r.sharding is not None)
    if r.main:
        r.log("checkpoint", step=step, path=path)


def _finish(r: _Run) -> TrainResult:
    """Evaluate again, save the adapter (and head), write the metadata and RUN_REPORT.md; ``complete``."""
    import torch

    s, plan, acc, objective = r.s, r.plan, r.acc, r.plan.objective
    unwrapped = acc.unwrap_model(r.model)
    train_after = r.evaluate(unwrapped, r.my_train_eval)
    val_after = r.evaluate(unwrapped, r.my_val)
    assert train_after is not None and r.train_before is not None
    r.log("eval", when="after", train=asdict(train_after), val=asdict(val_after) if val_after else None)

    checksum = _lora_checksum(unwrapped)
    sums = acc.gather(torch.tensor([checksum], dtype=torch.float64, device=acc.device)).cpu().tolist()
    # sharded: every process gathers the trainable tensors (not the frozen base) in the same order
    full_state = SH.full_trainable_state(unwrapped) if r.sharding else acc.get_state_dict(r.model)
    adapter_dir = os.path.join(r.out, "adapter")
    head_dir = os.path.join(r.out, "head") if objective == POOLED else None
    saved: dict[str, torch.Tensor] = {}
    if r.main:
        saved = save_outputs(plan, s, r.log, unwrapped, full_state, adapter_dir, head_dir)
        r.log("save_done", adapter_tensors=len(saved), replica_checksums=sums)
    acc.wait_for_everyone()
    result = TrainResult(
        layout=plan.layout,
        objective=objective,
        settings=s,
        num_processes=r.world,
        train_before=r.train_before,
        train_after=train_after,
        val_before=r.val_before,
        val_after=val_after,
        history=r.history,
        out_dir=r.out,
        adapter_dir=adapter_dir,
        head_dir=head_dir,
        seconds=time.time() - r.t0,
        saved_keys=sorted(saved),
        model=unwrapped.eval(),
        val_batch=D.collate(plan.val[: s.eval_batch_size] or plan.train[: s.eval_batch_size]),
        base_name=plan.base_name,
        is_main=r.main,
    )
    if r.main:
        write_records(
            plan,
            r.out,
            r.log,
            result,
            lora=r.peft_model.peft_config["default"].to_dict(),
            trainable=r.n_lora,
            sums=sums,
            resumed_from=r.ckpt,
        )
    return result


# ---------------------------------------------------------------------------------------------- helpers


def _cycle(examples: list[D.Example], rng: random.Random) -> Iterator[D.Example]:
    while True:
        order = list(examples)
        rng.shuffle(order)
        yield from order


def _unit_weight(e: D.Example) -> D.Example:
    return e if e.weight == 1.0 else D.Example(e.row_id, e.input_ids, e.labels, e.target, 1.0)


def _lora_checksum(model: nn.Module) -> float:
    """A number every replica must agree on after synchronised training."""
    total = 0.0
    for _name, p in sorted(model.named_parameters(), key=lambda t: t[0]):
        if p.requires_grad:
            t = SH.full(p.detach()).double()
            total += float(t.abs().sum()) + 1e-3 * float(t.sum())
    return total


if (
    __name__ == "__main__"
):  # the entry lives in launch; run it as the script (this file is not the loop module then)
    import runpy

    runpy.run_module("adapterdoc.train.launch", run_name="__main__", alter_sys=True)
