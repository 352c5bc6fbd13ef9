"""The PEFT adapter format (the hub every conversion goes through): a folder with ``adapter_config.json`` and
``adapter_model.safetensors``. Detection is header-only; PEFT → PEFT is a streamed copy (the data bytes as they
are, or re-cast by ``--outtype``), written atomically."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapterdoc.errors import AdapterdocError, UnsupportedInputError
from adapterdoc.formats import Converted, Detection

if TYPE_CHECKING:
    from adapterdoc.st.header import Header

NAME = "peft"
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
BIN = "adapter_model.bin"
METADATA = {"format": "pt"}
"""The ``__metadata__`` PEFT's ``save_pretrained`` writes."""


def detect(path: Path) -> Detection | None:
    """A PEFT adapter folder (``adapter_config.json`` + weights), or a ``.safetensors`` file of PEFT LoRA keys."""
    try:
        p = Path(path)
        if p.is_dir():
            cfg = p / CONFIG
            weights = [n for n in (WEIGHTS, BIN) if (p / n).is_file()]
            if not cfg.is_file() or not weights:
                return None
            evidence = [f"{CONFIG} and {weights[0]}"]
            raw = json.loads(cfg.read_text(encoding="utf-8"))
            if isinstance(raw, dict) and "peft_type" in raw:
                evidence.append(f"peft_type: {raw['peft_type']}")
            return Detection(NAME, tuple(evidence))
        if p.is_file() and p.suffix == ".safetensors":
            from adapterdoc.st.header import read_header

            header = read_header(p)
            lora = [k for k in header.tensors if ".lora_A." in k or ".lora_B." in k]
            if lora:
                return Detection(NAME, (f"{len(lora)} PEFT LoRA tensors (`{lora[0]}`)",), header)
    except (OSError, ValueError, AdapterdocError):
        return None
    return None


@dataclass
class PeftAdapter:
    """An opened PEFT adapter folder: its config (as written) and the header of its weights."""

    folder: str
    raw: dict[str, Any]
    header: Header
    """The header of ``adapter_model.safetensors``."""


def open_peft(src: str | os.PathLike[str]) -> PeftAdapter:
    """Open a PEFT adapter folder header-only; a ``.bin`` adapter or a lone file is refused with the fix."""
    from adapterdoc.checkpoint import open_checkpoint

    ckpt = open_checkpoint(src, read_bin=False)
    if ckpt.kind != "adapter" or ckpt.adapter_config is None:
        raise UnsupportedInputError(
            ckpt.spec, f"is not a PEFT adapter folder ({CONFIG} + {WEIGHTS}); convert reads adapter folders"
        )
    if ckpt.weights_format != "safetensors" or not ckpt.headers:
        raise UnsupportedInputError(
            ckpt.spec,
            f"holds {BIN}; write it as safetensors first (`adapterdoc remap ADAPTER --rule 'x=>x' --out DIR` "
            "rewrites the .bin as adapter_model.safetensors)",
        )
    return PeftAdapter(ckpt.root, dict(ckpt.adapter_config.raw), ckpt.headers[0])


def config_bytes(raw: dict[str, Any]) -> bytes:
    """``adapter_config.json`` as PEFT writes it (indent 2, sorted keys)."""
    return (json.dumps(raw, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def to_peft(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    """PEFT → PEFT: the same adapter, its tensors re-cast by ``outtype`` (else their bytes as they are)."""
    return _copy(src, out, outtype)


def from_peft(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    """The same as :func:`to_peft`: PEFT is its own hub."""
    return _copy(src, out, outtype)


def _copy(src: Path, out: Path, outtype: str | None) -> Converted:
    from adapterdoc.formats.cast import cast_bytes, target_dtype
    from adapterdoc.st.atomic import atomic_folder
    from adapterdoc.st.compose import Spec, compose
    from adapterdoc.st.tensors import TensorSource, tensor_windows

    adapter = open_peft(src)
    header = adapter.header
    specs = [Spec(n, target_dtype(t.dtype, outtype, what=n), t.shape) for n, t in header.tensors.items()]
    rounding = [0.0]

    def pieces() -> Iterator[bytes | memoryview]:
        with TensorSource(header) as source:
            for spec in specs:
                info = header.tensors[spec.name]
                if spec.dtype == info.dtype:
                    for _, view in tensor_windows(header, spec.name):
                        yield view
                else:
                    data, err = cast_bytes(source.read(spec.name), info.dtype, spec.dtype)
                    rounding[0] = max(rounding[0], err)
                    yield data

    with atomic_folder(os.fspath(out)) as tmp:
        with open(os.path.join(tmp, CONFIG), "wb") as f:
            f.write(config_bytes(adapter.raw))
        compose(os.path.join(tmp, WEIGHTS), specs, pieces(), metadata=header.metadata or dict(METADATA))
    notes = []
    recast = sum(1 for s in specs if s.dtype != header.tensors[s.name].dtype)
    if recast:
        notes.append(f"{recast} tensors re-cast to {outtype} (largest relative rounding {rounding[0]:.3g})")
    return Converted(NAME, NAME, Path(out), len(specs), tuple(notes))
