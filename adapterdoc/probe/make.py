"""Make canaries with PEFT on the local model: the prompts and positions where the adapter and the base differ most,
and their logprobs at every scale of :func:`~adapterdoc.probe.canaries.scale_grid` (torch, imported lazily)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adapterdoc.errors import InputNotFoundError, UnsupportedInputError
from adapterdoc.probe.canaries import Canaries, Canary, Position, scale_grid

BUILT_IN_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Question: What is the capital of France? Answer:",
    "def add(a, b):\n    return",
    "Once upon a time, in a small village by the sea,",
    "Translate to German: Good morning, how are you?",
    "The three primary colours are",
)
"""Prompts used when no ``--prompts`` file is given."""
MAX_PROMPTS = 4
"""Canaries kept (one request each when probing)."""
MAX_POSITIONS = 16
"""Teacher-forced positions kept per canary."""
TOP_NEXT = 8
"""Candidate next tokens per scale (their union is stored)."""
MAX_TOKENS = 64
"""Prompt length cap, in tokens."""


def read_prompts(path: str) -> list[str]:
    """The prompts of a JSONL file: each row's ``prompt``, ``text``, or its messages' contents joined."""
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(path, "no prompts file here")
    out: list[str] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise UnsupportedInputError(path, f"line {n} is not JSON: {e}") from e
        text = row.get("prompt") or row.get("text") if isinstance(row, dict) else None
        if not text and isinstance(row, dict) and isinstance(row.get("messages"), list):
            text = "\n".join(str(m.get("content", "")) for m in row["messages"])
        if not isinstance(text, str) or not text:
            raise UnsupportedInputError(path, f"line {n} has no prompt, text or messages")
        out.append(text)
    if not out:
        raise UnsupportedInputError(path, "the prompts file has no rows")
    return out


def make_canaries(adapter: str, base: str, prompts: Sequence[str] | None = None) -> Canaries:
    """Canaries of the PEFT adapter folder ``adapter`` on the model folder ``base`` (weights and tokenizer)."""
    import torch

    model, tokenizer, rank = _load(adapter, base)
    scales = scale_grid(rank)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    made: list[tuple[float, Canary]] = []
    for text in prompts or BUILT_IN_PROMPTS:
        ids = [int(i) for i in tokenizer(text)["input_ids"]][:MAX_TOKENS]
        if len(ids) < 2:
            continue
        with torch.no_grad():
            rows = [_logprobs(model, ids, s) for s in scales]
        made.append(_canary(text, ids, rows, scales))
    if not made:
        raise UnsupportedInputError(base, "no prompt gives two or more tokens")
    made.sort(key=lambda m: -m[0])
    return Canaries(
        adapter=adapter,
        base=base,
        rank=rank,
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        scales=list(scales),
        canaries=[c for _, c in made[:MAX_PROMPTS]],
        bos=bool(made[0][1].ids and bos_id is not None and made[0][1].ids[0] == bos_id),
    )


def _load(adapter: str, base: str) -> tuple[Any, Any, int]:
    """PEFT's model of ``adapter`` on ``base``, the base's tokenizer, and the adapter's rank."""
    from adapterdoc.ml.quiet import no_warnings, quiet_transformers

    config = Path(adapter) / "adapter_config.json"
    if not config.is_file():
        raise UnsupportedInputError(
            adapter, "canaries need a PEFT adapter folder (convert others: adapterdoc convert --to peft)"
        )
    rank = int(json.loads(config.read_text(encoding="utf-8")).get("r", 8))
    quiet_transformers()
    with no_warnings():
        import transformers
        from peft import PeftModel

        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(base)
            model = transformers.AutoModelForCausalLM.from_pretrained(base)
        except OSError as e:
            raise UnsupportedInputError(base, f"cannot load the base model and its tokenizer: {e}") from e
        peft_model = PeftModel.from_pretrained(model, adapter).eval()
    return peft_model, tokenizer, rank


def _logprobs(model: Any, ids: list[int], scale: float) -> Any:
    """Log-softmax of the logits on ``ids`` with every LoRA layer's scaling multiplied by ``scale``."""
    import torch
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    kept = [dict(m.scaling) for m in layers]
    try:
        for m, original in zip(layers, kept, strict=True):
            for name, value in original.items():
                m.scaling[name] = value * scale
        logits = model(torch.tensor([ids])).logits[0].float()
    finally:
        for m, original in zip(layers, kept, strict=True):
            m.scaling.update(original)
    return torch.log_softmax(logits, dim=-1)


def _canary(text: str, ids: list[int], rows: list[Any], scales: Sequence[float]) -> tuple[float, Canary]:
    """The canary of one prompt (its most-moved positions and next-token candidates) and how much it moves."""
    unit, zero = list(scales).index(1.0), list(scales).index(0.0)
    moved = [
        (abs(float(rows[unit][p - 1, ids[p]] - rows[zero][p - 1, ids[p]])), p) for p in range(1, len(ids))
    ]
    moved.sort(key=lambda m: -m[0])
    positions = [
        Position(p, ids[p], [float(r[p - 1, ids[p]]) for r in rows])
        for _, p in sorted(moved[:MAX_POSITIONS], key=lambda m: m[1])
    ]
    candidates: set[int] = set()
    for r in rows:
        candidates.update(int(t) for t in r[-1].topk(TOP_NEXT).indices)
    nxt = {t: [float(r[-1, t]) for r in rows] for t in sorted(candidates)}
    next_move = max(abs(v[unit] - v[zero]) for v in nxt.values())
    return max(moved[0][0], next_move), Canary(text, ids, positions, nxt)


def write_canaries(
    adapter: str, base: str, out: str, prompts_file: str | None = None, *, force: bool = False
) -> Any:
    """Make the canaries and write them to ``out`` (an existing file is refused unless ``force``): a
    :class:`~adapterdoc.report.probe_report.CanariesReport`."""
    import os

    from adapterdoc.errors import RefusedError
    from adapterdoc.probe.canaries import save
    from adapterdoc.report.probe_report import CanariesReport

    if os.path.lexists(out) and not force:
        raise RefusedError(out, "exists; choose another --out or pass --force")
    canaries = make_canaries(adapter, base, read_prompts(prompts_file) if prompts_file else None)
    save(canaries, out)
    unit, zero = canaries.unit(), canaries.zero()
    values = [p.logprobs for c in canaries.canaries for p in c.positions]
    values += [v for c in canaries.canaries for v in c.next.values()]
    return CanariesReport(
        out=out,
        adapter=adapter,
        base=base,
        prompts=len(canaries.canaries),
        positions=sum(len(c.positions) for c in canaries.canaries),
        candidates=sum(len(c.next) for c in canaries.canaries),
        scales=list(canaries.scales),
        largest_move=max(abs(v[unit] - v[zero]) for v in values),
    )
