"""The entry of ``adapterdoc roundtrip``: copy the adapter to a work folder, run every round trip on the copy,
and turn each failed check into its finding."""

from __future__ import annotations

import os
import shutil
import tempfile

from adapterdoc.checkpoint import open_checkpoint
from adapterdoc.errors import UnsupportedInputError
from adapterdoc.layouts import detect_layout
from adapterdoc.report.findings import Finding, make
from adapterdoc.report.roundtrip_report import Check, RoundtripReport
from adapterdoc.roundtrip.bytes import byte_roundtrips, format_roundtrip
from adapterdoc.roundtrip.common import copy_adapter, weights_file
from adapterdoc.roundtrip.convert import convert_roundtrips
from adapterdoc.roundtrip.expert_trip import expert_check
from adapterdoc.roundtrip.models import model_roundtrips


def roundtrip(
    spec: str | os.PathLike[str], base: str | None = None, *, keep: str | None = None
) -> RoundtripReport:
    """Run every round trip on copies of ``spec``; ``keep`` (a folder) keeps the work files for inspection."""
    src = open_checkpoint(spec)
    if not src.is_adapter:
        raise UnsupportedInputError(src.spec, "is not an adapter (no adapter_config.json and no LoRA keys)")
    from adapterdoc.adapter import parse_key

    modules = {parse_key(k).module for k in src.tensors if parse_key(k).is_lora}
    hint = src.adapter_config.layout_hints if src.adapter_config else None
    layout = detect_layout(modules, hint).name
    from adapterdoc.st.atomic import ensure_folder, writing

    if keep is not None:
        keep = ensure_folder(os.path.expanduser(os.fspath(keep)), option="--keep")
    with writing(keep or tempfile.gettempdir()):
        work = tempfile.mkdtemp(prefix="adapterdoc-roundtrip-", dir=keep)
    try:
        original = copy_adapter(src, os.path.join(work, "original"))
        findings = _identity_warning(original, src.spec)
        checks = byte_roundtrips(original, layout, work)
        checks.append(format_roundtrip(original, work))
        checks += convert_roundtrips(original, work, base)
        trip: dict[str, str] = {}
        checks.append(expert_check(original, work, trip))
        if base is None:
            checks.append(
                Check(
                    "load/save/merge/counterpart",
                    "skipped",
                    "no --base: the model-level round trips need base weights "
                    "(a model folder with weights, or tiny:LAYOUT)",
                )
            )
        else:
            checks += model_roundtrips(original, layout, base, work, trip)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    findings += [
        make(_CODE_FOR.get(c.name.split(":")[0], "AD701"), f"{c.name}: {c.detail}", path=src.spec)
        for c in checks
        if c.status == "fail"
    ]
    return RoundtripReport(input=src.spec, layout=layout, base=base, checks=tuple(checks), findings=findings)


def _identity_warning(original: str, spec: str) -> list[Finding]:
    """An all-zero lora_B adapter is the identity: every output comparison then passes trivially. Say so."""
    from adapterdoc.adapter import parse_key
    from adapterdoc.st.header import read_header
    from adapterdoc.st.tensors import scan_tensor

    weights = weights_file(original)
    if weights is None:
        return []
    header = read_header(weights)
    bs = [k for k in header.tensors if parse_key(k).is_b]
    if bs and all(scan_tensor(header, k, finite=False, stop_at_nonzero=True).all_zero for k in bs):
        return [
            make(
                "AD706",
                f"all {len(bs)} lora_B tensors are zero: the adapter is the identity, so the output "
                "comparisons below cannot tell a good move from a bad one",
                path=spec,
            )
        ]
    return []


_CODE_FOR = {
    "remap": "AD701",
    "format": "AD702",
    "reload": "AD703",
    "merge": "AD704",
    "counterpart": "AD705",
    "experts": "AD707",
    "convert": "AD808",
}
