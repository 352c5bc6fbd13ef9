"""The canaries file: what to send a server and what PEFT expects back, at several adapter scales (torch-free).

A canary is one prompt (its text and the token ids the local tokenizer gives) and the logprobs PEFT computes on it:
``positions`` the teacher-forced logprob of the prompt's own token at chosen positions (for servers that return
prompt logprobs), ``next`` the logprobs of a few candidate tokens after the whole prompt (for servers that return
only generated tokens' top logprobs); ``same``, beside each position, the logprob of its token in the distribution
after it (what llama-cpp-python reports for a prompt without BOS). Every expected value is a list with one entry per scale of ``scales``: the
adapter's LoRA scaling multiplied by that factor (0 is the base, 1 the adapter as PEFT applies it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.probe.fit import TOLERANCES

MAX_BYTES = 16 * 2**20
"""The largest canaries file read (make-canaries writes a few tens of kB)."""
VERSION = 1
"""The canaries file's format version (``"version"``); a file of another version is refused."""


def scale_grid(rank: int) -> tuple[float, ...]:
    """The factors canaries are computed at: 0, ½, 1/√r, 1, 2, √r, and ¼, ¾, 1½ between them, and steps of ×√2 from 2
    up to √r and from 1/√r up to ¼ (a large rank's √r is far from 2), so that the expected curve is close to straight
    between neighbours (sorted, duplicates dropped; 13 factors for r = 64)."""
    root = math.sqrt(rank)
    grid = {0.0, 0.25, 0.5, 0.75, 1.0 / root, 1.0, 1.5, 2.0, root}
    return tuple(sorted(grid | _steps(2.0, root) | _steps(1.0 / root, 0.25)))


def _steps(low: float, high: float) -> set[float]:
    """``low`` times √2, 2, 2√2, ... below ``high``."""
    out, k = set(), 1
    while low * 2 ** (k / 2) < high:
        out.add(low * 2 ** (k / 2))
        k += 1
    return out


@dataclass(frozen=True)
class Position:
    """The teacher-forced logprob of ``token`` (the prompt's own token at index ``pos``) given the tokens before it."""

    pos: int
    token: int
    logprobs: Sequence[float]
    """One per scale of :attr:`Canaries.scales`."""
    same: Sequence[float] = ()
    """The logprob of ``token`` in the distribution after it (the logits of index ``pos`` scored at the token of
    index ``pos``), one per scale: what llama-cpp-python's echo reports for a prompt that starts without BOS (its
    logits rows are then one step off its tokens). Empty in files made before it was recorded."""


@dataclass(frozen=True)
class Canary:
    """One prompt and what PEFT expects on it."""

    text: str
    ids: Sequence[int]
    positions: Sequence[Position]
    next: Mapping[int, Sequence[float]] = field(default_factory=dict)
    """token id → its logprob after the whole prompt, one per scale."""


@dataclass(frozen=True)
class Canaries:
    """A canaries file: where the logprobs came from, the scales, the prompts."""

    adapter: str
    base: str
    rank: int
    dtype: str
    """The base's dtype the logprobs were computed in (``float32``, ``bfloat16``, ...)."""
    scales: Sequence[float]
    canaries: Sequence[Canary]
    bos: bool = False
    """Whether the local tokenizer starts a prompt with a BOS token (``ids[0]``): recorded for the reader; the probe
    reads how an answer lines up from the fit of each alignment, not from this."""

    def to_dict(self) -> dict[str, object]:
        return {"version": VERSION, **asdict(self)}


def save(canaries: Canaries, path: str | Path) -> None:
    """Write ``canaries`` as JSON, atomically."""
    from adapterdoc.st.atomic import atomic_write_bytes

    text = json.dumps(canaries.to_dict(), indent=1) + "\n"
    atomic_write_bytes(str(path), text.encode("utf-8"))


def load(path: str | Path) -> Canaries:
    """Read a canaries file; a missing, unreadable or other-version file is exit 3 naming it."""
    from adapterdoc.errors import InputNotFoundError

    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(str(p), "no canaries file here (make one: adapterdoc probe --make-canaries)")
    if p.stat().st_size > MAX_BYTES:
        raise UnsupportedInputError(str(p), f"larger than {MAX_BYTES // 2**20} MiB: not a canaries file")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise UnsupportedInputError(str(p), f"cannot read it ({e.strerror or e})") from e
    try:
        raw = json.loads(text)
        if raw.get("version") != VERSION:
            raise UnsupportedInputError(
                str(p), f"canaries version {raw.get('version')!r}; this adapterdoc reads version {VERSION}"
            )
        return _from_dict(raw)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        if isinstance(e, UnsupportedInputError):
            raise
        why = "nested too deep" if isinstance(e, RecursionError) else e
        raise UnsupportedInputError(str(p), f"not a canaries file: {why}") from e


def _position(raw: Any) -> Position:
    same = raw.get("same")
    return Position(int(raw["pos"]), int(raw["token"]), list(raw["logprobs"]), list(same) if same else ())


def _from_dict(raw: dict[str, object]) -> Canaries:
    rows = raw["canaries"]
    if not isinstance(rows, list):
        raise ValueError("its canaries are no list")
    canaries = [
        Canary(
            text=str(c["text"]),
            ids=[int(i) for i in c["ids"]],
            positions=[_position(p) for p in c["positions"]],
            next={int(k): list(v) for k, v in c.get("next", {}).items()},
        )
        for c in rows
    ]
    scales = raw["scales"]
    if not isinstance(scales, list):
        raise ValueError("its scales are no list")
    if 0.0 not in scales or 1.0 not in scales:
        raise ValueError("its scales must hold 0 (the base) and 1 (the adapter)")
    lengths = {len(p.logprobs) for c in canaries for p in c.positions} | {
        len(v) for c in canaries for v in c.next.values()
    }
    lengths |= {len(p.same) for c in canaries for p in c.positions if p.same}
    if lengths - {len(scales)}:
        raise ValueError(f"every expected value needs {len(scales)} entries, one per scale")
    dtype = str(raw["dtype"])
    if dtype not in TOLERANCES:
        raise ValueError(f"its dtype {dtype[:40]!r} is none of {', '.join(TOLERANCES)}")
    return Canaries(
        adapter=str(raw["adapter"]),
        base=str(raw["base"]),
        rank=int(str(raw["rank"])),
        dtype=dtype,
        scales=[float(s) for s in scales],
        canaries=canaries,
        bos=bool(raw.get("bos", False)),
    )
