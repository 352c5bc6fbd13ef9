"""GGUF LoRA → PEFT adapter folder: the inverse of :mod:`.write`, exact (bytes kept where the dtype is kept).

Module paths and the PEFT config come from the ``adapterdoc.peft.source`` metadata when adapterdoc wrote the file;
otherwise from llama.cpp's name map (``names.NameMap.to_hf``), with ``lora_alpha = adapter.lora.alpha`` (PEFT's
``alpha / r`` is then llama.cpp's ``alpha / rank`` for every pair) and the ranks from the tensors. The
per-architecture permutations need the head counts, so architectures that permute need ``--base``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.formats import Converted
from adapterdoc.formats.gguf import names
from adapterdoc.formats.gguf.header import (
    PROVENANCE,
    GgufHeader,
    GgufTensor,
    llama_f32,
    llama_str,
    lora_pairs,
    out_of_bounds,
    read_header,
)
from adapterdoc.formats.gguf.write import base_config, convert_dtype
from adapterdoc.layouts import gguf as facts
from adapterdoc.layouts import strip_language_model

_KIND = {0: "F32", 1: "F16", 30: "BF16"}
_NP = {"F32": "float32", "F16": "float16", "BF16": "uint16"}


def _arch_for(src: Path, name: str | None) -> facts.GgufArch:
    for arch in facts.ARCHES.values():
        if names.arch_name(arch) == name:
            return arch
    raise UnsupportedInputError(str(src), f"general.architecture {name!r} is not one adapterdoc converts")


def _tensor(src: Path, mm: Any, header: GgufHeader, t: Any) -> tuple[Any, str, list[str]]:
    """(numpy array in numpy shape order, kind, notes) of one GGUF tensor."""
    import numpy as np

    start = header.data_start + t.offset
    kind = _KIND.get(t.type_id)
    if kind is not None:
        arr = mm[start : start + t.nbytes].view(_NP[kind]).reshape(t.np_shape)
        return arr, kind, []
    gguf = names.gguf_package()
    try:
        qtype = gguf.GGMLQuantizationType(t.type_id)
        n = t.nbytes
        if n is None:
            raise ValueError
        raw = np.asarray(mm[start : start + n])
        arr = gguf.quants.dequantize(raw.reshape(*t.np_shape[:-1], -1), qtype).reshape(t.np_shape)
    except (ValueError, NotImplementedError) as e:
        raise UnsupportedInputError(
            str(src), f"`{t.name}` is {t.type_name}, which adapterdoc cannot decode"
        ) from e
    return arr.astype(np.float32), "F32", [f"`{t.name}` dequantized from {t.type_name} to F32"]


def _wrapper(config: dict[str, Any] | None) -> bool:
    """Whether the base is a VL wrapper whose text model sits under ``model.language_model.``."""
    return bool(config and isinstance(config.get("text_config"), dict))


def read_gguf(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    import numpy as np

    header = read_header(src)
    _refuse_container(src, header)
    kinds = (llama_str(header, "general.type")[0], llama_str(header, "adapter.type")[0])
    if kinds != ("adapter", "lora"):  # read as llama.cpp reads them (a STRING or an array of one)
        raise UnsupportedInputError(
            str(src), "not a GGUF LoRA adapter (general.type must be 'adapter', adapter.type 'lora')"
        )
    pairs = lora_pairs(header)
    if not pairs:
        raise UnsupportedInputError(
            str(src), "holds no LoRA pair (no .lora_a / .lora_b tensor): nothing to convert"
        )
    # llama.cpp skips norm vectors at load (llama-adapter.cpp): so does the PEFT view of what it applies, and says so
    norms = [t for t in header.tensors if t.endswith("_norm.weight")]
    extra = [t for t in header.tensors if not t.endswith((".lora_a", ".lora_b", "_norm.weight"))]
    if extra:
        raise UnsupportedInputError(
            str(src),
            f"holds tensors that are not LoRA pairs ({', '.join(extra[:4])}): PEFT cannot hold them as LoRA",
        )
    for name, ab in pairs.items():
        if ab["a"] is None or ab["b"] is None:
            raise UnsupportedInputError(str(src), f"`{name}` has only one of lora_a / lora_b (AD854)")
        _check_pair(src, name, ab["a"], ab["b"])
    arch = _arch_for(src, header.get_str("general.architecture"))
    alpha = _alpha(src, header)
    prov = _provenance(header)
    if prov is not None and set(prov["modules"]) != set(pairs):
        prov = None  # the tensors were edited after adapterdoc wrote them: the name map decides
    config = base_config(base)
    hp = names.text_hparams(config) if config else None
    if hp is None:
        if prov is None:
            unread = (
                f"its {PROVENANCE} metadata is not what adapterdoc writes, so "
                if PROVENANCE in header.kv
                else ""
            )
            raise UnsupportedInputError(
                str(src),
                f"{unread}--base is needed (the base's config.json): it names the modules and undoes llama.cpp's "
                "permutations",
            )
        hp = names.text_hparams(prov.get("hparams") or {})
    nmap = names.NameMap(arch, names.block_count(hp)) if "num_hidden_layers" in hp else None
    notes: list[str] = []
    tensors: dict[str, tuple[Any, str]] = {}
    ranks: dict[str, int] = {}
    mm = np.memmap(src, dtype=np.uint8, mode="r")
    for gname, ab in sorted(pairs.items()):
        a, ka, na = _tensor(src, mm, header, ab["a"])
        b, kb, nb = _tensor(src, mm, header, ab["b"])
        notes += na + nb
        modules = _modules(src, gname, prov, nmap, config, a.ndim == 3, a.shape[0] if a.ndim == 3 else 0)
        stacked = a.ndim == 3
        if len(modules) != (a.shape[0] if stacked else 1):
            raise UnsupportedInputError(
                str(src),
                f"`{gname}`: adapterdoc's metadata names {len(modules)} modules for {a.shape} tensors",
            )
        for i, module in enumerate(modules):
            ai, bi = (a[i], b[i]) if stacked else (a, b)
            text = strip_language_model(module)
            embedding = gname.startswith("token_embd.")
            if embedding:
                ai = np.ascontiguousarray(ai.T)
            else:
                ai, bi = _unpermuted(src, gname, arch, hp, text, ai, bi)
            role_a, role_b = (
                ("lora_embedding_A", "lora_embedding_B") if embedding else ("lora_A.weight", "lora_B.weight")
            )
            tensors[f"base_model.model.{module}.{role_a}"] = convert_dtype(
                np.ascontiguousarray(ai), ka, outtype
            )
            tensors[f"base_model.model.{module}.{role_b}"] = convert_dtype(
                np.ascontiguousarray(bi), kb, outtype
            )
            ranks[module] = int(ai.shape[0])
    disagree = _disagrees(prov["adapter_config_json"], ranks, alpha) if prov else None
    if disagree:
        notes.append(
            f"adapterdoc's metadata says {disagree}, the file itself (what llama.cpp runs) says otherwise: the PEFT "
            "config is rebuilt from the file"
        )
    cfg_text = (
        prov["adapter_config_json"]
        if prov and not disagree
        else json.dumps({**_config(ranks, alpha, base), **_alora(src, header)}, indent=2) + "\n"
    )
    metadata = prov.get("metadata") if prov else {"format": "pt"}
    order = prov.get("order") if prov else None
    _write_peft(out, cfg_text, metadata, tensors, order if order and set(order) == set(tensors) else None)
    notes.append(
        "config and module paths from adapterdoc's metadata"
        if prov
        else "module paths from llama.cpp's name map"
    )
    if norms:
        notes.append(
            f"AD860: {len(norms)} norm vectors ({norms[0]}, ...) left out: llama.cpp skips them at load, and a PEFT "
            "LoRA adapter cannot hold them"
        )
    return Converted("gguf", "peft", out, len(tensors), tuple(notes))


def _refuse_container(src: Path, header: GgufHeader) -> None:
    """Exit 3 for a file llama.cpp does not open (ggml's gguf_init rules) or whose LoRA data lies past its end,
    before any tensor byte is read."""
    if header.problems:
        raise UnsupportedInputError(
            str(src), f"{header.problems[0].message} (adapterdoc verify names every problem)"
        )
    bad = out_of_bounds(header)
    if bad:
        raise UnsupportedInputError(
            str(src), f"`{bad[0]}`'s data ends past the end of the file: the file is truncated (AD859)"
        )


def _check_pair(src: Path, name: str, a: GgufTensor, b: GgufTensor) -> None:
    """A pair PEFT can hold: two 2-D tensors (or two 3-D stacks of experts), of one rank > 0."""
    dims = {len(a.shape), len(b.shape)}
    stacked_ok = dims == {3} and a.shape[2] == b.shape[2]
    rank_ok = name.endswith("token_embd.weight") or a.ne[1] == b.ne[0]
    if not (dims == {2} or stacked_ok) or not rank_ok or b.ne[0] == 0:
        raise UnsupportedInputError(
            str(src),
            f"`{name}`: lora_a ne {list(a.shape)}, lora_b ne {list(b.shape)} is not a LoRA pair PEFT can hold "
            "(adapterdoc verify names why)",
        )


def _alpha(src: Path, header: GgufHeader) -> float | None:
    """``adapter.lora.alpha`` as llama.cpp reads it (a FLOAT32 or an array of one; ``None`` when missing or 0);
    exit 3 when llama.cpp would abort on it or it is not a finite number."""
    alpha, aborts = llama_f32(header, "adapter.lora.alpha")
    if aborts is not None and isinstance(header.kv.get("adapter.lora.alpha"), (int, float)):
        alpha, aborts = (
            float(header.kv["adapter.lora.alpha"]),
            None,
        )  # another number type: read as that number
    if aborts is not None:
        raise UnsupportedInputError(str(src), aborts)
    if alpha == 0:
        return None
    if not math.isfinite(alpha):
        raise UnsupportedInputError(
            str(src), f"adapter.lora.alpha is {alpha}: not the finite number a LoRA scale needs"
        )
    return alpha


def _disagrees(config_json: str, ranks: dict[str, int], alpha: float | None) -> str | None:
    """What the PEFT config adapterdoc stored says that the file does not (a LoRA type, a rank, a scale), or ``None``
    when PEFT with it computes what llama.cpp computes from the file: every module's rank is its tensors' and its
    scaling is llama.cpp's ``alpha / rank`` (1 without an alpha). The file wins: an edited ``adapter.lora.alpha`` is
    how llama.cpp users retune a scale."""
    from adapterdoc.adapter import AdapterConfig

    cfg = AdapterConfig(json.loads(config_json), "adapter_config.json")
    if cfg.peft_type != "LORA" or cfg.use_dora:
        return f"peft_type {cfg.peft_type}{' with DoRA' if cfg.use_dora else ''}"
    for module, rank in sorted(ranks.items()):
        if cfg.rank_for(module) != rank:
            return f"rank {cfg.rank_for(module)} for `{module}` (its tensors have {rank})"
        want = alpha / rank if alpha else 1.0
        if not math.isclose(cfg.scaling_for(module), want, rel_tol=1e-6):
            return (
                f"scaling {cfg.scaling_for(module):g} for `{module}` (llama.cpp's alpha / rank is {want:g})"
            )
    return None


def _provenance(header: GgufHeader) -> dict[str, Any] | None:
    """adapterdoc's own metadata (``adapterdoc.peft.source``), or ``None`` where it is missing or not what
    :mod:`.write` writes (not JSON, another shape): the file is then read through llama.cpp's name map."""
    text = header.kv.get(PROVENANCE)
    if not isinstance(text, str):
        return None
    try:
        prov = json.loads(text)
        config = json.loads(prov["adapter_config_json"])
    except (ValueError, TypeError, KeyError):
        return None
    modules, metadata = prov.get("modules"), prov.get("metadata")
    order, hparams = prov.get("order"), prov.get("hparams") or {}
    named = (
        [m for v in modules.values() if isinstance(v, list) for m in v] if isinstance(modules, dict) else []
    )
    ok = (
        isinstance(config, dict)
        and isinstance(modules, dict)
        and all(isinstance(v, list) and v and all(isinstance(m, str) for m in v) for v in modules.values())
        and len(set(named)) == len(named)  # one module per pair: two pairs onto one module would lose one
        and (
            metadata is None
            or (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values()))
        )
        and (order is None or (isinstance(order, list) and all(isinstance(k, str) for k in order)))
        and isinstance(hparams, dict)
        and all(v is None or isinstance(v, bool) or (isinstance(v, int) and v > 0) for v in hparams.values())
    )
    return prov if ok else None


def _unpermuted(
    src: Path, gname: str, arch: facts.GgufArch, hp: dict[str, Any], text: str, a: Any, b: Any
) -> tuple[Any, Any]:
    """(lora_A, lora_B) before llama.cpp's permutations of ``text``; exit 3 where the base's head counts do not
    divide the tensors (another model's config, or a hostile file)."""
    try:
        rw = names.rewrites_for(arch, hp, text, b.shape[0], a.shape[1])
        return names.apply(rw, a, b, inverse=True)
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        raise UnsupportedInputError(
            str(src),
            f"`{gname}` (lora_a {list(a.shape)}, lora_b {list(b.shape)}) does not fit the base's head counts: "
            "pass the config.json of the model the adapter was trained on as --base",
        ) from e


def _modules(
    src: Path, gname: str, prov: dict[str, Any] | None, nmap: Any, config: Any, stacked: bool, n_exp: int
) -> list[str]:
    if prov is not None:
        modules = list(prov["modules"][gname])
        if config is None:
            return modules
        # llama.cpp names a VL model's text tensors as its text model's: the base given decides the spelling
        return [_spelled_for(config, strip_language_model(m)) for m in modules]
    hf = nmap.to_hf(gname) if nmap is not None else None
    if hf is None:
        raise UnsupportedInputError(
            str(src), f"`{gname}`: no Hugging Face module maps to it in llama.cpp's name map"
        )
    hf = _spelled_for(config, hf)
    if stacked:
        seg = facts.EXPERT_SEGMENT
        head, _, proj = hf.rpartition(".")
        if not head.endswith(seg):
            raise UnsupportedInputError(str(src), f"`{gname}` is stacked but is not an expert tensor")
        return [f"{head}.{e}.{proj}" for e in range(n_exp)]
    return [hf]


def _spelled_for(config: Any, text_module: str) -> str:
    """A text-model module path (``model.layers.0.…``) as the base ``config`` names it: under
    ``model.language_model.`` in a VL wrapper."""
    if _wrapper(config) and text_module.startswith(facts.TEXT_PREFIX):
        return facts.WRAPPED_TEXT_PREFIX + text_module[len(facts.TEXT_PREFIX) :]
    return text_module


ALORA = "adapter.alora.invocation_tokens"


def _alora(src: Path, header: GgufHeader) -> dict[str, Any]:
    """An activated LoRA's invocation tokens as PEFT's ``alora_invocation_tokens`` (``{}`` for a plain LoRA); exit
    3 where llama.cpp refuses them (AD867: not an array of UINT32)."""
    if ALORA not in header.kv_types:
        return {}
    tokens = header.kv[ALORA]
    if header.array_types.get(ALORA, ("", 0))[0] != "UINT32" or not isinstance(tokens, list):
        raise UnsupportedInputError(
            str(src), f"{ALORA} is not a short array of UINT32 token ids: llama.cpp refuses it (AD867)"
        )
    return {"alora_invocation_tokens": tokens}


def _config(ranks: dict[str, int], alpha: Any, base: str | None) -> dict[str, Any]:
    """A PEFT LoRA config whose scaling of every module equals llama.cpp's ``alpha / rank``."""
    common = Counter(ranks.values()).most_common(1)[0][0]
    leaves = sorted({m.rsplit(".", 1)[-1] for m in ranks})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": common,
        "lora_alpha": float(alpha) if alpha else float(common),
        "rank_pattern": {m: r for m, r in sorted(ranks.items()) if r != common},
        "alpha_pattern": {},
        "target_modules": leaves,
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "inference_mode": True,
    }


_ST_DTYPE = {"F32": "F32", "F16": "F16", "BF16": "BF16"}


def _write_peft(
    out: Path, cfg_text: str, metadata: Any, tensors: dict[str, tuple[Any, str]], order: list[str] | None
) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` (the source's tensor order when known, else
    safetensors' own: largest dtype first, then by name) into a temp folder beside ``out``, swapped in atomically."""
    from adapterdoc.st.atomic import atomic_folder
    from adapterdoc.st.header import TensorInfo, serialize_header
    from adapterdoc.st.rewrite import aligned_length, padded

    order = order or sorted(tensors, key=lambda k: (-tensors[k][0].dtype.itemsize, k))
    infos, pos = [], 0
    for k in order:
        arr, kind = tensors[k]
        infos.append(TensorInfo(k, _ST_DTYPE[kind], tuple(arr.shape), pos, pos + arr.nbytes))
        pos += arr.nbytes
    body = serialize_header(metadata, infos)
    head = padded(body, aligned_length(body))
    with atomic_folder(str(out)) as tmp:
        with open(Path(tmp) / "adapter_model.safetensors", "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for k in order:
                f.write(tensors[k][0].tobytes())
        with open(Path(tmp) / "adapter_config.json", "w", encoding="utf-8", newline="") as f:
            f.write(cfg_text)
