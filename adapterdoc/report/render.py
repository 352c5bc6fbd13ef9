"""Rendering helpers shared by the formats: JSON, and the human-text writer every ``*_text`` renderer uses.

Human output is compact and fits the width it is given (``COLUMNS``, else the terminal's width on a terminal,
else 80 columns): prose wraps with a hanging indent, commands, backticked names and keys never break, and
findings print one group per code with a count (:func:`write_findings`). Colour only on a colour-capable terminal
without ``NO_COLOR``.
"""

from __future__ import annotations

import io
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from adapterdoc.report.base import to_json as to_json  # its home before; --json imports base alone

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from adapterdoc.report.findings import Finding

DEFAULT_WIDTH = 80
"""Columns when stdout is not a terminal and ``COLUMNS`` is not set."""
MIN_WIDTH = 40

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
SEVERITIES = ("error", "warning", "info")
MORE = "--json lists them"


def _isatty(stream: IO[str] | None) -> bool:
    if stream is None:
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def color_enabled(stream: IO[str] | None = None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR"):
        return False
    return _isatty(stream)


def output_width(stream: IO[str] | None = None) -> int:
    """Columns for human output: ``COLUMNS`` when set, the terminal's width when stdout is one, else 80."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return max(MIN_WIDTH, int(env))
    stream = stream or sys.stdout
    if _isatty(stream):
        try:
            return max(MIN_WIDTH, os.get_terminal_size(stream.fileno()).columns)
        except (AttributeError, ValueError, OSError):
            pass
    return DEFAULT_WIDTH


def capture_console(width: int | None = None) -> tuple[Console, io.StringIO]:
    """A console writing to a buffer at :func:`output_width` (or ``width``); colour only on a colour terminal.
    Lines are printed as given (``soft_wrap``): the writer wraps, so a long key is never folded mid-name."""
    from rich.console import Console

    buf = io.StringIO()
    color = color_enabled()
    console = Console(
        file=buf,
        force_terminal=color,
        no_color=not color,
        color_system="auto" if color else None,
        width=width or output_width(),
        highlight=False,
        emoji=False,
        soft_wrap=True,
    )
    return console, buf


def human_bytes(n: int) -> str:
    """``1536`` → ``1.50 KiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{n} B"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, "key")`` → ``1 key``; ``plural(3, "key")`` → ``3 keys``."""
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


# --------------------------------------------------------------------------------------------- the writer

Span = str | tuple[str, str]
"""Plain text (wrapped at spaces, commands and backticked names kept whole), or ``(text, rich style)`` (kept whole)."""

_COMMAND = r"\badapterdoc (?:inspect|remap|verify|merge|roundtrip|train-smoke|train|eval|explain)\b(?:(?!; |, | \().)*"
"""An ``adapterdoc ...`` command, up to ``; ``, ``, `` or `` (`` (or the end of the text)."""
_UNBREAKABLE = re.compile(rf"`[^`]*`|{_COMMAND}")
"""Backticked names and commands: never broken across lines."""
_NBSP = "\u00a0"
KEEP = ""
"""The style of a span that is plain but kept whole (``(text, KEEP)``)."""


@dataclass(frozen=True)
class Token:
    """A span of human output and its rich style (``None``: plain)."""

    text: str
    style: str | None = None


class Writer:
    """Lines of human output at a fixed width, styled through rich (plain text when colour is off)."""

    def __init__(self, width: int | None = None) -> None:
        self.console, self._buf = capture_console(width)
        self.width: int = self.console.width

    def getvalue(self) -> str:
        return self._buf.getvalue()

    def blank(self) -> None:
        self.console.print()

    def line(self, *spans: Span, indent: int = 0) -> None:
        """One line exactly as given (table rows, aligned columns): spans joined without separators."""
        self.console.print(_text(indent, [Token(*_pair(s)) for s in spans], ""))

    def para(self, *spans: Span, indent: int = 0, hang: int | None = None) -> None:
        """Spans joined by single spaces and wrapped at the width: the first line at ``indent`` columns, the
        rest at ``hang`` (default ``indent + 4``). A word longer than a line sits alone on its line."""
        hang = indent + 4 if hang is None else hang
        for n, words in enumerate(_wrap(_tokens(spans), self.width, indent, hang)):
            self.console.print(_text(indent if n == 0 else hang, words, " "))


def _text(indent: int, tokens: Sequence[Token], sep: str) -> Text:
    """One line as a rich Text (styles as spans, so nothing in the text is read as markup)."""
    from rich.text import Text

    line = Text(" " * indent, end="")
    for i, tok in enumerate(tokens):
        if i:
            line.append(sep)
        line.append(tok.text, tok.style or None)
    return line


def _pair(span: Span) -> tuple[str, str | None]:
    return (span, None) if isinstance(span, str) else span


def _tokens(spans: Iterable[Span]) -> list[Token | None]:
    """Words to wrap; ``None`` is a hard line break (a newline in the text)."""
    out: list[Token | None] = []
    for span in spans:
        text, style = _pair(span)
        if style is not None:
            out.append(Token(text, style))
            continue
        for n, part in enumerate(text.split("\n")):
            if n:
                out.append(None)
            # spaces inside a command or backticked name are not break points
            part = _UNBREAKABLE.sub(lambda m: " ".join(m.group().split()).replace(" ", _NBSP), part)
            out.extend(Token(word.replace(_NBSP, " ")) for word in re.split(r"[ \t\r]+", part) if word)
    return out


def _wrap(tokens: Sequence[Token | None], width: int, indent: int, hang: int) -> list[list[Token]]:
    """Greedy word wrap: the tokens of each line."""
    from rich.cells import cell_len

    lines: list[list[Token]] = []
    cur: list[Token] = []
    used = indent

    def flush() -> None:
        nonlocal cur, used
        lines.append(cur)
        cur, used = [], hang

    for tok in tokens:
        if tok is None:
            flush()
            continue
        w = cell_len(tok.text)
        if cur and used + 1 + w > width:
            flush()
        used += (1 if cur else 0) + w
        cur.append(tok)
    if cur or not lines:
        flush()
    return lines


def columns(rows: Sequence[Sequence[Span]], right: Iterable[int] = (), gap: int = 2) -> list[list[Span]]:
    """Rows of cells padded to a common width per column (columns in ``right`` right-aligned), ready for
    :meth:`Writer.line`: a borderless table."""
    from rich.cells import cell_len

    right = set(right)
    ncol = max((len(r) for r in rows), default=0)
    widths = [max((cell_len(_pair(r[i])[0]) for r in rows if i < len(r)), default=0) for i in range(ncol)]
    out: list[list[Span]] = []
    for r in rows:
        line: list[Span] = []
        for i, cell in enumerate(r):
            text = _pair(cell)[0]
            pad = " " * (widths[i] - cell_len(text))
            last = i == len(r) - 1
            line.append(pad if i in right else "")
            line.append(cell)
            if i not in right and not last:
                line.append(pad)
            if not last:
                line.append(" " * gap)
        out.append(line)
    return out


# --------------------------------------------------------------------------------------------- findings


def count_line(findings: Iterable[Finding]) -> str:
    """``3 errors, 1 warning, 2 info`` (severities present only), or ``no findings``."""
    counts = {s: 0 for s in SEVERITIES}
    for f in findings:
        counts[f.severity] += 1
    parts = [
        plural(counts["error"], "error"),
        plural(counts["warning"], "warning"),
        f"{counts['info']:,} info",
    ]
    shown = [p for p, s in zip(parts, SEVERITIES) if counts[s]]
    return ", ".join(shown) if shown else "no findings"


def group_findings(findings: Iterable[Finding]) -> list[list[Finding]]:
    """Findings grouped by (severity, code): errors first, then warnings, then info; within a severity, codes in
    the order they first appear, and each group in report order."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.severity, f.code), []).append(f)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return [g for _, g in sorted(groups.items(), key=lambda kv: order[kv[0][0]])]


def write_findings(
    w: Writer,
    findings: Iterable[Finding],
    *,
    indent: int = 0,
    context: Iterable[str | None] = (),
    shown_hints: set[str] | None = None,
) -> None:
    """One block per finding code: ``error AD221 ×3 message``, then the key (``e.g. KEY and 2 more``) and the
    fix, each on its own indented line. A key or path in ``context`` (the adapter being described) is not
    repeated, nor a hint already in ``shown_hints`` (which collects the hints printed)."""
    ctx = {c for c in context if c}
    shown = shown_hints if shown_hints is not None else set()
    sub = indent + 4
    for group in group_findings(findings):
        f = group[0]
        head: list[Span] = [(f.severity, SEVERITY_STYLE[f.severity]), (f.code, "bold")]
        if len(group) > 1:
            head.append(f"×{len(group)}")
        w.para(*head, f.message, indent=indent, hang=sub)
        where = [x for x in dict.fromkeys(g.key or g.path for g in group) if x and x not in ctx]
        more = len(group) - 1
        if where and not _mentions(f.message, where[0]):
            label = "e.g." if more else "at"
            tail: list[Span] = [f"and {more:,} more;", (MORE, KEEP)] if more else []
            w.para((f"{label} {where[0]}", KEEP), *tail, indent=sub, hang=sub)
        elif more:
            w.para(f"and {more:,} more like it;", (MORE, KEEP), indent=sub, hang=sub)
        hint = next((g.hint for g in group if g.hint), None)
        if hint and hint not in shown:
            shown.add(hint)
            write_fix(w, hint, indent=sub)


def _mentions(message: str, name: str) -> bool:
    """Whether ``name`` appears in ``message`` as a whole name (not inside a longer dotted name)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", message) is not None


def write_fix(w: Writer, hint: str, *, indent: int = 0, label: str = "fix:") -> None:
    """``fix: HINT``; an ``adapterdoc ...`` command in it is bold and never broken across lines."""
    m = re.search(_COMMAND, hint)
    if m is None:
        w.para(label, hint, indent=indent, hang=indent + 2)
        return
    prose, rest = hint[: m.start()].rstrip(), hint[m.end() :]
    command = " ".join(m.group().split())
    hang = indent + 2 if indent + 2 + len(command) <= w.width else indent  # a long command gets the room
    w.para(label, *([prose] if prose else []), (command, "bold"), rest, indent=indent, hang=hang)
