"""``adapterdoc extract``: a LoRA from a full fine-tune. Each weight of a Linear or Embedding module of the base
(PEFT's own layer types, read off the base's meta-device model) whose tuned value differs is read with its base
value, one tensor pair at a time in file order (a pair whose bytes are equal is compared through two small
windows and never decoded; memory: one copy of the largest changed tensor, as the tuned values are subtracted from
the base's window by window), and its delta is factorised at the rank asked for (``--rank``, ``--energy``,
``--max-error``).

A large module is factorised by :mod:`adapterdoc.algebra.large` (seeded subspace iteration under ``--rank``, the
eigendecomposition of the Gram matrix of its shorter side under ``--energy`` / ``--max-error``), a small one by
numpy's full SVD; either way the error reported is the exact error of the factors written. What a LoRA
cannot hold (a norm or bias that changed, a vocabulary that grew) is said plainly."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from adapterdoc.algebra.doctor import finish
from adapterdoc.algebra.factors import method_name
from adapterdoc.algebra.large import Projected, factorised
from adapterdoc.algebra.progress import Progress, reported
from adapterdoc.algebra.write import OutModule, check_out, write_adapter
from adapterdoc.audit.read import Reader
from adapterdoc.bases import resolve_base
from adapterdoc.checkpoint import Checkpoint, open_checkpoint
from adapterdoc.errors import RefusedError, UnsupportedInputError
from adapterdoc.report.algebra_report import AlgebraReport, ModuleRow
from adapterdoc.report.findings import Finding, make
from adapterdoc.st.dtypes import FLOAT_DTYPES
from adapterdoc.st.tensors import same_bytes

if TYPE_CHECKING:
    from numpy import ndarray as NDArray

    from adapterdoc.st.header import Header

_WIDEN = ("BF16", "F16")
"""Dtypes read as float32: the difference of two such values is exact in float32 (others are read as float64)."""


@dataclass
class _Left:
    """Tensors that changed but that the extracted LoRA does not hold."""

    other: list[tuple[str, float]] = field(default_factory=list)
    """(name, largest absolute change) of a changed tensor of no Linear/Embedding weight."""
    grown: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    """(name, base shape, tuned shape) where the shapes differ, or the base has no such tensor (base shape ())."""


def extract(
    base: str,
    tuned: str,
    out: str,
    *,
    rank: int | None = None,
    energy: float | None = None,
    max_error: float | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> AlgebraReport:
    """The LoRA adapter whose every module is the best factorisation of ``tuned − base`` at the rank asked for
    (``progress``: the tuned checkpoint's bytes done, as each tensor is). Every changed 2-D weight is factorised
    first, with numpy alone; the base's class (torch, transformers) is built on the meta device once the tensors
    are released, and says which of them are Linear or Embedding weights (the others are reported, AD960): torch's
    memory and the largest delta are never held at once."""
    if sum(x is not None for x in (rank, energy, max_error)) != 1:
        raise RefusedError(None, "give exactly one of --rank, --energy, --max-error")
    resolve_base(
        base
    )  # a base that is no model folder, or an --out that may not be written, fails before a read
    check_out(out, command="extract", inputs=[base, tuned], force=force)
    b_ckpt, t_ckpt = _open(base), _open(tuned)
    found, left = _factorised_changes(b_ckpt, t_ckpt, rank, energy, max_error, progress)
    if not found:  # said before torch is imported for the base's class
        _nothing_to_extract(tuned, left)
    kinds = module_kinds(base, {n: tuple(t.shape) for n, t in b_ckpt.tensors.items()})
    rows: list[ModuleRow] = []
    written: list[OutModule] = []
    for change in found:
        module, _, leaf = kinds.memory.get(change.name, change.name).rpartition(".")
        if leaf != "weight" or module not in kinds.kinds:
            left.other.append((change.name, change.largest))
            continue
        embedding = kinds.kinds[module] == "embedding"
        done = change.done
        # PEFT keeps an embedding's delta transposed: (b a)ᵀ = aᵀ bᵀ
        b, a = (done.a.T, done.b.T) if embedding else (done.b, done.a)
        rows.append(
            ModuleRow(
                module, min(change.shape), int(a.shape[0]), done.effective_rank, done.energy, done.error
            )
        )
        written.append(OutModule(module, b, a, embedding))
    if not written:
        _nothing_to_extract(tuned, left)
    template = _template(base, _base_config(b_ckpt), written, kinds.tied)
    written += _tied_heads(written, kinds.tied)
    paths = write_adapter(out, template, written, {}, command="extract", inputs=[base, tuned], force=force)
    method = method_name(rank, energy, max_error)
    report = AlgebraReport(
        command="extract",
        inputs=[base, tuned],
        method=method,
        out=out,
        modules=rows,
        written=paths,
    )
    return finish(report, _left_findings(left, tuned), base)


def _nothing_to_extract(tuned: str, left: _Left) -> NoReturn:
    """Exit 3: no Linear or Embedding weight of the base's shape changed (with the tensors whose shape grew)."""
    grown = "".join(
        f"; AD961: `{n}` is {list(now)} here, {list(was)} in the base" for n, was, now in left.grown
    )
    raise RefusedError(
        tuned, f"no Linear or Embedding weight of the base's shape differs: nothing to extract{grown}"
    )


@dataclass(frozen=True)
class _Change:
    """A changed 2-D tensor of the tuned checkpoint, factorised as stored (``(out, in)`` for a Linear weight,
    ``(num, dim)`` for an Embedding's)."""

    name: str
    shape: tuple[int, int]
    done: Projected
    largest: float
    """Its largest absolute change (reported if it turns out to be no Linear or Embedding weight)."""


def _factorised_changes(
    b_ckpt: Checkpoint,
    t_ckpt: Checkpoint,
    rank: int | None,
    energy: float | None,
    max_error: float | None,
    progress: Progress | None,
) -> tuple[list[_Change], _Left]:
    """Every float tensor of the tuned checkpoint whose bytes differ from the base's, read one pair at a time in
    file order: a 2-D one factorised at the rank asked for (:func:`~adapterdoc.algebra.large.factorised`), any
    other noted with its largest change, one of another shape (or missing from the base) noted as grown."""
    import numpy as np

    found: list[_Change] = []
    left = _Left()
    b_read, t_read = Reader(b_ckpt, np), Reader(t_ckpt, np)
    try:
        for name in reported(_file_order(t_ckpt), lambda n: t_ckpt.tensors[n].nbytes, progress):
            info = t_ckpt.tensors[name]
            if info.dtype not in FLOAT_DTYPES:
                continue
            b_info = b_ckpt.tensors.get(name)
            if b_info is None or tuple(b_info.shape) != tuple(info.shape):
                left.grown.append((name, tuple(b_info.shape) if b_info else (), tuple(info.shape)))
                continue
            if _same_bytes(b_ckpt, t_ckpt, name):
                continue
            delta = _delta(b_read, t_read, name)
            if delta is None:
                continue
            largest = float(max(delta.max(), -delta.min()))  # two passes, no temporary copy
            if largest == 0:  # bytes differ, values equal (±0)
                continue
            if not math.isfinite(largest):
                raise UnsupportedInputError(
                    t_ckpt.spec,
                    "changed by NaN or infinite values (this model or the base stores them), so the change "
                    "has no factorisation",
                    key=name,
                )
            if delta.ndim != 2:
                left.other.append((name, largest))
                continue
            done = factorised(delta, rank, energy, max_error)
            found.append(_Change(name, (int(delta.shape[0]), int(delta.shape[1])), done, largest))
    finally:
        b_read.close()
        t_read.close()
    return found, left


def _open(spec: str) -> Checkpoint:
    ckpt = open_checkpoint(spec)
    if ckpt.is_adapter:
        raise UnsupportedInputError(
            spec, "is an adapter; extract reads two full checkpoints (--base and --tuned)"
        )
    return ckpt


@dataclass(frozen=True)
class Kinds:
    """What the base's class makes of its modules: ``linear`` or ``embedding`` per module PEFT can put LoRA on as
    such, and the output head tied to an input embedding (``tied``: embedding → head)."""

    kinds: dict[str, str]
    tied: dict[str, str]
    memory: dict[str, str] = field(default_factory=dict)
    """On-disk tensor name → the parameter transformers loads it into, where it renames at load (Mistral3's
    ``language_model.model.*`` → ``model.language_model.*``); a name not here loads under itself."""


def module_kinds(base: str, disk_shapes: dict[str, tuple[int, ...]] | None = None) -> Kinds:
    """The base's ``nn.Linear`` / ``nn.Embedding`` modules and tied head, from its class built on the meta device
    from its config.json; with ``disk_shapes`` (the checkpoint's tensors), the load-time renames of those names
    (transformers' own conversion, :func:`adapterdoc.ml.names.build_name_map`; a tensor split or fused at load,
    such as per-expert weights, keeps its name and is reported as held by no module)."""
    import torch

    from adapterdoc.ml.build import build_meta_model
    from adapterdoc.ml.names import build_name_map

    model = build_meta_model(resolve_base(base))
    memory: dict[str, str] = {}
    if disk_shapes:
        placed = build_name_map(model, disk_shapes).by_disk
        memory = {d: p.param for d, p in placed.items() if p.whole and p.param != d}
    kinds: dict[str, str] = {}
    names = {id(mod): name for name, mod in model.named_modules()}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Embedding):
            kinds[name] = "embedding"
        elif isinstance(mod, torch.nn.Linear):
            kinds[name] = "linear"
    tied: dict[str, str] = {}
    text = model.config.get_text_config()
    inp = model.get_input_embeddings()
    outp = model.get_output_embeddings()  # type: ignore[no-untyped-call]  # unannotated in transformers
    if getattr(text, "tie_word_embeddings", False) and id(inp) in names and id(outp) in names:
        tied[names[id(inp)]] = names[id(outp)]
    return Kinds(kinds, tied, memory)


def _file_order(ckpt: Checkpoint) -> list[str]:
    """Tensor names shard by shard, in their order within each file (each file read once, front to back)."""
    files = {p: i for i, p in enumerate(dict.fromkeys(ckpt.tensor_file.values()))}
    return sorted(
        ckpt.tensors, key=lambda n: (files.get(ckpt.tensor_file.get(n, ""), 0), ckpt.tensors[n].begin)
    )


def _same_bytes(b_ckpt: Checkpoint, t_ckpt: Checkpoint, name: str) -> bool:
    """Whether tensor ``name`` has the same dtype and bytes in both safetensors checkpoints (nothing decoded)."""
    if "bin" in (b_ckpt.weights_format, t_ckpt.weights_format):
        return False
    b, t = b_ckpt.tensors[name], t_ckpt.tensors[name]
    return b.dtype == t.dtype and same_bytes(_header(b_ckpt, name), b, _header(t_ckpt, name), t)


def _header(ckpt: Checkpoint, name: str) -> Header:
    """The header of the file holding ``name``."""
    return next(h for h in ckpt.headers if h.path == ckpt.tensor_file[name])


def _delta(b_read: Reader, t_read: Reader, name: str) -> NDArray | None:
    """``tuned − base`` (float32 for BF16/F16, where the difference is exact; else float64), or None where a dtype
    is not one the reader decodes. The base is read into its reader's buffer and the tuned values are subtracted
    from it window by window (one copy of the tensor in memory): valid until the base reader's next read."""
    narrow = t_read.ckpt.tensors[name].dtype in _WIDEN and b_read.ckpt.tensors[name].dtype in _WIDEN
    delta = b_read.read(name, narrow=narrow)
    if delta is None or not t_read.subtract_from(name, delta):
        return None
    return delta


def _base_config(base: Checkpoint) -> dict[str, object]:
    """The base's config.json (empty when there is none beside its weights)."""
    import json

    path = os.path.join(base.root, "config.json") if os.path.isdir(base.root) else ""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    return raw if isinstance(raw, dict) else {}


def _template(
    base: str, config: dict[str, object], written: list[OutModule], tied: dict[str, str]
) -> dict[str, object]:
    """The extracted adapter's config: the exact modules written, the task type of a causal LM, and
    ``ensure_weight_tying`` where the base ties its output head to an embedding the adapter changes (else PEFT would
    apply the embedding's LoRA to the input side only, and the head would keep the base's weights)."""
    archs = config.get("architectures")
    causal = isinstance(archs, list) and any(str(a).endswith("ForCausalLM") for a in archs)
    tying = any(m.embedding and m.name in tied for m in written)
    return {
        "peft_type": "LORA",
        "base_model_name_or_path": base,
        "bias": "none",
        "target_modules": sorted(m.name for m in written),
        "task_type": "CAUSAL_LM" if causal else None,
        **({"ensure_weight_tying": True} if tying else {}),
    }


def _tied_heads(written: list[OutModule], tied: dict[str, str]) -> list[OutModule]:
    """The tied head's LoRA, as PEFT saves it with ``ensure_weight_tying``: ``lora_A = Bᵀ``, ``lora_B = Aᵀ`` of the
    embedding's (the head's delta is the embedding's, ``(B A)ᵀ``)."""
    return [OutModule(tied[m.name], m.a.T, m.b.T) for m in written if m.embedding and m.name in tied]


def _left_findings(left: _Left, tuned: str) -> list[Finding]:
    out: list[Finding] = []
    if left.other:
        worst = max(left.other, key=lambda x: x[1])
        out.append(
            make(
                "AD960",
                f"{len(left.other)} changed tensors are no Linear or Embedding weight, so the LoRA does not hold "
                f"them (largest change {worst[1]:.3g} in `{worst[0]}`)",
                key=worst[0],
                path=tuned,
                hint="list their modules in modules_to_save when you train, or merge the tuned model instead",
            )
        )
    for name, was, now in left.grown:
        what = f"grew from {list(was)} to {list(now)}" if was else f"is new ({list(now)})"
        out.append(
            make(
                "AD961",
                f"`{name}` {what}: a LoRA cannot add rows or tensors",
                key=name,
                path=tuned,
                hint="save the module whole (modules_to_save) and resize the base's embeddings to match",
            )
        )
    return out


__all__ = ["Kinds", "extract", "module_kinds"]
