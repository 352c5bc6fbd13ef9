"""The expert trip: a mixture-of-experts adapter to the other expert layout and back with ``remap --experts``
(names equal, shapes and bytes equal where the move is exact), and how PEFT's outputs of the moved adapters are
compared with the original's."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from adapterdoc.checkpoint import open_checkpoint
from adapterdoc.errors import AdapterdocError
from adapterdoc.report.roundtrip_report import Check
from adapterdoc.roundtrip.common import Fail, Skip, weights_file

if TYPE_CHECKING:
    import torch

EXPERT_RTOL = 1e-5
"""The adapter moved to the other expert layout (and back) vs the original, through PEFT on the same base:
max |Δ| ≤ EXPERT_RTOL · max(1, max |output|) (float32; the fused rank changes the order of the sums)."""


_DOUBLED = {"fused": ("gate_up",), "per-expert": ("gate", "up")}
"""Per expert layout, the projections whose rank the way there and back doubles."""


def expert_trip(original: str, work: str) -> dict[str, str]:
    """Move ``original`` to the other expert layout and back with ``remap --experts`` (new folders under ``work``).

    Returns ``{"form", "other", "path", "there", "back", "detail"}``. Names must come back equal; every tensor
    must come back with its shape and bytes but gate and up, whose rank doubles: fused → per-expert gives each
    expert's gate and up the same ``A_e`` (rank r each), and per-expert → fused stacks gate's and up's ranks
    (PEFT's own conversion: rank and alpha of ``gate_up_proj`` doubled, ``lora_B`` block-diagonal), so the trip
    is equal in outputs, not in bytes. Raises :class:`Skip` for an adapter ``remap --experts`` does not move
    (no routed-expert LoRA, a 3-D or mixed layout, gate or up without the other) and :class:`Fail` otherwise.
    """
    from adapterdoc.adapter.expert_picture import classify, expert_picture
    from adapterdoc.remap import remap

    src = open_checkpoint(original)
    weights = weights_file(original)
    if weights is None:
        raise Skip("the adapter has no .safetensors weights to move")
    shapes = {k: tuple(t.shape) for k, t in src.tensors.items()}
    pic = expert_picture(shapes, config=src.adapter_config)
    if pic.layout is None:
        raise Skip("no routed expert carries LoRA: nothing for remap --experts to move")
    if pic.layout not in _DOUBLED:
        raise Skip(f"expert layout {pic.layout}: remap --experts moves per-expert and fused adapters")
    if pic.one_sided:
        raise Skip(f"{pic.one_sided[0].path} has only {pic.one_sided[0].one_sided}: PEFT cannot fuse it")
    form = pic.layout
    other = "fused" if form == "per-expert" else "per-expert"
    there, back = os.path.join(work, f"experts-{other}"), os.path.join(work, f"experts-{other}-back")
    remap(original, experts=other, out=there)
    remap(there, experts=form, out=back)
    path = f"{form}→{other}→{form}"
    got = open_checkpoint(back)
    got_shapes = {k: tuple(t.shape) for k, t in got.tensors.items()}
    if set(got_shapes) != set(shapes):
        raise Fail(f"{path}: names differ ({sorted(set(shapes) ^ set(got_shapes))[:3]} ...)")
    from adapterdoc.adapter import parse_key
    from adapterdoc.st.header import read_header
    from adapterdoc.st.tensors import read_tensor_bytes

    h_in, h_back = read_header(weights), read_header(weights_file(back) or "")
    doubled, same = [], 0
    for k, shape in shapes.items():
        ek = classify(parse_key(k), shape)
        if ek is not None and ek.projection in _DOUBLED[form]:
            if got_shapes[k] != _rank_doubled(shape, ek.role):
                raise Fail(f"{path}: `{k}` {list(got_shapes[k])}, want {list(_rank_doubled(shape, ek.role))}")
            doubled.append(k)
        elif got_shapes[k] != shape or read_tensor_bytes(h_in, k) != read_tensor_bytes(h_back, k):
            raise Fail(f"{path}: `{k}` differs ({list(shape)} → {list(got_shapes[k])})")
        else:
            same += 1
    which = "/".join(_DOUBLED[form])
    detail = (
        f"{path}: {len(shapes)} names identical, {same} tensors byte-identical; {len(doubled)} {which} tensors "
        f"come back with twice the rank (not byte-equal by construction: {which}'s rank doubles on the way "
        "to fused), so they are compared in outputs"
    )
    return {"form": form, "other": other, "path": path, "there": there, "back": back, "detail": detail}


def _rank_doubled(shape: tuple[int, ...], role: str) -> tuple[int, ...]:
    """``lora_A [r, in]`` → ``[2r, in]``; ``lora_B [out, r]`` → ``[out, 2r]``."""
    if len(shape) != 2:
        return shape
    return (2 * shape[0], shape[1]) if role == "lora_A" else (shape[0], 2 * shape[1])


def expert_check(original: str, work: str, trip: dict[str, str]) -> Check:
    """The expert trip's check; on a pass ``trip`` holds what the model trips compare (else it stays empty)."""
    t = time.perf_counter()
    try:
        trip.update(expert_trip(original, work))
        status, detail, name = "pass", trip["detail"], f"experts:{trip['path']}"
    except Skip as e:
        status, detail, name = "skipped", str(e), "experts"
    except Fail as e:
        status, detail, name = "fail", str(e), "experts"
    except AdapterdocError as e:
        status, detail, name = "fail", f"refused: {e}", "experts"
    if status != "pass":
        trip.clear()
    return Check(name, status, detail, round(time.perf_counter() - t, 3))


def expert_outputs_match(reference: torch.Tensor, got: torch.Tensor, what: str) -> str:
    """``max |Δ| = … ≤ bound`` or :class:`Fail`."""
    if got.shape != reference.shape:
        raise Fail(f"{what}: outputs have different shapes: {tuple(got.shape)} vs {tuple(reference.shape)}")
    diff = float((got - reference).abs().max())
    bound = EXPERT_RTOL * max(1.0, float(reference.abs().max()))
    if diff > bound:
        raise Fail(f"{what}: outputs differ from the original's by {diff:.3g} (bound {bound:.3g})")
    return f"{what} max |Δ| {diff:.3g}"


def peft_has_expert_lora(model: torch.nn.Module) -> bool:
    """Whether PEFT put LoRA on a routed-experts module. Loading a per-expert adapter, PEFT converts it to fused
    only for the model types its conversion table lists (``peft/utils/transformers_weight_conversion.py``,
    ``_convert_peft_config_moe``: ``_MODEL_TO_CONVERSION_PATTERN``, which has no ``qwen3_5_moe`` in PEFT 0.21);
    elsewhere the expert keys are dropped without a warning and the experts carry no LoRA."""
    return any(n.endswith(".experts") and hasattr(m, "lora_A") for n, m in model.named_modules())


def peft_drops_note(model: torch.nn.Module, other: str) -> str:
    kind = getattr(getattr(model, "config", None), "model_type", "?")
    return (
        f"as {other} not comparable: PEFT loads it with no LoRA on the experts (no per-expert conversion for "
        f"model type {kind}), so that spelling is checked in names and the way back only"
    )
