"""The data of a merge plan: the edits to one parameter, the tensors of the merged checkpoint, and the plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from adapterdoc.checkpoint import Checkpoint
from adapterdoc.report.findings import Finding
from adapterdoc.st.dtypes import DTYPE_BITS
from adapterdoc.st.header import Header, TensorInfo

if TYPE_CHECKING:
    from adapterdoc.merge.fuse_experts import ExpertConversion
    from adapterdoc.ml.inject import LoraTarget
    from adapterdoc.ml.names import Piece
    from adapterdoc.quant.schemes import Quantization, QuantizedModule

HEADERS, META_MODEL = "headers", "meta-model"
"""The two planners (:mod:`~adapterdoc.merge.header_plan`, :mod:`~adapterdoc.merge.plan`), as ``merge --json``
names the one that ran (``plan``)."""


@dataclass(frozen=True)
class Edit:
    """One change to one in-memory parameter: ``replace`` / ``lora`` / ``dora`` / ``bias`` / ``tokens``."""

    kind: str
    label: str
    keys: dict[str, str]
    """Role → adapter tensor name."""
    target: LoraTarget | None = None
    """The :class:`~adapterdoc.ml.inject.LoraTarget` (not for ``replace``)."""

    @property
    def layer(self) -> LoraTarget:
        """The ``target`` of an edit of any kind but ``replace`` (each of those is made with one)."""
        assert self.target is not None, f"a {self.kind} edit without its LoRA layer"
        return self.target


@dataclass(frozen=True)
class Output:
    """One tensor of the merged checkpoint."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    source: TensorInfo | None
    """The base tensor it starts from (``None`` for a tensor the merge adds, e.g. an untied head)."""
    source_file: str | None
    edits: list[Edit] = field(default_factory=list)
    quantized: QuantizedModule | None = None
    """The quantized module this tensor is computed from (``source`` is then its code tensor): the module
    decoded when the output is its float weight, or re-encoded (``--requantize``) when the output is one of its
    stored tensors and the adapter changes it."""

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BITS[self.dtype] // 8


@dataclass(frozen=True)
class Plan:
    """A merge worked out before any byte is written: the output shards, the edits and the findings."""

    base: Checkpoint
    adapter: Checkpoint
    shards: list[tuple[str, Header, list[Output]]]
    """(output file name relative to the folder, base header, tensors in write order)."""
    applied: list[str]
    unused: list[str]
    findings: list[Finding]
    pieces: dict[str, Piece]
    """Output tensor name → its :class:`~adapterdoc.ml.names.Piece`."""
    untie: bool
    model_class: str
    added: list[str] = field(default_factory=list)
    """Output tensors the base does not have (an untied weight)."""
    experts: ExpertConversion | None = None
    """The :class:`~adapterdoc.merge.fuse_experts.ExpertConversion` (per-expert LoRA converted as PEFT converts it)."""
    planner: str = META_MODEL
    """Which planner made the plan: :data:`HEADERS` or :data:`META_MODEL`."""
    fallback: str | None = None
    """Why the header plan could not vouch for this merge (the meta-model plan ran), if it was tried."""
    quantization: Quantization | None = None
    """The base's quantization, when it is stored quantized (the plan was made on its decoded view)."""
    requantize: bool = False
    """Whether the merged weights of quantized modules are encoded again in the base's format."""
