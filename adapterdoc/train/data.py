"""Training data for the reference runs: the bundled JSONL rows, an offline byte-level tokenizer, and encodings.

Three encodings share one tokenizer: a chat-style prompt + answer for decoders (labels -100 on the prompt and the
padding), masked answer tokens for masked-LM encoders, and a class label for a pooled head on embedding models.
Nothing here downloads anything: the tokenizer is trained on the rows themselves each time it is needed.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from adapterdoc.errors import ConfigError, InputNotFoundError, UnsupportedInputError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    import torch
    from tokenizers import Tokenizer

    DataSource = str | os.PathLike[str] | Traversable
    Batch = dict[str, torch.Tensor]
    """A collated batch: ``input_ids``, ``attention_mask``, ``weights`` and ``labels`` or ``targets``."""

IGNORE = -100
"""Label value cross-entropy skips (prompt, padding, unmasked encoder positions)."""

SPECIALS = ("<pad>", "<bos>", "<eos>", "<mask>", "<|user|>", "<|assistant|>", "<|end|>")
PAD, BOS, EOS, MASK, USER, ASSISTANT, END = range(len(SPECIALS))
"""Special-token ids: their position in :data:`SPECIALS` (the trainer adds them first)."""

TOKENIZER_VOCAB = 512
"""Below every tiny model's vocabulary (1000), so every id has an embedding row."""

MASK_FRACTION = 0.4
"""Share of answer tokens hidden in the masked-LM task (at least one per row)."""

DEFAULT_DATA: Traversable = files("adapterdoc") / "data" / "smoke.jsonl"
"""The reference rows, shipped inside the package (package data, so a wheel install has them too).

A :class:`pathlib.Path` for every ordinary install; anything that reads it goes through ``is_file``/``open``."""


@dataclass(frozen=True)
class Row:
    """One bundled example: a request and the structured answer a model should produce for it."""

    id: str
    split: str
    prompt: str
    answer: dict[str, object]

    @property
    def answer_text(self) -> str:
        return json.dumps(self.answer, ensure_ascii=False)

    @property
    def category(self) -> str:
        """The class a pooled head predicts: the answer's ``intent`` field."""
        return str(self.answer.get("intent", ""))


@dataclass
class Example:
    """One encoded row. ``labels`` is per token (decoders, masked-LM); ``target`` a class (pooled head)."""

    row_id: str
    input_ids: list[int]
    labels: list[int] | None = None
    target: int | None = None
    weight: float = 1.0
    """0.0 for the duplicates that pad a process's shard; evaluation leaves them out."""


@dataclass
class Dataset:
    """The rows of one file, split, with the tokenizer built from them."""

    path: str
    train: list[Row]
    val: list[Row]
    classes: list[str] = field(default_factory=list)


def load_rows(path: DataSource = DEFAULT_DATA) -> list[Row]:
    """Read and validate the JSONL rows (``prompt`` str, ``answer`` object, ``split`` str, optional ``id``).

    A missing, unreadable or non-UTF-8 file is one :class:`~adapterdoc.errors.AdapterdocError` (exit 3)."""
    src = Path(os.path.expanduser(os.fspath(path))) if isinstance(path, (str, os.PathLike)) else path
    p = str(src)
    if isinstance(src, Path):
        check_data_file(p)
    elif not src.is_file():
        raise InputNotFoundError(p, "training data file not found")
    rows: list[Row] = []
    try:
        with src.open("r", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                rows.append(_parse_row(p, n, line))
    except PermissionError as e:
        raise UnsupportedInputError(p, "training data file is not readable (permission denied)") from e
    except UnicodeDecodeError as e:
        raise ConfigError(p, f"training data file is not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise UnsupportedInputError(p, f"cannot read the training data file: {e.strerror or e}") from e
    if not rows:
        raise ConfigError(p, "holds no rows")
    return rows


def check_data_file(path: str) -> None:
    """Refuse (exit 3) a ``--data`` path that is not a readable regular file, saying which: not found, a folder, a
    FIFO or a device (never opened: a pipe is read once, and a run reads its data file more than once), or not
    readable (``cannot read: Permission denied``)."""
    from adapterdoc.st.paths import cannot_read

    why = cannot_read(path)
    if why is None:
        return
    if why == "not found":
        raise InputNotFoundError(path, "training data file not found")
    if os.path.isdir(path):
        raise InputNotFoundError(path, "is a folder, not a JSONL file")
    raise UnsupportedInputError(path, why)


def json_object(path: str, where: str, line: str) -> dict[str, object]:
    """One JSONL line (``where``: ``line N``) as a JSON object; a :class:`ConfigError` naming the file and line
    when it is not JSON or not an object."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ConfigError(path, f"{where} is not JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise ConfigError(path, f"{where} is not a JSON object")
    return obj


def _parse_row(path: str, n: int, line: str) -> Row:
    obj = json_object(path, f"line {n}", line)
    prompt, answer, split = obj.get("prompt"), obj.get("answer"), obj.get("split")
    if not isinstance(prompt, str) or not prompt:
        raise ConfigError(path, f"line {n}: `prompt` must be a non-empty string")
    if not isinstance(answer, dict) or not answer:
        raise ConfigError(path, f"line {n}: `answer` must be a non-empty JSON object")
    if not isinstance(split, str):
        raise ConfigError(path, f"line {n}: `split` must be a string")
    return Row(str(obj.get("id", f"line{n}")), split, prompt, answer)


def load_dataset(path: DataSource = DEFAULT_DATA) -> Dataset:
    """The rows split into ``train`` and ``val`` (other split names are ignored), with the class list."""
    rows = load_rows(path)
    train = [r for r in rows if r.split == "train"]
    val = [r for r in rows if r.split == "val"]
    if not train:
        raise ConfigError(str(path), "no row has split 'train'")
    classes = sorted({r.category for r in train})
    return Dataset(str(path), train, val, classes)


def prompt_text(row: Row) -> str:
    """The chat-style prompt up to and including the assistant turn's opening."""
    return f"{SPECIALS[USER]}\n{row.prompt}{SPECIALS[END]}\n{SPECIALS[ASSISTANT]}\n"


def answer_text(row: Row) -> str:
    return f"{row.answer_text}{SPECIALS[END]}"


def build_tokenizer(rows: list[Row], vocab_size: int = TOKENIZER_VOCAB) -> Tokenizer:
    """A byte-level BPE tokenizer trained on ``rows`` (deterministic; no hub, no files)."""
    texts = tuple(t for r in rows for t in (r.prompt, r.answer_text))
    return _train_tokenizer(texts, vocab_size)


@lru_cache(maxsize=4)
def _train_tokenizer(texts: tuple[str, ...], vocab_size: int) -> Tokenizer:
    return train_bpe(list(texts), vocab_size, SPECIALS)


def train_bpe(texts: list[str], vocab_size: int, specials: tuple[str, ...]) -> Tokenizer:
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` in that order; ``specials`` get ids 0, 1, ..."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def _ids(tok: Tokenizer, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False).ids)


def encode_chat(tok: Tokenizer, row: Row) -> Example:
    """Prompt + answer for a causal LM; only the answer (and its end marker) is supervised.

    The two halves are tokenized separately and joined, so no BPE merge can straddle the boundary and the
    prompt length is exact.
    """
    prompt = [BOS, *_ids(tok, prompt_text(row))]
    answer = _ids(tok, answer_text(row))
    return Example(row.id, prompt + answer, [IGNORE] * len(prompt) + answer)


def encode_masked(tok: Tokenizer, row: Row, seed: int = 0) -> Example:
    """``<bos> prompt <eos> answer <eos>`` with a fixed, seeded subset of answer tokens replaced by ``<mask>``."""
    prompt = [BOS, *_ids(tok, row.prompt), EOS]
    answer = _ids(tok, row.answer_text)
    rng = random.Random(f"{seed}:{row.id}")
    k = max(1, round(MASK_FRACTION * len(answer)))
    hidden = set(rng.sample(range(len(answer)), k))
    ids = prompt + [MASK if i in hidden else t for i, t in enumerate(answer)] + [EOS]
    labels = [IGNORE] * len(prompt) + [t if i in hidden else IGNORE for i, t in enumerate(answer)] + [IGNORE]
    return Example(row.id, ids, labels)


def encode_pooled(tok: Tokenizer, row: Row, classes: list[str]) -> Example:
    """``<bos> prompt <eos>`` and the index of the row's class (its answer's ``intent``)."""
    if row.category not in classes:
        raise ConfigError(row.id, f"class {row.category!r} is not among the training classes {classes}")
    return Example(row.id, [BOS, *_ids(tok, row.prompt), EOS], target=classes.index(row.category))


def collate(examples: list[Example]) -> Batch:
    """Right-pad a batch: ``input_ids``, ``attention_mask``, ``labels`` (-100 on padding) or ``targets``, ``weights``."""
    import torch

    if not examples:
        raise ValueError("empty batch")
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        mask[i, :n] = 1
        if e.labels is not None:
            labels[i, :n] = torch.tensor(e.labels)
    batch: Batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "weights": torch.tensor([e.weight for e in examples], dtype=torch.float32),
    }
    if examples[0].target is not None:
        batch["targets"] = torch.tensor([e.target for e in examples], dtype=torch.long)
    else:
        batch["labels"] = labels
    return batch


def shard(examples: list[Example], index: int, count: int) -> list[Example]:
    """Process ``index`` of ``count``: every ``count``-th example, padded to the common length with weight-0 copies.

    Every process then runs the same number of steps (a collective never waits on a process that ran out), and
    the padding copies add nothing to a gathered evaluation.
    """
    if count <= 1:
        return list(examples)
    if not examples:
        return []
    mine = list(examples[index::count])
    size = -(-len(examples) // count)
    k = 0
    while len(mine) < size:
        src = examples[(index + k) % len(examples)]
        mine.append(Example(src.row_id, src.input_ids, src.labels, src.target, weight=0.0))
        k += 1
    return mine
