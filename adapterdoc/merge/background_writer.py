"""Ordered writes on one thread, so that computing the next block of a merge overlaps writing the last one."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import BinaryIO

from adapterdoc.errors import UnsupportedInputError

Job = Callable[[], None]

_COPY_CHUNK = 8 << 20
"""Buffer size of the fallback copy where ``sendfile`` cannot copy between files."""


class Writer:
    """Writes to the output files in order on one thread, so computing the next block overlaps writing the
    last one. At most ``depth`` blocks wait (bounded memory); byte-for-byte copies run in the kernel."""

    def __init__(self, depth: int = 2) -> None:
        import queue
        import threading

        self.depth = depth
        """Blocks that may wait in the queue; with the one being written, ``depth + 1`` blocks are held here."""
        self.q: queue.Queue[Job | None] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="adapterdoc-merge-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.q.get()
            if job is None:
                return
            if self.error is None:
                try:
                    job()
                except BaseException as e:  # re-raised on the main thread
                    self.error = e

    def _submit(self, job: Job) -> None:
        if self.error is not None:
            raise self.error
        self.q.put(job)

    def put(self, f: BinaryIO, data: bytes | bytearray | memoryview) -> None:
        def job() -> None:
            view = memoryview(data)
            while view:
                n = f.write(view)
                view = view[n:]

        self._submit(job)

    def copy(self, f: BinaryIO, src: BinaryIO, offset: int, n: int) -> None:
        out_fd, in_fd = f.fileno(), src.fileno()

        def job() -> None:
            pos, left = offset, n
            while left:
                try:
                    k = os.sendfile(out_fd, in_fd, pos, min(left, 1 << 30))
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                        raise
                    k = len(chunk := os.pread(in_fd, min(left, _COPY_CHUNK), pos))
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out_fd, view) :]
                if not k:
                    raise UnsupportedInputError(src.name, "file ended inside a tensor")
                pos += k
                left -= k

        self._submit(job)

    def flush(self) -> None:
        """Wait until every queued job ran; raise what one of them raised."""
        import threading

        done = threading.Event()
        self.q.put(done.set)
        done.wait()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
