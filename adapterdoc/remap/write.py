"""Writing a planned remap: the header in place, a streamed copy over the file, a ``.bin`` converted to
safetensors, or a complete new folder for ``--out``; every write atomic (:mod:`adapterdoc.st.atomic`), every
refusal before the first byte is written."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from adapterdoc.adapter import ADAPTER_CONFIG
from adapterdoc.checkpoint import ADAPTER_BIN, ADAPTER_WEIGHTS, load_bin
from adapterdoc.errors import RefusedError
from adapterdoc.remap.plan import BIN_BACKUP, Plan
from adapterdoc.report.remap_report import Written
from adapterdoc.st import rewrite
from adapterdoc.st.atomic import (
    TEMP_PREFIX,
    atomic_folder,
    atomic_write_bytes,
    check_output_folder,
    move_aside,
    slow_point,
    target_mode,
)
from adapterdoc.st.paths import check_writable, inside

CopyProgress = Callable[[str, int], AbstractContextManager[Callable[[int], None]]]
"""Opens a progress display for copying ``total`` data bytes of the file named ``label``; yields the callback that
is told how many bytes each step copied (the command layer draws it; see :mod:`adapterdoc.commands.remap_cmd`)."""


def write(plan: Plan, *, out: str | None, progress: CopyProgress | None) -> Written:
    """Carry out ``plan``: into the new folder ``out``, or in place (refusals first, then the config, then the
    weights); what was written."""
    if out is not None:
        return _write_out(plan, out, progress=progress)
    strategy = plan.planned.strategy
    if strategy == "none":
        return Written()
    weights = plan.weights_path
    bin_input = plan.ckpt.weights_format == "bin"
    # refuse before writing anything
    if bin_input:
        _check_bin(plan)
    else:
        check_writable(
            weights,
            temp_beside=strategy != "in-place",
            why=" (a rewrite needs a temp file beside the file)",
        )
    if plan.config_bytes is not None and plan.config_path is not None:
        check_writable(plan.config_path)
    # config first: if we are killed between the two writes, running the same command again finishes the job
    done = Written()
    if plan.config_bytes is not None and plan.config_path is not None:
        done = write_config(plan.config_path, plan.config_bytes)
    if bin_input:
        return done + _write_bin_as_safetensors(plan, os.path.dirname(weights))
    if plan.compose is not None:  # --experts: new tensor data, streamed over the file
        notes = _link_notes(weights)
        with _copying(progress, weights, plan) as advance:
            plan.compose(weights, "replace", advance)
        return done + Written((weights,), notes)
    assert plan.header is not None and plan.body is not None
    notes = ()
    if strategy == "in-place":
        rewrite.rewrite_in_place(weights, plan.header, plan.body)
    else:
        notes = _link_notes(weights)
        with _copying(progress, weights, plan) as advance:
            rewrite.rewrite_copy(weights, weights, plan.header, plan.body, progress=advance, link="replace")
    return done + Written((weights,), notes)


def write_config(path: str, data: bytes) -> Written:
    """adapter_config.json replaced atomically (a link there replaced by a regular file, with a note)."""
    notes = _link_notes(path)
    atomic_write_bytes(path, data, link="replace")
    return Written((path,), notes)


@contextlib.contextmanager
def _copying(progress: CopyProgress | None, dest: str, plan: Plan) -> Iterator[Callable[[int], None] | None]:
    """The progress callback for streaming ``plan``'s data section into ``dest`` (``None`` without a display)."""
    if progress is None:
        yield None
        return
    assert plan.header is not None
    with progress(os.path.basename(dest), plan.header.data_bytes) as advance:
        yield advance


def _link_notes(path: str) -> tuple[str, ...]:
    if not os.path.islink(path):
        return ()
    return (
        f"{path} was a symlink to {os.path.realpath(path)}: the link was replaced by a regular file, "
        "the file it pointed to (a shared cache blob) is unchanged",
    )


def _check_bin(plan: Plan) -> None:
    weights = plan.weights_path
    folder = os.path.dirname(os.path.abspath(weights))
    check_writable(weights)
    for name in (ADAPTER_WEIGHTS, BIN_BACKUP):
        p = os.path.join(folder, name)
        if os.path.lexists(p) and plan.ckpt.kind == "adapter":
            raise RefusedError(p, "already exists; converting the .bin would overwrite it (use --out DIR)")


def _bin_target(plan: Plan, folder: str) -> str:
    if plan.ckpt.kind == "adapter":
        return os.path.join(folder, ADAPTER_WEIGHTS)
    stem = os.path.splitext(os.path.basename(plan.weights_path))[0]
    return os.path.join(folder, stem + ".safetensors")


def _bin_bytes(plan: Plan) -> bytes:
    """The .bin's tensors, renamed, as safetensors bytes with PEFT's metadata: read by the restricted unpickler
    (no torch), laid out as ``safetensors.torch.save`` lays them out; the legacy format through torch."""
    from adapterdoc.st.pickled import LegacyFormatError, read_pickled, safetensors_bytes

    mapping = plan.planned.mapping
    try:
        tensors = read_pickled(plan.weights_path)
    except LegacyFormatError:
        pass
    else:
        return safetensors_bytes({mapping.get(k, k): t for k, t in tensors.items()}, {"format": "pt"})
    from safetensors.torch import save

    state = load_bin(plan.weights_path)
    renamed = {mapping.get(k, k): v.detach().contiguous().clone() for k, v in state.items()}
    return save(renamed, metadata={"format": "pt"})


def _write_bin_as_safetensors(plan: Plan, folder: str) -> Written:
    target = _bin_target(plan, folder)
    if os.path.lexists(target):
        raise RefusedError(target, "already exists; converting the .bin would overwrite it (use --out DIR)")
    atomic_write_bytes(target, _bin_bytes(plan), mode=target_mode(plan.weights_path))
    if plan.ckpt.kind != "adapter":
        return Written((target,))
    backup = os.path.join(folder, BIN_BACKUP)
    slow_point("before-bin-backup")
    move_aside(plan.weights_path, backup)
    note = f"{plan.weights_path} renamed to {backup} (the old keys; delete it when done)"
    return Written((target, backup), (note,))


def _write_out(plan: Plan, out: str, *, progress: CopyProgress | None) -> Written:
    """A complete new adapter folder at ``out``, built in a temp folder beside it and renamed into place."""
    source_dir = plan.ckpt.root if os.path.isdir(plan.ckpt.root) else os.path.dirname(plan.weights_path)
    if inside(out, source_dir):
        raise RefusedError(out, "is inside the input adapter folder; choose a folder outside it")
    check_output_folder(out, make_parents=False)  # a new or empty folder only (remap has no --force)
    with atomic_folder(out) as tmp:
        filled = _fill_out(plan, tmp, progress=progress)
    return Written(tuple(os.path.join(out, w) for w in filled.paths), filled.notes)


def _fill_out(plan: Plan, tmp: str, *, progress: CopyProgress | None) -> Written:
    """Fill the temp folder: the adapter's other files, the config, the renamed weights; their names."""
    ckpt = plan.ckpt
    written: list[str] = []
    notes: list[str] = []
    weights_name = os.path.basename(plan.weights_path)
    skip = {weights_name, ADAPTER_CONFIG}
    if ckpt.kind == "adapter":
        skip |= {ADAPTER_WEIGHTS, ADAPTER_BIN}
        for name in sorted(os.listdir(ckpt.root)):
            src = os.path.join(ckpt.root, name)
            if name in skip or name.startswith(TEMP_PREFIX):
                continue
            if os.path.isdir(src):
                notes.append(f"subfolder {name}/ not copied to --out")
                continue
            if not os.path.isfile(src):
                continue
            shutil.copyfile(src, os.path.join(tmp, name))
            shutil.copymode(src, os.path.join(tmp, name))
            written.append(name)
    if plan.config_path is not None and plan.config_bytes is not None:
        with open(os.path.join(tmp, ADAPTER_CONFIG), "wb") as f:
            f.write(plan.config_bytes)
        written.append(ADAPTER_CONFIG)
    written.append(_fill_weights(plan, tmp, weights_name, progress))
    return Written(tuple(written), tuple(notes))


def _fill_weights(plan: Plan, tmp: str, weights_name: str, progress: CopyProgress | None) -> str:
    """The weights file of the new folder (a .bin as safetensors, the experts' new tensors, or the renamed
    header over the same data); its name."""
    if plan.ckpt.weights_format == "bin":
        target = os.path.basename(_bin_target(plan, tmp))
        data = _bin_bytes(plan)
        dest = os.path.join(tmp, target)
        with open(dest, "wb") as f:
            f.write(data)
        os.chmod(dest, target_mode(plan.weights_path))
        return target
    header = plan.header
    assert header is not None
    dest = os.path.join(tmp, weights_name)
    if plan.compose is not None:
        with _copying(progress, dest, plan) as advance:
            plan.compose(dest, "follow", advance)
        return weights_name
    body = plan.body
    if body is None:
        body = header.raw.rstrip(b" \t\n\r")
    # a new file gets a fresh header padded the way safetensors pads (not the old, possibly padded, length): so a
    # move that had to grow the header (a copy) and its inverse written with --out give back the original bytes
    with _copying(progress, dest, plan) as advance:
        rewrite.rewrite_copy(plan.weights_path, dest, header, body, keep_length=False, progress=advance)
    return weights_name
