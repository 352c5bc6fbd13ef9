"""``adapterdoc combine`` and ``adapterdoc resize``: read the adapters, compute each module's result from its
factors, write a plain PEFT adapter, and report per module rank in → out, kept energy and relative error."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import TYPE_CHECKING

from adapterdoc.algebra.checks import base_findings, check_layouts, check_modules_to_save, check_shapes
from adapterdoc.algebra.doctor import finish
from adapterdoc.algebra.elementwise import ELEMENTWISE, merged_delta
from adapterdoc.algebra.factors import (
    Term,
    chosen_rank,
    kept_rank,
    method_name,
    spectrum,
    stack,
    truncate,
)
from adapterdoc.algebra.large import optimal
from adapterdoc.algebra.progress import Progress, reported
from adapterdoc.algebra.read import Module, Source, read_source
from adapterdoc.algebra.write import OutModule, Planned, check_out, write_adapter, write_stream
from adapterdoc.errors import RefusedError
from adapterdoc.report.algebra_report import AlgebraReport, ModuleRow

if TYPE_CHECKING:
    from numpy import ndarray as NDArray

METHODS = ("cat", "svd", *ELEMENTWISE)
"""``combine --method`` choices."""


def combine(
    adapters: Sequence[str | os.PathLike[str]],
    out: str,
    *,
    method: str = "cat",
    weights: Sequence[float] | None = None,
    rank: int | None = None,
    density: float | None = None,
    seed: int = 0,
    base: str | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> AlgebraReport:
    """``Σ wᵢ · scalingᵢ · Bᵢ Aᵢ`` per module: exactly (``cat``, rank ``Σ rᵢ``) or its best rank-``rank``
    factorisation (``svd``; default rank: the largest source rank); ``ties`` / ``dare`` (PEFT's, at ``density``,
    ``dare`` seeded) of the sources' full deltas, factorised like ``svd``. ``progress``: the sources' factor bytes
    read, as each module is."""
    if method not in METHODS:
        raise RefusedError(None, f"--method {method} is not built yet; use one of {', '.join(METHODS)}")
    if (density is None) != (method not in ELEMENTWISE):
        raise RefusedError(None, "--density goes with --method ties or dare, and they need it")
    ws = [1.0] * len(adapters) if weights is None else [float(w) for w in weights]
    if len(ws) != len(adapters):
        raise RefusedError(None, f"--weights gives {len(ws)} weights for {len(adapters)} adapters")
    check_out(out, command="combine", inputs=[os.fspath(a) for a in adapters], force=force)
    with ExitStack() as stack_:
        sources = [stack_.enter_context(read_source(a)) for a in adapters]
        rows, written = _combine_modules(sources, ws, method, rank, density, seed, progress)
    full_saved = {k: v for s in sources for k, v in s.full.items()}
    paths = write_adapter(
        out,
        _template(sources),
        written,
        full_saved,
        command="combine",
        inputs=[s.spec for s in sources],
        force=force,
    )
    notes = _notes(full_saved)
    if method in ELEMENTWISE:
        notes.append(f"{method} at density {density:g}" + (f", seed {seed}" if method == "dare" else ""))
    report = AlgebraReport(
        command="combine",
        inputs=[s.spec for s in sources],
        method=method,
        out=out,
        weights=ws,
        modules=rows,
        written=paths,
        notes=notes,
    )
    return finish(report, base_findings(sources), base)


def _combine_modules(
    sources: list[Source],
    ws: list[float],
    method: str,
    rank: int | None,
    density: float | None,
    seed: int,
    progress: Progress | None = None,
) -> tuple[list[ModuleRow], list[OutModule]]:
    """Every module of the union, in order of first appearance, one at a time (each source's factors read for it
    alone: memory is one module of each source plus the results)."""
    check_layouts(sources)
    check_shapes(sources)
    check_modules_to_save(sources)
    names = list(dict.fromkeys(n for s in sources for n in s.factors))
    target = rank if rank is not None else max(f.rank for s in sources for f in s.factors.values())
    rows: list[ModuleRow] = []
    written: list[OutModule] = []
    for index, name in enumerate(reported(names, lambda n: sum(s.nbytes(n) for s in sources), progress)):
        held = [(s.read(name), w) for s, w in zip(sources, ws, strict=True) if name in s.factors]
        row, module = _combined(name, held, method, target, density, seed + index)
        rows.append(row)
        written.append(module)
    return rows, written


def resize(
    adapter: str | os.PathLike[str],
    out: str,
    *,
    rank: int | None = None,
    energy: float | None = None,
    max_error: float | None = None,
    base: str | None = None,
    to_lora: bool = False,
    force: bool = False,
    progress: Progress | None = None,
) -> AlgebraReport:
    """Each module's best factorisation at ``rank``, or at the smallest rank per module keeping ``energy`` of
    ``‖ΔW‖_F²`` or within relative error ``max_error`` (written as ``rank_pattern``). ``progress``: the adapter's
    factor bytes read, as each module is."""
    chosen = [x for x in (rank, energy, max_error) if x is not None]
    if len(chosen) != 1:
        raise RefusedError(None, "give exactly one of --rank, --energy, --max-error")
    if to_lora and base is None:
        raise RefusedError(None, "--to-lora needs --base BASE (the weights DoRA normalises)")
    check_out(
        out, command="resize", inputs=[os.fspath(adapter), *([base] if to_lora and base else [])], force=force
    )
    if to_lora:
        assert base is not None
        from adapterdoc.algebra.dora import dora_to_lora

        done = dora_to_lora(
            adapter, base, out, rank=rank, energy=energy, max_error=max_error, force=force, progress=progress
        )
        return finish(done, [], base)
    rows: list[ModuleRow] = []
    with read_source(adapter) as src:
        results = _resized_in_order(src, rank, energy, max_error, rows, progress)
        if rank is None:  # the ranks are known once every module is computed
            paths = write_adapter(
                out, src.config.raw, list(results), src.full, command="resize", inputs=[src.spec], force=force
            )
        else:  # every module's rank is known now: each is written as soon as it is computed
            plan = [
                Planned(f.name, kept_rank(rank, f.rank), f.shape, f.embedding) for f in src.factors.values()
            ]
            paths = write_stream(
                out, src.config.raw, plan, results, src.full, command="resize", inputs=[src.spec], force=force
            )
    method = method_name(rank, energy, max_error)
    report = AlgebraReport(
        command="resize",
        inputs=[src.spec],
        method=method,
        out=out,
        modules=rows,
        written=paths,
        notes=_notes(src.full),
    )
    return finish(report, [], base)


WORKERS = 2
"""Threads ``resize`` computes modules on (numpy's BLAS and LAPACK calls release the GIL; the reads stay on the
calling thread, in file order)."""


def _resized_in_order(
    src: Source,
    rank: int | None,
    energy: float | None,
    max_error: float | None,
    rows: list[ModuleRow],
    progress: Progress | None = None,
) -> Iterator[OutModule]:
    """Each module of ``src`` resized, in file order, its row appended to ``rows``: read on the calling thread,
    computed on :data:`WORKERS` threads. The reads go into a ring of ``WORKERS + 1`` buffer pairs: a module is read
    only once at most ``WORKERS - 1`` others are in flight, so no module's buffers are read over while it is
    computed."""
    pending: deque[Future[tuple[ModuleRow, OutModule]]] = deque()
    with ThreadPoolExecutor(WORKERS) as pool:
        for i, name in enumerate(reported(src.factors, src.nbytes, progress)):
            m = src.read(name, i % (WORKERS + 1))
            pending.append(pool.submit(_resized, m, rank, energy, max_error))
            while len(pending) >= WORKERS:
                yield _collected(pending.popleft(), rows)
        while pending:
            yield _collected(pending.popleft(), rows)


def _resized(
    m: Module, rank: int | None, energy: float | None, max_error: float | None
) -> tuple[ModuleRow, OutModule]:
    """One module of ``resize``: its best factorisation at the rank asked for, as float32 (what is written)."""
    import numpy as np

    sp = spectrum(m.b, m.a, m.scaling)
    t = truncate(sp, chosen_rank(sp.s, rank, energy, max_error))
    b, a = t.b.astype(np.float32), t.a.astype(np.float32)
    return t.row(m.name, m.rank), OutModule(m.name, b, a, m.embedding)


def _collected(done: Future[tuple[ModuleRow, OutModule]], rows: list[ModuleRow]) -> OutModule:
    row, module = done.result()
    rows.append(row)
    return module


def _combined(
    name: str, held: list[tuple[Module, float]], method: str, rank: int, density: float | None, seed: int
) -> tuple[ModuleRow, OutModule]:
    """One module of ``combine``: the sources that hold it, with their weights, by ``method``."""
    embedding = held[0][0].embedding
    if method in ELEMENTWISE:
        assert density is not None
        deltas = [m.scaling * (m.b @ m.a) for m, _ in held]
        full = merged_delta(method, deltas, [w for _, w in held], density=density, seed=seed)
        return _full_truncated(name, full, sum(m.rank for m, _ in held), rank, embedding)
    b, a = stack([Term(m.a, m.b, w * m.scaling) for m, w in held])
    if method == "cat":
        return ModuleRow(name, a.shape[0], a.shape[0], None, _energy(b, a), 0.0), OutModule(
            name, b, a, embedding
        )
    return _truncated(name, b, a, rank, embedding)


def _truncated(name: str, b: NDArray, a: NDArray, rank: int, embedding: bool) -> tuple[ModuleRow, OutModule]:
    """The best rank-``rank`` factorisation of ``b @ a`` and its row."""
    t = truncate(spectrum(b, a), rank)
    row = t.row(name, int(a.shape[0]))
    return row, OutModule(name, t.b, t.a, embedding)


def _full_truncated(
    name: str, full: NDArray, rank_in: int, rank: int, embedding: bool
) -> tuple[ModuleRow, OutModule]:
    """The best rank-``rank`` factorisation of a full delta (:func:`~adapterdoc.algebra.large.optimal`) and its
    row."""
    done = optimal(full, rank, None, None)
    row = ModuleRow(name, rank_in, int(done.a.shape[0]), done.effective_rank, done.energy, done.error)
    return row, OutModule(name, done.b, done.a, embedding)


def _energy(b: NDArray, a: NDArray) -> float:
    """``‖b a‖_F²`` from the factors: ``trace((bᵀb)(a aᵀ))``."""
    import numpy as np

    return float(np.einsum("ij,ji->", b.T @ b, a @ a.T))


def _template(sources: Sequence[Source]) -> dict[str, object]:
    """The first source's config; where the sources select their modules differently, the exact list of the
    modules written (so PEFT wraps exactly those)."""
    fields = ("target_modules", "exclude_modules", "layers_to_transform", "layers_pattern", "modules_to_save")
    raw = dict(sources[0].config.raw)
    if any(any(s.config.raw.get(f) != raw.get(f) for f in fields) for s in sources[1:]):
        for f in fields:
            raw.pop(f, None)
        raw["target_modules"] = sorted({n for s in sources for n in s.factors})
        saved = sorted({m for s in sources for m in s.config.modules_to_save})
        if saved:
            raw["modules_to_save"] = saved
    return raw


def _notes(full: Mapping[str, object]) -> list[str]:
    return [f"{len(full)} whole saved weights (modules_to_save) copied as float32"] if full else []


__all__ = ["METHODS", "combine", "resize"]
