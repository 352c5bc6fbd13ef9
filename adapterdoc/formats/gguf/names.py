"""Hugging Face module paths ⇄ llama.cpp tensor names, and llama.cpp's per-architecture LoRA rewrites.

Names come from the ``gguf`` package's own ``TensorNameMap`` (llama.cpp's table, forward only: HF → GGUF); the
reverse map sends the known HF module paths (:data:`adapterdoc.layouts.gguf.LAYER_MODULES`) through it. The rewrites
are the ones llama.cpp's ``modify_tensors`` applies to a ``LoraTorchTensor`` (permutations of ``lora_B``'s rows or
``lora_A``'s columns), as index arrays whose inverses undo them exactly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.layouts import gguf as facts


def gguf_package() -> Any:
    """The ``gguf`` package (llama.cpp's gguf-py), or exit 3 naming the extra."""
    try:
        import gguf
    except ImportError as e:
        raise UnsupportedInputError(
            None,
            "converting to or from GGUF needs the `gguf` package (llama.cpp's gguf-py, with numpy); "
            "install the extra: pip install 'adapterdoc[gguf]'",
        ) from e
    return gguf


def text_hparams(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's hyperparameters as llama.cpp reads them: a wrapper's ``text_config`` over its top level."""
    hp = dict(config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        hp.update(text)
    return hp


def architecture_of(config: Mapping[str, Any]) -> tuple[str, facts.GgufArch]:
    """(``architectures[0]``, llama.cpp's text architecture for it); exit 3 (AD870) for one llama.cpp lacks."""
    archs = config.get("architectures") or []
    cls = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if cls is None:
        raise UnsupportedInputError(
            None,
            "the base's config.json has no `architectures`: llama.cpp picks its GGUF architecture from it (AD870)",
        )
    why = facts.REFUSED.get(cls)
    text = config.get("text_config")
    text_type = text.get("model_type") if isinstance(text, Mapping) else None
    if why is None and isinstance(text_type, str) and text_type in facts.TEXT_MODEL_TYPES:
        why = facts.TEXT_MODEL_TYPES[text_type]
    if why is None and cls not in facts.ARCHES:
        why = (
            "not checked against llama.cpp's converter in adapterdoc (adapterdoc/layouts/gguf.py): its converter "
            "class may rewrite the tensors a LoRA targets"
        )
    if why is not None:
        have = ", ".join(sorted(facts.ARCHES))
        raise UnsupportedInputError(
            None, f"cannot write a GGUF LoRA for {cls}: {why} (AD870; supported: {have})"
        )
    return cls, facts.ARCHES[cls]


def model_arch(arch: facts.GgufArch) -> Any:
    """``gguf.MODEL_ARCH[arch.arch]``, or exit 3 when the installed ``gguf`` package predates that architecture."""
    gguf = gguf_package()
    member = getattr(gguf.MODEL_ARCH, arch.arch, None)
    if member is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            have = version("gguf")
        except PackageNotFoundError:
            have = "unknown version"
        raise UnsupportedInputError(
            None,
            f"the installed gguf package ({have}) has no llama.cpp architecture {arch.arch}; "
            "upgrade it: pip install -U gguf",
        )
    return member


def arch_name(arch: facts.GgufArch) -> str:
    """``general.architecture`` for ``arch`` (``gguf.MODEL_ARCH_NAMES``)."""
    name: str = gguf_package().MODEL_ARCH_NAMES[model_arch(arch)]
    return name


def block_count(hp: Mapping[str, Any]) -> int:
    n = hp.get("num_hidden_layers", hp.get("n_layer"))
    if not isinstance(n, int) or n <= 0:
        raise UnsupportedInputError(None, "the base's config.json has no `num_hidden_layers`")
    return n


@dataclass
class NameMap:
    """llama.cpp's tensor names for one architecture and depth."""

    arch: facts.GgufArch
    n_blocks: int

    def __post_init__(self) -> None:
        gguf = gguf_package()
        self._map = gguf.get_tensor_name_map(model_arch(self.arch), self.n_blocks)
        self._reverse: dict[str, str] | None = None

    def to_gguf(self, hf_module: str) -> str | None:
        """``model.layers.0.self_attn.q_proj`` → ``blk.0.attn_q.weight`` (``None``: llama.cpp has no such tensor)."""
        name: str | None = self._map.get_name(hf_module + ".weight", try_suffixes=(".weight",))
        return name

    def to_hf(self, gguf_name: str) -> str | None:
        """``blk.0.attn_q.weight`` → ``model.layers.0.self_attn.q_proj`` (the text model's plain spelling)."""
        if self._reverse is None:
            rev: dict[str, str] = {}
            paths = [*facts.TOP_MODULES]
            modules = self.arch.layer_modules or facts.LAYER_MODULES
            paths += [f"model.layers.{b}.{m}" for b in range(self.n_blocks) for m in modules]
            for p in paths:
                g = self.to_gguf(p)
                if g is not None:
                    rev.setdefault(g, p)
            self._reverse = rev
        return self._reverse.get(gguf_name)


_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def layer_of(hf_module: str) -> tuple[int, str] | None:
    m = _LAYER.match(hf_module)
    return (int(m[1]), m[2]) if m else None


# ------------------------------------------------------------------ llama.cpp's permutations, as index arrays


@dataclass(frozen=True)
class Rewrite:
    """A permutation of ``lora_B``'s rows (``side = "B"``) or ``lora_A``'s columns (``side = "A"``)."""

    side: str
    index: Any
    """numpy int64 index: ``new = old[index]`` (rows) or ``new = old[:, index]`` (columns)."""
    why: str


def rewrites_for(
    arch: facts.GgufArch, hp: Mapping[str, Any], hf_module: str, out_dim: int, in_dim: int
) -> list[Rewrite]:
    """The permutations llama.cpp's converter applies to the LoRA of ``hf_module`` (a plain text-model path)."""
    import numpy as np

    out: list[Rewrite] = []
    leaf = hf_module.rsplit(".", 2)
    tail = ".".join(leaf[-2:])
    if arch.rope_unpermute and tail in ("self_attn.q_proj", "self_attn.k_proj"):
        n_head = hp["num_attention_heads"]
        n_kv = hp.get("num_key_value_heads", n_head)
        n = n_kv if tail == "self_attn.k_proj" and n_kv is not None and n_kv != n_head else n_head
        idx = np.arange(out_dim).reshape(n, 2, out_dim // n // 2).swapaxes(1, 2).reshape(-1)
        out.append(Rewrite("B", idx, "rotary rows permuted (llama.cpp's LlamaModel.permute)"))
    nk, nv = hp.get("linear_num_key_heads", 0) or 0, hp.get("linear_num_value_heads", 0) or 0
    if arch.v_head_tiling and nk > 0 and nv > 0 and nk != nv and tail.startswith("linear_attn."):
        hk, hv, per = hp["linear_key_head_dim"], hp["linear_value_head_dim"], nv // nk

        def tiled(n: int, head: int) -> Any:
            return np.arange(n).reshape(nk, per, head).transpose(1, 0, 2).reshape(-1)

        why = "V heads from grouped to tiled order (llama.cpp's _reorder_v_heads)"
        if tail == "linear_attn.in_proj_qkv":
            qk = 2 * hk * nk
            idx = np.concatenate([np.arange(qk), qk + tiled(out_dim - qk, hv)])
            out.append(Rewrite("B", idx, why))
        elif tail == "linear_attn.in_proj_z":
            out.append(Rewrite("B", tiled(out_dim, hv), why))
        elif tail in ("linear_attn.in_proj_a", "linear_attn.in_proj_b"):
            out.append(Rewrite("B", tiled(out_dim, 1), why))
        elif tail == "linear_attn.out_proj":
            out.append(Rewrite("A", tiled(in_dim, hv), why))
    return out


def apply(rewrites: list[Rewrite], a: Any, b: Any, *, inverse: bool = False) -> tuple[Any, Any]:
    """``(lora_A, lora_B)`` after ``rewrites`` (or before them, ``inverse``): exact, the values only move."""
    import numpy as np

    for rw in reversed(rewrites) if inverse else rewrites:
        idx = np.argsort(rw.index) if inverse else rw.index
        if rw.side == "B":
            b = np.ascontiguousarray(b[idx])
        else:
            a = np.ascontiguousarray(a[:, idx])
    return a, b
