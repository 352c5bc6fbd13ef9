"""Every write adapterdoc makes, and the output-path rules of CLI.md, in one place.

Files:

- a regular file (or a new name) is replaced atomically: a temp file beside it, fsync, rename over it, the old
  file's mode kept (a new file gets ``0666 & ~umask``, like any program's);
- a character device, a FIFO, ``/dev/stdout``, ``/dev/fd/N`` or ``/proc/self/fd/N`` is written directly, the way a
  shell redirect does it (``/dev/null`` stays ``/dev/null``; ``--output-file >(wc -c)`` works);
- a symlink is followed and its target is written (atomically when the target is a regular file); the link
  stays. The one exception is an in-place rewrite of an *input* (``link="replace"``, used by remap): there a link
  usually points into content-addressed storage shared by other names (a Hugging Face cache blob, git-annex,
  DVC), so the link is replaced by a regular file and its target is never written;
- a socket, a block device, a folder, or a read-only file or folder (no write permission bits: 0444, 0555) is
  refused with :class:`~adapterdoc.errors.RefusedError` (exit 3) before anything is written.

Folders (``merge --out``, ``remap --out``, ``train-smoke --out``): built as a temp folder beside the target and
renamed into place. The target may be missing or an empty folder; anything else (a file, a device, a symlink) is
refused even with ``--force``, and ``--force`` replaces a non-empty folder only when it holds a previous adapterdoc
output: the :data:`OUTPUT_MARKER` file merge writes into its output (train-smoke recognises its own layout folders
by their ``progress.jsonl``).

A ``PermissionError`` (or a read-only file system, or a full disk) while writing becomes a one-line
:class:`~adapterdoc.errors.RefusedError` naming the path, chained to the OS error.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from adapterdoc.errors import InputNotFoundError, RefusedError
from adapterdoc.st.paths import (
    TEMP_PREFIX,
    Target,
    describe,
    folder_unwritable,
    is_full,
    is_write_refusal,
    new_dir_mode,
    new_file_mode,
    not_writable,
    os_refusal,
    read_only,
    resolve_output,
    slow_point,
    target_mode,
    unwritable,
    writing,
)

__all__ = [  # the writers, and what the callers of the writers import with them
    "OUTPUT_MARKER",
    "TEMP_PREFIX",
    "atomic_folder",
    "atomic_write_bytes",
    "atomic_writer",
    "check_output_folder",
    "ensure_folder",
    "folder_lock",
    "fsync",
    "fsync_tree",
    "is_our_output",
    "is_write_refusal",
    "make_temp_folder",
    "move_aside",
    "new_file_mode",
    "not_writable",
    "os_refusal",
    "prepare_output_folder",
    "read_only",
    "replace_folder",
    "resolve_output",
    "slow_point",
    "target_mode",
    "write_marker",
    "writing",
]

OUTPUT_MARKER = ".adapterdoc-output.json"
"""Written into every output folder adapterdoc builds (which command, which version); ``--force`` replaces a
non-empty folder only when this file is in it."""


# ----------------------------------------------------------------------------------------------------- fsync


def fsync(what: int | str) -> None:
    """The one fsync: an open descriptor (its errors raise: the data may not be on disk), or a file or folder by
    name (a file system that cannot fsync it, or a special file, is not an error)."""
    if isinstance(what, int):
        os.fsync(what)
        return
    with contextlib.suppress(OSError):
        fd = os.open(what, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(folder: str) -> None:
    """fsync every regular file under ``folder``, then every folder bottom-up (before renaming it into place)."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                fsync(path)
        for name in dirs:
            fsync(os.path.join(root, name))
    fsync(folder)


# ----------------------------------------------------------------------------------------------------- files


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike[str], *, mode: int | None = None, link: str = "follow"
) -> Iterator[BinaryIO]:
    """Yield a binary file; on clean exit it replaces ``path`` atomically, or is written through (see the module).

    The temp file lives in the same folder as the file replaced. On any exception the temp file is removed and
    ``path`` is untouched. ``mode`` defaults to the replaced file's mode, else :func:`new_file_mode`.
    """
    target = resolve_output(path, link=link)
    if target.direct:
        with _direct(target) as f:
            yield f
        return
    folder = os.path.dirname(target.real)
    perm = (target_mode(target.real) if target.exists else new_file_mode()) if mode is None else mode
    with writing(target.path):
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            with writing(target.path):
                f.flush()
                os.fchmod(f.fileno(), perm)
                fsync(f.fileno())
        slow_point("before-replace")
        with writing(target.path):
            os.replace(tmp, target.real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync(folder)


@contextlib.contextmanager
def _direct(target: Target) -> Iterator[BinaryIO]:
    """A device, FIFO or descriptor, written the way a shell redirect writes it (a FIFO waits for its reader)."""
    try:
        if target.fd is not None:
            fd = os.dup(target.fd)
        else:
            fd = os.open(target.real, os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.EBADF:
            raise RefusedError(target.path, f"descriptor {target.fd} is not open in this process") from e
        if e.errno == errno.ENXIO:
            raise RefusedError(target.path, "has no reader or device behind it (no such device)") from e
        if is_write_refusal(e):
            raise not_writable(target.path, e) from e
        raise
    with writing(target.path), os.fdopen(fd, "wb") as f:  # a full /dev/full names the path, as a file's would
        yield f
        f.flush()


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, mode: int | None = None, link: str = "follow"
) -> None:
    """Write ``data`` to ``path`` by the rules of :func:`atomic_writer`."""
    with atomic_writer(path, mode=mode, link=link) as f:
        f.write(data)


def move_aside(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` (same folder; e.g. ``adapter_model.bin`` → ``.bin.bak``), durably."""
    with writing(src):
        os.rename(src, dst)
    fsync(os.path.dirname(os.path.abspath(dst)))


# --------------------------------------------------------------------------------------------------- folders


def check_output_folder(
    path: str | os.PathLike[str],
    *,
    force: bool | None = None,
    ours: Callable[[str], bool] | None = None,
    mark: str = OUTPUT_MARKER,
    into: bool = False,
    make_parents: bool = True,
    option: str = "--out",
) -> str:
    """The output-folder rule of every command (``merge``, ``convert``, ``remap``, ``train`` and ``train-smoke
    --out``, ``roundtrip --keep``): refuse with exit 3 (nothing written) a folder adapterdoc may not write; return
    its absolute path.

    Allowed: a missing path whose nearest existing folder above it is writable (the folder is made there), an empty
    folder, and a non-empty folder that ``ours`` recognises (default: it holds :data:`OUTPUT_MARKER`; ``mark``
    names what ``ours`` looks for, in the message) when ``force`` is true or the command writes ``into`` it (train
    continues or restarts its own run there; the caller decides). Refused: a symlink, dangling or not (adapterdoc
    neither writes an output folder through a link nor replaces the link), anything else that is not a folder, a
    read-only folder, a path below a file or a broken symlink, and, without ``make_parents``, a missing parent
    folder. ``force=None``: the command has no ``--force``. ``option`` names the option in messages.
    """
    spath = os.fspath(path)
    out = os.path.abspath(spath)
    ours = ours or is_our_output
    try:
        st = os.lstat(out)
    except (FileNotFoundError, NotADirectoryError):  # missing, or below a file: the walk up says which
        st = None
    if st is not None:
        _check_existing_folder(spath, out, st, force=force, ours=ours, mark=mark, into=into, option=option)
    if st is None or not into:  # made in the folder above, or built beside it and renamed into place
        _check_folder_above(spath, out, make_parents=make_parents, option=option)
    return out


def _check_existing_folder(
    spath: str,
    out: str,
    st: os.stat_result,
    *,
    force: bool | None,
    ours: Callable[[str], bool],
    mark: str,
    into: bool,
    option: str,
) -> None:
    """What is at ``out`` (``st``, not followed): a writable folder, empty or one adapterdoc may reuse."""
    if stat.S_ISLNK(st.st_mode):
        broken = "" if os.path.exists(out) else "broken "
        raise RefusedError(
            spath,
            f"is a {broken}symlink (to {os.path.realpath(out)}); adapterdoc neither writes an output folder "
            "through a link nor replaces the link: give the real folder or a new path",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise RefusedError(spath, f"is {describe(st)}, not a folder; give a new or empty folder for {option}")
    if read_only(out, st):
        raise RefusedError(spath, f"folder is {unwritable(out, st)}")
    entries = sorted(os.listdir(out))
    if not entries or ((force or into) and ours(out)):
        return
    if not force:
        hint = "pass --force to replace a previous adapterdoc output" if force is not None else ""
        raise RefusedError(
            spath, f"is not empty; refusing to overwrite it ({hint or 'choose a new or empty folder'})"
        )
    raise RefusedError(
        spath,
        f"is a folder adapterdoc did not write (no {mark} in it); it holds {_listing(entries)}; "
        "only adapterdoc's own output folders are replaced: choose another folder or empty it yourself",
    )


def _check_folder_above(spath: str, out: str, *, make_parents: bool, option: str) -> None:
    """The nearest existing path above ``out`` must be a writable folder (a symlink to one is fine: only the output
    folder itself is never a link); without ``make_parents`` it must be ``out``'s parent."""
    parent = os.path.dirname(out)
    folder = parent
    while not os.path.lexists(folder):
        folder = os.path.dirname(folder)  # the root always exists
    try:
        st = os.stat(folder)
    except OSError:
        st = None
    if st is None or not stat.S_ISDIR(st.st_mode):
        what = f"a broken symlink (to {os.path.realpath(folder)})" if st is None else describe(st)
        raise RefusedError(spath, f"{folder} is {what}, not a folder; choose another {option}")
    if folder != parent and not make_parents:
        raise InputNotFoundError(parent, f"the parent folder of {option} does not exist")
    if read_only(folder, st):
        raise RefusedError(
            folder,
            f"{folder_unwritable(folder, st)}; {spath} is made in it: make it writable or choose another {option}",
        )


def _listing(entries: list[str], most: int = 5) -> str:
    shown = ", ".join(entries[:most])
    more = len(entries) - most
    return f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: {shown}" + (
        f" and {more} more" if more > 0 else ""
    )


def is_our_output(folder: str) -> bool:
    """Whether ``folder`` holds a previous adapterdoc output (the marker file is a regular file in it)."""
    marker = os.path.join(folder, OUTPUT_MARKER)
    return os.path.isfile(marker) and not os.path.islink(marker)


def write_marker(folder: str, command: str, **info: Any) -> None:
    """Mark ``folder`` as this command's output (so a later ``--force`` may replace it)."""
    from adapterdoc import __version__

    body = {"written_by": f"adapterdoc {command}", "version": __version__, **info}
    path = os.path.join(folder, OUTPUT_MARKER)
    with writing(path), open(path, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def make_temp_folder(out: str) -> str:
    """A temp folder beside ``out`` (parents made), mode ``0777 & ~umask``, to be :func:`replace_folder`-ed."""
    parent = os.path.dirname(os.path.abspath(out))
    with writing(parent):
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent)
    os.chmod(tmp, new_dir_mode())
    return tmp


def replace_folder(
    tmp: str, out: str, *, force: bool = False, ours: Callable[[str], bool] | None = None
) -> None:
    """fsync ``tmp`` and rename it to ``out``: over a missing or empty folder atomically; over a previous output
    (checked by :func:`check_output_folder`) via a rename aside, then removed. Re-checks what is at ``out`` now."""
    fsync_tree(tmp)
    slow_point("before-replace")
    ours = ours or is_our_output
    parent = os.path.dirname(os.path.abspath(out))
    with writing(parent):
        st = _lstat(out)
        if st is None or (stat.S_ISDIR(st.st_mode) and not os.listdir(out)):
            os.replace(tmp, out)  # rename(2) replaces an empty folder atomically
        elif force and stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode) and ours(out):
            old = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent)
            os.rmdir(old)
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            what = "something" if st is None else describe(st)
            raise RefusedError(
                out, f"{what} appeared here while adapterdoc was writing; refusing to replace it"
            )
    fsync(parent)


@contextlib.contextmanager
def atomic_folder(
    out: str, *, force: bool = False, ours: Callable[[str], bool] | None = None
) -> Iterator[str]:
    """The one atomic folder swap: yield a temp folder beside ``out`` to fill; on clean exit it replaces ``out``
    (:func:`replace_folder`), on any exception it is removed and ``out`` is untouched."""
    tmp = make_temp_folder(out)
    try:
        yield tmp
        replace_folder(tmp, out, force=force, ours=ours)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_full(e):  # whatever file was being read or written, it is this folder that did not fit
            raise RefusedError(out, "no space left on the device (or over quota)") from e
        raise


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def prepare_output_folder(
    path: str, *, ours: Callable[[str], bool] | None = None, mark: str = OUTPUT_MARKER
) -> None:
    """Make ``path`` an empty folder to write into directly: a missing or empty folder, or a previous output
    (``ours``) which is removed first; anything else is refused by :func:`check_output_folder`."""
    out = check_output_folder(path, force=True, ours=ours, mark=mark)
    with writing(path):
        if os.path.isdir(out) and os.listdir(out):
            shutil.rmtree(out)
        os.makedirs(out, exist_ok=True)


def ensure_folder(path: str, *, option: str = "--out") -> str:
    """A folder adapterdoc writes *into* (new entries only, nothing in it replaced): made if missing; whatever
    :func:`check_output_folder` refuses (a file, a symlink, a read-only folder) is refused. Returns its absolute
    path."""
    out = check_output_folder(path, ours=_any_folder, into=True, option=option)
    with writing(out):
        os.makedirs(out, exist_ok=True)
    return out


def _any_folder(folder: str) -> bool:
    """Every folder may take new entries (:func:`ensure_folder`'s ``ours``)."""
    return True


# ----------------------------------------------------------------------------------------------------- locks


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
