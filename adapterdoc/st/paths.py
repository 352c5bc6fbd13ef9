"""What an output path is and whether adapterdoc may write it: file modes, the kinds of path CLI.md's output rules
tell apart, the one writability check, and the one-line refusals that "cannot write here" OS errors become; and
why an input file cannot be read (:func:`cannot_read`).

The writers themselves (temp file or folder, fsync, rename) are in :mod:`adapterdoc.st.atomic`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from adapterdoc.errors import InputNotFoundError, RefusedError

TEMP_PREFIX = ".adapterdoc-tmp-"
"""Every temp file or folder adapterdoc creates starts with this; leftovers from a killed run are safe to delete."""

_FD_PATH = re.compile(r"^/(?:dev/fd|proc/(?:self|thread-self|\d+)/fd)/(\d+)$")
_STD_FD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_MAX_LINKS = 40
_NOT_WRITABLE = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted"}

# ----------------------------------------------------------------------------------------------------- modes


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


def cannot_read(path: str) -> str | None:
    """For an input: why ``path`` cannot be read as a file (``cannot read: Permission denied``, ``is a FIFO (named
    pipe), not a regular file``, ``is a broken symlink``), or ``None``. A FIFO or device is never opened (that could
    block)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"is a broken symlink (to {os.readlink(path)})" if os.path.islink(path) else "not found"
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    if not stat.S_ISREG(st.st_mode):
        return f"is {describe(st)}, not a regular file"
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    return None


_FS_IOC_GETFLAGS = 0x80086601  # Linux <linux/fs.h>; FS_IMMUTABLE_FL 0x10, FS_APPEND_FL 0x20
_ATTRIBUTES = ((0x10, "immutable", "i"), (0x20, "append-only", "a"))


def unwritable(path: str, st: os.stat_result | None = None) -> str:
    """Why :func:`read_only` refuses ``path``, for ``<path>: is <this>``: its mode has no write bits, or (bits
    there, the system refuses anyway) a ``chattr`` attribute, a read-only mount, or this user's access."""
    st = st or os.stat(path)
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o222:
        return f"read-only (mode {mode:04o})"
    flags = _attribute_flags(path)
    for bit, name, letter in _ATTRIBUTES:
        if flags & bit:
            return f"{name} (chattr +{letter}: no write goes through, whatever its mode {mode:04o}; `chattr -{letter}` undoes it)"
    with contextlib.suppress(OSError):
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "on a read-only file system"
    return f"not writable for this user (mode {mode:04o}, owner uid {st.st_uid})"


def folder_unwritable(path: str, st: os.stat_result | None = None) -> str:
    """``folder is not writable (mode 0555)``, or the reason :func:`unwritable` finds when the bits allow it."""
    st = st or os.stat(path)
    reason = unwritable(path, st)
    if reason.startswith("read-only"):
        return f"folder is not writable (mode {stat.S_IMODE(st.st_mode):04o})"
    return f"folder is not writable: it is {reason}"


def _attribute_flags(path: str) -> int:
    try:
        import fcntl
        import struct

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except (ImportError, OSError):
        return 0
    try:
        buf = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("l", 0))
        return int(struct.unpack("l", buf)[0])
    except OSError:
        return 0
    finally:
        os.close(fd)


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
                    spath, f"is {unwritable(current, st)}; make it writable or choose another path"
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
            f"{folder_unwritable(folder, st)}; {spath} is written as a temp file "
            "beside it and renamed; make the folder writable or choose another path",
        )


def not_writable(path: str, e: OSError) -> RefusedError:
    """The one-line refusal for an OS error that says the path cannot be written (see :func:`writing`)."""
    full = is_full(e)
    what = e.filename if isinstance(e.filename, str) and e.filename else path
    if full and isinstance(e.filename2, str) and e.filename2:
        what = e.filename2  # shutil's copies name the source first: the destination is what filled the disk
    if os.path.basename(what).startswith(TEMP_PREFIX):
        what = os.path.dirname(what)  # the temp file beside the target: it is the folder that refuses
    if e.errno == errno.EROFS:
        return RefusedError(what, "is on a read-only file system")
    if full:
        return RefusedError(_written_folder(what), "no space left on the device (or over quota)")
    reason = _NOT_WRITABLE.get(e.errno or 0, e.strerror or "cannot be written")
    if os.path.isdir(what):
        return RefusedError(what, f"folder is not writable ({reason})")
    return RefusedError(what, f"is not writable ({reason})")


def _written_folder(what: str) -> str:
    """The folder a full disk is reported against: a file's folder (a temp folder of ours, the folder it was made
    in); a folder, a device or a pseudo name (``stdout``) stays what it is."""
    if not what or (os.sep not in what and not os.path.exists(what)):
        return what
    if os.path.exists(what) and not os.path.isfile(what):
        return what  # a folder, /dev/full and the like
    path = os.path.dirname(os.path.abspath(what))
    while os.path.basename(path).startswith(TEMP_PREFIX):
        path = os.path.dirname(path)
    return path


def is_full(e: BaseException) -> bool:
    """A full disk or an exhausted quota."""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


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


def check_writable(path: str, *, temp_beside: bool = True, why: str = "", fix: str = "use --out DIR") -> None:
    """Refuse (nothing touched) a rewrite of the existing ``path``: a read-only regular file, or, when the write
    puts a temp file beside it (``temp_beside``), a read-only folder (``why`` says why the folder matters)."""
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode) and read_only(path, st):
        raise RefusedError(path, f"is {unwritable(path, st)}; make it writable or {fix}")
    folder = os.path.dirname(os.path.abspath(path))
    if temp_beside and read_only(folder):
        raise RefusedError(folder, f"folder is not writable{why}; {fix}")


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it, both with their symlinks followed."""
    child, parent = os.path.realpath(os.path.abspath(path)), os.path.realpath(os.path.abspath(folder))
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def check_not_an_input(dest: str, shown: str, inputs: Sequence[tuple[str, str | None]], command: str) -> None:
    """Refuse (exit 3, ``--force`` or not) a ``dest`` that is one of the command's inputs, lies inside one (new or
    not: an output is never written into an input's folder) or holds one; ``inputs``: (label, path) pairs, a None
    path skipped."""
    for label, root in inputs:
        if root is None:
            continue
        if inside(dest, root) and inside(root, dest):
            where = f"is {label}"
        elif inside(dest, root):
            where = f"is inside {label} {root}"
        elif inside(root, dest):
            where = f"holds {label} {root}"
        else:
            continue
        raise RefusedError(
            shown, f"{where}; {command} never replaces an input (--force does not change this)"
        )


def slow_point(name: str) -> None:
    """Test hook: ``ADAPTERDOC_SLOW_WRITES=SECONDS`` sleeps at write checkpoints to widen crash windows."""
    delay = os.environ.get("ADAPTERDOC_SLOW_WRITES")
    if delay:
        import time

        time.sleep(float(delay))
