"""A user's training rows (TRL's conventions) and their encoding with the base's own tokenizer.

Each JSONL line is one object of one of three shapes:

- ``{"messages": [{"role": ..., "content": ...}, ...]}``: a chat, rendered with the tokenizer's chat template; the
  loss is on the assistant turns only. With ``{% generation %}`` markers in the template the mask comes from
  ``apply_chat_template(return_assistant_tokens_mask=True)``; without them, from prefix differences (each assistant
  turn is the tokens between the template of the turns before it with ``add_generation_prompt=True`` and the
  template including it).
- ``{"prompt": str, "completion": str}``: the loss is on the completion (and the end-of-sequence token), the two
  tokenized separately so no merge straddles the boundary. For a pooled-head encoder the completion is the class.
- ``{"text": str}``: the loss is on every token (plus end-of-sequence).

Masked-LM encoders supervise a fixed, seeded subset of the completion's tokens (``text``: of all tokens). A
malformed line raises :class:`~adapterdoc.errors.ConfigError` naming the file and line; nothing is written.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from adapterdoc.errors import ConfigError
from adapterdoc.train.data import IGNORE, MASK_FRACTION, Example, check_data_file, json_object
from adapterdoc.train.objectives import CAUSAL, MASKED, POOLED

if TYPE_CHECKING:
    from transformers import BatchEncoding, PreTrainedTokenizerBase

MESSAGES, PROMPT_COMPLETION, TEXT = "messages", "prompt_completion", "text"
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class UserRow:
    """One validated row of a user's JSONL dataset, in the shape its file has (messages, prompt/completion or text)."""

    line: int
    kind: str
    messages: tuple[tuple[str, str], ...] = ()
    prompt: str = ""
    completion: str = ""
    text: str = ""


def read_rows(path: str | os.PathLike[str]) -> list[UserRow]:
    """All rows of ``path``, validated; every row of one file must have the same shape."""
    p = os.fspath(path)
    check_data_file(p)
    rows: list[UserRow] = []
    try:
        with open(p, encoding="utf-8") as f:
            lines = list(f)
    except UnicodeDecodeError as e:
        raise ConfigError(p, f"is not UTF-8 text: {e.reason}") from None
    for n, line in enumerate(lines, 1):
        if line.strip():
            rows.append(parse_row(p, n, line))
    if not rows:
        raise ConfigError(p, "holds no rows")
    kinds = {r.kind for r in rows}
    if len(kinds) > 1:
        first = rows[0].kind
        other = next(r for r in rows if r.kind != first)
        raise ConfigError(p, f"line {other.line}: a `{other.kind}` row in a file of `{first}` rows")
    return rows


def parse_row(path: str, n: int, line: str) -> UserRow:
    where = f"line {n}"
    obj = json_object(path, where, line)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ConfigError(path, f"{where}: `messages` must be a non-empty list")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
                raise ConfigError(
                    path, f"{where}: messages[{i}] must be {{role: {'|'.join(ROLES)}, content: string}}"
                )
            out.append((m["role"], m["content"]))
        if not any(r == "assistant" for r, _ in out):
            raise ConfigError(path, f"{where}: no assistant message to learn from")
        return UserRow(n, MESSAGES, messages=tuple(out))
    if "prompt" in obj or "completion" in obj:
        prompt, completion = obj.get("prompt"), obj.get("completion")
        if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
            raise ConfigError(
                path, f"{where}: `prompt` and `completion` must be strings (completion non-empty)"
            )
        return UserRow(n, PROMPT_COMPLETION, prompt=prompt, completion=completion)
    if "text" in obj:
        if not isinstance(obj["text"], str) or not obj["text"]:
            raise ConfigError(path, f"{where}: `text` must be a non-empty string")
        return UserRow(n, TEXT, text=obj["text"])
    raise ConfigError(path, f"{where}: a row needs `messages`, `prompt` + `completion`, or `text`")


def split_rows(rows: list[UserRow], fraction: float, seed: int) -> tuple[list[UserRow], list[UserRow]]:
    """A seeded random ``fraction`` of the rows (at least one when > 0) for validation, the rest for training."""
    if fraction <= 0:
        return list(rows), []
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    k = max(1, round(fraction * len(rows)))
    if k >= len(rows):
        raise ConfigError(None, f"--val-split {fraction} leaves no training rows of {len(rows)}")
    held = set(order[:k])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def has_generation_markers(tok: PreTrainedTokenizerBase) -> bool:
    template = getattr(tok, "chat_template", None)
    return isinstance(template, str) and bool(_GENERATION.search(template))


def chat_mask_method(tok: PreTrainedTokenizerBase) -> str:
    return "generation markers" if has_generation_markers(tok) else "prefix differences"


def _chat(
    tok: PreTrainedTokenizerBase,
    msgs: list[dict[str, str]],
    *,
    add_generation_prompt: bool = False,
    return_assistant_tokens_mask: bool = False,
) -> BatchEncoding:
    """``msgs`` through the chat template, tokenized, as the dict ``return_dict=True`` gives."""
    out = tok.apply_chat_template(
        msgs,
        tokenize=True,
        return_dict=True,
        add_generation_prompt=add_generation_prompt,
        return_assistant_tokens_mask=return_assistant_tokens_mask,
    )
    return cast("BatchEncoding", out)


def _template(
    tok: PreTrainedTokenizerBase, msgs: list[dict[str, str]], *, add_generation_prompt: bool = False
) -> list[int]:
    return list(_chat(tok, msgs, add_generation_prompt=add_generation_prompt)["input_ids"])


def encode_messages(tok: PreTrainedTokenizerBase, row: UserRow, path: str) -> tuple[list[int], list[int]]:
    """(input ids, 0/1 supervision per token) of a chat row."""
    msgs = [{"role": r, "content": c} for r, c in row.messages]
    if getattr(tok, "chat_template", None) is None:
        raise ConfigError(path, f"line {row.line}: a `messages` row needs a tokenizer with a chat template")
    if has_generation_markers(tok):
        out = _chat(tok, msgs, return_assistant_tokens_mask=True)
        return list(out["input_ids"]), [int(x) for x in out["assistant_masks"]]
    ids = _template(tok, msgs)
    sup = [0] * len(ids)
    for i, (role, _) in enumerate(row.messages):
        if role != "assistant":
            continue
        before = _template(tok, msgs[:i], add_generation_prompt=True) if i else []
        upto = _template(tok, msgs[: i + 1])
        if upto[: len(before)] != before or ids[: len(upto)] != upto:
            raise ConfigError(
                path,
                f"line {row.line}: the chat template is not prefix-stable, so the assistant tokens cannot be "
                "found; add {% generation %} markers to the template",
            )
        for j in range(len(before), len(upto)):
            sup[j] = 1
    return ids, sup


def _plain(tok: PreTrainedTokenizerBase, text: str, *, special: bool) -> list[int]:
    return list(tok(text, add_special_tokens=special)["input_ids"])


def _eos(tok: PreTrainedTokenizerBase) -> list[int]:
    return [tok.eos_token_id] if tok.eos_token_id is not None else []


def encode_row(tok: PreTrainedTokenizerBase, row: UserRow, path: str) -> tuple[list[int], list[int]]:
    """(input ids, 0/1 supervision) for a causal LM."""
    if row.kind == MESSAGES:
        return encode_messages(tok, row, path)
    if row.kind == PROMPT_COMPLETION:
        prompt = _plain(tok, row.prompt, special=True) if row.prompt else []
        completion = _plain(tok, row.completion, special=False) + _eos(tok)
        return prompt + completion, [0] * len(prompt) + [1] * len(completion)
    ids = _plain(tok, row.text, special=True) + _eos(tok)
    return ids, [1] * len(ids)


def causal_example(tok: PreTrainedTokenizerBase, row: UserRow, path: str, max_length: int | None) -> Example:
    ids, sup = encode_row(tok, row, path)
    if max_length:
        ids, sup = ids[:max_length], sup[:max_length]
    labels = [t if s else IGNORE for t, s in zip(ids, sup)]
    return Example(f"line{row.line}", ids, labels)


def masked_example(
    tok: PreTrainedTokenizerBase, row: UserRow, path: str, max_length: int | None, seed: int
) -> Example:
    """``prompt`` + ``completion`` (or ``text``) with a seeded subset of the supervised tokens masked."""
    if row.kind == MESSAGES:
        raise ConfigError(
            path, f"line {row.line}: a masked-LM encoder trains on `prompt`+`completion` or `text`"
        )
    if tok.mask_token_id is None:
        raise ConfigError(path, "the tokenizer has no mask token, which a masked-LM objective needs")
    ids, sup = encode_row(tok, row, path)
    if max_length:
        ids, sup = ids[:max_length], sup[:max_length]
    positions = [i for i, s in enumerate(sup) if s and ids[i] not in tok.all_special_ids]
    if not positions:
        raise ConfigError(path, f"line {row.line}: no token to mask (empty after truncation?)")
    rng = random.Random(f"{seed}:{row.line}")
    hidden = set(rng.sample(positions, max(1, round(MASK_FRACTION * len(positions)))))
    inputs = [tok.mask_token_id if i in hidden else t for i, t in enumerate(ids)]
    labels = [t if i in hidden else IGNORE for i, t in enumerate(ids)]
    return Example(f"line{row.line}", inputs, labels)


def pooled_example(
    tok: PreTrainedTokenizerBase, row: UserRow, path: str, max_length: int | None, classes: list[str]
) -> Example:
    if row.kind != PROMPT_COMPLETION:
        raise ConfigError(
            path, f"line {row.line}: a pooled-head encoder trains on `prompt` + `completion` (the class)"
        )
    if row.completion not in classes:
        raise ConfigError(
            path, f"line {row.line}: class {row.completion!r} is not among the training classes"
        )
    ids = _plain(tok, row.prompt, special=True)
    if max_length:
        ids = ids[:max_length]
    return Example(f"line{row.line}", ids, target=classes.index(row.completion))


def encode(
    objective: str,
    tok: PreTrainedTokenizerBase,
    rows: list[UserRow],
    path: str,
    *,
    max_length: int | None,
    seed: int,
    classes: list[str],
) -> list[Example]:
    if objective == CAUSAL:
        out = [causal_example(tok, r, path, max_length) for r in rows]
    elif objective == MASKED:
        out = [masked_example(tok, r, path, max_length, seed) for r in rows]
    else:
        return [pooled_example(tok, r, path, max_length, classes) for r in rows]
    for r, e in zip(rows, out):
        if e.labels is not None and all(x == IGNORE for x in e.labels[1:]):
            raise ConfigError(path, f"line {r.line}: no supervised token (all truncated by --max-length?)")
    return out


def classes_of(rows: list[UserRow]) -> list[str]:
    return sorted({r.completion for r in rows if r.kind == PROMPT_COMPLETION})


def texts(rows: list[UserRow]) -> list[str]:
    """Every string in the rows (to train a tokenizer for a ``tiny:`` base)."""
    out: list[str] = []
    for r in rows:
        out += [c for _, c in r.messages] + [t for t in (r.prompt, r.completion, r.text) if t]
    return out


@dataclass
class Encoded:
    """A data file's rows encoded for one objective: train and validation examples, the classes, the row kind."""

    train: list[Example]
    val: list[Example]
    classes: list[str]
    kind: str


def encode_data(
    objective: str,
    tok: PreTrainedTokenizerBase,
    data: str,
    *,
    val_data: str | None,
    val_split: float,
    max_length: int | None,
    seed: int,
    classes: list[str] | None = None,
) -> Encoded:
    """Read ``data`` (and ``val_data``, else split off ``val_split``) and encode both sides with training's rules."""
    rows = read_rows(data)
    if val_data:
        train_rows, val_rows = rows, read_rows(val_data)
    else:
        train_rows, val_rows = split_rows(rows, val_split, seed)
    cls = classes if classes is not None else (classes_of(train_rows) if objective == POOLED else [])
    train = encode(objective, tok, train_rows, data, max_length=max_length, seed=seed, classes=cls)
    val = (
        encode(objective, tok, val_rows, val_data or data, max_length=max_length, seed=seed, classes=cls)
        if val_rows
        else []
    )
    return Encoded(train, val, cls, rows[0].kind)
