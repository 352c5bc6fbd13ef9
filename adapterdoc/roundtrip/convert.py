"""The runtime-format round trips: PEFT → MLX → PEFT (and PEFT → GGUF → PEFT once that format exists) through
``adapterdoc convert``'s own code must give every module's delta ``scaling · B A`` back: bit for bit, or within
the one rounding the conversion reported (a scaling folded into ``lora_B``, AD806). What the target cannot hold
(a refusal) skips the trip with the reason."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from adapterdoc import formats
from adapterdoc.errors import AdapterdocError, MissingExtraError
from adapterdoc.report.roundtrip_report import Check
from adapterdoc.roundtrip.common import Fail, Skip, timed, weights_file

if TYPE_CHECKING:
    import numpy as np

    from adapterdoc.st.header import Header

ROUNDING = {"F32": 2.0**-22, "F16": 2.0**-9, "BF16": 2.0**-6}
"""The relative bound on a delta after one rounding of ``lora_B`` per element (two ulps, in float64 products)."""


def convert_roundtrips(original: str, work: str, base: str | None = None) -> list[Check]:
    """PEFT → FORMAT → PEFT for every other format this install has: one check each."""
    checks = []
    for name in formats.FORMATS:
        if name == "peft":
            continue
        try:
            mod = formats.module(name)
        except ImportError:
            continue

        def trip(mod: ModuleType = mod, name: str = name) -> str:
            return _trip(mod, name, original, os.path.join(work, f"convert-{name}"), base)

        checks.append(timed(f"convert: peft → {name} → peft", trip))
    return checks


def _trip(mod: ModuleType, name: str, original: str, folder: str, base: str | None = None) -> str:
    if weights_file(original) is None or not original:
        raise Skip("the adapter has no .safetensors weights")
    os.makedirs(folder)
    there = Path(folder) / (f"adapter.{name}" if getattr(mod, "SUFFIX", "") else name)
    back = Path(folder) / "peft"
    try:
        done = mod.from_peft(Path(original), there, base=base, outtype=None)
        mod.to_peft(there, back, base=base, outtype=None)
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
    """Every module's delta ``scaling · B A`` of ``back`` against ``original``'s, in float64 (each product of two
    factors of 16 or 32 bits is exact there, and every sum runs over the rank in one fixed order, so zero-padded
    ranks and zero blocks add nothing): equal bit for bit, or within the one rounding the conversion reported.
    PEFT's fused experts are compared expert by expert (each expert's ``B_e A_e`` per projection), so a fused form
    given back at another rank layout (``gate_up`` at twice the rank, gate and up side by side) is judged on what
    that change keeps exactly."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise Skip("comparing the deltas needs numpy (the weights extra)") from None
    want, got = _Deltas.read(original), _Deltas.read(back)
    if sorted(want.names) != sorted(got.names):
        lost = sorted(set(want.names) - set(got.names))[:3]
        new = sorted(set(got.names) - set(want.names))[:3]
        raise Fail(f"modules changed: lost {lost}, gained {new}")
    worst, compared = 0.0, 0
    for name in want.names:
        bound = ROUNDING.get(want.dtype(name), 2.0**-22) if rounded else 0.0
        for which, (d, g) in enumerate(zip(want.deltas(name), got.deltas(name), strict=True)):
            compared += 1
            if g.shape == d.shape and (g == d).all():
                continue
            where = f"`{name}` expert {which}" if name in want.fused else f"`{name}`"
            if g.shape != d.shape:
                raise Fail(f"{where}: the delta is {list(g.shape)}, was {list(d.shape)}")
            err = float(abs(g - d).max()) / (float(abs(d).max()) or 1.0)
            if err > bound:
                raise Fail(f"{where}: the delta changed by {err:.3g} (relative; allowed {bound:.3g})")
            worst = max(worst, err)
    how = "bit for bit" if worst == 0.0 else f"within the reported rounding ({worst:.3g} relative)"
    experts = sum(1 for n in want.names if n in want.fused)
    per = f" ({experts} fused expert projections compared expert by expert)" if experts else ""
    return f"{len(want.names)} module deltas equal {how}{per}"


@dataclass(frozen=True)
class _Deltas:
    """One PEFT adapter's LoRA, read header-first: what each module's delta is made of."""

    header: Header
    dense: Mapping[str, tuple[str, str, str | None, float]]
    """Module → (lora_A key, lora_B key, magnitude key or ``None``, scaling)."""
    fused: Mapping[str, tuple[str, str, int, float]]
    """``<experts block>.<projection>`` of PEFT's fused experts → (lora_A key, lora_B key, experts, scaling)."""

    @property
    def names(self) -> list[str]:
        return [*self.dense, *(f"{m}.m" for m, v in self.dense.items() if v[2]), *self.fused]

    @classmethod
    def read(cls, folder: Path) -> _Deltas:
        from adapterdoc.adapter import AdapterConfig, parse_key
        from adapterdoc.adapter.expert_picture import expert_picture
        from adapterdoc.remap.expert_names import DOWN, GATE_UP
        from adapterdoc.st.header import read_header

        cfg = AdapterConfig.load(folder / "adapter_config.json")
        header = read_header(folder / "adapter_model.safetensors")
        pic = expert_picture({k: t.shape for k, t in header.tensors.items()}, config=cfg)
        fused: dict[str, tuple[str, str, int, float]] = {}
        taken: set[str] = set()
        for block in pic.blocks:
            keys = [k for k in block.keys if k.form == "fused"]
            for proj in sorted({k.projection for k in keys}):
                pair = {k.role: k.key for k in keys if k.projection == proj}
                r = block.fused_rank.get(proj)
                if set(pair) != {"lora_A", "lora_B"} or not block.experts or not r:
                    continue
                param = GATE_UP if proj == "gate_up" else DOWN  # PEFT's patterns see the parameter's path
                scaling = cfg.scaling_for(f"{block.path}.{param}")
                fused[f"{block.path}.{proj}"] = (pair["lora_A"], pair["lora_B"], block.experts, scaling)
                taken.update(pair.values())
        roles: dict[str, dict[str, str]] = {}
        for k in header.tensors:
            if k not in taken:
                p = parse_key(k)
                roles.setdefault(p.module, {})[p.role] = k
        dense = {
            m: (r["lora_A"], r["lora_B"], r.get("magnitude"), cfg.scaling_for(m))
            for m, r in roles.items()
            if "lora_A" in r and "lora_B" in r
        }
        return cls(header, dense, fused)

    def dtype(self, name: str) -> str:
        a_b = self.fused.get(name) or self.dense.get(name.removesuffix(".m"))
        assert a_b is not None
        return self.header.tensors[a_b[1]].dtype

    def deltas(self, name: str) -> Iterator[np.ndarray]:
        """The module's delta (one), or each expert's, in float64."""
        if name in self.fused:
            a_key, b_key, experts, scaling = self.fused[name]
            a, b = self._f64(a_key), self._f64(b_key)
            a = a.reshape(experts, -1, a.shape[-1])  # [E, r, in]: expert e's rows e·r …
            b = b.reshape(b.shape[0], -1, experts)  # [out, r, E]: expert e's rank k in column k·E + e
            for e in range(experts):
                yield scaling * _product(b[:, :, e], a[e])
        elif name.endswith(".m") and name.removesuffix(".m") in self.dense:
            m = self.dense[name.removesuffix(".m")][2]
            assert m is not None
            yield self._f64(m)
        else:
            a_key, b_key, _, scaling = self.dense[name]
            yield scaling * _product(self._f64(b_key), self._f64(a_key))

    def _f64(self, key: str) -> np.ndarray:
        import numpy as np

        from adapterdoc.st.tensors import read_tensor_bytes

        info = self.header.tensors[key]
        buf = read_tensor_bytes(self.header, key)
        if info.dtype == "BF16":
            x = (np.frombuffer(buf, "<u2").astype("<u4") << 16).view("<f4")
        else:
            x = np.frombuffer(buf, {"F32": "<f4", "F16": "<f2", "F64": "<f8"}[info.dtype])
        return x.astype("<f8").reshape(info.shape)


def _product(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``b @ a`` summed over the rank in one fixed order (rank 0 first), so that zero-padded ranks and zero blocks
    leave every element's sum as it was (a BLAS product may block the sum differently per shape)."""
    import numpy as np

    out = np.zeros((b.shape[0], a.shape[1]))
    for k in range(a.shape[0]):
        out += np.outer(b[:, k], a[k])
    return out
