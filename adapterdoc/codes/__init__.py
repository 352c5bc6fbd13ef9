"""The catalogue of finding codes: one module per area, each a list of :class:`Code` entries.

AD1xx format, AD2xx keys and layouts, AD3xx weights, AD4xx serving profiles, AD5xx merge,
AD6xx training, AD7xx round trips, AD8xx format conversions, AD900-AD949 probing a running server, AD950-AD999
adapter algebra. Codes are stable once released.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

Severity = Literal["error", "warning", "info"]
"""How bad a finding is (``adapterdoc.report.findings`` uses the same)."""

AREAS = (
    "format",
    "keys",
    "weights",
    "serving",
    "merge",
    "training",
    "roundtrip",
    "convert",
    "probe",
    "algebra",
)


@dataclass(frozen=True)
class Code:
    """One finding code and its explanation (``adapterdoc explain``)."""

    code: str
    name: str
    """kebab-case; names the problem, not the fix."""
    severity: Severity
    summary: str
    """What the finding means."""
    why: str
    """Why it matters: the real failure it prevents."""
    example: str
    instead: str
    """What to do instead."""
    since: str = "0.1.0"


_CATALOGUE: dict[str, Code] | None = None


def area_modules() -> dict[str, ModuleType]:
    """Each area's module; a listed area whose module is missing is an ImportError, never skipped."""
    return {area: importlib.import_module(f"adapterdoc.codes.{area}") for area in AREAS}


def module_codes(mod: ModuleType) -> list[Code]:
    """An area module's ``CODES`` list."""
    codes: list[Code] = mod.CODES
    return codes


def catalogue() -> dict[str, Code]:
    """Every code, from every area module."""
    global _CATALOGUE
    if _CATALOGUE is None:
        out: dict[str, Code] = {}
        for mod in area_modules().values():
            for c in module_codes(mod):
                if c.code in out:
                    raise RuntimeError(f"duplicate finding code {c.code}")
                out[c.code] = c
        _CATALOGUE = dict(sorted(out.items()))
    return _CATALOGUE


_BY_AREA: dict[str, dict[str, Code]] = {}
"""Each area module's codes, read when a code of that area is first asked for (:func:`get_code`)."""


def get_code(code: str) -> Code:
    """The catalogued ``code``. It is looked up in its area's module first (``AD209`` in ``keys``), so a command that
    makes one finding imports one area module, not the whole catalogue; a code not found there goes to
    :func:`catalogue`, which reads every area (and refuses duplicates: ``tests/codes``)."""
    upper = code.upper()
    area = area_of(upper)
    if _CATALOGUE is None and area in AREAS:
        codes = _BY_AREA.get(area)
        if codes is None:
            mod = importlib.import_module(f"adapterdoc.codes.{area}")
            codes = _BY_AREA[area] = {c.code: c for c in module_codes(mod)}
        found = codes.get(upper)
        if found is not None:
            return found
    try:
        return catalogue()[upper]
    except KeyError:
        raise KeyError(f"unknown finding code {code!r}") from None


SUBAREAS = {f"AD9{d}": "algebra" for d in "56789"}
"""Areas sharing a first digit with another (AD9xx: probe below AD950, algebra from it): the code prefixes naming
them, read before the digit."""


def area_of(code: str) -> str:
    """The area of a code from its prefix in :data:`SUBAREAS`, else its first digit (``AD301`` → ``weights``), or
    ``other``."""
    sub = SUBAREAS.get(code[:4].upper())
    if sub is not None:
        return sub
    digit = int(code[2]) if len(code) > 2 and code[2].isdigit() else 0
    return AREAS[digit - 1] if 1 <= digit <= len(AREAS) else "other"
