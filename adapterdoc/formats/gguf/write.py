"""PEFT → GGUF LoRA: plan every tensor (or refuse, exit 3, before anything is written), then one atomic write.

What llama.cpp's loader cannot hold is refused with the code that explains it: DoRA (AD871), whole weights that
differ from the base (AD872; copies equal to the base's are dropped), biases (AD873), PEFT's fused expert form
(AD874), per-module scalings one ``adapter.lora.alpha`` cannot express (AD875; a ratio that is a power of two is folded into
``lora_B`` exactly), an ``lm_head`` LoRA on a base whose
output is tied to the embedding (AD876), vision/audio tower modules (AD877), partial expert coverage (AD878) and
modules llama.cpp has no tensor for (AD879). The arithmetic matches llama.cpp's ``convert_lora_to_gguf.py``:
``lora_a``/``lora_b`` are PEFT's ``lora_A``/``lora_B`` bytes (the embedding's ``lora_a`` transposed), permuted where
llama.cpp permutes the base weight, experts stacked ``[E, ...]``.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapterdoc.adapter.config import AdapterConfig
from adapterdoc.adapter.keys import parse_key
from adapterdoc.errors import InputNotFoundError, UnsupportedInputError
from adapterdoc.formats import Converted
from adapterdoc.formats.gguf import names
from adapterdoc.formats.gguf.header import PROVENANCE
from adapterdoc.layouts import gguf as facts
from adapterdoc.layouts import strip_language_model, tower_segment

HPARAMS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "tie_word_embeddings",
)
"""The base's hyperparameters the inverse permutations need, kept in the provenance metadata."""

NP_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "uint16"}
"""safetensors dtype → the numpy dtype its bytes are held in (bf16 as its raw 16 bits)."""


def refuse(src: Path, code: str, reason: str) -> UnsupportedInputError:
    return UnsupportedInputError(str(src), f"{reason} ({code}; adapterdoc explain {code})")


# ---------------------------------------------------------------------------------------------- the base


def base_config(base: str | None) -> dict[str, Any] | None:
    """The base's ``config.json`` (a folder, a config.json, a cached repo id or ``tiny:LAYOUT``), or ``None``."""
    if base is None:
        return None
    from adapterdoc.bases import read_config_json, resolve_base

    spec = resolve_base(base)
    if spec.kind == "tiny":
        from adapterdoc.ml.tiny import tiny_config

        assert spec.tiny_layout is not None
        from adapterdoc.layouts import LAYOUTS

        config = tiny_config(spec.tiny_layout).to_dict()
        # a saved tiny model's config.json names its class (save_pretrained writes it); the bare config does not
        config.setdefault("architectures", None)
        config["architectures"] = config["architectures"] or [LAYOUTS[spec.tiny_layout].model_class]
        return config
    return read_config_json(spec)


def base_weight_bytes(base: str | None, name: str) -> tuple[str, bytes] | None:
    """(dtype, raw bytes) of the base's tensor ``name`` from its safetensors files, or ``None`` (no weights)."""
    if base is None or not os.path.isdir(base):
        return None
    from adapterdoc.st.header import read_header

    for f in sorted(os.listdir(base)):
        if not f.endswith(".safetensors"):
            continue
        path = os.path.join(base, f)
        h = read_header(path)
        t = h.tensors.get(name)
        if t is not None:
            with open(path, "rb") as fh:
                fh.seek(h.data_start + t.begin)
                return t.dtype, fh.read(t.nbytes)
    return None


# ---------------------------------------------------------------------------------------------- the plan


@dataclass
class Pair:
    """One PEFT LoRA module: where its two tensors are in the safetensors file."""

    module: str
    """PEFT's module path (no ``base_model.model.``)."""
    text: str
    """The plain text-model path llama.cpp maps (``language_model.`` dropped)."""
    a: Any = None
    b: Any = None
    embedding: bool = False


@dataclass
class Planned:
    """One GGUF pair to write: its name and the PEFT pairs it comes from (several for stacked experts)."""

    gguf: str
    pairs: list[Pair]
    rewrites: list[Any] = field(default_factory=list)


def _group(src: Path, header: Any, cfg: AdapterConfig) -> tuple[list[Pair], list[tuple[str, Any]]]:
    pairs: dict[str, Pair] = {}
    fulls: list[tuple[str, Any]] = []
    for key, info in header.tensors.items():
        k = parse_key(key)
        if k.role == "magnitude" or cfg.use_dora:
            raise refuse(
                src, "AD871", "DoRA: llama.cpp's LoRA has no magnitude vector; merge the adapter instead"
            )
        if k.role.endswith(".bias") or (k.role == "full" and key.endswith(".bias")):
            raise refuse(
                src, "AD873", f"`{key}` is a bias: llama.cpp's LoRA holds only lora_a/lora_b matrices"
            )
        if k.role == "tokens":
            raise refuse(
                src, "AD872", f"`{key}` is a trainable-tokens delta, which llama.cpp's LoRA cannot hold"
            )
        if k.role == "full":
            fulls.append((key, info))
            continue
        seg = tower_segment(k.module)
        if seg is not None:
            raise refuse(
                src,
                "AD877",
                f"`{key}` adapts the {seg} tower: llama.cpp applies a LoRA to the text model only (the tower "
                "goes to a separate mmproj file); drop the tower modules or merge the adapter",
            )
        text = strip_language_model(k.module)
        p = pairs.setdefault(k.module, Pair(k.module, text, embedding=k.role.startswith("lora_embedding")))
        if k.is_a:
            p.a = info
        elif k.is_b:
            p.b = info
    for p in pairs.values():
        if p.a is None or p.b is None:
            raise UnsupportedInputError(str(src), f"`{p.module}` has only one of lora_A / lora_B")
    return list(pairs.values()), fulls


def check_whole_weights(
    src: Path, header: Any, fulls: list[tuple[str, Any]], base: str | None, hp: dict[str, Any]
) -> list[str]:
    """Drop whole weights equal to the base's (byte for byte, same dtype); refuse the rest (AD872)."""
    notes = []
    for key, info in fulls:
        k = parse_key(key)
        module = k.module.replace(".base_layer", "")
        names_ = [f"{module}.{key.rpartition('.')[2]}"]
        if module.endswith("lm_head") and hp.get("tie_word_embeddings") is True:
            names_.append(module[: -len("lm_head")] + "model.embed_tokens.weight")
        found = next((f for n in names_ if (f := base_weight_bytes(base, n)) is not None), None)
        if found is None:
            raise refuse(
                src,
                "AD872",
                f"`{key}` is a whole weight (modules_to_save or a saved embedding) and llama.cpp's LoRA holds "
                "only lora_a/lora_b; pass --base a folder with the base's weights to drop copies equal to the "
                "base, or merge the adapter (adapterdoc merge) and convert the merged model",
            )
        with open(header.path, "rb") as fh:
            fh.seek(header.data_start + info.begin)
            same = found == (info.dtype, fh.read(info.nbytes))
        if not same:
            raise refuse(
                src,
                "AD872",
                f"`{key}` is a whole weight that differs from the base's (a trained modules_to_save or a "
                "resized embedding): llama.cpp's LoRA cannot hold it; merge the adapter and convert the model",
            )
        notes.append(f"`{key}` equals the base's weight: dropped")
    return notes


def _expert(text: str) -> tuple[int, int, str] | None:
    """``model.layers.L.mlp.experts.E.gate_proj`` → (L, E, ``gate_proj``)."""
    lay = names.layer_of(text)
    if lay is None:
        return None
    parts = lay[1].split(".")
    seg = facts.EXPERT_SEGMENT.split(".")
    if len(parts) == len(seg) + 2 and parts[: len(seg)] == seg and parts[len(seg)].isdigit():
        return lay[0], int(parts[len(seg)]), parts[-1]
    return None


def _fused_experts(text: str) -> bool:
    """``model.layers.L.mlp.experts`` (or its ``base_layer``): PEFT's fused expert LoRA (``target_parameters``).
    A per-expert adapter may keep ``target_parameters`` in its config (PEFT loads a per-expert Qwen3.5-MoE adapter
    through transformers' expert conversion); its pairs are per expert, so only the module decides."""
    lay = names.layer_of(text)
    return lay is not None and lay[1].replace(".base_layer", "") == facts.EXPERT_SEGMENT


def plan(
    src: Path, pairs: list[Pair], cfg: AdapterConfig, hp: dict[str, Any], arch: facts.GgufArch
) -> list[Planned]:
    nmap = names.NameMap(arch, names.block_count(hp))
    out: list[Planned] = []
    experts: dict[tuple[int, str], dict[int, Pair]] = defaultdict(dict)
    for p in pairs:
        e = _expert(p.text)
        if e is not None:
            experts[(e[0], e[2])][e[1]] = p
            continue
        if _fused_experts(p.text):
            raise refuse(
                src,
                "AD874",
                f"`{p.module}` is PEFT's fused expert form (target_parameters); llama.cpp stacks one LoRA per "
                "expert: run `adapterdoc remap ADAPTER --experts per-expert` first",
            )
        if p.text == "lm_head" and (hp.get("tie_word_embeddings") is True):
            raise refuse(
                src,
                "AD876",
                "`lm_head` has a LoRA but the base ties its output to the embedding (tie_word_embeddings), so the "
                "GGUF base has no output.weight to apply it to; drop the lm_head LoRA or merge the adapter",
            )
        g = nmap.to_gguf(p.text)
        if g is None:
            raise refuse(src, "AD879", f"`{p.module}`: llama.cpp's {arch.arch} has no tensor for this module")
        rw = [] if p.embedding else names.rewrites_for(arch, hp, p.text, p.b.shape[0], p.a.shape[1])
        out.append(Planned(g, [p], rw))
    n_exp = next((v for k in ("num_local_experts", "num_experts") if isinstance(v := hp.get(k), int)), None)
    for (layer, proj), by_e in sorted(experts.items()):
        have = sorted(by_e)
        if not isinstance(n_exp, int) or have != list(range(n_exp)):
            raise refuse(
                src,
                "AD878",
                f"layer {layer} `{proj}` has LoRA on experts {have[:8]}{'…' if len(have) > 8 else ''} of "
                f"{n_exp}: llama.cpp stacks all experts into one tensor; target every expert",
            )
        ranks = {p.a.shape[0] for p in by_e.values()}
        if len(ranks) != 1:
            raise refuse(
                src, "AD878", f"layer {layer} `{proj}`: experts have different ranks {sorted(ranks)}"
            )
        merged = f"model.layers.{layer}.{facts.EXPERT_SEGMENT}.{proj}"
        g = nmap.to_gguf(merged)
        if g is None:
            raise refuse(src, "AD879", f"`{merged}`: llama.cpp's {arch.arch} has no stacked expert tensor")
        out.append(Planned(g, [by_e[i] for i in have]))
    seen: dict[str, str] = {}
    for pl in out:
        if pl.gguf in seen:
            raise refuse(src, "AD879", f"`{pl.pairs[0].module}` and `{seen[pl.gguf]}` both map to {pl.gguf}")
        seen[pl.gguf] = pl.pairs[0].module
    return out


@dataclass
class Alpha:
    """The one ``adapter.lora.alpha`` of the file, and the pairs whose scaling differs from it by a power of two."""

    value: float
    folds: dict[str, float]
    """PEFT module → the factor multiplied into its ``lora_B`` (only factors other than 1)."""
    notes: list[str]


def pair_alphas(cfg: AdapterConfig, pairs: list[Pair]) -> dict[str, float]:
    """Each pair's G with G / rank = PEFT's scaling of that pair (``alpha_pattern``, rsLoRA's ``alpha·√r``)."""
    out = {}
    for p in pairs:
        alpha = cfg.alpha_for(p.module)
        out[p.module] = alpha * math.sqrt(p.a.shape[0]) if cfg.use_rslora else float(alpha)
    return out


def common_alpha(wanted: dict[str, float]) -> float:
    """The G that the most pairs can be written with exactly (theirs, or a power of two from it), then the one the
    most pairs have, then the largest (as ``mlx._common_scale`` picks MLX's scale)."""
    from adapterdoc.st.tensor_edits import is_power_of_two

    counts = Counter(wanted.values())

    def score(g: float) -> tuple[int, int, float]:
        exact = sum(n for w, n in counts.items() if g != 0 and is_power_of_two(w / g))
        return exact, counts[g], g

    return max(counts, key=score)


def gguf_alpha(src: Path, cfg: AdapterConfig, pairs: list[Pair]) -> Alpha:
    """The one ``adapter.lora.alpha`` G with G / rank = PEFT's scaling for every pair, a pair whose own G differs
    from it by a power of two folded into its ``lora_B`` (exact in any float dtype); otherwise AD875."""
    from adapterdoc.st.tensor_edits import is_power_of_two

    wanted = pair_alphas(cfg, pairs)
    g = common_alpha(wanted)
    if g == 0:
        raise refuse(src, "AD875", "lora_alpha is 0: llama.cpp reads alpha 0 as 'no alpha' (scale 1, not 0)")
    folds = {m: w / g for m, w in wanted.items() if w != g}
    odd = {m: w for m, w in wanted.items() if m in folds and not is_power_of_two(folds[m])}
    if odd:
        by_value: dict[float, list[str]] = defaultdict(list)
        for m, w in odd.items():
            by_value[w].append(m)
        shown = "; ".join(f"{w:g} for {len(m)} modules (e.g. {m[0]})" for w, m in by_value.items())
        raise refuse(
            src,
            "AD875",
            f"llama.cpp has one alpha per adapter (scale = alpha / rank of each pair); adapter.lora.alpha = {g:g} "
            f"holds most pairs, but {shown} need alpha·rank/scaling at a ratio to it that is not a power of two "
            "(only those fold exactly into lora_B); use one lora_alpha (and, with rsLoRA, one rank), or merge",
        )
    notes = []
    if cfg.use_rslora:
        notes.append(f"rsLoRA folded: adapter.lora.alpha = lora_alpha·√r = {g:g}")
    if folds:
        factors = ", ".join(f"×{f:g}" for f in sorted(set(folds.values())))
        notes.append(
            f"{len(folds)} pairs' own alpha (alpha_pattern{', rsLoRA rank' if cfg.use_rslora else ''}) folded into "
            f"lora_B ({factors}, a power of two: exact)"
        )
    import numpy as np

    if float(np.float32(g)) != g:
        notes.append(f"adapter.lora.alpha {g!r} rounded to float32 {float(np.float32(g))!r}")
    return Alpha(g, folds, notes)


def fold(src: Path, module: str, b: Any, kind: str, factor: float) -> Any:
    """``b`` (numpy, in its safetensors ``kind``; bf16 as uint16 bits) times a power of two, exactly: AD875 where a
    value would overflow or lose bits as a subnormal."""
    import numpy as np

    f32 = (b.astype(np.uint32) << 16).view(np.float32) if kind == "BF16" else b.astype(np.float32)
    with np.errstate(over="ignore", under="ignore"):
        scaled = f32 * np.float32(factor)
        out: Any = scaled.astype(np.float16) if kind == "F16" else scaled
        if kind == "BF16":
            out = (scaled.view(np.uint32) >> 16).astype(np.uint16)
        back = (out.astype(np.uint32) << 16).view(np.float32) if kind == "BF16" else out.astype(np.float32)
        exact = np.array_equal(back / np.float32(factor), f32)
    if not exact or not np.isfinite(back).all():
        raise refuse(
            src,
            "AD875",
            f"`{module}`: folding its alpha into lora_B (×{factor:g}) would overflow or round {kind} values; "
            "use one lora_alpha, or merge",
        )
    return np.ascontiguousarray(out)


def folded_config(cfg_text: str, alpha: Alpha) -> str:
    """The ``adapter_config.json`` kept in the provenance: as it is, or, where pairs' alphas were folded into
    ``lora_B``, the config PEFT reads those bytes with (one ``lora_alpha``, no ``alpha_pattern``, no rsLoRA)."""
    if not alpha.folds:
        return cfg_text
    raw = json.loads(cfg_text)
    raw.update({"lora_alpha": alpha.value, "alpha_pattern": {}, "use_rslora": False})
    return json.dumps(raw, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------------------------- the data


def _array(mm: Any, header: Any, info: Any) -> Any:
    import numpy as np

    dt = NP_DTYPES[info.dtype]
    return np.frombuffer(mm, dtype=dt, count=info.numel, offset=header.data_start + info.begin).reshape(
        info.shape
    )


def convert_dtype(arr: Any, kind: str, outtype: str | None) -> tuple[Any, str]:
    """``(array, kind)`` in ``outtype`` (``None``: kept). bf16 is held as uint16 bits; f32 → bf16 rounds to nearest
    even as llama.cpp's converter does (``gguf.quants``)."""
    import numpy as np

    want = {"f32": "F32", "f16": "F16", "bf16": "BF16"}.get(outtype or "", kind)
    if want == kind:
        return arr, kind
    f32 = (arr.astype(np.uint32) << 16).view(np.float32) if kind == "BF16" else arr.astype(np.float32)
    if want == "F32":
        return f32, want
    if want == "F16":
        return f32.astype(np.float16), want
    gguf = names.gguf_package()
    q = gguf.quants.quantize(np.ascontiguousarray(f32), gguf.GGMLQuantizationType.BF16)
    return q.view(np.uint16).reshape(f32.shape), want


def _refuse_unsupported_dtypes(src: Path, pairs: list[Pair]) -> None:
    """Refuse a LoRA factor whose dtype GGUF LoRA does not take (F32/F16/BF16 only)."""
    for p in pairs:
        for info in (p.a, p.b):
            if info.dtype not in NP_DTYPES:
                raise UnsupportedInputError(
                    str(src), f"`{info.name}` is {info.dtype}: GGUF LoRA takes F32/F16/BF16"
                )


def write_gguf(src: Path, out: Path, *, base: str | None, outtype: str | None) -> Converted:
    import numpy as np

    from adapterdoc.st.atomic import atomic_writer
    from adapterdoc.st.header import read_header

    gguf = names.gguf_package()
    cfg_path = src / "adapter_config.json"
    st_path = src / "adapter_model.safetensors"
    if not cfg_path.is_file():
        raise InputNotFoundError(str(src), "no adapter_config.json (a PEFT adapter folder is needed)")
    if not st_path.is_file():
        raise InputNotFoundError(
            str(src), "no adapter_model.safetensors (convert a .bin adapter to safetensors first)"
        )
    cfg = AdapterConfig.load(cfg_path)
    if cfg.peft_type.upper() != "LORA":
        raise UnsupportedInputError(
            str(src), f"peft_type {cfg.peft_type}: llama.cpp reads LoRA adapters only"
        )
    config = base_config(base)
    if config is None:
        raise UnsupportedInputError(
            str(src),
            "--base is needed: llama.cpp names and permutes tensors per architecture; pass the base model's "
            "folder or config.json (no weights needed)",
        )
    _cls, arch = names.architecture_of(config)
    hp = names.text_hparams(config)
    header = read_header(st_path)
    pairs, fulls = _group(src, header, cfg)
    if not pairs:
        raise UnsupportedInputError(str(src), "has no LoRA pairs to convert")
    _refuse_unsupported_dtypes(src, pairs)
    planned = plan(src, pairs, cfg, hp, arch)
    notes = check_whole_weights(src, header, fulls, base, hp)
    alpha = gguf_alpha(src, cfg, pairs)
    notes += alpha.notes
    provenance = {
        "adapter_config_json": folded_config(cfg_path.read_bytes().decode("utf-8"), alpha),
        "hparams": {k: v for k, v in hp.items() if k in HPARAMS},
        "metadata": header.metadata,
        "modules": {pl.gguf: [p.module for p in pl.pairs] for pl in planned},
        "order": [k for k in header.tensors if not any(k == f[0] for f in fulls)],
        "dtypes": sorted({p.a.dtype for p in pairs} | {p.b.dtype for p in pairs}),
    }
    w = gguf.GGUFWriter(None, names.arch_name(arch))
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha.value))
    tokens = cfg.raw.get("alora_invocation_tokens")
    if isinstance(tokens, list) and tokens:
        w.add_key_value(
            gguf.Keys.Adapter.ALORA_INVOCATION_TOKENS,
            [int(t) for t in tokens],
            gguf.GGUFValueType.ARRAY,
            gguf.GGUFValueType.UINT32,
        )
    w.add_string(PROVENANCE, json.dumps(provenance, sort_keys=True, separators=(",", ":")))
    kinds: set[str] = set()
    rewritten = 0
    mm = np.memmap(st_path, dtype=np.uint8, mode="r")
    for pl in planned:
        arrays = []
        for p in pl.pairs:
            a, b = _array(mm, header, p.a), _array(mm, header, p.b)
            if p.module in alpha.folds:
                b = fold(src, p.module, b, p.b.dtype, alpha.folds[p.module])
            if p.embedding:  # llama.cpp's llm_build_inp_embd takes token_embd's lora_a as [vocab, r]
                a = np.ascontiguousarray(a.T)
            a, b = names.apply(pl.rewrites, a, b)
            arrays.append((a, p.a.dtype, b, p.b.dtype))
        rewritten += bool(pl.rewrites)
        if len(arrays) == 1:
            a, ka, b, kb = arrays[0]
        else:
            a, b = np.stack([x[0] for x in arrays]), np.stack([x[2] for x in arrays])
            ka, kb = arrays[0][1], arrays[0][3]
        for suffix, arr, kind in ((".lora_a", a, ka), (".lora_b", b, kb)):
            arr, kind = convert_dtype(arr, kind, outtype)
            kinds.add(kind)
            raw = gguf.GGMLQuantizationType.BF16 if kind == "BF16" else None
            w.add_tensor(pl.gguf + suffix, np.ascontiguousarray(arr), raw_dtype=raw)
    _write(w, out, atomic_writer)
    if rewritten:
        notes.append(f"{rewritten} pairs permuted as llama.cpp permutes the base ({arch.arch})")
    notes.append(f"tensor dtype {', '.join(sorted(kinds))}; adapter.lora.alpha = {alpha.value:g}")
    return Converted("peft", "gguf", out, 2 * len(planned), tuple(notes))


def _write(w: Any, out: Path, atomic_writer: Any) -> None:
    """The writer's header, metadata and tensors into one atomic file (temp beside ``out``, fsync, rename)."""
    from gguf.gguf_writer import WriterState

    with atomic_writer(out) as f:
        w.fout, w.state = [f], WriterState.EMPTY
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.fout = None
