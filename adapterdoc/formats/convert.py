"""``adapterdoc convert ADAPTER --to FORMAT``: detect the source format, go through PEFT (the hub), write ``--out``.

Inputs: a PEFT adapter folder (or one ``.safetensors`` file of PEFT keys), an mlx-lm adapter folder
(``adapters.safetensors``), one GGUF LoRA file. An input that cannot be read says why (``cannot read: Permission
denied``, ``is a FIFO (named pipe), not a regular file``) rather than "not an adapter".

``--out`` follows CLI.md's output rules (:mod:`adapterdoc.st.atomic`), as ``merge --out`` does:

- a folder target (PEFT, MLX) is a new or empty folder; with ``--force`` also a previous adapterdoc output folder
  (its :data:`~adapterdoc.st.atomic.OUTPUT_MARKER`, which convert writes into every output folder). It is built
  beside the target and swapped in atomically; a file, a device or a symlink there is refused, ``--force`` or not;
- a file target (GGUF) is a new file; with ``--force`` also an existing GGUF adapter (a previous output), replaced
  atomically. Any other existing file is refused. A symlink is refused, ``--force`` or not: convert never writes
  through a link into another file (a Hugging Face cache blob, git-annex), and CLI.md never replaces a link. A
  character device, a FIFO or ``/dev/stdout`` is written through, the way a shell redirect does (``--out
  /dev/null`` writes nothing anywhere; nothing is replaced, so it needs no ``--force``);
- never the input or inside an input folder; an existing path that is one of the command's inputs (the adapter,
  the ``--base`` folder or any file in it) or holds one is refused even with ``--force``; the parent must exist.

Without ``--out`` the result goes beside the input as ``<input>-<format>`` (``<input>.gguf`` for GGUF), under the
same rules. A hop through PEFT (MLX → GGUF) uses a temporary folder beside the output, removed afterwards.
``--outtype`` re-casts in the last hop only, so values are rounded at most once. A format module's note that starts
with a finding code (``AD806: ...``) becomes that finding of the report.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from types import ModuleType

from adapterdoc import formats
from adapterdoc.errors import (
    AdapterdocError,
    InputNotFoundError,
    RefusedError,
    UnsupportedInputError,
)
from adapterdoc.formats import Converted
from adapterdoc.report.convert_report import ConvertReport
from adapterdoc.report.findings import Finding

_CODE_NOTE = re.compile(r"^(AD\d{3}): (.+)$", re.S)


def _module(name: str, role: str) -> ModuleType:
    try:
        return formats.module(name)
    except ImportError:
        raise UnsupportedInputError(
            name,
            f"the {name} format is not available in this adapterdoc (no adapterdoc.formats.{name}) ({role})",
        ) from None


def _resolve_input(spec: str) -> str:
    path = os.path.expanduser(spec)
    if os.path.lexists(path):
        return path
    from adapterdoc.bases import match_repo_id, resolve_cached_repo

    m = match_repo_id(spec)
    if m:
        return resolve_cached_repo(m["repo"], m["rev"])
    raise InputNotFoundError(spec, "no such file or directory")


def is_file_format(mod: object) -> bool:
    """Whether a format's output is one file (GGUF) rather than a folder."""
    return bool(getattr(mod, "SUFFIX", "")) or getattr(mod, "NAME", "") == "gguf"


def default_out(src: str, to: str, mod: object) -> str:
    stem = os.path.abspath(src).rstrip(os.sep)
    if os.path.isfile(stem):
        stem = os.path.splitext(stem)[0]
    if is_file_format(mod):
        return stem + (getattr(mod, "SUFFIX", "") or f".{to}")
    return f"{stem}-{to}"


def convert(
    spec: str,
    to: str,
    *,
    base: str | None = None,
    out: str | None = None,
    outtype: str | None = None,
    force: bool = False,
) -> ConvertReport:
    """Convert the adapter ``spec`` to format ``to``; refusals raise (exit 3) before anything is written."""
    from adapterdoc.formats.cast import OUTTYPES
    from adapterdoc.report.findings import make
    from adapterdoc.st.atomic import check_output_folder
    from adapterdoc.st.paths import inside

    if to not in formats.FORMATS:
        raise UnsupportedInputError(to, f"is not a format; choose one of {', '.join(formats.FORMATS)}")
    if outtype is not None and outtype not in OUTTYPES:
        raise UnsupportedInputError(outtype, f"is not an --outtype; choose one of {', '.join(OUTTYPES)}")
    src = _resolve_input(spec)
    found = formats.detect(Path(src))
    if found is None:
        raise _not_an_adapter(spec, src)
    source = _module(found.format, "the input's format")
    target = _module(to, "the target format")
    dest = os.path.abspath(os.path.expanduser(out)) if out else default_out(src, to, target)
    shown = out or dest
    folder_in = (
        src if os.path.isdir(src) else None
    )  # a one-file input (GGUF): only the file itself is off limits
    if inside(src, dest) or (folder_in is not None and inside(dest, folder_in)):
        raise RefusedError(shown, "is the input or inside the input adapter folder; choose a path outside it")
    parent = os.path.dirname(dest)
    if is_file_format(target) and not os.path.isdir(parent):  # check_output_folder says it for a folder
        raise InputNotFoundError(parent, "the parent folder of --out does not exist")
    check_not_an_input(dest, shown, src, base)
    if is_file_format(target):
        direct = check_output_file(dest, shown, force=force)
    else:
        check_output_folder(dest, force=force, make_parents=False)
        direct = False
    route = [found.format, to] if "peft" in (found.format, to) else [found.format, "peft", to]
    require_extras(route)
    done, weights = _write(
        source,
        target,
        src,
        dest,
        route=route,
        names=(spec, shown),
        base=base,
        outtype=outtype,
        force=force,
        direct=direct,
        beside=None if direct else parent,
    )
    findings, notes = [], []
    for note in done.notes:
        m = _CODE_NOTE.match(note)
        if m:
            findings.append(make(m[1], m[2], path=os.fspath(done.out)))
        else:
            notes.append(note)
    findings += [dataclasses.replace(f, path=os.fspath(done.out)) for f in weights]
    return ConvertReport(
        input=spec,
        source_format=found.format,
        target_format=to,
        out=os.fspath(done.out),
        tensors=done.tensors,
        evidence=tuple(found.evidence),
        route=tuple(route),
        outtype=outtype,
        notes=tuple(notes),
        findings=findings,
    )


def written_weights(out: str, target: ModuleType, base: str | None) -> list[Finding]:
    """The doctor's weight findings (AD3xx: every ``lora_B`` zero, NaN/Inf, an inert share) on what was written,
    read back through its PEFT view (:func:`adapterdoc.formats.foreign.peft_view`): a conversion that writes an
    adapter which changes nothing says so. ``out`` is the file or folder as written, before it is moved into place
    or copied to a device."""
    from adapterdoc.formats.foreign import peft_view
    from adapterdoc.verify.options import VerifyOptions
    from adapterdoc.verify.run import verify_static

    if target.NAME == "peft":
        findings = verify_static(out, VerifyOptions()).findings
    else:
        with peft_view(Path(out), target, base) as view:
            findings = verify_static(os.fspath(view), VerifyOptions()).findings
    return [dataclasses.replace(f, path=out, line=None) for f in findings if f.code.startswith("AD3")]


def require_extras(route: list[str]) -> None:
    """Exit 3 naming the extra to install when a format of ``route`` reads or writes its tensors with a package
    that is not installed (its ``READ_EXTRA``: GGUF's numpy and gguf-py); MLX and PEFT need only the base install."""
    from adapterdoc.formats.foreign import require_read_extra

    for name in route:
        require_read_extra(formats.module(name), f"convert {' → '.join(route)}")


def _write(
    source: ModuleType,
    target: ModuleType,
    src: str,
    dest: str,
    *,
    route: list[str],
    names: tuple[str, str],
    base: str | None,
    outtype: str | None,
    force: bool,
    direct: bool,
    beside: str | None,
) -> tuple[Converted, list[Finding]]:
    """Run the conversion along ``route``, check what it wrote (:func:`written_weights`) and put it in place. A file
    target is written by its format module atomically; for a ``direct`` target (a device, a FIFO, ``/dev/stdout``)
    it is written into the work folder and then copied through, since a writer may seek. A folder target is built
    in the work folder, marked as convert's output and swapped in over ``dest`` (over a previous output only with
    ``force``). The work folder (and the PEFT hop of MLX → GGUF) lies in ``beside`` (the output's folder; the
    system's temp folder for a device) and is removed whatever happens. ``names``: the input and the output as the
    user gave them, for errors that name a path in the work folder."""
    from adapterdoc.st.atomic import atomic_writer, replace_folder, write_marker
    from adapterdoc.st.paths import inside

    spec, shown = names
    work = tempfile.mkdtemp(prefix=".adapterdoc-convert-", dir=beside)
    hub, staged = os.path.join(work, "peft"), os.path.join(work, "out")
    folder = not is_file_format(target)
    into = staged if folder or direct else dest
    try:
        if route[0] == "peft":
            done = target.from_peft(Path(src), Path(into), base=base, outtype=outtype)
        elif route[-1] == "peft":
            done = source.to_peft(Path(src), Path(into), base=base, outtype=outtype)
        else:
            first = source.to_peft(Path(src), Path(hub), base=base, outtype=None)
            done = target.from_peft(Path(hub), Path(into), base=base, outtype=outtype)
            done = dataclasses.replace(done, source_format=route[0], notes=(*first.notes, *done.notes))
        weights = written_weights(into, target, base)
        if folder:
            write_marker(staged, "convert", input=spec, to=route[-1])
            replace_folder(staged, dest, force=force)
        elif direct:
            with open(staged, "rb") as f, atomic_writer(dest) as out:
                shutil.copyfileobj(f, out)
    except AdapterdocError as e:
        if e.what is not None and inside(e.what, hub):  # the temporary PEFT folder: name the input
            e.what = spec
        elif e.what is not None and inside(e.what, staged):  # the folder being built: name the output
            e.what = shown
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dataclasses.replace(done, out=Path(dest)), weights


def check_not_an_input(dest: str, shown: str, src: str, base: str | None) -> None:
    """Refuse an existing ``dest`` that is one of convert's inputs, lies inside one or holds one (the adapter, the
    ``--base`` folder or a file in it), ``--force`` or not; a new path is not an input."""
    from adapterdoc.st import paths

    inputs = (("the input adapter", src), ("the --base folder", _base_root(base)))
    paths.check_not_an_input(dest, shown, inputs, "convert")


def _base_root(base: str | None) -> str | None:
    """The folder ``--base`` is read from (a model folder, the folder of its config.json, a cached snapshot), or
    the path itself when it does not resolve as a base; ``None`` for ``tiny:`` and a missing base."""
    if base is None:
        return None
    from adapterdoc.bases import resolve_base

    try:
        return resolve_base(base).root
    except AdapterdocError:
        path = os.path.expanduser(base)
        return path if os.path.lexists(path) else None


def check_output_file(dest: str, shown: str, *, force: bool) -> bool:
    """Refuse (nothing written) a file output convert may not write; return whether it is written through (a
    device, a FIFO, a descriptor) rather than replaced. See the module's rules."""
    from adapterdoc.st.paths import resolve_output

    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    target = resolve_output(dest)  # a missing folder, a read-only file or folder, a socket: refused here
    if target.direct:
        return True
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise RefusedError(
            shown,
            f"is a symlink (to {os.path.realpath(dest)}); convert neither writes through a link into another "
            "file nor replaces the link: give the real path or a new one",
        )
    if st is None:
        return False
    if not force:
        raise RefusedError(
            shown, "exists; refusing to overwrite it (pass --force to replace a previous GGUF adapter)"
        )
    if not _is_gguf_adapter(dest):
        raise RefusedError(
            shown,
            "is not a GGUF adapter; --force replaces only a previous GGUF adapter output: choose another path",
        )
    return False


def _is_gguf_adapter(path: str) -> bool:
    """A GGUF file whose header reads as a LoRA adapter (``general.type = adapter`` or lora_a/lora_b tensors)."""
    from adapterdoc.formats.gguf.header import is_gguf, is_model, read_header

    if not is_gguf(path):
        return False
    try:
        return not is_model(read_header(path))
    except AdapterdocError:
        return False


_DECIDING = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", "adapters.safetensors")
"""The files of an adapter folder whose reading decides its format (PEFT's and mlx-lm's)."""


def _not_an_adapter(spec: str, src: str) -> AdapterdocError:
    """Why ``src`` was not recognised: a file that decides its format cannot be read (the first one, and why), or
    it is no adapter of any format."""
    from adapterdoc.st.paths import cannot_read

    for path in _deciding_files(src):
        why = cannot_read(path)
        if why is not None:
            return UnsupportedInputError(path if path != src else spec, why)
    return UnsupportedInputError(
        spec, f"is not an adapter in a format adapterdoc converts ({', '.join(formats.FORMATS)})"
    )


def _deciding_files(src: str) -> list[str]:
    if not os.path.isdir(src):
        return [src]
    return [os.path.join(src, n) for n in _DECIDING if os.path.lexists(os.path.join(src, n))]
