"""The report of ``adapterdoc explain``: one finding code's explanation, or the list of every code."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from adapterdoc.codes import Code, area_of
from adapterdoc.report.base import FrozenReport


@dataclass(frozen=True)
class ExplainReport(FrozenReport):
    """``codes`` holds the one code asked for (``listing`` false) or every code of the catalogue."""

    codes: list[Code]
    listing: bool = False

    def body(self) -> dict[str, object]:
        if not self.listing:
            info = self.codes[0]
            return {"area": area_of(info.code), **asdict(info)}
        rows = [
            {
                "code": c.code,
                "name": c.name,
                "severity": c.severity,
                "summary": c.summary,
                "area": area_of(c.code),
            }
            for c in self.codes
        ]
        return {"codes": rows}
