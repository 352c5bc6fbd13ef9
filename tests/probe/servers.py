"""Real servers on 127.0.0.1 for the probe tests: started as a subprocess, ready when ``/v1/models`` answers, and
always stopped (terminate, then kill) when the ``with`` block ends."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

READY_SECONDS = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(
    argv: Sequence[str | Path], port: int, log: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Run ``argv`` (a server listening on ``port``) until the block ends; yields its URL."""
    url = f"http://127.0.0.1:{port}"
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, env={**clean, **(env or {})}
        )
        try:
            _wait(url, proc, log)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"the server exited ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}"
            )
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(
        f"the server did not answer in {READY_SECONDS} s: {log.read_text(errors='replace')[-2000:]}"
    )
