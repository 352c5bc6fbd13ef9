"""A fused-expert adapter written by a PEFT that laid out its factors the other way round (AD271), torch-free.

PEFT 0.17–0.18 stored the LoRA of a 3-D expert parameter ``[E, d1, d2]`` with ``lora_A`` reading ``d1``; PEFT
≥ 0.19.1 makes ``lora_A`` read the features the experts read, which for transformers' ``[E, out, in]`` experts is
``d2`` (:mod:`adapterdoc.adapter.expert_layout`). Decided from ``peft_version`` and ``target_parameters`` in
adapter_config.json, the base's model type and, per fused module, the header's shapes against the ones today's PEFT
builds on the base: an adapter whose ``lora_A`` is as wide as today's ``lora_B`` is tall (and ``lora_B`` as tall as
today's ``lora_A`` is wide) holds the old layout; today's PEFT refuses it (a size mismatch) or, where the two sizes
are equal, applies every expert's delta transposed without a word.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from adapterdoc.adapter import AdapterConfig, parse_key
from adapterdoc.adapter.expert_layout import (
    FIXED,
    UNRECORDED,
    differs_from_today,
    peft_release,
    transposed_model_type,
)
from adapterdoc.ml.meta import ExpectedModel
from adapterdoc.report.findings import Finding, make

_UNRECORDED = (
    "a PEFT before 0.18 (adapter_config.json has no peft_version; its shapes are that PEFT's layout)"
)
_FUSED_A = re.compile(r"(^|\.)experts(\.base_layer)*\.lora_A\.weight$")


def check_peft_layout(
    spec: str, acfg: AdapterConfig | None, shapes: Mapping[str, tuple[int, ...]], meta: ExpectedModel
) -> list[Finding]:
    """AD271 when the adapter's fused-expert factors are in the layout of the PEFT that wrote it and today's PEFT
    reads them the other way round; nothing otherwise."""
    if acfg is None or not acfg.target_parameters:
        return []
    version = acfg.raw.get("peft_version")
    recorded = "peft_version" in acfg.raw
    release = peft_release(version) if recorded else UNRECORDED
    if release is None or not differs_from_today(release, transposed_model_type(meta.model_type)):
        return []
    refused: list[str] = []
    silent: list[str] = []
    for a_key in sorted(shapes):
        b_key = a_key[: -len("lora_A.weight")] + "lora_B.weight"
        if not _FUSED_A.search(a_key) or b_key not in shapes:
            continue
        now_a, now_b = meta.expected.get(a_key), meta.expected.get(b_key)
        if now_a is None or now_b is None or len(now_a) != 2 or len(now_b) != 2:
            continue
        if _old_layout(shapes[a_key], shapes[b_key], now_a, now_b):
            (silent if now_a[1] == now_b[0] else refused).append(a_key)
    if not recorded:  # where in == out the shapes cannot tell which PEFT wrote it
        silent = []
    if not refused and not silent:
        return []
    writer = f"PEFT {version} (adapter_config.json peft_version)" if recorded else _UNRECORDED
    return [_finding(spec, writer, refused, silent)]


def _old_layout(
    a: tuple[int, ...], b: tuple[int, ...], now_a: tuple[int, ...], now_b: tuple[int, ...]
) -> bool:
    """``lora_A`` ``[E·r, out]`` and ``lora_B`` ``[in, r·E]`` where today's PEFT builds ``[E·r, in]`` / ``[out, r·E]``."""
    return tuple(a) == (now_a[0], now_b[0]) and tuple(b) == (now_a[1], now_b[1])


def _today() -> str:
    """Today's PEFT as the message names it: the rule's first release, and the installed version when there is one."""
    from importlib.metadata import PackageNotFoundError, version

    since = ".".join(map(str, FIXED))
    try:
        return f"PEFT ≥ {since} ({version('peft')} installed)"
    except PackageNotFoundError:
        return f"PEFT ≥ {since}"


def _finding(spec: str, writer: str, refused: list[str], silent: list[str]) -> Finding:
    first = (refused or silent)[0]
    module = parse_key(first).module
    count = len(refused) + len(silent)
    what = []
    if refused:
        what.append(f"refuses {len(refused)} of them (size mismatch on load)")
    if silent:
        what.append(
            f"loads {len(silent)} of them, whose two sizes are equal, and applies every expert's delta transposed, "
            "without an error (wrong outputs)"
        )
    return make(
        "AD271",
        f"written by {writer}: its {count} fused-expert LoRA module(s) "
        f"(`{module}`{', ...' if count > 1 else ''}) hold lora_A over the experts' output features and lora_B over "
        f"their inputs, as that PEFT laid them out; {_today()} reads them the other way round and "
        f"{' and '.join(what)}",
        key=first,
        path=spec,
        hint=f"adapterdoc remap {spec} --experts fused --out DIR",
    )
