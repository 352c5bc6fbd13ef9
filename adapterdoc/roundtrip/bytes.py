"""The byte round trips (no base needed): every registry remap there and back must give the input's exact bytes,
and ``.safetensors`` → ``.bin`` → ``.safetensors`` must keep names, dtypes and values."""

from __future__ import annotations

import os
import shutil

from adapterdoc.adapter import ADAPTER_CONFIG
from adapterdoc.checkpoint import ADAPTER_WEIGHTS
from adapterdoc.layouts import LAYOUTS, remap_path
from adapterdoc.report.roundtrip_report import Check
from adapterdoc.roundtrip.common import Fail, Skip, read_json, same_tensors, sha, timed, weights_file


def reachable_layouts(layout: str) -> list[str]:
    """Every layout the registry can move ``layout`` to (directly or chained)."""
    if layout not in LAYOUTS:
        return []
    return [name for name in LAYOUTS if name != layout and remap_path(layout, name) is not None]


def byte_roundtrips(original: str, layout: str, work: str) -> list[Check]:
    """Every registry remap from ``layout`` there and back on copies of ``original``: one check each (or one
    skipped check saying why there is none)."""
    from adapterdoc.remap import remap

    weights = weights_file(original)
    if weights is None:
        return [Check("remap", "skipped", "the adapter has no .safetensors weights to remap")]
    targets = reachable_layouts(layout)
    if not targets:
        why = f"layout {layout!r} has no registry moves" if layout in LAYOUTS else f"layout is {layout}"
        return [Check("remap", "skipped", why)]
    want_w = sha(weights)
    want_c = read_json(os.path.join(original, ADAPTER_CONFIG))
    checks = []
    for target in targets:

        def there_and_back(target: str = target) -> str:
            folder = os.path.join(work, f"remap-{target}")
            shutil.copytree(original, folder)
            there = remap(folder, to=target, source=layout)
            if there.strategy == "copy":
                # the header grew, so the way back in place would keep the longer, padded header: write the way
                # back as a fresh file (--out), whose header is padded the way safetensors pads, as the input's is
                back_dir = os.path.join(work, f"remap-{target}-back")
                back = remap(folder, to=layout, source=target, out=back_dir)
                folder = back_dir
            else:
                back = remap(folder, to=layout, source=target)
            got = weights_file(folder)
            assert got is not None
            if sha(got) != want_w:
                raise Fail(f"{layout} → {target} → {layout}: weights bytes differ from the input")
            note = _config_difference(want_c, read_json(os.path.join(folder, ADAPTER_CONFIG)), target)
            return (
                f"{there.renamed} keys renamed ({there.strategy}), {back.renamed} back ({back.strategy}); "
                f"weights byte-identical, {note}"
            )

        checks.append(timed(f"remap:{layout}→{target}→{layout}", there_and_back))
    return checks


def _config_difference(want: object, got: object, via: str) -> str:
    """``config identical`` or the one accepted difference; raises :class:`Fail` otherwise.

    Moving onto a layout with towers adds their exclusion to ``exclude_modules`` (so PEFT keeps LoRA off them);
    the way back keeps it, because the text class has no such modules and the exclusion is then a no-op.
    """
    if got == want:
        return "config identical"
    if isinstance(want, dict) and isinstance(got, dict):
        diff = {k for k in set(want) | set(got) if want.get(k) != got.get(k)}
        tower_rx = LAYOUTS[via].exclude_regex if via in LAYOUTS else None
        if diff == {"exclude_modules"} and tower_rx and tower_rx in str(got.get("exclude_modules")):
            return f"config identical but for exclude_modules, which keeps {via}'s tower exclusion"
        raise Fail(f"adapter_config.json differs from the input in {sorted(diff)}")
    raise Fail("adapter_config.json differs from the input")


def format_roundtrip(original: str, work: str) -> Check:
    def convert() -> str:
        try:
            import torch
            from safetensors.torch import load_file
        except ImportError:
            raise Skip("needs torch (the ML extra) to write a .bin") from None
        from adapterdoc.checkpoint import load_bin
        from adapterdoc.remap import remap

        weights = weights_file(original)
        if weights is None:  # a .bin input: convert to safetensors and compare
            bin_path = os.path.join(original, "adapter_model.bin")
            ref = load_bin(bin_path)
        else:
            ref = load_file(weights)
        bin_dir = os.path.join(work, "as-bin")
        os.makedirs(bin_dir)
        for name in os.listdir(original):
            if name not in (ADAPTER_WEIGHTS, "adapter_model.bin"):
                shutil.copyfile(os.path.join(original, name), os.path.join(bin_dir, name))
        torch.save(ref, os.path.join(bin_dir, "adapter_model.bin"))
        mid = load_bin(os.path.join(bin_dir, "adapter_model.bin"))
        same_tensors(ref, mid, "safetensors → .bin")
        back_dir = os.path.join(work, "back-to-safetensors")
        remap(
            bin_dir, rules=["(?!)=>"], out=back_dir
        )  # a rule that matches nothing: a pure format conversion
        back = load_file(os.path.join(back_dir, ADAPTER_WEIGHTS))
        same_tensors(ref, back, ".bin → safetensors")
        return f"{len(ref)} tensors: names, dtypes, shapes and values identical both ways"

    return timed("format:safetensors↔bin", convert)
