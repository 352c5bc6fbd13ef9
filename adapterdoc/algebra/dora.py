"""``resize --to-lora --base BASE``: a DoRA adapter as plain LoRA. Each DoRA module's effective delta is PEFT's merge
of it, ``ΔW = (m / ‖W + s·B A‖_row) · (W + s·B A) − W`` (the magnitude ``m`` over the row norms of the updated base
weight, as ``peft.tuners.lora.dora`` computes them, in float64), factorised at the rank asked for; its error is
reported per module like any truncation. On an embedding PEFT normalises the columns of the ``(num, dim)`` weight
(one magnitude per embedding dimension, the norm over the vocabulary), which are the rows of its transpose, the
layout ``b @ a`` has there: the same formula on the transposed weight. Needs the base's weights, one module's weight
at a time."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from adapterdoc.adapter import parse_key
from adapterdoc.algebra.factors import chosen_rank, method_name, spectrum, truncate
from adapterdoc.algebra.large import optimal
from adapterdoc.algebra.progress import Progress, reported
from adapterdoc.algebra.read import read_array, read_source
from adapterdoc.algebra.write import OutModule, write_adapter
from adapterdoc.audit.read import Reader
from adapterdoc.checkpoint import open_checkpoint
from adapterdoc.errors import RefusedError, UnsupportedInputError
from adapterdoc.report.algebra_report import AlgebraReport, ModuleRow

if TYPE_CHECKING:
    from numpy import ndarray as NDArray


def dora_to_lora(
    adapter: str | os.PathLike[str],
    base: str,
    out: str,
    *,
    rank: int | None = None,
    energy: float | None = None,
    max_error: float | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> AlgebraReport:
    """The plain LoRA adapter nearest (per module, at the rank asked for) to the DoRA adapter ``adapter`` on
    ``base``; modules without a magnitude are resized as plain LoRA. ``progress``: the adapter's factor bytes
    read, as each module is."""
    import numpy as np

    rows: list[ModuleRow] = []
    written: list[OutModule] = []
    with read_source(adapter, dora=True) as src:
        tensors = src.reader.ckpt.tensors
        magnitudes = {parse_key(k).module: k for k in tensors if parse_key(k).role == "magnitude"}
        if not magnitudes:
            raise RefusedError(
                src.spec, "is no DoRA adapter (no magnitude vectors); resize it without --to-lora"
            )
        b_ckpt = open_checkpoint(base)
        b_reader = Reader(b_ckpt, np)
        try:
            for name in reported(src.factors, src.nbytes, progress):
                m = src.read(name)
                if name not in magnitudes:
                    sp = spectrum(m.b, m.a, m.scaling)
                    t = truncate(sp, chosen_rank(sp.s, rank, energy, max_error))
                    rows.append(t.row(name, m.rank))
                    written.append(OutModule(name, t.b, t.a, m.embedding))
                    continue
                weight = _base_weight(b_reader, b_ckpt.spec, name, m.shape, m.embedding)
                magnitude = read_array(src.reader, magnitudes[name], src.spec, 2)
                if magnitude.shape != (m.shape[0],):
                    raise UnsupportedInputError(
                        src.spec, f"`{magnitudes[name]}` is no float vector of {m.shape[0]}"
                    )
                done = optimal(
                    effective_delta(weight, m.b, m.a, m.scaling, magnitude), rank, energy, max_error
                )
                rank_out = int(done.a.shape[0])
                rows.append(ModuleRow(name, m.rank, rank_out, done.effective_rank, done.energy, done.error))
                written.append(OutModule(name, done.b, done.a, m.embedding))
        finally:
            b_reader.close()
        cfg, full, spec = src.config, src.full, src.spec
    paths = write_adapter(
        out, cfg.raw, written, full, command="resize", inputs=[os.fspath(adapter), base], force=force
    )
    method = method_name(rank, energy, max_error)
    return AlgebraReport(
        command="resize",
        inputs=[spec],
        method=f"to-lora, {method}",
        out=out,
        modules=rows,
        written=paths,
        notes=[f"DoRA → LoRA on {base}: {len(magnitudes)} modules' effective deltas factorised"],
    )


def effective_delta(weight: NDArray, b: NDArray, a: NDArray, scaling: float, magnitude: NDArray) -> NDArray:
    """PEFT's merged DoRA weight minus the base weight: ``(m / ‖W + s·B A‖_row) · (W + s·B A) − W`` (for an
    embedding, ``weight`` is the transpose of the stored one and so is the result)."""
    import numpy as np

    updated = weight + scaling * (b @ a)
    norm = np.linalg.norm(updated, axis=1)
    delta: NDArray = (magnitude / norm)[:, None] * updated - weight
    return delta


def _base_weight(reader: Reader, spec: str, module: str, shape: tuple[int, int], embedding: bool) -> NDArray:
    """The base weight DoRA module ``module`` normalises, laid out as ``b @ a`` (``shape``): an embedding's stored
    ``(num, dim)`` weight transposed."""
    name = f"{module}.weight"
    if name not in reader.ckpt.tensors:
        raise RefusedError(
            spec, f"stores no `{name}`, the weight DoRA module `{module}` normalises", key=name
        )
    stored = (shape[1], shape[0]) if embedding else shape
    weight = reader.read(name, 0)
    if weight is None or tuple(weight.shape) != stored:
        raise RefusedError(spec, f"`{name}` is no float {list(stored)} weight", key=name)
    return weight.T if embedding else weight


__all__ = ["dora_to_lora", "effective_delta"]
