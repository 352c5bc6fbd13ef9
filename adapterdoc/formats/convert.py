"""``adapterdoc convert ADAPTER --to FORMAT``: detect the source format, go through PEFT (the hub), write ``--out``.

``--out`` follows the rules of the other commands' output folders (:mod:`adapterdoc.st.atomic`): a new or empty
folder (a GGUF target is one file, replaced atomically), never inside the input, its parent must exist; without
``--out`` the result goes beside the input as ``<input>-<format>`` (``<input>.gguf`` for GGUF). A hop through PEFT
(MLX → GGUF) uses a temporary folder beside the output, removed afterwards. ``--outtype`` re-casts in the last hop
only, so values are rounded at most once. A format module's note that starts with a finding code (``AD806: ...``)
becomes that finding of the report.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from adapterdoc import formats
from adapterdoc.errors import AdapterdocError, InputNotFoundError, RefusedError, UnsupportedInputError
from adapterdoc.report.convert_report import ConvertReport

_CODE_NOTE = re.compile(r"^(AD\d{3}): (.+)$", re.S)


def _module(name: str, role: str):  # type: ignore[no-untyped-def]
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
    spec: str, to: str, *, base: str | None = None, out: str | None = None, outtype: str | None = None
) -> ConvertReport:
    """Convert the adapter ``spec`` to format ``to``; refusals raise (exit 3) before anything is written."""
    from adapterdoc.formats.cast import OUTTYPES
    from adapterdoc.report.findings import make
    from adapterdoc.st.atomic import check_output_folder, resolve_output
    from adapterdoc.st.paths import inside

    if to not in formats.FORMATS:
        raise UnsupportedInputError(to, f"is not a format; choose one of {', '.join(formats.FORMATS)}")
    if outtype is not None and outtype not in OUTTYPES:
        raise UnsupportedInputError(outtype, f"is not an --outtype; choose one of {', '.join(OUTTYPES)}")
    src = _resolve_input(spec)
    found = formats.detect(Path(src))
    if found is None:
        raise UnsupportedInputError(
            spec, f"is not an adapter in a format adapterdoc converts ({', '.join(formats.FORMATS)})"
        )
    source = _module(found.format, "the input's format")
    target = _module(to, "the target format")
    dest = os.path.abspath(os.path.expanduser(out)) if out else default_out(src, to, target)
    folder_in = (
        src if os.path.isdir(src) else None
    )  # a one-file input (GGUF): only the file itself is off limits
    if inside(src, dest) or (folder_in is not None and inside(dest, folder_in)):
        raise RefusedError(
            out or dest, "is the input or inside the input adapter folder; choose a path outside it"
        )
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise InputNotFoundError(parent, "the parent folder of --out does not exist")
    if is_file_format(target):
        resolve_output(dest)
    else:
        check_output_folder(dest)  # a new or empty folder (convert has no --force)
    route = [found.format, to] if "peft" in (found.format, to) else [found.format, "peft", to]
    if found.format == "peft":
        done = target.from_peft(Path(src), Path(dest), base=base, outtype=outtype)
    elif to == "peft":
        done = source.to_peft(Path(src), Path(dest), base=base, outtype=outtype)
    else:
        hub = tempfile.mkdtemp(prefix=".adapterdoc-convert-", dir=parent)
        try:
            first = source.to_peft(Path(src), Path(hub) / "peft", base=base, outtype=None)
            done = target.from_peft(Path(hub) / "peft", Path(dest), base=base, outtype=outtype)
            done = type(done)(found.format, to, done.out, done.tensors, (*first.notes, *done.notes))
        except AdapterdocError as e:
            if e.what is not None and inside(e.what, hub):  # the temporary PEFT folder: name the input
                e.what = spec
            raise
        finally:
            shutil.rmtree(hub, ignore_errors=True)
    findings, notes = [], []
    for note in done.notes:
        m = _CODE_NOTE.match(note)
        if m:
            findings.append(make(m[1], m[2], path=os.fspath(done.out)))
        else:
            notes.append(note)
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
