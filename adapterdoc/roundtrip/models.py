"""The model-level round trips (a base with weights): load → save → load through PEFT, merged vs unmerged
outputs, the adapter remapped to the text counterpart on the counterpart class, and the expert trip's outputs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

from adapterdoc.adapter import ADAPTER_CONFIG
from adapterdoc.checkpoint import ADAPTER_WEIGHTS
from adapterdoc.layouts import LAYOUTS
from adapterdoc.ml.quiet import quiet_transformers
from adapterdoc.report.roundtrip_report import Check
from adapterdoc.roundtrip.common import Fail, Skip, bitwise_equal, same_tensors, timed, weights_file
from adapterdoc.roundtrip.expert_trip import (
    EXPERT_RTOL,
    expert_outputs_match,
    peft_drops_note,
    peft_has_expert_lora,
)

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel

    from adapterdoc.bases import BaseSpec

State = dict[str, "torch.Tensor"]
"""What the model trips share: ``outputs``, the adapter model's probe output (set by the reload trip)."""

MERGE_RTOL = 1e-4
"""Merged vs unmerged outputs: max |diff| ≤ MERGE_RTOL · max(1, max |output|) (float32 rounding of W + s·BA)."""


def model_roundtrips(
    original: str, layout: str, base_spec: str, work: str, trip: dict[str, str]
) -> list[Check]:
    """Reload, merge, counterpart and the expert trip's outputs on ``base_spec``'s weights: one check each."""
    from adapterdoc.bases import resolve_base
    from adapterdoc.ml.build import require_ml

    require_ml(base_spec)
    quiet_transformers()
    base = resolve_base(base_spec)
    if not base.has_weights:
        return [
            Check(
                "load/save/merge/counterpart",
                "skipped",
                f"{base_spec} has no weights (config only): the model-level round trips need them",
            )
        ]
    if not os.path.exists(os.path.join(original, ADAPTER_CONFIG)):
        return [
            Check(
                "load/save/merge/counterpart",
                "skipped",
                "the adapter has no adapter_config.json, so PEFT cannot load it",
            )
        ]
    from adapterdoc.ml.load import load_base

    state: State = {}
    checks = [timed("reload:load→save→load", lambda: _reload(state, base, original, work, trip))]
    if "outputs" not in state:
        return checks
    checks.append(timed("merge:merged=unmerged", lambda: _merge(state, base, original, work)))
    checks.append(
        timed(
            "counterpart:remapped on text class",
            lambda: _counterpart(state, load_base(base), layout, original, work),
        )
    )
    if trip:
        checks.append(timed(f"experts:outputs {trip['path']}", lambda: _expert_outputs(state, base, trip)))
    return checks


def _peft_outputs(model: PreTrainedModel, adapter_dir: str) -> tuple[PeftModel, torch.Tensor]:
    import warnings

    import torch
    from peft import PeftModel

    from adapterdoc.ml.load import forward, probe_inputs

    probe = probe_inputs(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = PeftModel.from_pretrained(model, adapter_dir, is_trainable=False)
    pm.eval()
    with torch.no_grad():
        out = forward(_inner(pm), probe)
    return pm, out


def _inner(pm: PeftModel) -> PreTrainedModel:
    """The transformers model a LoRA ``PeftModel`` wraps."""
    return cast("PreTrainedModel", pm.get_base_model())


def _reload(state: State, base: BaseSpec, original: str, work: str, trip: dict[str, str]) -> str:
    from safetensors.torch import load_file

    from adapterdoc.ml.load import load_base

    try:
        pm, first = _peft_outputs(load_base(base), original)
    except (
        ValueError
    ) as e:  # PEFT refuses to convert it at load (gate without up, ...): a finding, not a crash
        raise Fail(f"PEFT refuses to load it: {' '.join(str(e).split())[:300]}") from None
    saved = os.path.join(work, "resaved")
    pm.save_pretrained(saved)
    _, second = _peft_outputs(load_base(base), os.path.join(saved))
    state["outputs"] = first
    # PEFT loads a per-expert adapter fused (its load conversion) and saves it fused: the saved tensors must then
    # equal ``remap --experts fused``'s, tensor for tensor
    fused = trip.get("form") == "per-expert"
    ref = weights_file(trip["there"] if fused else original)
    if ref is not None:
        what = "load → save (PEFT's fused vs remap --experts fused)" if fused else "load → save"
        same_tensors(load_file(ref), load_file(os.path.join(saved, ADAPTER_WEIGHTS)), what)
    diff = float((first - second).abs().max())
    if not bitwise_equal(first, second):
        raise Fail(f"outputs after load → save → load differ by {diff:.3g}")
    said = "PEFT saved it fused, tensor for tensor as remap --experts fused" if fused else "tensors identical"
    return f"{said} after save; outputs identical (probe output {tuple(first.shape)})"


def _merge(state: State, base: BaseSpec, original: str, work: str) -> str:
    from adapterdoc.merge import merge
    from adapterdoc.ml.load import forward, load_base, probe_inputs

    base_dir = base.root
    if base.kind == "tiny":
        base_dir = os.path.join(work, "tiny-base")
        load_base(base).save_pretrained(base_dir)
    assert base_dir is not None  # every base but a tiny one is a folder
    out = os.path.join(work, "merged")
    result = merge(original, base=base_dir, out=out)
    refused = [f for f in result.findings if f.severity == "error"]
    if refused and not result.unused:
        raise Fail("merge refused: " + "; ".join(f"{f.code} {f.message}" for f in refused[:2]))
    if getattr(result, "unused", None):
        raise Fail(f"merge left {len(result.unused)} adapter module(s) unused: {result.unused[:3]}")
    import dataclasses

    import torch

    from adapterdoc.bases import resolve_base

    merged = load_base(dataclasses.replace(resolve_base(out)))
    with torch.no_grad():
        got = forward(merged, probe_inputs(merged))
    want = state["outputs"]
    diff = float((got - want).abs().max())
    bound = MERGE_RTOL * max(1.0, float(want.abs().max()))
    if diff > bound:
        raise Fail(
            f"merged outputs differ from the unmerged adapter model's by {diff:.3g} (bound {bound:.3g})"
        )
    return f"max |merged − unmerged| = {diff:.3g} ≤ {bound:.3g}"


def _counterpart(state: State, base_model: PreTrainedModel, layout: str, original: str, work: str) -> str:
    import torch

    from adapterdoc.ml.tiny import build_counterpart
    from adapterdoc.remap import remap

    target = LAYOUTS[layout].text_counterpart if layout in LAYOUTS else None
    if target is None:
        raise Skip(f"layout {layout!r} has no text counterpart in the registry")
    folder = os.path.join(work, f"counterpart-{target}")
    remap(original, to=target, source=layout, out=folder)
    try:
        other = build_counterpart(base_model, layout, target)
    except (RuntimeError, KeyError, ValueError) as e:
        raise Skip(f"cannot build {target} with the base's weights: {e}") from None
    _, got = _peft_outputs(other, folder)
    want = state["outputs"]
    inner = LAYOUTS[layout].counterpart_module
    if inner:  # the counterpart is a part of this model (an encoder without its head): compare that part
        from adapterdoc.ml.load import forward, probe_inputs

        pm, _ = _peft_outputs(base_model, original)
        with torch.no_grad():
            want = forward(getattr(_inner(pm), inner), probe_inputs(_inner(pm)))
    if got.shape != want.shape:
        raise Fail(f"outputs have different shapes: {tuple(got.shape)} vs {tuple(want.shape)}")
    if not bitwise_equal(got, want):
        raise Fail(f"{target} outputs differ from {layout}'s by {float((got - want).abs().max()):.3g}")
    return f"{target} with the remapped adapter gives identical outputs"


def _expert_outputs(state: State, base: BaseSpec, trip: dict[str, str]) -> str:
    from adapterdoc.ml.load import load_base

    want = state["outputs"]
    pm, there = _peft_outputs(load_base(base), trip["there"])
    _, back = _peft_outputs(load_base(base), trip["back"])
    if trip["other"] == "per-expert" and not peft_has_expert_lora(pm):
        a = peft_drops_note(pm.get_base_model(), trip["other"])
    else:
        a = expert_outputs_match(want, there, f"as {trip['other']}")
    b = expert_outputs_match(want, back, "back")
    return f"PEFT on the base: {a}; {b} (≤ {EXPERT_RTOL:g} relative)"
