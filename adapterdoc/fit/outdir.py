"""`adapterdoc train --out DIR`: what the run folder is, and whether the run starts, continues or starts again there.

The output rules of CLI.md apply as for `merge`: a file, a symlink or a read-only folder (or a new folder inside a
read-only one) is refused with exit 3, root included. An earlier run of ours (its ``progress.jsonl``) is continued
with ``--resume`` from its last complete checkpoint, replaced with ``--force``, and started again when it holds no
complete checkpoint and never finished (Ctrl-C or a full disk before the first checkpoint: there is nothing to lose).

Only reads happen here (every process of a launch decides the same); the main process clears the folder once the
processes have joined (:func:`adapterdoc.train.checkpoints.clear_run`, from the loop).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from adapterdoc.errors import RefusedError
from adapterdoc.st.paths import TEMP_PREFIX, read_only
from adapterdoc.train.checkpoints import FINISHED, MARKER, last_checkpoint

NEW, RESUME, RESTART, FRESH = "new", "resume", "restart", "fresh"
_NOTHING = "--resume: this folder holds no complete checkpoint to continue from"


@dataclass(frozen=True)
class OutPlan:
    """How the run uses its folder: ``new`` (missing or empty), ``resume`` (from ``checkpoint``), ``restart`` (an
    earlier run with no complete checkpoint, started again) or ``fresh`` (``--force`` over an earlier run)."""

    path: str
    mode: str
    checkpoint: str | None = None
    reason: str = ""
    """For ``restart``: what the earlier run left (said in the AD628 finding)."""

    @property
    def clears(self) -> bool:
        return self.mode in (RESTART, FRESH)


def plan_out(out: str, *, resume: bool, force: bool) -> OutPlan:
    """Check ``out`` against the output rules and decide how the run uses it; nothing is written."""
    path = os.path.abspath(out)
    st = _lstat(out)
    if st is None:
        _check_parent(out, path)
        return OutPlan(path, RESTART if resume else NEW, reason=_NOTHING if resume else "")
    if stat.S_ISLNK(st.st_mode):
        raise RefusedError(
            out,
            f"is a symlink (to {os.path.realpath(path)}); adapterdoc does not write its run folder through a "
            "link: give the real folder or a new path",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise RefusedError(out, "is a regular file, not a folder; give a new or empty folder for --out")
    if read_only(path, st):
        raise RefusedError(out, f"folder is read-only (mode {stat.S_IMODE(st.st_mode):04o})")
    entries = [e for e in os.listdir(path) if not e.startswith(TEMP_PREFIX)]
    if not entries:
        return OutPlan(path, RESTART if resume else NEW, reason=_NOTHING if resume else "")
    if not os.path.isfile(os.path.join(path, MARKER)):
        raise RefusedError(
            out, "is a non-empty folder that adapterdoc train did not write; choose another --out"
        )
    if force:
        return OutPlan(path, FRESH)
    ckpt = last_checkpoint(path)
    finished = os.path.isfile(os.path.join(path, FINISHED))
    if ckpt is None and not finished:
        return OutPlan(
            path, RESTART, reason="the earlier run here stopped before its first complete checkpoint"
        )
    if resume:
        if ckpt is None:
            raise RefusedError(
                out,
                "holds a finished run with no checkpoint to continue from (--save-steps 0); pass --force to "
                "train it again from the start, or choose another --out",
            )
        return OutPlan(path, RESUME, checkpoint=ckpt)
    if finished:
        raise RefusedError(out, "holds a finished run; pass --force to replace it, or choose another --out")
    step = os.path.basename(ckpt or "").removeprefix("step-").lstrip("0") or "0"
    raise RefusedError(
        out,
        f"holds an interrupted run (last complete checkpoint: step {step}); pass --resume to continue it, "
        "or --force to start again from step 0",
    )


def _lstat(out: str) -> os.stat_result | None:
    try:
        return os.lstat(out)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise RefusedError(out, "a part of the path is not a folder") from None


def _check_parent(out: str, path: str) -> None:
    """The nearest existing folder above a new ``out`` must be writable (the run folder is made in it)."""
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise RefusedError(out, f"{parent} is not a folder")
    st = os.stat(parent)
    if read_only(parent, st):
        raise RefusedError(
            parent,
            f"folder is not writable (mode {stat.S_IMODE(st.st_mode):04o}); the run folder {out} is made in it: "
            "make it writable or choose another --out",
        )
