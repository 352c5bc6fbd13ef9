"""Rename tensors in a safetensors file without touching its data section: in place when the new header fits,
else a streamed copy to a temp file in the same folder, fsync, and an atomic rename over the file
(:mod:`adapterdoc.st.atomic`).

Only the renamed keys' JSON strings change; every other header byte (``__metadata__``, field order, number
formatting) is kept, and the header is padded with spaces back to its old length when it fits. So renaming A→B
in place and B→A again restores the original file byte for byte, and the data section is never rewritten in
place (a copy moves it verbatim).
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

from adapterdoc.errors import HeaderError
from adapterdoc.st.atomic import TEMP_PREFIX, atomic_writer, fsync, slow_point, target_mode
from adapterdoc.st.header import Header

COPY_CHUNK = 8 * 1024 * 1024
_WS = " \t\n\r"
_DECODER = json.JSONDecoder()
_encode = json.encoder.encode_basestring  # what json.dumps(s, ensure_ascii=False) uses
_WS_RE = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True)
class KeySpan:
    """Where one top-level key's JSON string sits in the header text (``start`` at the opening quote)."""

    name: str
    start: int
    end: int


def key_spans(text: str) -> list[KeySpan]:
    """The top-level keys of a (validated) header text with their exact positions."""
    spans: list[KeySpan] = []
    n = len(text)

    def skip(i: int) -> int:  # whitespace is rare in headers: test one char before calling the regex
        return _WS_RE.match(text, i).end() if i < n and text[i] in _WS else i  # type: ignore[union-attr]

    scan_string = json.decoder.scanstring  # type: ignore[attr-defined]
    # JSONDecoder sets scan_once (its C scanner) in __init__; typeshed does not declare it
    scan_value: Callable[[str, int], tuple[object, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
    i = skip(0)
    if i >= n or text[i] != "{":
        raise ValueError("header is not a JSON object")
    i = skip(i + 1)
    if i < n and text[i] == "}":
        return spans
    while True:
        if i >= n or text[i] != '"':
            raise ValueError(f"expected a key at char {i}")
        name, end = scan_string(text, i + 1)
        spans.append(KeySpan(name, i, end))
        i = skip(end)
        if i >= n or text[i] != ":":
            raise ValueError(f"expected ':' at char {i}")
        try:
            _, i = scan_value(text, skip(i + 1))
        except StopIteration as e:
            raise ValueError(f"expected a value at char {e.value}") from None
        i = skip(i)
        if i < n and text[i] == "}":
            return spans
        if i >= n or text[i] != ",":
            raise ValueError(f"expected ',' or '}}' at char {i}")
        i = skip(i + 1)


def renamed_header(raw: bytes, mapping: Mapping[str, str]) -> tuple[bytes, int]:
    """The header JSON with the keys in ``mapping`` renamed, all other bytes kept, trailing padding removed.

    Returns (new header bytes without padding, number of keys renamed).
    """
    text = raw.decode("utf-8")
    parts: list[str] = []
    pos = 0
    renamed = 0
    for span in key_spans(text):
        new = mapping.get(span.name)
        if new is None or new == span.name:
            continue
        parts.append(text[pos : span.start])
        parts.append(_encode(new))
        pos = span.end
        renamed += 1
    parts.append(text[pos:])
    return "".join(parts).rstrip(_WS).encode("utf-8"), renamed


def padded(body: bytes, length: int) -> bytes:
    """``body`` padded with trailing spaces to ``length`` bytes (which must be enough)."""
    if len(body) > length:
        raise ValueError(f"header of {len(body)} bytes does not fit in {length}")
    return body + b" " * (length - len(body))


def aligned_length(body: bytes) -> int:
    """The header length safetensors' writer would use: ``8 + N`` rounded up to a multiple of 8."""
    return len(body) + (-(8 + len(body)) % 8)


def in_place_blocker(path: str, header: Header, body: bytes) -> str | None:
    """Why ``path`` cannot be rewritten in place with ``body`` (``None`` when it can)."""
    if len(body) > header.header_len:
        return f"the new header needs {len(body)} bytes, the old one has {header.header_len}"
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return (
            "the weights file is a symlink (shared cache blob): the link is replaced, the blob is not written"
        )
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink > 1:
        return f"the file has {st.st_nlink} hard links: a copy replaces this name and leaves the others as they were"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return "the file belongs to another user"
    return None


def rewrite_in_place(path: str, header: Header, body: bytes) -> None:
    """pwrite the new header (space-padded to the same length) over the old one and fsync. O(header)."""
    data = padded(body, header.header_len)
    flags = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if st.st_size != header.file_size:
            raise HeaderError(path, "the file changed size since its header was read; nothing was written")
        slow_point("before-header-write")
        written = os.pwrite(fd, data, 8)
        if written != len(data):
            raise OSError(f"short write: {written} of {len(data)} header bytes")
        fsync(fd)
    finally:
        os.close(fd)


def rewrite_copy(
    src: str,
    dest: str,
    header: Header,
    body: bytes,
    *,
    keep_length: bool = True,
    progress: Callable[[int], None] | None = None,
    link: str = "follow",
) -> int:
    """Write ``dest`` atomically: the new header, then the data section of ``src`` copied verbatim.

    With ``keep_length`` the header keeps its old length when the new one fits (so the bytes equal an in-place
    rewrite); otherwise it is padded the way safetensors pads. ``dest`` may be ``src``: then pass
    ``link="replace"`` so that a symlink is replaced by a regular file and its target (a shared cache blob) is never
    written. ``progress`` is called with the number of data bytes each step copied. Returns the bytes written.
    """
    n = header.header_len if keep_length and len(body) <= header.header_len else aligned_length(body)
    prefix = struct.pack("<Q", n) + padded(body, n)
    total = header.file_size - header.data_start
    mode = target_mode(src)
    with open(src, "rb") as fin, atomic_writer(dest, mode=mode, link=link) as fout:
        if os.fstat(fin.fileno()).st_size != header.file_size:
            raise HeaderError(src, "the file changed size since its header was read; nothing was written")
        fout.write(prefix)
        fout.flush()
        _copy_range(fin, fout, header.data_start, len(prefix), total, progress or _ignore)
    return len(prefix) + total


def _ignore(n: int) -> None:
    pass


def _copy_range(
    fin: BinaryIO, fout: BinaryIO, src_off: int, dst_off: int, count: int, advance: Callable[[int], None]
) -> None:
    """Copy ``count`` bytes; ``os.copy_file_range`` where the kernel allows it, else read/write in chunks."""
    done = 0
    fast = hasattr(os, "copy_file_range")
    while done < count:
        want = min(COPY_CHUNK * 8 if fast else COPY_CHUNK, count - done)
        n = 0
        if fast:
            try:
                n = os.copy_file_range(fin.fileno(), fout.fileno(), want, src_off + done, dst_off + done)
            except OSError:
                fast = False
                continue
            if n == 0:
                fast = False
                continue
        else:
            fin.seek(src_off + done)
            chunk = fin.read(want)
            if not chunk:
                raise HeaderError(fin.name, "the file shrank while it was being copied")
            fout.seek(dst_off + done)
            fout.write(chunk)
            n = len(chunk)
        done += n
        advance(n)
    fout.seek(dst_off + count)


def is_temp_leftover(name: str) -> bool:
    """Whether a file name is one of adapterdoc's temp files (safe to delete after a killed run)."""
    return os.path.basename(name).startswith(TEMP_PREFIX)
