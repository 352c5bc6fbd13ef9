"""GGUF LoRA adapters as llama.cpp reads them (``llama_adapter_lora_init``): detect, describe, PEFT ⇄ GGUF.

A GGUF LoRA is one file: ``general.type = adapter``, ``adapter.type = lora``, ``general.architecture`` (the base's),
``adapter.lora.alpha`` (one float for the whole adapter: llama.cpp scales each pair by ``alpha / rank``, the rank read
from ``lora_b``) and tensors ``<base tensor>.lora_a`` / ``.lora_b``, whose bytes are PEFT's ``lora_A`` / ``lora_B``
(ggml's ``ne`` is numpy's shape reversed), after llama.cpp's per-architecture permutations (:mod:`.names`).
Writing needs the base's ``config.json`` only. Detection and description are header-only and need neither numpy
nor the ``gguf`` package (:mod:`.header`); conversion needs the ``gguf`` extra. PEFT → GGUF is split out in
(:mod:`.write`) (refusals first, then one atomic write); GGUF → PEFT in :mod:`.read`.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from adapterdoc.errors import AdapterdocError
from adapterdoc.formats import Converted, Detection
from adapterdoc.formats.gguf.header import (
    PROVENANCE,
    GgufHeader,
    is_gguf,
    is_model,
    lora_pairs,
    read_header,
    tensor_info_problem,
)
from adapterdoc.report.findings import Finding

NAME = "gguf"
READ_EXTRA = ("gguf", ("numpy", "gguf"))
"""What reading the tensors imports (:func:`adapterdoc.formats.foreign.peft_view`): the ``gguf`` extra."""
__all__ = [
    "NAME",
    "describe",
    "describe_lines",
    "detect",
    "from_peft",
    "is_model_file",
    "lora_pairs",
    "to_peft",
]


def _evidence(header: GgufHeader) -> list[str]:
    ev = [f"GGUF magic, version {header.version}"]
    for key in ("general.type", "adapter.type", "general.architecture", "adapter.lora.alpha"):
        if key in header.kv:
            ev.append(f"{key} = {_shown(header.kv[key])}")
    pairs = lora_pairs(header)
    if pairs:
        ev.append(f"{len(pairs)} tensor pairs *.lora_a / *.lora_b")
    return ev


def _shown(value: Any, limit: int = 80) -> str:
    """A metadata value as text, cut to ``limit`` characters (a hostile file may hold a 1 GiB string)."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def detect(path: Path) -> Detection | None:
    """A GGUF file that llama.cpp would read as a LoRA adapter (``general.type = adapter`` or lora_a/lora_b
    tensors), with the keys that decided it; ``None`` for anything else, a GGUF model included
    (:func:`is_model_file` tells a model apart)."""
    p = Path(path)
    if not is_gguf(p):
        return None
    try:
        header = read_header(p)
    except AdapterdocError:
        return Detection(NAME, ("GGUF magic", "header unreadable (convert or verify names why)"))
    if is_model(header):
        return None
    return Detection(NAME, tuple(_evidence(header)))


def is_model_file(path: str | Path) -> bool:
    """Whether ``path`` is a GGUF *model* file, not an adapter (neither ``general.type = adapter`` nor any
    ``.lora_a`` / ``.lora_b`` tensor: :func:`~adapterdoc.formats.gguf.header.is_model`), for "a model GGUF, not an
    adapter"; the complement of :func:`detect` on a readable GGUF file.
    ``False`` for anything else (not GGUF, an adapter, a header that cannot be read); never raises."""
    if not is_gguf(path):
        return False
    try:
        return is_model(read_header(path))
    except AdapterdocError:
        return False


def _number(value: Any) -> float | None:
    """A metadata value as a finite number, or ``None`` (a string, an array, a bool, NaN or inf: JSON has no NaN;
    verify's AD866 names a non-finite alpha)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _scale(alpha: float | None, rank: int | None) -> float | None:
    """llama.cpp's ``alpha ? alpha / rank : 1`` for one pair (``None`` where the rank is unknown or 0)."""
    if not rank:
        return None
    return alpha / rank if alpha else 1.0


def describe(path: Path) -> dict[str, Any]:
    """What ``inspect`` shows of a GGUF file (adapter or model), header-only: format, evidence, architecture,
    alpha, counts (``tensors``, ``parameters``: the sum of every readable tensor's elements, ``dtypes``: ggml type
    name → tensors, ``header_bytes``: where the data section starts), pairs with their ranks and ggml shapes, the
    PEFT scaling each pair gets in llama.cpp, and what ggml's ``gguf_init`` refuses (``problems``)."""
    header = read_header(path)
    pairs = lora_pairs(header)
    alpha = header.kv.get("adapter.lora.alpha")
    rows = []
    for base, ab in sorted(pairs.items()):
        a, b = ab["a"], ab["b"]
        rank = b.ne[0] if b is not None else None
        rows.append(
            {
                "tensor": base,
                "rank": rank,
                "lora_a": list(a.shape) if a else None,
                "lora_b": list(b.shape) if b else None,
                "dtype": (a or b).type_name,
                "scale": _scale(_number(alpha), rank),
            }
        )
    ranks = Counter(r["rank"] for r in rows if r["rank"] is not None)
    others = [t for t in header.tensors if not t.endswith((".lora_a", ".lora_b"))]
    readable = [t for t in header.tensors.values() if tensor_info_problem(t) is None]
    return {
        "format": NAME,
        "path": str(path),
        "evidence": _evidence(header),
        "general_type": header.get_str("general.type"),
        "model": is_model(header),
        "architecture": header.get_str("general.architecture"),
        "adapter_type": header.get_str("adapter.type"),
        "alpha": _number(alpha),
        "tensors": len(header.tensors),
        "parameters": sum(t.numel for t in readable),
        "dtypes": dict(sorted(Counter(t.type_name for t in header.tensors.values()).items())),
        "header_bytes": header.data_start,
        "pairs": rows,
        "ranks": dict(sorted(ranks.items())),
        "other_tensors": others,
        "problems": [p.message for p in header.problems],
        "written_by_adapterdoc": PROVENANCE in header.kv,
    }


def describe_lines(path: Path) -> list[str]:
    """:func:`describe` as plain text lines (for a human ``inspect``)."""
    d = describe(path)
    ranks = ", ".join(f"r={r} ×{n}" for r, n in d["ranks"].items()) or "none"
    what = "GGUF model" if d["model"] else "GGUF LoRA"
    lines = [
        f"format: {what} ({'; '.join(d['evidence'])})",
        f"architecture: {d['architecture']}  alpha: {d['alpha']}  pairs: {len(d['pairs'])}  ranks: {ranks}",
    ]
    for row in d["pairs"]:
        lines.append(
            f"  {row['tensor']}: lora_a {row['lora_a']} lora_b {row['lora_b']} {row['dtype']} scale {row['scale']}"
        )
    if d["other_tensors"]:
        lines.append(f"other tensors (llama.cpp skips *_norm.weight, refuses the rest): {d['other_tensors']}")
    lines += [f"llama.cpp refuses the file: {p}" for p in d["problems"]]
    return lines


def from_peft(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    """PEFT adapter folder → one GGUF LoRA file at ``out`` (see :mod:`adapterdoc.formats.gguf.write`)."""
    from adapterdoc.formats.gguf.write import write_gguf

    return write_gguf(Path(src), Path(out), base=base, outtype=outtype)


def to_peft(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    """GGUF LoRA file → PEFT adapter folder at ``out`` (see :mod:`adapterdoc.formats.gguf.read`)."""
    from adapterdoc.formats.gguf.read import read_gguf

    return read_gguf(Path(src), Path(out), base=base, outtype=outtype)


def check(path: str | Path, base: str | None) -> list[Finding]:
    """``verify``'s container rules for a GGUF LoRA file (the generic hook, :mod:`adapterdoc.formats.foreign`):
    llama.cpp's load checks against ``base`` when it is a GGUF model file (header only), else the base-free ones
    (a Hugging Face base is checked on the PEFT view by the doctor itself)."""
    from adapterdoc.formats.gguf.load_rules import verify_gguf

    if base and is_gguf(base):
        return verify_gguf(Path(path), Path(base))
    return verify_gguf(Path(path), None) + _architecture_for_config(Path(path), base)


def _architecture_for_config(path: Path, base: str | None) -> list[Finding]:
    """The adapter's ``general.architecture`` against the one llama.cpp's converter gives the base ``config.json``
    (what the model GGUF made from it says): llama.cpp refuses another (AD852). Nothing where adapterdoc does not
    map the base's class to a llama.cpp architecture, or cannot read the adapter's header."""
    from adapterdoc.formats.gguf import names
    from adapterdoc.formats.gguf.write import base_config
    from adapterdoc.report.findings import make

    if base is None:
        return []
    try:
        ours = read_header(path).get_str("general.architecture")
        config = base_config(base)
        want = names.arch_name(names.architecture_of(config)[1]) if config else None
    except AdapterdocError:
        return []
    if not ours or want is None or ours == want:
        return []
    return [
        make(
            "AD852",
            f"adapter architecture {ours!r}; llama.cpp's converter makes {want!r} of the base {base}: llama.cpp "
            "refuses the adapter on that model ('model arch and LoRA arch mismatch')",
            key="general.architecture",
            path=str(path),
            hint="convert the adapter again against the base's own config.json: "
            "adapterdoc convert ADAPTER --to gguf --base BASE_CONFIG",
        )
    ]


HPARAMS = {
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
}
"""A GGUF model's ``{arch}.*`` keys and the ``config.json`` fields they are (what the PEFT view needs to name the
modules and undo llama.cpp's permutations)."""


def base_config_file(base: Path, folder: Path) -> str | None:
    """A model folder in ``folder`` whose ``config.json`` holds the hyperparameters the GGUF model ``base`` states (``None`` when it is
    not a GGUF file or states no layer count): the PEFT view of a GGUF adapter verified against a GGUF model."""
    import json

    if not is_gguf(base):
        return None
    header = read_header(base)
    arch = header.get_str("general.architecture")
    config: dict[str, Any] = {"model_type": f"gguf-{arch}"}  # no transformers class: only its facts are read
    for key, field in HPARAMS.items():
        value = header.kv.get(f"{arch}.{key}")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            config[field] = value
    if "num_hidden_layers" not in config or "num_attention_heads" not in config:
        return None  # too few facts to name the modules and undo the permutations: the adapter's own metadata must
    out = folder / "gguf-base"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(out)
