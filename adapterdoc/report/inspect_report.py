"""The report of ``adapterdoc inspect``: the files, tensors, dtypes, layout and LoRA summary of one input, and
its findings (with ``--weights``, the weights audit too)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from adapterdoc.layouts import Detection
from adapterdoc.report.base import FrozenReport

if TYPE_CHECKING:
    from adapterdoc.adapter.expert_picture import ExpertPicture
    from adapterdoc.quant import Quantization
    from adapterdoc.report.audit_report import Audit  # only with --weights, which builds it


@dataclass(frozen=True)
class FileSummary:
    """One weights file of the checkpoint: its path, size, header size and tensor count."""

    path: str
    bytes: int
    header_bytes: int
    tensors: int


@dataclass(frozen=True)
class LoraSummary:
    """The adapter's LoRA: module count, ranks, scaling, what its config targets, and modules per prefix and leaf."""

    modules: int
    ranks: dict[int, int]
    """rank → number of modules (the rank dimension of lora_A; fused experts count r·E)."""
    alpha: float | None
    scaling: float | None
    use_rslora: bool
    use_dora: bool
    target_modules: str | list[str] | None
    exclude_modules: str | list[str] | None
    target_parameters: list[str]
    modules_to_save: list[str]
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    per_prefix: dict[str, int]
    per_leaf: dict[str, int]
    fused_expert_modules: int
    embedding_modules: int
    config_r: int | None
    peft_type: str | None


@dataclass(frozen=True)
class InspectReport(FrozenReport):
    """What one checkpoint or adapter holds, from its headers (and, with ``--weights``, its LoRA tensors)."""

    spec: str
    kind: str
    files: list[FileSummary]
    tensors: int
    parameters: int
    bytes: int
    dtypes: dict[str, int]
    metadata: dict[str, str] | None
    layout: Detection
    lora: LoraSummary | None
    weights_format: str = "safetensors"
    bytes_received: int | None = None
    """For ``hf://`` inputs: bytes fetched over HTTP (headers only)."""
    weights: Audit | None = None
    """The weights audit with ``--weights``, else ``None``."""
    format: dict[str, object] | None = None
    """For an adapter in another runtime's format (MLX, GGUF): its name, the evidence that decided it and the
    format's own facts (:mod:`adapterdoc.formats.foreign`); ``None`` (and no ``format`` in the JSON) for PEFT and
    plain safetensors inputs."""
    experts: ExpertPicture | None = None
    """The expert layout and coverage (:class:`adapterdoc.adapter.expert_picture.ExpertPicture`) of a mixture-of-experts adapter,
    else ``None`` (and no ``experts`` object in the JSON)."""
    quantization: Quantization | None = None
    """How a base model (not an adapter) is stored quantized (:func:`adapterdoc.quant.detect`), else ``None`` (and
    no ``quantization`` object in the JSON)."""

    requantized: dict[str, object] | None = None
    """With ``--weights --base``: the base, its quantization and, per quantized module the adapter changes, what
    survives re-quantizing the merged weight (``modules``: ``merge --dry-run``'s ``survival`` rows); else ``None``
    (and no ``requantized`` object in the JSON)."""

    def body(self) -> dict[str, object]:
        lora: dict[str, object] | None = None
        if self.lora:
            lora = asdict(self.lora)
            lora["ranks"] = {str(k): v for k, v in self.lora.ranks.items()}
        d: dict[str, object] = dict(
            input=self.spec,
            kind=self.kind,
            weights_format=self.weights_format,
            files=[asdict(f) for f in self.files],
            tensors=self.tensors,
            parameters=self.parameters,
            bytes=self.bytes,
            dtypes=self.dtypes,
            metadata=self.metadata,
            layout={
                "name": self.layout.name,
                "evidence": list(self.layout.evidence),
                "candidates": list(self.layout.candidates),
            },
            lora=lora,
        )
        if self.format is not None:
            d["format"] = self.format
        if self.bytes_received is not None:
            d["bytes_received"] = self.bytes_received
        if self.experts is not None:
            d["experts"] = self.experts.to_dict()
        if self.quantization is not None:
            from adapterdoc.report.inspect_quant import quantization_dict

            d["quantization"] = quantization_dict(self.quantization)
        if self.weights is not None:
            d.update(self.weights.to_dict())
        if self.requantized is not None:
            d["requantized"] = self.requantized
        return d
