"""Where each field of an ``adapter_config.json`` stands: the 1-based line of ``"field":``, for findings about a
config field (the CI formats attach them to that line). Torch-free, standard library only.

A finding is given its line when it is made (:func:`adapterdoc.report.findings.make` calls
:func:`config_field_line`), so the emitters only format. A file is read once per run while it is unchanged (the
cache is keyed by its path, size and modification time).
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

from adapterdoc.adapter.fields import ADAPTER_CONFIG


def config_file(path: str) -> str | None:
    """The ``adapter_config.json`` a finding's ``path`` names: the file itself, or the one in the folder; None
    when there is none."""
    if os.path.basename(path) == ADAPTER_CONFIG:
        return path if os.path.isfile(path) else None
    candidate = os.path.join(path, ADAPTER_CONFIG)
    return candidate if os.path.isdir(path) and os.path.isfile(candidate) else None


def config_field_line(path: str, field: str) -> int | None:
    """The 1-based line of ``"field":`` in the ``adapter_config.json`` of ``path`` (the file or its folder), or None
    (no such file, not found, unreadable). The first line that opens with the quoted name counts."""
    config = config_file(path)
    if config is None:
        return None
    try:
        st = os.stat(config)
    except OSError:
        return None
    return _lines(config, st.st_size, st.st_mtime_ns).get(field)


@lru_cache(maxsize=64)
def _lines(config: str, size: int, mtime_ns: int) -> dict[str, int]:
    """Every ``"name":`` that opens a line of ``config``, with the first line it opens (size and time key the cache)."""
    del size, mtime_ns
    found: dict[str, int] = {}
    try:
        with open(config, encoding="utf-8") as fh:
            for n, text in enumerate(fh, 1):
                m = _FIELD.match(text)
                if m:
                    found.setdefault(json_string(m.group(1)), n)
    except (OSError, UnicodeDecodeError):
        return {}
    return found


_FIELD = re.compile(r'^\s*"((?:[^"\\]|\\.)*)"\s*:')


def json_string(body: str) -> str:
    """The value of a JSON string's body (escapes decoded); the body itself where it is not valid JSON."""
    if "\\" not in body:
        return body
    import json

    try:
        value = json.loads(f'"{body}"')
    except ValueError:
        return body
    return value if isinstance(value, str) else body
