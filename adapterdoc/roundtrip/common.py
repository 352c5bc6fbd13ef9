"""What every round trip shares: the copy it works on, its verdict (:class:`Fail` / :class:`Skip`), the timing
of one check, and exact comparisons of files and tensors."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from adapterdoc.checkpoint import ADAPTER_WEIGHTS, Checkpoint
from adapterdoc.errors import AdapterdocError
from adapterdoc.report.roundtrip_report import Check

if TYPE_CHECKING:
    import torch


class Fail(Exception):
    """A round trip that ran and found a difference."""


class Skip(Exception):
    """A round trip that does not apply to this adapter (the reason)."""


TripFailed, TripSkipped = Fail, Skip
"""What :func:`expert_trip` raises, for the callers outside this module (train-smoke's expert check)."""


def copy_adapter(src: Checkpoint, folder: str) -> str:
    """A private, regular-file copy of the adapter (symlinks followed, so the cache is never touched)."""
    os.makedirs(folder)
    if src.kind == "adapter" and os.path.isdir(src.root):
        for name in os.listdir(src.root):
            p = os.path.join(src.root, name)
            if os.path.isfile(p):
                shutil.copyfile(p, os.path.join(folder, name))
    else:
        assert src.weights_path is not None
        if src.weights_format == "bin":
            shutil.copyfile(src.weights_path, os.path.join(folder, "adapter_model.bin"))
        else:
            shutil.copyfile(src.weights_path, os.path.join(folder, ADAPTER_WEIGHTS))
    return folder


def timed(name: str, fn: Callable[[], str]) -> Check:
    """Run one round trip ``fn`` (its detail, or :class:`Fail` / :class:`Skip`) and give its timed verdict."""
    t = time.perf_counter()
    try:
        detail, status = fn(), "pass"
    except Fail as e:
        detail, status = str(e), "fail"
    except Skip as e:
        detail, status = str(e), "skipped"
    except AdapterdocError as e:
        detail, status = f"refused: {e}", "fail"
    return Check(name, status, detail, round(time.perf_counter() - t, 3))


def sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weights_file(folder: str) -> str | None:
    p = os.path.join(folder, ADAPTER_WEIGHTS)
    return p if os.path.exists(p) else None


def read_json(path: str) -> object:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def same_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], what: str) -> None:
    if set(a) != set(b):
        raise Fail(f"{what}: names differ ({sorted(set(a) ^ set(b))[:3]} ...)")
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not bitwise_equal(a[k], b[k]):
            raise Fail(
                f"{what}: `{k}` differs ({a[k].dtype}{list(a[k].shape)} vs {b[k].dtype}{list(b[k].shape)})"
            )


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (so NaN equals the same NaN, which ``torch.equal`` denies)."""
    import torch

    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
