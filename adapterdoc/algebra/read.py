"""An adapter's LoRA modules as factor pairs with PEFT's scaling folded in: ``scaling · B A`` of each module, where
``scaling`` is ``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA), the rank and alpha taken from ``rank_pattern`` and
``alpha_pattern`` by PEFT's ``get_pattern_key``. What has no meaning as a sum of factors is refused here (exit 3)
with the fix: DoRA magnitudes, ``lora_bias``, LoRA on fused expert parameters, trainable tokens."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adapterdoc.adapter import AdapterConfig, fused_expert_owner, parse_key
from adapterdoc.audit import require_numpy
from adapterdoc.audit.read import Reader, factor_pairs
from adapterdoc.checkpoint import Checkpoint, open_checkpoint
from adapterdoc.errors import RefusedError, UnsupportedInputError

if TYPE_CHECKING:
    from numpy import ndarray as NDArray


@dataclass(frozen=True)
class Module:
    """One LoRA module: ``delta = scaling · b @ a`` (for an embedding, the transpose of the weight's delta, as PEFT
    stores ``lora_embedding_A``/``lora_embedding_B``)."""

    name: str
    """The module path without ``base_model.model.``."""
    a: NDArray
    """``(r, in)`` float64."""
    b: NDArray
    """``(out, r)`` float64."""
    scaling: float
    embedding: bool = False

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        """``(out, in)`` of ``b @ a``."""
        return int(self.b.shape[0]), int(self.a.shape[1])


@dataclass(frozen=True)
class Factors:
    """One LoRA module as its headers give it: the names of its factors, its rank, shape, kind and scaling."""

    name: str
    a: str
    b: str
    rank: int
    shape: tuple[int, int]
    """``(out, in)`` of ``b @ a``."""
    scaling: float
    embedding: bool = False


@dataclass
class Source:
    """An adapter opened for the algebra: its config, its modules' :class:`Factors` in file order, its whole saved
    weights (``modules_to_save``, small: read at once) and a reader for the factors, read on demand
    (:meth:`read`). Close it (:meth:`close`, or ``with``)."""

    spec: str
    config: AdapterConfig
    factors: dict[str, Factors]
    reader: Reader
    full: dict[str, NDArray] = field(default_factory=dict)

    def read(self, name: str, slot: int = 0) -> Module:
        """Module ``name``'s factors as float64, in this source's reader buffers ``2·slot`` (A) and ``2·slot + 1``
        (B): valid until the next read into the same ``slot``."""
        f = self.factors[name]
        a = read_array(self.reader, f.a, self.spec, 2 * slot)
        b = read_array(self.reader, f.b, self.spec, 2 * slot + 1)
        return Module(name, a, b, f.scaling, f.embedding)

    def nbytes(self, name: str) -> int:
        """The stored bytes of module ``name``'s two factors (0 for a module this source does not hold)."""
        f = self.factors.get(name)
        tensors = self.reader.ckpt.tensors
        return 0 if f is None else tensors[f.a].nbytes + tensors[f.b].nbytes

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_source(spec: str | os.PathLike[str], *, dora: bool = False) -> tuple[Checkpoint, AdapterConfig]:
    """Open ``spec`` (an adapter folder) header-only and refuse what the algebra cannot hold (``dora``: but DoRA).
    numpy is imported here, with one BLAS thread unless ``OPENBLAS_NUM_THREADS`` says otherwise
    (:func:`~adapterdoc.audit.require_numpy`): ``resize`` computes modules on threads of its own, and BLAS threads
    spinning beside them made a 1 GiB resize on 2 cores take 115 s instead of 7."""
    s = os.fspath(spec)
    require_numpy(s)
    ckpt = open_checkpoint(s)
    cfg = ckpt.adapter_config
    if cfg is None:
        raise UnsupportedInputError(s, "not a PEFT adapter (no adapter_config.json)")
    refuse_unsupported(s, cfg, list(ckpt.tensors), dora=dora)
    refuse_stacked_experts(ckpt, cfg)
    return ckpt, cfg


def read_full(ckpt: Checkpoint, reader: Reader) -> dict[str, NDArray]:
    """The whole saved weights (``modules_to_save``, saved embedding layers) by tensor name, as float64 copies."""
    return {
        n: read_array(reader, n, ckpt.spec, 0).copy() for n in ckpt.tensors if parse_key(n).role == "full"
    }


def read_source(spec: str | os.PathLike[str], *, dora: bool = False) -> Source:
    """Open ``spec``, refuse what the algebra cannot hold (``dora``: but DoRA), and list its modules from the
    headers; the whole saved weights are read now, the factors when asked for (:meth:`Source.read`)."""
    ckpt, cfg = open_source(spec, dora=dora)
    import numpy as np

    factors: dict[str, Factors] = {}
    for g in factor_pairs(ckpt).values():
        if g.a is None or g.b is None:
            raise RefusedError(
                ckpt.spec, f"module `{g.module}` has only one LoRA factor; the adapter is incomplete"
            )
        a, b = ckpt.tensors[g.a].shape, ckpt.tensors[g.b].shape
        if len(a) != 2 or len(b) != 2 or a[0] != b[1]:
            raise RefusedError(
                ckpt.spec, f"module `{g.module}`: factors {list(a)} and {list(b)} do not multiply"
            )
        factors[g.module] = Factors(
            g.module,
            g.a,
            g.b,
            int(a[0]),
            (int(b[0]), int(a[1])),
            cfg.scaling_for(pattern_name(cfg.target_parameters, g.module)),
            g.embedding,
        )
    reader = Reader(ckpt, np)
    try:
        full = read_full(ckpt, reader)
    except BaseException:
        reader.close()
        raise
    return Source(ckpt.spec, cfg, factors, reader, full)


def read_array(reader: Reader, name: str, spec: str, slot: int) -> NDArray:
    """Tensor ``name`` as float64 in ``reader``'s buffer ``slot``; one exit-3 line when it is no float or holds NaN
    or infinite values."""
    arr = reader.read(name, slot)
    if arr is None:
        raise UnsupportedInputError(
            spec, f"`{name}` is stored as {reader.ckpt.tensors[name].dtype}, not a float"
        )
    if not reader.np.isfinite(arr).all():
        raise UnsupportedInputError(
            spec,
            f"`{name}` holds NaN or infinite values, so its module has no delta to sum or truncate "
            "(adapterdoc inspect ADAPTER --weights shows where)",
            key=name,
        )
    return arr


def refuse_unsupported(spec: str, cfg: AdapterConfig, keys: list[str], *, dora: bool = False) -> None:
    """Exit 3, with the fix, on what no factor sum can hold (``dora``: DoRA is allowed, ``resize --to-lora``)."""
    roles = {parse_key(k).role for k in keys}
    if cfg.peft_type.upper() != "LORA":
        raise RefusedError(
            spec, f"AD950: peft_type {cfg.peft_type} is not LoRA; only LoRA adapters have factors"
        )
    if not dora and (cfg.use_dora or "magnitude" in roles):
        raise RefusedError(
            spec,
            "AD951: DoRA magnitudes rescale each row of the merged weight, so they have no sum or truncation "
            "of their own; turn it into plain LoRA first with `adapterdoc resize ADAPTER --to-lora --base BASE "
            "--max-error 0 --out DIR` (or merge it into its base with `adapterdoc merge`)",
        )
    if cfg.raw.get("lora_bias") is True or any(r.endswith(".bias") for r in roles):
        raise RefusedError(
            spec,
            "AD952: lora_bias adds a bias term that is no product of factors; merge it with `adapterdoc merge` "
            "or train without lora_bias",
        )
    if "tokens" in roles:
        raise RefusedError(
            spec, "AD954: trainable tokens have no factors; merge the adapter with `adapterdoc merge` instead"
        )
    if cfg.raw.get("kasa_config") or any("lora_diag" in k.split(".") for k in keys):
        raise RefusedError(
            spec,
            "AD962: a KaSA adapter's lora_diag sits between its factors (s·B diag(d) A on a base KaSA changed), "
            "which no sum or truncation of B and A holds; merge it into its base with `adapterdoc merge`",
        )


def pattern_name(target_parameters: list[str], module: str) -> str:
    """The name PEFT matches ``rank_pattern`` / ``alpha_pattern`` against for ``module`` (its ``current_key``): the
    module path, or for LoRA on a parameter (``target_parameters`` entry ``OWNER.PARAM`` whose owner ends the
    module path) ``module.PARAM``. A bare parameter name (no owner) names no module here."""
    owner = fused_expert_owner(module)
    params = [
        p.rpartition(".")[2]
        for p in target_parameters
        if p.rpartition(".")[0]
        and (owner == p.rpartition(".")[0] or owner.endswith("." + p.rpartition(".")[0]))
    ]
    return f"{owner}.{params[0]}" if len(params) == 1 else module


def refuse_stacked_experts(ckpt: Checkpoint, cfg: AdapterConfig) -> None:
    """AD953: LoRA on a fused expert parameter (``target_parameters`` on an ``(E, out, in)`` tensor), whose factors
    stack one rank-r block per expert (``lora_A`` has ``r·E`` rows, more than the module's rank): a sum or truncation
    of the stacked factors would mix experts. LoRA on a 2-D parameter (a router's ``gate.weight``: ``r`` rows) is a
    plain product and is kept."""
    if not cfg.target_parameters:
        return
    for g in factor_pairs(ckpt).values():
        owner = fused_expert_owner(g.module)
        if g.a is None or not cfg.targets_parameter(owner):
            continue
        rows = ckpt.tensors[g.a].shape[0]
        if rows != cfg.rank_for(pattern_name(cfg.target_parameters, g.module)):
            raise RefusedError(
                ckpt.spec,
                f"AD953: `{g.module}` holds LoRA on fused expert parameters ({rows} rows of lora_A: one block per "
                "expert); a sum or truncation of them would mix experts. Move it to one LoRA per expert first: "
                f"`adapterdoc remap {ckpt.spec} --experts per-expert --out DIR`",
                key=g.module,
            )


__all__ = [
    "Module",
    "Source",
    "open_source",
    "pattern_name",
    "read_array",
    "read_full",
    "read_source",
    "refuse_stacked_experts",
    "refuse_unsupported",
]
