"""The runtime-format round trips: PEFT → MLX → PEFT (and PEFT → GGUF → PEFT once that format exists) through
``adapterdoc convert``'s own code must give every module's delta ``scaling · B A`` back: bit for bit, or within
the one rounding the conversion reported (a scaling folded into ``lora_B``, AD806). What the target cannot hold
(a refusal) skips the trip with the reason."""

from __future__ import annotations

import os
from pathlib import Path

from adapterdoc import formats
from adapterdoc.errors import AdapterdocError, MissingExtraError
from adapterdoc.report.roundtrip_report import RoundtripReport
from adapterdoc.roundtrip.common import Fail, Skip, timed, weights_file

ROUNDING = {"F32": 2.0**-22, "F16": 2.0**-9, "BF16": 2.0**-6}
"""The relative bound on a delta after one rounding of ``lora_B`` per element (two ulps, in float64 products)."""


def convert_roundtrips(report: RoundtripReport, original: str, work: str, base: str | None = None) -> None:
    for name in formats.FORMATS:
        if name == "peft":
            continue
        try:
            mod = formats.module(name)
        except ImportError:
            continue

        def trip(mod: object = mod, name: str = name) -> str:
            return _trip(mod, name, original, os.path.join(work, f"convert-{name}"), base)

        timed(report, f"convert: peft → {name} → peft", trip)


def _trip(mod: object, name: str, original: str, folder: str, base: str | None = None) -> str:
    if weights_file(original) is None or not original:
        raise Skip("the adapter has no .safetensors weights")
    os.makedirs(folder)
    there = Path(folder) / (f"adapter.{name}" if getattr(mod, "SUFFIX", "") else name)
    back = Path(folder) / "peft"
    try:
        done = mod.from_peft(Path(original), there, base=base, outtype=None)  # type: ignore[attr-defined]
        mod.to_peft(there, back, base=base, outtype=None)  # type: ignore[attr-defined]
    except MissingExtraError:
        raise
    except AdapterdocError as e:
        raise Skip(f"{name} cannot hold this adapter: {e.reason}") from e
    rounded = any(n.startswith("AD806") for n in done.notes)
    try:
        return _compare(Path(original), back, rounded)
    except Fail as e:
        if not str(e).startswith("modules changed"):
            raise
        # the runtime gave the experts back in the other expert layout: judge every expert's delta instead
        want, got = (
            _per_expert(Path(original), Path(folder) / "want"),
            _per_expert(back, Path(folder) / "got"),
        )
        if (want, got) == (Path(original), back):
            raise
        return _compare(want, got, rounded)


def _per_expert(adapter: Path, out: Path) -> Path:
    """``adapter`` with PEFT's fused expert LoRA rewritten per expert (``remap --experts per-expert``, exact), so
    that the trip is judged on every expert's ``scaling · B A`` whichever expert layout each side is written in (a
    runtime may give back either); ``adapter`` itself when it has no fused experts."""
    from adapterdoc.remap import remap

    try:
        report = remap(str(adapter), experts="per-expert", out=str(out))
    except AdapterdocError:
        return adapter
    return out if report.strategy != "none" and out.is_dir() else adapter


def _compare(original: Path, back: Path, rounded: bool) -> str:
    try:
        import numpy as np
    except ImportError:
        raise Skip("comparing the deltas needs numpy (the weights extra)") from None
    from adapterdoc.adapter import AdapterConfig, parse_key
    from adapterdoc.st.header import read_header
    from adapterdoc.st.tensors import read_tensor_bytes

    def deltas(folder: Path) -> tuple[dict[str, object], dict[str, str]]:
        cfg = AdapterConfig.load(folder / "adapter_config.json")
        header = read_header(folder / "adapter_model.safetensors")
        roles: dict[str, dict[str, str]] = {}
        for k in header.tensors:
            p = parse_key(k)
            roles.setdefault(p.module, {})[p.role] = k
        out, dtypes = {}, {}
        for m, r in roles.items():
            if "lora_A" not in r or "lora_B" not in r:
                continue
            a, b = header.tensors[r["lora_A"]], header.tensors[r["lora_B"]]
            out[m] = (
                cfg.scaling_for(m)
                * _f64(np, read_tensor_bytes(header, r["lora_B"]), b)
                @ _f64(np, read_tensor_bytes(header, r["lora_A"]), a)
            )
            dtypes[m] = b.dtype
            if "magnitude" in r:
                out[m + ".m"] = _f64(
                    np, read_tensor_bytes(header, r["magnitude"]), header.tensors[r["magnitude"]]
                )
        return out, dtypes

    def shapes_of(folder: Path, module: str) -> tuple[object, ...]:
        header = read_header(folder / "adapter_model.safetensors")
        return tuple(sorted((k, t.shape) for k, t in header.tensors.items() if parse_key(k).module == module))

    want, dtypes = deltas(original)
    got, _ = deltas(back)
    if sorted(want) != sorted(got):
        lost = sorted(set(want) - set(got))[:3]
        new = sorted(set(got) - set(want))[:3]
        raise Fail(f"modules changed: lost {lost}, gained {new}")
    relaid = sorted(m for m in want if ".experts" in m and shapes_of(original, m) != shapes_of(back, m))
    if relaid:
        # PEFT's fused experts given back at another rank layout (gate and up as separate rank blocks, the form PEFT
        # fuses at load on some classes): the factors are not comparable one to one, and their product over all
        # experts is not each expert's delta; say so rather than pass or fail on a number that means nothing
        raise Skip(
            f"fused experts came back at another rank layout ({relaid[0]}): not comparable factor by factor"
        )
    worst = 0.0
    for m, d in want.items():
        g = got[m]
        if np.array_equal(g, d):
            continue
        scale = float(np.abs(d).max()) or 1.0
        err = float(np.abs(g - d).max()) / scale
        bound = ROUNDING.get(dtypes.get(m.removesuffix(".m"), "F32"), 2.0**-22) if rounded else 0.0
        if err > bound:
            raise Fail(f"`{m}`: the delta changed by {err:.3g} (relative; allowed {bound:.3g})")
        worst = max(worst, err)
    how = "bit for bit" if worst == 0.0 else f"within the reported rounding ({worst:.3g} relative)"
    return f"{len(want)} module deltas equal {how}"


def _f64(np: object, buf: bytes, info: object) -> object:
    dtype = info.dtype  # type: ignore[attr-defined]
    if dtype == "BF16":
        x = (np.frombuffer(buf, "<u2").astype("<u4") << 16).view("<f4")  # type: ignore[attr-defined]
    else:
        x = np.frombuffer(buf, {"F32": "<f4", "F16": "<f2", "F64": "<f8"}[dtype])  # type: ignore[attr-defined]
    return x.astype("<f8").reshape(info.shape)  # type: ignore[attr-defined]
