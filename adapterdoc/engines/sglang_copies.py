"""PEFT's ``base_layer.weight`` copy of a LoRA-wrapped ``embed_tokens`` / ``lm_head``, checked against the base.

PEFT saves the whole embedding (or output head) beside its LoRA when either is targeted
(``save_embedding_layers="auto"``) and loads it over the base's own. SGLang skips the copy on purpose (it applies
only the ``lora_A`` / ``lora_B`` factors, ``mem_pool.py`` ``load_lora_weight_to_buffer``) and serves the base's
weight, which is the same outputs exactly when the copy equals the base's weight. A copy differs when the
vocabulary was resized or the embedding itself was trained: then SGLang serves other outputs (and a resized
vocabulary does not fit its buffers at all).

:func:`compare` decides this torch-free from the safetensors bytes when the base is a folder with weights, with
torch for a ``tiny:`` base (its weights are rebuilt from the fixed seed), and from the shapes alone (the base's
``vocab_size`` x ``hidden_size``) when the base has no weights.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapterdoc.adapter import LoraKey
from adapterdoc.engines.base import CopyCheck
from adapterdoc.st.tensors import same_bytes

if TYPE_CHECKING:
    from adapterdoc.bases import BaseSpec
    from adapterdoc.st.header import Header, TensorInfo

Raw = Mapping[str, object]
"""A base's config.json (or a sub-config of it), as read."""

HEADS = ("embed_tokens", "lm_head")


def copy_keys(keys: list[LoraKey]) -> list[LoraKey]:
    """The ``<...>.embed_tokens.base_layer.weight`` / ``lm_head.base_layer.weight`` tensors."""
    out = []
    for k in keys:
        if k.role == "full" and k.module.endswith(".base_layer"):
            owner = k.module.removesuffix(".base_layer")
            if owner.rpartition(".")[2] in HEADS and k.key.endswith(".weight"):
                out.append(k)
    return out


def compare(
    keys: list[LoraKey], adapter_root: str | None, base: BaseSpec | None, raw: Raw | None
) -> list[CopyCheck]:
    """Each copy compared with the base's own weight (``base``: a resolved :class:`~adapterdoc.bases.BaseSpec`
    or ``None``; ``raw``: the base's text config, for the shapes)."""
    copies = copy_keys(keys)
    if not copies:
        return []
    headers = _adapter_headers(adapter_root)
    out = []
    for k in copies:
        head = k.module.removesuffix(".base_layer").rpartition(".")[2]
        info = _find(headers, k.key)
        if info is None:
            out.append(CopyCheck(k.key, head, "unchecked", "the adapter's weights file could not be read"))
            continue
        out.append(_compare_one(k.key, head, info, base, raw))
    return out


def base_config(base: BaseSpec | None) -> Raw | None:
    """A base's config as plain data: the registry's reference config for ``tiny:``, else its config.json
    (``None`` without one)."""
    if base is None:
        return None
    if base.kind == "tiny":
        from adapterdoc.layouts import LAYOUTS

        lay = LAYOUTS.get(base.tiny_layout or "")
        return lay.tiny.kwargs() if lay and lay.tiny else None
    if base.config_path:
        from adapterdoc.bases import read_config_json

        return read_config_json(base)
    return None


def _adapter_headers(root: str | None) -> list[Header]:
    if not root:
        return []
    from adapterdoc.checkpoint import open_checkpoint
    from adapterdoc.errors import AdapterdocError

    try:
        return list(open_checkpoint(root, read_bin=False).headers)
    except AdapterdocError:
        return []


def _find(headers: list[Header], name: str) -> tuple[Header, TensorInfo] | None:
    for h in headers:
        if name in h.tensors:
            return h, h.tensors[name]
    return None


def _compare_one(
    key: str, head: str, info: tuple[Header, TensorInfo], base: BaseSpec | None, raw: Raw | None
) -> CopyCheck:
    header, t = info
    expected = _expected_shape(head, raw)
    if expected is not None and tuple(t.shape) != expected:
        return CopyCheck(
            key,
            head,
            "shape",
            f"shape {list(t.shape)}, the base's {head} is {list(expected)} (a resized vocabulary)",
        )
    if base is not None and base.kind == "tiny" and base.tiny_layout is not None:
        return _compare_tiny(key, head, header, base.tiny_layout)
    if base is not None and base.kind in ("dir", "repo") and base.has_weights and base.root:
        return _compare_folder(key, head, header, t, base.root, raw)
    return CopyCheck(
        key, head, "unchecked", "the base has no weights to compare with (shapes match its config)"
    )


def _expected_shape(head: str, raw: Raw | None) -> tuple[int, int] | None:
    text = _text_config(raw)
    if not text:
        return None
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    if isinstance(vocab, int) and isinstance(hidden, int):
        return (vocab, hidden)
    return None


def _text_config(raw: object) -> Raw | None:
    if not isinstance(raw, dict):
        return None
    if isinstance(raw.get("vocab_size"), int) and isinstance(raw.get("hidden_size"), int):
        return raw
    for sub in ("text_config", "thinker_config", "llm_config", "language_config"):
        found = _text_config(raw.get(sub))
        if found:
            return found
    return None


def _base_names(key: str, head: str, tied: bool) -> list[str]:
    """The base's tensor names this copy stands for, most likely first."""
    rest = key.removeprefix("base_model.model.").replace(".base_layer.weight", ".weight")
    names = [rest]
    if head == "lm_head" and tied:
        names.append(rest.replace("lm_head.weight", "model.embed_tokens.weight"))
    return names


def _compare_folder(
    key: str, head: str, header: Header, t: TensorInfo, root: str, raw: Raw | None
) -> CopyCheck:
    from adapterdoc.errors import AdapterdocError
    from adapterdoc.st.header import read_header

    tied = bool((_text_config(raw) or {}).get("tie_word_embeddings", (raw or {}).get("tie_word_embeddings")))
    base_headers = []
    for f in sorted(os.listdir(root)):
        if f.endswith(".safetensors"):
            try:
                base_headers.append(read_header(os.path.join(root, f)))
            except AdapterdocError:
                continue
    want = _base_names(key, head, tied)
    leaf = "embed_tokens.weight" if head == "embed_tokens" or tied else "lm_head.weight"
    found = None
    for name in want:
        found = _find(base_headers, name)
        if found:
            break
    if found is None:  # a wrapped base (a VL model's language_model...): the one tensor with that leaf
        hits = [(h, bt) for h in base_headers for n, bt in h.tensors.items() if n.endswith(leaf)]
        found = hits[0] if len(hits) == 1 else None
    if found is None:
        return CopyCheck(
            key, head, "unchecked", f"the base's weights have no single `{leaf}` to compare with"
        )
    bh, bt = found
    if tuple(bt.shape) != tuple(t.shape):
        return CopyCheck(
            key, head, "shape", f"shape {list(t.shape)}, the base's `{bt.name}` is {list(bt.shape)}"
        )
    if bt.dtype != t.dtype:
        return CopyCheck(key, head, "unchecked", f"dtype {t.dtype}, the base's `{bt.name}` is {bt.dtype}")
    same = same_bytes(header, t, bh, bt)
    return CopyCheck(key, head, "equal" if same else "differs", f"compared with the base's `{bt.name}`")


def _compare_tiny(key: str, head: str, header: Header, layout: str) -> CopyCheck:
    try:
        import torch
        from safetensors import safe_open

        from adapterdoc.ml.tiny import build_tiny
    except ImportError:
        return CopyCheck(key, head, "unchecked", "comparing with a tiny base needs the ml extra (torch)")
    model: Any = build_tiny(layout)  # a transformers model, whose get_output_embeddings is unannotated
    module = model.get_input_embeddings() if head == "embed_tokens" else model.get_output_embeddings()
    weight: torch.Tensor = module.weight
    with safe_open(header.path, "pt") as f:
        copy = f.get_tensor(key)
    if tuple(copy.shape) != tuple(weight.shape):
        return CopyCheck(
            key, head, "shape", f"shape {list(copy.shape)}, the base's {head} is {list(weight.shape)}"
        )
    same = torch.equal(copy.to(weight.dtype), weight.detach())
    return CopyCheck(key, head, "equal" if same else "differs", f"compared with the tiny base's {head}")
