"""Which way round a PEFT version stored the factors of a fused-expert adapter (torch-free).

PEFT reaches a 3-D expert parameter ``[E, d1, d2]`` through its ParamWrapper (``target_parameters``) and saves
``lora_A`` ``[E·r, in]`` and ``lora_B`` ``[out, r·E]``; which of ``d1`` / ``d2`` is ``in`` changed (read from
``peft/tuners/lora/layer.py``, class ``ParamWrapper``, of each release, and probed with 0.18.1 and 0.21.2):

* PEFT 0.17 and 0.18: ``num_experts, in_features, out_features = param.shape``: ``in`` is ``d1``, always.
* PEFT 0.19.0: ``in`` and ``out`` swapped when the experts module is ``is_transposed`` (the flag read backwards).
* PEFT ≥ 0.19.1: swapped for a 3-D parameter that is not ``is_transposed``: ``in`` is always the features the
  experts read.

transformers 5 stores fused experts ``[E, out, in]`` (``gate_up_proj`` ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``)
except in the classes it decorates ``@use_experts_implementation(is_transposed=True)`` (``[E, in, out]``): gpt-oss,
Aria, Ergo and the OpenAI privacy filter (transformers 5.25). So an adapter written by PEFT 0.17–0.18 for any other
fused-expert model (Qwen3-MoE, Qwen3.5-MoE, Mixtral, ...) holds each expert's factors the other way round from what
today's PEFT builds: ``lora_A`` ``[E·r, out]`` and ``lora_B`` ``[in, r·E]``. Today's PEFT refuses it (a size
mismatch) or, where ``in == out``, loads it and applies the transposed delta without a word. The delta is the same
product either way (expert e's ``A_eᵀ B_eᵀ`` = ``(B_e A_e)ᵀ``), so the old layout converts exactly: the new
``lora_A`` is the old ``lora_B`` read as ``[in, r, E]`` with its axes reversed, the new ``lora_B`` the old
``lora_A`` read as ``[E, r, out]`` with its axes reversed; the same operation converts back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from adapterdoc.st.compose import transpose

if TYPE_CHECKING:
    from adapterdoc.adapter.config import AdapterConfig

FIXED = (0, 19, 1)
"""The first PEFT release whose fused-expert layout today's PEFT reads (``in`` = the features the experts read)."""
INVERTED = (0, 19, 0)
"""The PEFT release that swapped ``in`` and ``out`` for ``is_transposed`` experts only."""

TRANSPOSED_MODEL_TYPES = frozenset({"gpt_oss", "aria", "aria_text", "ergo", "openai_privacy_filter"})
"""Model types whose experts transformers 5.25 marks ``is_transposed`` (stored ``[E, in, out]``)."""
TRANSPOSED_CLASS_PREFIXES = ("GptOss", "Aria", "Ergo", "OpenAIPrivacyFilter")
"""The class names of those model types (``auto_mapping.base_model_class`` in an adapter_config.json)."""
_TRANSPOSED_NAME = re.compile(
    r"gpt[-_]?oss|(^|[/_.-])aria([/_.-]|$)|(^|[/_.-])ergo([/_.-]|$)|privacy[-_]filter", re.I
)
"""A ``base_model_name_or_path`` that names one of those families."""

UNRECORDED = (0, 17, 0)
"""The release an adapter config without ``peft_version`` is taken for: PEFT 0.17, the first with
``target_parameters``, wrote no version (0.18 on do). Only its shapes can show its layout (:func:`pair_layout`,
or a size mismatch)."""

_RELEASE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?")


def peft_release(version: object) -> tuple[int, int, int] | None:
    """``peft_version`` from adapter_config.json as (major, minor, patch); ``None`` when absent or not a version.
    A development or local version counts as its release (``0.19.1.dev0`` and ``0.18.1@abc`` as 0.19.1, 0.18.1)."""
    if not isinstance(version, str):
        return None
    m = _RELEASE.match(version)
    if m is None:
        return None
    return int(m[1]), int(m[2]), int(m[3] or 0)


def written_by(raw: Mapping[str, object]) -> tuple[int, int, int] | None:
    """The PEFT release that wrote an adapter_config.json (``raw``): :data:`UNRECORDED` when it names none,
    ``None`` when its ``peft_version`` is not a version."""
    return peft_release(raw["peft_version"]) if "peft_version" in raw else UNRECORDED


def writer_swapped(release: tuple[int, int, int], transposed: bool) -> bool:
    """Whether PEFT ``release`` swapped ``in`` and ``out`` of a 3-D expert parameter (``in`` = ``d2``)."""
    if release < INVERTED:
        return False
    if release < FIXED:
        return transposed
    return not transposed


def differs_from_today(release: tuple[int, int, int], transposed: bool) -> bool:
    """Whether an adapter written by PEFT ``release`` holds its fused-expert factors the other way round from
    PEFT ≥ 0.19.1 on experts that are (``transposed``) or are not stored ``[E, in, out]``."""
    return writer_swapped(release, transposed) != writer_swapped(FIXED, transposed)


def transposed_model_type(*model_types: object) -> bool:
    """Whether any of ``model_types`` (a base config's and its text config's) stores its experts ``[E, in, out]``."""
    return any(t in TRANSPOSED_MODEL_TYPES for t in model_types)


def transposed_from_hints(hints: Iterable[str]) -> bool | None:
    """From an adapter config's layout hints (``auto_mapping.base_model_class``, ``base_model_name_or_path``):
    ``True`` when one names a model whose experts are stored ``[E, in, out]``; ``False`` when the class is another
    one; ``None`` when the hints name no class (the name alone says nothing else)."""
    known_class = False
    for hint in hints:
        if hint.startswith(TRANSPOSED_CLASS_PREFIXES) or _TRANSPOSED_NAME.search(hint):
            return True
        known_class = known_class or bool(re.fullmatch(r"[A-Z]\w*For\w+", hint))
    return False if known_class else None


def transposed_base(cfg: AdapterConfig) -> tuple[bool, str]:
    """Whether the base an adapter config names stores its experts ``[E, in, out]``, and what said so: a local base
    folder's config.json, the config's class or base name (:func:`transposed_from_hints`), else transformers'
    default ``[E, out, in]``."""
    import json
    import os

    base = cfg.base_model
    config = os.path.join(base, "config.json") if base else None
    if config and os.path.isfile(config):
        try:
            with open(config, "rb") as f:
                raw = json.loads(f.read())
        except (OSError, ValueError):
            raw = None
        if isinstance(raw, dict):
            text = raw.get("text_config")
            types = (raw.get("model_type"), text.get("model_type") if isinstance(text, dict) else None)
            return transposed_model_type(*types), f"the base `{base}` (model_type {types[0]})"
    hints = cfg.layout_hints
    if transposed_from_hints(hints):
        return True, f"`{next(h for h in hints if transposed_from_hints([h]))}` (experts stored [E, in, out])"
    named = f"`{hints[0]}`" if hints else "a base it does not name"
    return (
        False,
        f"{named} (experts stored [E, out, in], as in every transformers fused-expert model but gpt-oss, "
        "Aria, Ergo and the OpenAI privacy filter)",
    )


def pair_layout(gate_up_in: int, gate_up_out: int, down_in: int, down_out: int) -> str | None:
    """Which layout the fused factors of one layer's ``gate_up_proj`` and ``down_proj`` are in, from their shapes
    (``in``: the lora_A width, ``out``: the lora_B height, as stored): ``today`` when gate_up's lora_A reads what
    down's lora_B writes (the hidden size) and gate_up's lora_B writes twice what down's lora_A reads; ``old`` when
    it is the other way round (both read the experts' outputs); ``None`` when neither fits. Never both: that
    would need ``I = 2·I``."""
    if gate_up_in == down_out and gate_up_out == 2 * down_in:
        return "today"
    if gate_up_out == down_in and gate_up_in == 2 * down_out:
        return "old"
    return None


def reverse_axes(buf: bytes | bytearray | memoryview, width: int, x: int, y: int, z: int) -> bytes:
    """The ``[x, y, z]`` array of ``width``-byte elements in ``buf`` as ``[z, y, x]``: ``[x·y, z]`` transposed
    to ``[z, x, y]``, then each of the ``z`` planes ``[x, y]`` transposed."""
    first = memoryview(transpose(buf, width, x * y, z)).cast("B")
    plane = x * y * width
    return b"".join(transpose(first[i * plane : (i + 1) * plane], width, x, y) for i in range(z))


def swap_factors(
    a: bytes | bytearray | memoryview,
    b: bytes | bytearray | memoryview,
    width: int,
    experts: int,
    rank: int,
) -> tuple[bytes, bytes]:
    """The fused factors the other way round: ``a`` (``lora_A`` ``[E·r, p]``) and ``b`` (``lora_B``
    ``[q, r·E]``, expert e's rank k in column ``k·E + e``) become ``lora_A`` ``[E·r, q]`` and ``lora_B``
    ``[p, r·E]`` with every expert's delta transposed (``A'_e = B_eᵀ``, ``B'_e = A_eᵀ``), bit for bit."""
    p = len(a) // (width * experts * rank)
    q = len(b) // (width * experts * rank)
    new_a = reverse_axes(b, width, q, rank, experts)  # [q, r, E] → [E, r, q]
    new_b = reverse_axes(a, width, experts, rank, p)  # [E, r, p] → [p, r, E]
    return new_a, new_b
