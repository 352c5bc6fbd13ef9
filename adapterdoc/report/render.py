"""Format-independent rendering helpers: JSON, and a rich console that honours NO_COLOR and non-terminals."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


def to_json(obj: dict[str, Any]) -> str:
    """Exactly one JSON object, as the contract asks."""
    return json.dumps(obj, indent=2, ensure_ascii=False, default=_default)


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def color_enabled(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def capture_console(width: int | None = None) -> tuple[Console, io.StringIO]:
    """A console writing to a buffer; colour only on a colour-capable terminal."""
    from rich.console import Console

    buf = io.StringIO()
    color = color_enabled()
    console = Console(
        file=buf,
        force_terminal=color,
        no_color=not color,
        color_system="auto" if color else None,
        width=width or max(100, shutil.get_terminal_size((120, 24)).columns),
        highlight=False,
        soft_wrap=False,
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


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def findings_table(findings: list[Any]) -> Any:
    from rich.table import Table

    table = Table(title="Findings", show_lines=False, expand=False)
    table.add_column("code")
    table.add_column("severity")
    table.add_column("message", overflow="fold")
    table.add_column("key / path", overflow="fold")
    for f in findings:
        where = f.key or f.path or ""
        msg = f.message + (f"\n→ {f.hint}" if f.hint else "")
        table.add_row(f.code, f"[{SEVERITY_STYLE[f.severity]}]{f.severity}[/]", msg, where)
    return table
