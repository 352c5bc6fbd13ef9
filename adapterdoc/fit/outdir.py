"""`adapterdoc train --out DIR`: what the run folder is, and whether the run starts, continues or starts again there.

The output-folder rule is every command's (:func:`adapterdoc.st.atomic.check_output_folder`): a file, a symlink or
a read-only folder (or a new folder inside a read-only one) is refused with exit 3, root included; a non-empty
folder train did not write is refused, ``--force`` or not. An earlier run of ours (its ``progress.jsonl``) is continued
with ``--resume`` from its last complete checkpoint, replaced with ``--force``, and started again when it holds no
complete checkpoint and never finished (Ctrl-C or a full disk before the first checkpoint: there is nothing to lose).

Only reads happen here (every process of a launch decides the same); the main process clears the folder once the
processes have joined (:func:`adapterdoc.train.checkpoints.clear_run`, from the loop).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from adapterdoc.errors import RefusedError
from adapterdoc.st.atomic import check_output_folder
from adapterdoc.st.paths import TEMP_PREFIX
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
    """Check ``out`` by the output-folder rule (:func:`~adapterdoc.st.atomic.check_output_folder`: an earlier run of
    ours may be written into) and decide how the run uses it; nothing is written."""
    path = check_output_folder(out, force=force, ours=_earlier_run, mark=MARKER, into=True)
    entries = [e for e in os.listdir(path) if not e.startswith(TEMP_PREFIX)] if os.path.isdir(path) else []
    if not entries:
        return OutPlan(path, RESTART if resume else NEW, reason=_NOTHING if resume else "")
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


def _earlier_run(folder: str) -> bool:
    """A folder train may write into: an earlier run of train's (its ``progress.jsonl``), or nothing but
    adapterdoc's temp leftovers."""
    if os.path.isfile(os.path.join(folder, MARKER)):
        return True
    return all(e.startswith(TEMP_PREFIX) for e in os.listdir(folder))
