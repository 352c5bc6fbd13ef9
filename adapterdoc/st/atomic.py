"""Atomic file writes: a temp file in the target's folder, fsync, ``os.replace``; never through a symlink."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

from adapterdoc.errors import RefusedError

TEMP_PREFIX = ".adapterdoc-tmp-"
"""Every temp file or folder adapterdoc creates starts with this; leftovers from a killed run are safe to delete."""


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def target_mode(path: str, default: int = 0o644) -> int:
    """The permission bits the replacement file should get: the existing file's (through a link), else ``default``."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return default


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[BinaryIO]:
    """Yield a binary file; on clean exit it atomically replaces ``path``.

    The temp file lives in the same folder. If ``path`` is a symlink (the Hugging Face cache), the link itself
    is replaced by a regular file and its target is never written. On any exception the temp file is
    removed and ``path`` is untouched.
    """
    spath = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(spath))
    perm = target_mode(spath) if mode is None else mode
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fchmod(f.fileno(), perm)
            os.fsync(f.fileno())
        _slow_point("before-replace")
        os.replace(tmp, spath)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """Atomically replace ``path`` with ``data``."""
    with atomic_writer(path, mode=mode) as f:
        f.write(data)


LOCK_WAIT_SECONDS = 60.0


@contextlib.contextmanager
def folder_lock(folder: str, *, wait: float = LOCK_WAIT_SECONDS) -> Iterator[None]:
    """An exclusive advisory lock (``flock``) on ``folder`` itself, so two adapterdoc writers never interleave.

    Nothing is created in the folder. Waits up to ``wait`` seconds for another holder, then refuses.
    """
    import fcntl
    import time

    fd = os.open(folder, os.O_RDONLY)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RefusedError(
                        folder, "another adapterdoc process is writing here; try again later"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _slow_point(name: str) -> None:
    """Test hook: ``ADAPTERDOC_SLOW_WRITES=SECONDS`` sleeps at write checkpoints to widen crash windows."""
    delay = os.environ.get("ADAPTERDOC_SLOW_WRITES")
    if delay:
        import time

        time.sleep(float(delay))


slow_point = _slow_point
