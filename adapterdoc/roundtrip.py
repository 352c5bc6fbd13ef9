"""`adapterdoc roundtrip`: run every move a user makes with an adapter, on copies, and prove nothing changed.

Byte level (always): every remap the registry allows from the adapter's layout, there and back, must give the
input's exact bytes; ``.safetensors`` → ``.bin`` → ``.safetensors`` must keep names, dtypes and values.
With a base that has weights (a model folder or ``tiny:LAYOUT``): load → save → load gives identical tensors and
outputs; the merged model's outputs equal the unmerged adapter model's; the adapter remapped to the text
counterpart, loaded on the counterpart class holding the same base weights, gives identical outputs.
A mixture-of-experts adapter also goes to the other expert layout and back (``remap --experts``): names equal,
shapes and bytes equal where the move is exact (gate_up's rank doubles, see :func:`expert_trip`), and with a base
the outputs of both moved adapters equal the original's.
The input is never modified: everything runs in a temp folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from adapterdoc.adapter import ADAPTER_CONFIG
from adapterdoc.checkpoint import ADAPTER_WEIGHTS, Checkpoint, open_checkpoint
from adapterdoc.errors import AdapterdocError, UnsupportedInputError
from adapterdoc.layouts import LAYOUTS, detect_layout, remap_path
from adapterdoc.ml.quiet import quiet_transformers
from adapterdoc.report.findings import make
from adapterdoc.report.roundtrip_report import Check, RoundtripReport

MERGE_RTOL = 1e-4
"""Merged vs unmerged outputs: max |diff| ≤ MERGE_RTOL · max(1, max |output|) (float32 rounding of W + s·BA)."""


class _Fail(Exception):
    """A round trip that ran and found a difference."""


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
    report = RoundtripReport(input=src.spec, layout=layout, base=base)
    from adapterdoc.st.atomic import ensure_folder, writing

    if keep is not None:
        keep = ensure_folder(os.path.expanduser(os.fspath(keep)), option="--keep")
    with writing(keep or tempfile.gettempdir()):
        work = tempfile.mkdtemp(prefix="adapterdoc-roundtrip-", dir=keep)
    try:
        original = copy_adapter(src, os.path.join(work, "original"))
        _identity_warning(report, original)
        byte_roundtrips(report, original, layout, work)
        _format_roundtrip(report, original, work)
        trip: dict[str, str] = {}
        _expert_check(report, original, work, trip)
        if base is None:
            report.checks.append(
                Check(
                    "load/save/merge/counterpart",
                    "skipped",
                    "no --base: the model-level round trips need base weights "
                    "(a model folder with weights, or tiny:LAYOUT)",
                )
            )
        else:
            _model_roundtrips(report, original, layout, base, work, trip)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    for c in report.checks:
        if c.status == "fail":
            report.findings.append(
                make(_CODE_FOR.get(c.name.split(":")[0], "AD701"), f"{c.name}: {c.detail}", path=report.input)
            )
    return report


def _identity_warning(report: RoundtripReport, original: str) -> None:
    """An all-zero lora_B adapter is the identity: every output comparison then passes trivially. Say so."""
    from adapterdoc.adapter import parse_key
    from adapterdoc.st.header import read_header
    from adapterdoc.st.tensors import scan_tensor

    weights = _weights_file(original)
    if weights is None:
        return
    header = read_header(weights)
    bs = [k for k in header.tensors if parse_key(k).is_b]
    if bs and all(scan_tensor(header, k, finite=False, stop_at_nonzero=True).all_zero for k in bs):
        report.findings.append(
            make(
                "AD706",
                f"all {len(bs)} lora_B tensors are zero: the adapter is the identity, so the output "
                "comparisons below cannot tell a good move from a bad one",
                path=report.input,
            )
        )


_CODE_FOR = {
    "remap": "AD701",
    "format": "AD702",
    "reload": "AD703",
    "merge": "AD704",
    "counterpart": "AD705",
    "experts": "AD707",
}


def copy_adapter(src: Checkpoint, folder: str) -> str:
    """A private, regular-file copy of the adapter (symlinks followed, so the cache is never touched)."""
    os.makedirs(folder)
    if src.kind == "adapter" and os.path.isdir(src.root):
        for name in os.listdir(src.root):
            p = os.path.join(src.root, name)
            if os.path.isfile(p):
                shutil.copyfile(p, os.path.join(folder, name))
    else:
        assert src.weights_path is not None
        if src.weights_format == "bin":
            shutil.copyfile(src.weights_path, os.path.join(folder, "adapter_model.bin"))
        else:
            shutil.copyfile(src.weights_path, os.path.join(folder, ADAPTER_WEIGHTS))
    return folder


def _timed(report: RoundtripReport, name: str, fn: Callable[[], str]) -> None:
    t = time.perf_counter()
    try:
        detail, status = fn(), "pass"
    except _Fail as e:
        detail, status = str(e), "fail"
    except _Skip as e:
        detail, status = str(e), "skipped"
    except AdapterdocError as e:
        detail, status = f"refused: {e}", "fail"
    report.checks.append(Check(name, status, detail, round(time.perf_counter() - t, 3)))


class _Skip(Exception):
    """A round trip that does not apply to this adapter (the reason)."""


TripFailed, TripSkipped = _Fail, _Skip
"""What :func:`expert_trip` raises, for the callers outside this module (train-smoke's expert check)."""


def _sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _weights_file(folder: str) -> str | None:
    p = os.path.join(folder, ADAPTER_WEIGHTS)
    return p if os.path.exists(p) else None


def reachable_layouts(layout: str) -> list[str]:
    """Every layout the registry can move ``layout`` to (directly or chained)."""
    if layout not in LAYOUTS:
        return []
    return [name for name in LAYOUTS if name != layout and remap_path(layout, name) is not None]


def byte_roundtrips(report: RoundtripReport, original: str, layout: str, work: str) -> None:
    from adapterdoc.remap import remap

    weights = _weights_file(original)
    if weights is None:
        report.checks.append(Check("remap", "skipped", "the adapter has no .safetensors weights to remap"))
        return
    targets = reachable_layouts(layout)
    if not targets:
        why = f"layout {layout!r} has no registry moves" if layout in LAYOUTS else f"layout is {layout}"
        report.checks.append(Check("remap", "skipped", why))
        return
    want_w = _sha(weights)
    want_c = _read_json(os.path.join(original, ADAPTER_CONFIG))
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
            got = _weights_file(folder)
            assert got is not None
            if _sha(got) != want_w:
                raise _Fail(f"{layout} → {target} → {layout}: weights bytes differ from the input")
            note = _config_difference(want_c, _read_json(os.path.join(folder, ADAPTER_CONFIG)), target)
            return (
                f"{there.renamed} keys renamed ({there.strategy}), {back.renamed} back ({back.strategy}); "
                f"weights byte-identical, {note}"
            )

        _timed(report, f"remap:{layout}→{target}→{layout}", there_and_back)


def _config_difference(want: Any, got: Any, via: str) -> str:
    """``config identical`` or the one accepted difference; raises :class:`_Fail` otherwise.

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
        raise _Fail(f"adapter_config.json differs from the input in {sorted(diff)}")
    raise _Fail("adapter_config.json differs from the input")


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def _format_roundtrip(report: RoundtripReport, original: str, work: str) -> None:
    def convert() -> str:
        try:
            import torch
            from safetensors.torch import load_file
        except ImportError:
            raise _Skip("needs torch (the ML extra) to write a .bin") from None
        from adapterdoc.checkpoint import load_bin
        from adapterdoc.remap import remap

        weights = _weights_file(original)
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
        _same_tensors(ref, mid, "safetensors → .bin")
        back_dir = os.path.join(work, "back-to-safetensors")
        remap(
            bin_dir, rules=["(?!)=>"], out=back_dir
        )  # a rule that matches nothing: a pure format conversion
        back = load_file(os.path.join(back_dir, ADAPTER_WEIGHTS))
        _same_tensors(ref, back, ".bin → safetensors")
        return f"{len(ref)} tensors: names, dtypes, shapes and values identical both ways"

    _timed(report, "format:safetensors↔bin", convert)


def _same_tensors(a: dict[str, Any], b: dict[str, Any], what: str) -> None:

    if set(a) != set(b):
        raise _Fail(f"{what}: names differ ({sorted(set(a) ^ set(b))[:3]} ...)")
    for k in a:
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not _bitwise_equal(a[k], b[k]):
            raise _Fail(
                f"{what}: `{k}` differs ({a[k].dtype}{list(a[k].shape)} vs {b[k].dtype}{list(b[k].shape)})"
            )


def _bitwise_equal(a: Any, b: Any) -> bool:
    """Equal bit for bit (so NaN equals the same NaN, which ``torch.equal`` denies)."""
    import torch

    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ------------------------------------------------------------------------------------------------- model level


def _model_roundtrips(
    report: RoundtripReport, original: str, layout: str, base_spec: str, work: str, trip: dict[str, str]
) -> None:
    from adapterdoc.bases import resolve_base
    from adapterdoc.ml.build import require_ml

    require_ml(base_spec)
    quiet_transformers()
    base = resolve_base(base_spec)
    if not base.has_weights:
        report.checks.append(
            Check(
                "load/save/merge/counterpart",
                "skipped",
                f"{base_spec} has no weights (config only): the model-level round trips need them",
            )
        )
        return
    if not os.path.exists(os.path.join(original, ADAPTER_CONFIG)):
        report.checks.append(
            Check(
                "load/save/merge/counterpart",
                "skipped",
                "the adapter has no adapter_config.json, so PEFT cannot load it",
            )
        )
        return
    from adapterdoc.ml.load import load_base

    state: dict[str, Any] = {}
    _timed(report, "reload:load→save→load", lambda: _reload(state, base, original, work, trip))
    if "outputs" not in state:
        return
    _timed(report, "merge:merged=unmerged", lambda: _merge(state, base, original, work))
    _timed(
        report,
        "counterpart:remapped on text class",
        lambda: _counterpart(state, load_base(base), layout, original, work),
    )
    if trip:
        _timed(report, f"experts:outputs {trip['path']}", lambda: _expert_outputs(state, base, trip))


def _peft_outputs(model: Any, adapter_dir: str) -> tuple[Any, Any]:
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
        out = forward(pm.base_model.model, probe)
    return pm, out


def _reload(state: dict[str, Any], base: Any, original: str, work: str, trip: dict[str, str]) -> str:
    from safetensors.torch import load_file

    from adapterdoc.ml.load import load_base

    try:
        pm, first = _peft_outputs(load_base(base), original)
    except (
        ValueError
    ) as e:  # PEFT refuses to convert it at load (gate without up, ...): a finding, not a crash
        raise _Fail(f"PEFT refuses to load it: {' '.join(str(e).split())[:300]}") from None
    saved = os.path.join(work, "resaved")
    pm.save_pretrained(saved)
    _, second = _peft_outputs(load_base(base), os.path.join(saved))
    state["outputs"] = first
    # PEFT loads a per-expert adapter fused (its load conversion) and saves it fused: the saved tensors must then
    # equal ``remap --experts fused``'s, tensor for tensor
    fused = trip.get("form") == "per-expert"
    ref = _weights_file(trip["there"] if fused else original)
    if ref is not None:
        what = "load → save (PEFT's fused vs remap --experts fused)" if fused else "load → save"
        _same_tensors(load_file(ref), load_file(os.path.join(saved, ADAPTER_WEIGHTS)), what)
    diff = float((first - second).abs().max())
    if not _bitwise_equal(first, second):
        raise _Fail(f"outputs after load → save → load differ by {diff:.3g}")
    said = "PEFT saved it fused, tensor for tensor as remap --experts fused" if fused else "tensors identical"
    return f"{said} after save; outputs identical (probe output {tuple(first.shape)})"


def _merge(state: dict[str, Any], base: Any, original: str, work: str) -> str:
    from adapterdoc.merge import merge
    from adapterdoc.ml.load import forward, load_base, probe_inputs

    base_dir = base.root
    if base.kind == "tiny":
        base_dir = os.path.join(work, "tiny-base")
        load_base(base).save_pretrained(base_dir)
    out = os.path.join(work, "merged")
    result = merge(original, base=base_dir, out=out)
    refused = [f for f in result.findings if f.severity == "error"]
    if refused and not result.unused:
        raise _Fail("merge refused: " + "; ".join(f"{f.code} {f.message}" for f in refused[:2]))
    if getattr(result, "unused", None):
        raise _Fail(f"merge left {len(result.unused)} adapter module(s) unused: {result.unused[:3]}")
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
        raise _Fail(
            f"merged outputs differ from the unmerged adapter model's by {diff:.3g} (bound {bound:.3g})"
        )
    return f"max |merged − unmerged| = {diff:.3g} ≤ {bound:.3g}"


def _counterpart(state: dict[str, Any], base_model: Any, layout: str, original: str, work: str) -> str:
    import torch

    from adapterdoc.ml.tiny import build_counterpart
    from adapterdoc.remap import remap

    target = LAYOUTS[layout].text_counterpart if layout in LAYOUTS else None
    if target is None:
        raise _Skip(f"layout {layout!r} has no text counterpart in the registry")
    folder = os.path.join(work, f"counterpart-{target}")
    remap(original, to=target, source=layout, out=folder)
    try:
        other = build_counterpart(base_model, layout, target)
    except (RuntimeError, KeyError, ValueError) as e:
        raise _Skip(f"cannot build {target} with the base's weights: {e}") from None
    _, got = _peft_outputs(other, folder)
    want = state["outputs"]
    inner = LAYOUTS[layout].counterpart_module
    if inner:  # the counterpart is a part of this model (an encoder without its head): compare that part
        from adapterdoc.ml.load import forward, probe_inputs

        pm, _ = _peft_outputs(base_model, original)
        with torch.no_grad():
            want = forward(getattr(pm.base_model.model, inner), probe_inputs(pm.base_model.model))
    if got.shape != want.shape:
        raise _Fail(f"outputs have different shapes: {tuple(got.shape)} vs {tuple(want.shape)}")
    if not _bitwise_equal(got, want):
        raise _Fail(f"{target} outputs differ from {layout}'s by {float((got - want).abs().max()):.3g}")
    return f"{target} with the remapped adapter gives identical outputs"


# ------------------------------------------------------------------------------------------------- expert layouts

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
    is equal in outputs, not in bytes. Raises :class:`_Skip` for an adapter ``remap --experts`` does not move
    (no routed-expert LoRA, a 3-D or mixed layout, gate or up without the other) and :class:`_Fail` otherwise.
    """
    from adapterdoc.experts import classify, expert_picture
    from adapterdoc.remap import remap

    src = open_checkpoint(original)
    weights = _weights_file(original)
    if weights is None:
        raise _Skip("the adapter has no .safetensors weights to move")
    shapes = {k: tuple(t.shape) for k, t in src.tensors.items()}
    pic = expert_picture(shapes, config=src.adapter_config)
    if pic.layout is None:
        raise _Skip("no routed expert carries LoRA: nothing for remap --experts to move")
    if pic.layout not in _DOUBLED:
        raise _Skip(f"expert layout {pic.layout}: remap --experts moves per-expert and fused adapters")
    if pic.one_sided:
        raise _Skip(f"{pic.one_sided[0].path} has only {pic.one_sided[0].one_sided}: PEFT cannot fuse it")
    form = pic.layout
    other = "fused" if form == "per-expert" else "per-expert"
    there, back = os.path.join(work, f"experts-{other}"), os.path.join(work, f"experts-{other}-back")
    remap(original, experts=other, out=there)
    remap(there, experts=form, out=back)
    path = f"{form}→{other}→{form}"
    got = open_checkpoint(back)
    got_shapes = {k: tuple(t.shape) for k, t in got.tensors.items()}
    if set(got_shapes) != set(shapes):
        raise _Fail(f"{path}: names differ ({sorted(set(shapes) ^ set(got_shapes))[:3]} ...)")
    from adapterdoc.adapter import parse_key
    from adapterdoc.st.header import read_header
    from adapterdoc.st.tensors import read_tensor_bytes

    h_in, h_back = read_header(weights), read_header(_weights_file(back) or "")
    doubled, same = [], 0
    for k, shape in shapes.items():
        ek = classify(parse_key(k), shape)
        if ek is not None and ek.projection in _DOUBLED[form]:
            if got_shapes[k] != _rank_doubled(shape, ek.role):
                raise _Fail(
                    f"{path}: `{k}` {list(got_shapes[k])}, want {list(_rank_doubled(shape, ek.role))}"
                )
            doubled.append(k)
        elif got_shapes[k] != shape or read_tensor_bytes(h_in, k) != read_tensor_bytes(h_back, k):
            raise _Fail(f"{path}: `{k}` differs ({list(shape)} → {list(got_shapes[k])})")
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


def _expert_check(report: RoundtripReport, original: str, work: str, trip: dict[str, str]) -> None:
    t = time.perf_counter()
    try:
        trip.update(expert_trip(original, work))
        status, detail, name = "pass", trip["detail"], f"experts:{trip['path']}"
    except _Skip as e:
        status, detail, name = "skipped", str(e), "experts"
    except _Fail as e:
        status, detail, name = "fail", str(e), "experts"
    except AdapterdocError as e:
        status, detail, name = "fail", f"refused: {e}", "experts"
    report.checks.append(Check(name, status, detail, round(time.perf_counter() - t, 3)))
    if status != "pass":
        trip.clear()


def expert_outputs_match(reference: Any, got: Any, what: str) -> str:
    """``max |Δ| = … ≤ bound`` or :class:`_Fail`."""
    if got.shape != reference.shape:
        raise _Fail(f"{what}: outputs have different shapes: {tuple(got.shape)} vs {tuple(reference.shape)}")
    diff = float((got - reference).abs().max())
    bound = EXPERT_RTOL * max(1.0, float(reference.abs().max()))
    if diff > bound:
        raise _Fail(f"{what}: outputs differ from the original's by {diff:.3g} (bound {bound:.3g})")
    return f"{what} max |Δ| {diff:.3g}"


def peft_has_expert_lora(model: Any) -> bool:
    """Whether PEFT put LoRA on a routed-experts module. Loading a per-expert adapter, PEFT converts it to fused
    only for the model types its conversion table lists (``peft/utils/transformers_weight_conversion.py``,
    ``_convert_peft_config_moe``: ``_MODEL_TO_CONVERSION_PATTERN``, which has no ``qwen3_5_moe`` in PEFT 0.21);
    elsewhere the expert keys are dropped without a warning and the experts carry no LoRA."""
    return any(n.endswith(".experts") and hasattr(m, "lora_A") for n, m in model.named_modules())


def peft_drops_note(model: Any, other: str) -> str:
    kind = getattr(getattr(model, "config", None), "model_type", "?")
    return (
        f"as {other} not comparable: PEFT loads it with no LoRA on the experts (no per-expert conversion for "
        f"model type {kind}), so that spelling is checked in names and the way back only"
    )


def _expert_outputs(state: dict[str, Any], base: Any, trip: dict[str, str]) -> str:
    from adapterdoc.ml.load import load_base

    want = state["outputs"]
    pm, there = _peft_outputs(load_base(base), trip["there"])
    _, back = _peft_outputs(load_base(base), trip["back"])
    if trip["other"] == "per-expert" and not peft_has_expert_lora(pm):
        a = peft_drops_note(pm.base_model.model, trip["other"])
    else:
        a = expert_outputs_match(want, there, f"as {trip['other']}")
    b = expert_outputs_match(want, back, "back")
    return f"PEFT on the base: {a}; {b} (≤ {EXPERT_RTOL:g} relative)"
