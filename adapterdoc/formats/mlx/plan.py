"""What PEFT → MLX decides before a byte is written (:func:`adapterdoc.formats.mlx._plan`) and the writer
(:func:`adapterdoc.formats.mlx.write.write_mlx`) carries out: each mlx-lm module and the PEFT LoRA it holds."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Factor:
    """One PEFT module's LoRA (one expert of a stacked module)."""

    a: str
    b: str
    m: str | None
    rank: int
    scaling: float
    din: int
    dout: int


@dataclass
class Target:
    """One mlx-lm module and the PEFT LoRA it holds (``experts``: stacked, indexed by expert)."""

    path: str
    layer: int | None
    key: str
    dense: Factor | None = None
    experts: dict[int, Factor] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """Everything the MLX writer needs, decided (and every refusal made) before a byte is written."""

    targets: tuple[Target, ...]
    config: dict[str, object]
    rank: int
    scale: float
    experts: int | None
    notes: tuple[str, ...]
