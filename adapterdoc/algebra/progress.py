"""Progress of the algebra's reads: the bytes read so far of all it reads, reported as each item is done."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Progress = Callable[[int, int], None]
"""``progress(done, total)``: bytes read so far and in all (the CLI draws a bar from it)."""

T = TypeVar("T")


def reported(items: Iterable[T], size: Callable[[T], int], progress: Progress | None) -> Iterator[T]:
    """``items`` one at a time; once the caller is done with one (it asks for the next, or the loop ends) the
    bytes of those done so far and of all of them (``size`` each) go to ``progress``."""
    listed = list(items)
    total = sum(size(x) for x in listed)
    done = 0
    for x in listed:
        yield x
        done += size(x)
        if progress is not None:
            progress(done, total)


__all__ = ["Progress", "reported"]
