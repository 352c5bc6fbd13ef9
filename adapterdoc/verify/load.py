"""``--load`` findings: the base's weights and the adapter loaded with PEFT for real (:mod:`adapterdoc.ml.load`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adapterdoc.checkpoint import Checkpoint
from adapterdoc.report.findings import Finding, make

if TYPE_CHECKING:
    from adapterdoc.bases import BaseSpec
    from adapterdoc.ml.build import BuiltAs
    from adapterdoc.ml.load import LoadResult


@dataclass(frozen=True)
class LoadCheck:
    """The real load's findings and its summary (the report's ``load``)."""

    findings: tuple[Finding, ...]
    load: Mapping[str, object]


def check_load(spec: str, ckpt: Checkpoint, base: BaseSpec, built_as: BuiltAs | None = None) -> LoadCheck:
    from adapterdoc.ml.load import load_check

    res = load_check(base, ckpt, built_as)
    return LoadCheck(tuple(_findings(spec, res)), res.to_dict())


def _findings(spec: str, res: LoadResult) -> list[Finding]:
    out: list[Finding] = []
    if res.skipped:
        out.append(make("AD235", f"real load skipped: {res.skipped}", path=spec))
        return out
    if res.lora_modules == 0:
        out.append(make("AD232", "PEFT load left 0 LoRA modules in the model", path=spec))
    if res.missing or res.unexpected:
        first = (res.missing or res.unexpected)[0]
        out.append(
            make(
                "AD233",
                f"PEFT load_adapter reported {len(res.missing)} missing and {len(res.unexpected)} unexpected "
                "LoRA key(s)",
                path=spec,
                key=first,
            )
        )
    if res.max_abs_diff == 0.0:
        out.append(make("AD234", f"output unchanged on the probe input ({res.probe})", path=spec))
    out.append(
        make(
            "AD235",
            f"real PEFT load: {res.lora_modules} LoRA module(s), {len(res.missing)} missing, "
            f"{len(res.unexpected)} unexpected, max |Δ output| {res.max_abs_diff:.3g}",
            path=spec,
        )
    )
    return out
