"""Make canaries with PEFT on the local model: the prompts and positions where the adapter and the base differ most,
and their logprobs at every scale of :func:`~adapterdoc.probe.canaries.scale_grid` (torch, imported lazily)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from adapterdoc.errors import InputNotFoundError, UnsupportedInputError
from adapterdoc.probe.canaries import Canaries, Canary, Position, scale_grid
from adapterdoc.probe.fit import anchors, separation_of

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
BATCH = 8
"""Prompts per forward (right-padded): one forward per scale and batch, not per scale and prompt."""


def read_prompts(path: str) -> list[str]:
    """The prompts of a JSONL file: each row's ``prompt``, ``text``, or its messages' contents joined (strings)."""
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(path, "no prompts file here")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UnsupportedInputError(path, f"not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UnsupportedInputError(path, f"cannot read it ({e.strerror or e})") from None
    out: list[str] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:
            why = "nested too deep" if isinstance(e, RecursionError) else e
            raise UnsupportedInputError(path, f"line {n} is not JSON: {why}") from None
        text = _prompt_of(row)
        if not text:
            raise UnsupportedInputError(
                path, f"line {n} has no prompt or text string, nor messages with a string content"
            )
        out.append(text)
    if not out:
        raise UnsupportedInputError(path, "the prompts file has no rows")
    return out


def _prompt_of(row: object) -> str | None:
    """A row's ``prompt`` or ``text`` string, else the string contents of its ``messages`` (objects) joined, one per
    line; None when it has none."""
    if not isinstance(row, dict):
        return None
    for key in ("prompt", "text"):
        if isinstance(row.get(key), str) and row[key]:
            return str(row[key])
    messages = row.get("messages")
    if not isinstance(messages, list):
        return None
    contents = [m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)]
    return "\n".join(contents) or None


def make_canaries(adapter: str, base: str, prompts: Sequence[str] | None = None) -> Canaries:
    """Canaries of the PEFT adapter folder ``adapter`` on the model folder ``base`` (weights and tokenizer)."""
    rank = adapter_rank(adapter)  # a folder that is not a PEFT adapter is refused before the base is loaded
    model, tokenizer = _load(adapter, base)
    return canaries_of(model, tokenizer, rank, adapter=adapter, base=base, prompts=prompts)


def canaries_of(
    model: Any, tokenizer: Any, rank: int, *, adapter: str, base: str, prompts: Sequence[str] | None = None
) -> Canaries:
    """Canaries of a loaded PEFT model (its LoRA layers' scaling is varied over the grid of ``rank``) with the base's
    ``tokenizer``; ``adapter`` and ``base`` are what the file records. ``prompts``: none or empty, the built-in set."""
    import torch

    scales = scale_grid(rank)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    encoded = [
        (text, [int(i) for i in tokenizer(text)["input_ids"]][:MAX_TOKENS])
        for text in prompts or BUILT_IN_PROMPTS
    ]
    encoded = [(text, ids) for text, ids in encoded if len(ids) >= 2]
    if not encoded:
        raise UnsupportedInputError(base, "no prompt gives two or more tokens")
    made: list[tuple[float, Canary]] = []
    for start in range(0, len(encoded), BATCH):
        chunk = encoded[start : start + BATCH]
        with torch.no_grad():
            seen = [_seen(model, [ids for _, ids in chunk], s) for s in scales]
        made += [_canary(text, ids, [by[i] for by in seen], scales) for i, (text, ids) in enumerate(chunk)]
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


def adapter_rank(adapter: str) -> int:
    """The ``r`` of a PEFT adapter folder's config (8 when it has none); a folder without one, a config that is no
    JSON object, or an ``r`` that is no positive integer is exit 3."""
    config = Path(adapter) / "adapter_config.json"
    if not config.is_file():
        raise UnsupportedInputError(
            adapter, "canaries need a PEFT adapter folder (convert others: adapterdoc convert --to peft)"
        )
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, OSError) as e:  # UnicodeDecodeError is a ValueError
        raise UnsupportedInputError(str(config), f"not a readable JSON file ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise UnsupportedInputError(str(config), "not a JSON object")
    rank = raw.get("r", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise UnsupportedInputError(str(config), f"its r is {str(rank)[:40]!r}, not a positive integer")
    return rank


def separation(canaries: Canaries, dtype: str | None = None) -> float:
    """How far the adapter moves the canaries from the base: the largest |scale 1 - scale 0| over every stored
    value, in tolerances of ``dtype`` (default the canaries' own; the probe cannot decide below
    :data:`~adapterdoc.probe.fit.SEPARATION`)."""
    return separation_of(_values(canaries), canaries.scales, dtype or canaries.dtype)


def _values(canaries: Canaries) -> list[Sequence[float]]:
    """Every expected value of the canaries (one entry per scale): positions, then next-token candidates."""
    values = [p.logprobs for c in canaries.canaries for p in c.positions]
    return values + [v for c in canaries.canaries for v in c.next.values()]


def _load(adapter: str, base: str) -> tuple[Any, Any]:
    """PEFT's model of ``adapter`` on ``base`` and the base's tokenizer."""
    from adapterdoc.ml.quiet import no_warnings, quiet_transformers

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
    return peft_model, tokenizer


class _Seen(NamedTuple):
    """What one forward gives for one prompt at one scale."""

    own: list[float]
    """``own[p - 1]``: the logprob of the prompt's token ``p`` given the tokens before it."""
    same: list[float]
    """``same[p]``: the logprob of the prompt's token ``p`` in the distribution after it (row ``p``)."""
    last: Any
    """The log-softmax after the whole prompt (a tensor over the vocabulary)."""


def _seen(model: Any, batch: list[list[int]], scale: float) -> list[_Seen]:
    """One forward of the prompts (right-padded and masked, so each prompt's positions are its own) with every LoRA
    layer's scaling multiplied by ``scale``."""
    import torch

    width = max(len(ids) for ids in batch)
    device = next(model.parameters()).device
    tokens = torch.tensor([ids + [ids[-1]] * (width - len(ids)) for ids in batch], device=device)
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch], device=device)
    with _scaled(model, scale):
        logits = model(input_ids=tokens, attention_mask=mask).logits
    out: list[_Seen] = []
    for i, ids in enumerate(batch):
        rows = torch.log_softmax(logits[i, : len(ids)].float(), dim=-1).cpu()
        own = rows[:-1].gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
        same = rows.gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1)
        out.append(_Seen([float(x) for x in own.tolist()], [float(x) for x in same.tolist()], rows[-1]))
    return out


@contextlib.contextmanager
def _scaled(model: Any, scale: float) -> Iterator[None]:
    """Every LoRA layer's scaling multiplied by ``scale`` inside the block, restored after it."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    kept = [dict(m.scaling) for m in layers]
    try:
        for m, original in zip(layers, kept, strict=True):
            for name, value in original.items():
                m.scaling[name] = value * scale
        yield
    finally:
        for m, original in zip(layers, kept, strict=True):
            m.scaling.update(original)


def _canary(text: str, ids: list[int], seen: list[_Seen], scales: Sequence[float]) -> tuple[float, Canary]:
    """The canary of one prompt (its most-moved positions and next-token candidates) and how much it moves;
    ``seen`` has one entry per scale."""
    unit, zero = anchors(scales)
    moved = [(abs(seen[unit].own[p - 1] - seen[zero].own[p - 1]), p) for p in range(1, len(ids))]
    moved.sort(key=lambda m: -m[0])
    positions = [
        Position(p, ids[p], [s.own[p - 1] for s in seen], [s.same[p] for s in seen])
        for _, p in sorted(moved[:MAX_POSITIONS], key=lambda m: m[1])
    ]
    candidates: set[int] = set()
    for s in seen:
        candidates.update(int(t) for t in s.last.topk(TOP_NEXT).indices)
    nxt = {t: [float(s.last[t]) for s in seen] for t in sorted(candidates)}
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
    unit, zero = anchors(canaries.scales)
    return CanariesReport(
        out=out,
        adapter=adapter,
        base=base,
        prompts=len(canaries.canaries),
        positions=sum(len(c.positions) for c in canaries.canaries),
        candidates=sum(len(c.next) for c in canaries.canaries),
        scales=list(canaries.scales),
        largest_move=max(abs(v[unit] - v[zero]) for v in _values(canaries)),
    )
