"""``RUN_REPORT.md``, the markdown a training run leaves in its folder: a title, the run's facts as a list, then
sections (the doctor's verdict, the loss curve, the weights audit). One emitter writes it, once per run: the
training loop for `train-smoke`, the doctor for `adapterdoc train` (which tells the loop not to)."""

from __future__ import annotations

import os
from collections.abc import Sequence

RUN_REPORT = "RUN_REPORT.md"


def render_run_report(title: str, facts: Sequence[str], note: str, sections: Sequence[str] = ()) -> str:
    """``# title``, one ``- `` line per fact, ``note`` as a paragraph, then each section (markdown, ``## ...``)."""
    lines = [f"# {title}", "", *(f"- {fact}" for fact in facts)]
    lines += ["", note, ""]
    for section in sections:
        lines += [section.rstrip("\n"), ""]
    return "\n".join(lines)


def write_run_report(folder: str | os.PathLike[str], text: str) -> str:
    """Write ``folder/RUN_REPORT.md`` atomically; its path."""
    from adapterdoc.st.atomic import atomic_write_bytes

    path = os.path.join(os.fspath(folder), RUN_REPORT)
    atomic_write_bytes(path, text.encode())
    return path
