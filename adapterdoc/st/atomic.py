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
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from adapterdoc.errors import InputNotFoundError, RefusedError

TEMP_PREFIX = ".adapterdoc-tmp-"
"""Every temp file or folder adapterdoc creates starts with this; leftovers from a killed run are safe to delete."""
OUTPUT_MARKER = ".adapterdoc-output.json"
"""Written into every output folder adapterdoc builds (which command, which version); ``--force`` replaces a
non-empty folder only when this file is in it."""

_FD_PATH = re.compile(r"^/(?:dev/fd|proc/(?:self|thread-self|\d+)/fd)/(\d+)$")
_STD_FD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_MAX_LINKS = 40
_NOT_WRITABLE = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}


# ------------------------------------------------------------------------------------------------- modes and fsync


def umask() -> int:
    """The process umask: from ``/proc/self/status`` where Linux has it (no window in which another thread would
    create a file under umask 0), else by setting and restoring it."""
    with (
        contextlib.suppress(OSError, ValueError),
        open("/proc/self/status", encoding="ascii", errors="replace") as f,
    ):
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode a new file gets: ``0666`` less the umask (0644 under the usual 022)."""
    return 0o666 & ~umask()


def new_dir_mode() -> int:
    """The mode a new folder gets: ``0777`` less the umask (0755 under the usual 022)."""
    return 0o777 & ~umask()


def target_mode(path: str, default: int | None = None) -> int:
    """The permission bits a replacement should get: the existing file's (through a link), else ``default``
    (else :func:`new_file_mode`)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return new_file_mode() if default is None else default


def fsync_path(path: str) -> None:
    """fsync a file or folder by name; a file system that cannot (or a special file) is not an error."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
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
                fsync_path(path)
        for name in dirs:
            fsync_path(os.path.join(root, name))
    fsync_path(folder)


# -------------------------------------------------------------------------------------------- what a path is


def describe(st: os.stat_result) -> str:
    """``a regular file``, ``a character device``, ... for messages."""
    mode = st.st_mode
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def read_only(path: str, st: os.stat_result | None = None) -> bool:
    """No write permission bits at all (0444, 0555), or no write access for this user.

    The bits are checked as well as :func:`os.access` because root passes ``access`` on every local file: a file
    or folder someone made read-only is still refused when adapterdoc runs as root (the usual CI container).
    """
    st = st or os.stat(path)
    return not st.st_mode & 0o222 or not os.access(path, os.W_OK)


@dataclass(frozen=True)
class Target:
    """Where a write to an output path really goes."""

    path: str
    """What the user named."""
    real: str
    """The file written: ``path`` with its symlinks followed (``path`` itself with ``link="replace"``)."""
    direct: bool
    """Written directly (a device, FIFO or file descriptor), not replaced."""
    fd: int | None = None
    """For ``/dev/stdout``, ``/dev/fd/N`` and ``/proc/self/fd/N``: the descriptor to write (a duplicate of it)."""
    exists: bool = False
    """``real`` exists (a regular file that the write replaces)."""


def resolve_output(path: str | os.PathLike[str], *, link: str = "follow") -> Target:
    """Classify an output file path by CLI.md's rules; refuse (nothing written) what may not be written.

    ``link="follow"`` (outputs the user names) writes a symlink's target; ``link="replace"`` (in-place rewrites of
    inputs) replaces the link itself.
    """
    spath = os.fspath(path)
    if link not in ("follow", "replace"):
        raise ValueError(f"link must be 'follow' or 'replace', not {link!r}")
    current = os.path.abspath(spath)
    for _ in range(_MAX_LINKS):
        fd = _fd_of(current)
        if fd is not None:
            return Target(spath, current, direct=True, fd=fd if fd >= 0 else None)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return _new_file(spath, current)
        except NotADirectoryError as e:
            raise InputNotFoundError(spath, "a part of the path is not a folder") from e
        if stat.S_ISLNK(st.st_mode) and link == "follow":
            here = os.path.realpath(os.path.dirname(current))
            current = os.path.normpath(os.path.join(here, os.readlink(current)))
            continue
        if stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode):
            if stat.S_ISREG(st.st_mode) and read_only(current, st):
                raise RefusedError(
                    spath,
                    f"is read-only (mode {stat.S_IMODE(st.st_mode):04o}); make it writable or choose another path",
                )
            _check_folder_writable(spath, os.path.dirname(current))
            return Target(spath, current, direct=False, exists=True)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return Target(spath, current, direct=True)
        what = describe(st)
        if stat.S_ISDIR(st.st_mode):
            raise RefusedError(spath, "is a folder; give a file path")
        raise RefusedError(
            spath, f"is {what}; adapterdoc writes to regular files, character devices and pipes"
        )
    raise RefusedError(spath, f"more than {_MAX_LINKS} symlinks (a loop?)")


def _fd_of(path: str) -> int | None:
    """For a path naming a file descriptor (``/dev/stdout``, ``/dev/fd/N``, ``/proc/PID/fd/N``): the descriptor
    number when it is this process's, ``-1`` for another process's (opened by name); ``None`` for other paths."""
    if path in _STD_FD:
        return _STD_FD[path]
    m = _FD_PATH.match(path)
    if m is None:
        return None
    if path.startswith("/proc/") and path.split("/")[2] not in ("self", "thread-self", str(os.getpid())):
        return -1
    return int(m.group(1))


def _new_file(spath: str, real: str) -> Target:
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        raise InputNotFoundError(spath, f"the folder {folder} does not exist")
    _check_folder_writable(spath, folder)
    return Target(spath, real, direct=False)


def _check_folder_writable(spath: str, folder: str) -> None:
    st = os.stat(folder)
    if read_only(folder, st):
        raise RefusedError(
            folder,
            f"folder is not writable (mode {stat.S_IMODE(st.st_mode):04o}); {spath} is written as a temp file "
            "beside it and renamed; make the folder writable or choose another path",
        )


def not_writable(path: str, e: OSError) -> RefusedError:
    """The one-line refusal for an OS error that says the path cannot be written (see :func:`writing`)."""
    what = e.filename if isinstance(e.filename, str) and e.filename else path
    if os.path.basename(what).startswith(TEMP_PREFIX):
        what = os.path.dirname(what)  # the temp file beside the target: it is the folder that refuses
    if e.errno == errno.EROFS:
        return RefusedError(what, "is on a read-only file system")
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return RefusedError(what, "no space left on the device (or over quota)")
    reason = _NOT_WRITABLE.get(e.errno or 0, e.strerror or "cannot be written")
    if os.path.isdir(what):
        return RefusedError(what, f"folder is not writable ({reason})")
    return RefusedError(what, f"is not writable ({reason})")


def os_refusal(e: OSError) -> RefusedError:
    """The one-line refusal for a "cannot write here" OS error met outside :func:`writing` (read or write unknown):
    a temp file of ours names its folder as not writable, anything else says what the system said."""
    what = e.filename if isinstance(e.filename, str) and e.filename else ""
    if os.path.basename(what).startswith(TEMP_PREFIX) or e.errno not in _NOT_WRITABLE:
        return not_writable(what, e)
    return RefusedError(what or None, _NOT_WRITABLE[e.errno or 0])


_WRITE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def is_write_refusal(e: BaseException) -> bool:
    """An OS error that means "cannot write here" (permissions, read-only file system, full disk)."""
    return isinstance(e, OSError) and (isinstance(e, PermissionError) or e.errno in _WRITE_ERRNOS)


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """Turn "cannot write here" OS errors inside the block into a one-line refusal about ``path``."""
    try:
        yield
    except OSError as e:
        if not is_write_refusal(e):
            raise
        raise not_writable(path, e) from e


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
                os.fsync(f.fileno())
        _slow_point("before-replace")
        with writing(target.path):
            os.replace(tmp, target.real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_path(folder)


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
    fsync_path(os.path.dirname(os.path.abspath(dst)))


# --------------------------------------------------------------------------------------------------- folders


def check_output_folder(
    path: str | os.PathLike[str],
    *,
    force: bool | None = None,
    ours: Callable[[str], bool] | None = None,
    mark: str = OUTPUT_MARKER,
) -> str:
    """Refuse (nothing written) an output folder adapterdoc may not replace; return its absolute path.

    Allowed: a missing path (its parent must be a writable folder, or missing, to be made), an empty folder, and,
    when ``force`` is true, a folder that ``ours`` recognises (default: it holds :data:`OUTPUT_MARKER`; ``mark``
    names what ``ours`` looks for, in the message). ``force=None`` means the command has no ``--force``.
    """
    spath = os.fspath(path)
    out = os.path.abspath(spath)
    ours = ours or is_our_output
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except NotADirectoryError as e:
        raise RefusedError(spath, "a part of the path is not a folder") from e
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise RefusedError(
                spath,
                f"is a symlink (to {os.path.realpath(out)}); the output folder is replaced, which would replace "
                "the link: give the real folder or a new path",
            )
        if not stat.S_ISDIR(st.st_mode):
            raise RefusedError(
                spath,
                f"is {describe(st)}, not a folder; give a new or empty folder (--force does not change this)",
            )
        if read_only(out, st):
            raise RefusedError(spath, f"folder is read-only (mode {stat.S_IMODE(st.st_mode):04o})")
        entries = sorted(os.listdir(out))
        if entries:
            if not force:
                hint = "pass --force to replace a previous adapterdoc output" if force is not None else ""
                raise RefusedError(
                    spath,
                    f"is not empty; refusing to overwrite it ({hint or 'choose a new or empty folder'})",
                )
            if not ours(out):
                raise RefusedError(
                    spath,
                    f"is a folder adapterdoc did not write (no {mark} in it); it holds {_listing(entries)}; "
                    "only adapterdoc's own output folders are replaced: choose another folder or empty it yourself",
                )
    parent = _existing_ancestor(os.path.dirname(out))
    pst = os.stat(parent)
    if read_only(parent, pst):
        raise RefusedError(
            parent,
            f"folder is not writable (mode {stat.S_IMODE(pst.st_mode):04o}); {spath} is built beside it first",
        )
    return out


def _existing_ancestor(folder: str) -> str:
    while not os.path.exists(folder):
        up = os.path.dirname(folder)
        if up == folder:
            break
        folder = up
    if not os.path.isdir(folder):
        raise RefusedError(folder, "is not a folder")
    return folder


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
    _slow_point("before-replace")
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
    fsync_path(parent)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def prepare_output_folder(
    path: str, *, ours: Callable[[str], bool] | None = None, mark: str = OUTPUT_MARKER
) -> None:
    """Make ``path`` an empty folder to write into directly: a missing or empty folder, or a previous output
    (``ours``) which is removed first; anything else is refused as by :func:`check_output_folder`."""
    out = check_output_folder(path, force=True, ours=ours, mark=mark)
    with writing(path):
        if os.path.isdir(out) and os.listdir(out):
            shutil.rmtree(out)
        os.makedirs(out, exist_ok=True)


def ensure_folder(path: str, *, option: str = "--out") -> str:
    """A folder adapterdoc writes *into* (new entries only, nothing in it replaced): made if missing; a file, device
    or other non-folder there is refused. Returns its absolute path."""
    out = os.path.abspath(path)
    if os.path.lexists(out) and not os.path.isdir(out):
        raise RefusedError(path, f"is {describe(os.lstat(out))}, not a folder; give a folder for {option}")
    with writing(out):
        os.makedirs(out, exist_ok=True)
    if read_only(out):
        raise RefusedError(path, f"folder is not writable (mode {stat.S_IMODE(os.stat(out).st_mode):04o})")
    return out


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


def _slow_point(name: str) -> None:
    """Test hook: ``ADAPTERDOC_SLOW_WRITES=SECONDS`` sleeps at write checkpoints to widen crash windows."""
    delay = os.environ.get("ADAPTERDOC_SLOW_WRITES")
    if delay:
        import time

        time.sleep(float(delay))


slow_point = _slow_point
