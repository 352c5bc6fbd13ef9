"""``verify ADAPTER.gguf --base MODEL.gguf``: llama.cpp's LoRA load checks, header-only, as findings with the fix.

First ggml's container rules (``gguf_init_from_file_impl``, ``ggml/src/gguf.cpp``), which :func:`~adapterdoc.
formats.gguf.header.read_header` applies: a header it cannot read at all is exit 3, the other refusals
(keys, tensor names, shapes, types, offsets, ``general.alignment``) are error findings here. Then
``llama_adapter_lora_init_impl`` (``src/llama-adapter.cpp``, both vendored in llama-cpp-python 0.3.36) in its order:
``general.type``, ``general.architecture``, ``adapter.type``, ``adapter.lora.alpha``,
``adapter.alora.invocation_tokens``, the tensor suffixes, the pairs, each pair's base tensor and shape, the rank
dimension, the data bounds. Each refusal there ("failed to apply lora adapter: ...") is an error finding here; what
llama.cpp accepts but serves differently from PEFT (no alpha, skipped norms) is a warning; what it loads but cannot
work (a NaN or infinite scale: alpha not finite, a pair of rank 0) is an error. A metadata value of the wrong GGUF
type (an integer alpha, a non-string ``general.type``) is an error too: llama.cpp's ``gguf_get_val_*`` asserts on
it and the process aborts. Reads no tensor data, needs neither numpy nor the ``gguf`` package.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.formats.gguf.header import (
    GgufHeader,
    GgufProblem,
    GgufTensor,
    is_gguf,
    llama_f32,
    llama_str,
    lora_pairs,
    out_of_bounds,
    read_header,
)
from adapterdoc.report.findings import Finding, make

CONVERT = "adapterdoc convert ADAPTER --to gguf --base BASE_CONFIG"


def read_base(base: Path) -> GgufHeader:
    """The --base GGUF's header; a base that is not a GGUF file is exit 3 (a GGUF adapter needs a GGUF model)."""
    if not is_gguf(base):
        raise UnsupportedInputError(
            str(base), "verify of a GGUF adapter takes the base model's GGUF file as --base (llama.cpp's -m)"
        )
    return read_header(base)


def verify_gguf(adapter: Path, base: Path | None) -> list[Finding]:
    """Findings for the GGUF LoRA ``adapter`` on the GGUF model ``base`` (without a base: the file's own checks)."""
    path = str(adapter)
    a = read_header(adapter)
    out = [_problem(p, path) for p in a.problems]
    b = _base_header(base, out) if base is not None else None
    out += _metadata_findings(a, b, path)
    out += _tensor_findings(a, b, path)
    return out


_REWRITE = f"the file was edited or written by a broken tool; convert the PEFT adapter again ({CONVERT})"
_PROBLEM_HINTS = {
    "AD859": "download or convert the adapter again",
    "AD863": _REWRITE,
    "AD864": _REWRITE,
    "AD865": f"write the tensors back to back, each padded to general.alignment ({CONVERT} does)",
}


def _problem(p: GgufProblem, path: str) -> Finding:
    """A rule of ggml's gguf_init the header breaks (:attr:`GgufHeader.problems`)."""
    return make(p.code, p.message, key=p.key, path=path, hint=_PROBLEM_HINTS[p.code])


def _base_header(base: Path, out: list[Finding]) -> GgufHeader | None:
    """The --base model's header, or ``None`` (and a finding) where it is an adapter or llama.cpp refuses it."""
    b = read_base(base)
    if b.get_str("general.type") == "adapter" or lora_pairs(b):
        why = f"the base {base} is a LoRA adapter, not a model"
    elif b.problems:
        why = f"the base {base}: {b.problems[0].message}"
    else:
        return b
    hint = "pass the base model's GGUF (convert_hf_to_gguf.py's output) as --base"
    out.append(make("AD861", why, path=str(base), hint=hint))
    return None


def _metadata_findings(a: GgufHeader, b: GgufHeader | None, path: str) -> list[Finding]:
    """llama_adapter_lora_init's metadata checks, in its order: general.type, general.architecture, adapter.type,
    adapter.lora.alpha, adapter.alora.invocation_tokens."""
    out: list[Finding] = []
    gtype, aborts = llama_str(a, "general.type")
    if gtype != "adapter":
        out.append(
            make(
                "AD850",
                aborts
                or f"general.type is {gtype or None!r}, not 'adapter': llama.cpp refuses it as a LoRA "
                f"('expect general.type to be 'adapter', but got: {gtype}')",
                key="general.type",
                path=path,
                hint="pass the LoRA GGUF; " + CONVERT + " writes one",
            )
        )
    out += _architecture(a, b, path)
    atype, aborts = llama_str(a, "adapter.type")
    if atype != "lora":
        out.append(
            make(
                "AD851",
                aborts
                or f"adapter.type is {atype or None!r}, not 'lora': llama.cpp refuses the adapter "
                f"('expect adapter.type to be 'lora', but got: {atype}')",
                key="adapter.type",
                path=path,
                hint="a control vector loads with --control-vector; a LoRA needs adapter.type = lora",
            )
        )
    out += _alpha(a, path)
    out += _alora_tokens(a, path)
    return out


def _architecture(a: GgufHeader, b: GgufHeader | None, path: str) -> list[Finding]:
    """llama.cpp compares the adapter's architecture with the model's: a missing one matches no model."""
    arch, aborts = llama_str(a, "general.architecture")
    hint = f"convert the adapter again against the base's own config.json: {CONVERT}"
    if aborts or not arch:
        why = aborts or (
            "general.architecture is missing: llama.cpp refuses the adapter on any model "
            "('model arch and LoRA arch mismatch')"
        )
        return [make("AD852", why, key="general.architecture", path=path, hint=hint)]
    if b is None or arch == b.get_str("general.architecture"):
        return []
    return [
        make(
            "AD852",
            f"adapter architecture {arch!r}, base {b.get_str('general.architecture')!r}: llama.cpp "
            "refuses ('model arch and LoRA arch mismatch')",
            key="general.architecture",
            path=path,
            hint=hint,
        )
    ]


def _alpha(a: GgufHeader, path: str) -> list[Finding]:
    key = "adapter.lora.alpha"
    alpha, aborts = llama_f32(a, key)
    hint = f"convert again ({CONVERT}) to write the alpha that reproduces PEFT's scaling"
    if aborts:
        return [
            make(
                "AD858",
                aborts,
                severity="error",
                key=key,
                path=path,
                hint=f"write adapter.lora.alpha as a float32 ({CONVERT} does)",
            )
        ]
    if not math.isfinite(alpha):
        return [
            make(
                "AD866",
                f"adapter.lora.alpha is {alpha}: llama.cpp loads the adapter and scales every pair by "
                f"alpha / rank = {alpha}: its outputs are NaN or infinite",
                key=key,
                path=path,
                hint=hint,
            )
        ]
    if not alpha:
        return [
            make(
                "AD858",
                f"adapter.lora.alpha is {a.kv.get(key)!r}: llama.cpp scales every pair by 1, not alpha / rank",
                key=key,
                path=path,
                hint=hint,
            )
        ]
    return []


def _alora_tokens(a: GgufHeader, path: str) -> list[Finding]:
    """An activated LoRA's invocation tokens must be an array of UINT32 (llama.cpp refuses the adapter otherwise)."""
    key = "adapter.alora.invocation_tokens"
    kind = a.kv_types.get(key)
    if kind is None:
        return []
    if kind != "ARRAY":
        why = (
            f"{key} is a {kind}, not an array: llama.cpp refuses the adapter ('invalid gguf type for {key}')"
        )
    elif a.array_types[key][0] != "UINT32":
        why = (
            f"{key} is an array of {a.array_types[key][0]}, not of UINT32: llama.cpp refuses the adapter "
            f"('invalid gguf element type for {key}')"
        )
    else:
        return []
    return [make("AD867", why, key=key, path=path, hint=f"write {key} as an array of UINT32 token ids")]


def _tensor_findings(a: GgufHeader, b: GgufHeader | None, path: str) -> list[Finding]:
    out: list[Finding] = []
    norms = []
    for name in a.tensors:
        if name.endswith((".lora_a", ".lora_b")):
            continue
        if name.endswith("_norm.weight"):
            norms.append(name)
            continue
        out.append(
            make(
                "AD853",
                f"`{name}` is neither a .lora_a/.lora_b tensor nor a norm: llama.cpp refuses the adapter "
                "('has unexpected suffix')",
                key=name,
                path=path,
                hint=f"convert the PEFT adapter again ({CONVERT}), which writes only LoRA pairs",
            )
        )
    if norms:
        out.append(
            make(
                "AD860",
                f"{len(norms)} norm vectors ({norms[0]}, ...) are skipped by llama.cpp at load",
                key=norms[0],
                path=path,
                hint="merge the adapter (adapterdoc merge) and convert the merged model if the norms matter",
            )
        )
    scales: dict[int, int] = defaultdict(int)
    alpha = llama_f32(a, "adapter.lora.alpha")[0]
    complete = []
    for name, ab in sorted(lora_pairs(a).items()):
        la, lb = ab["a"], ab["b"]
        if la is None or lb is None:
            out.append(
                make(
                    "AD854",
                    f"`{name}` has only its {'lora_b' if la is None else 'lora_a'}: llama.cpp refuses the adapter "
                    "('missing one component')",
                    key=name,
                    path=path,
                    hint=f"the file was cut or edited; convert the PEFT adapter again ({CONVERT})",
                )
            )
            continue
        complete += [la, lb]
        found = _pair(name, la, lb, b, path)
        out += found or _rank_zero(name, lb, alpha, path)
        scales[lb.ne[0]] += 1
    if not lora_pairs(a):
        out.append(
            make(
                "AD201",
                "holds no .lora_a/.lora_b pair: llama.cpp loads it, and the model behaves exactly like the base",
                path=path,
                hint=f"convert the PEFT adapter again ({CONVERT})",
            )
        )
    if complete and all(t.nbytes == 0 for t in complete):
        out.append(
            make(
                "AD868",
                "every LoRA tensor holds 0 bytes: llama.cpp refuses the adapter ('failed to allocate buffer for "
                "lora adapter')",
                path=path,
                hint=f"convert the PEFT adapter again ({CONVERT})",
            )
        )
    for bad in out_of_bounds(a):
        out.append(
            make(
                "AD859",
                f"`{bad}`'s data ends past the end of the file ({a.file_size} bytes): llama.cpp refuses the "
                "adapter ('data is not within the file bounds, file is corrupted or incomplete')",
                key=bad,
                path=path,
                hint="download or convert the adapter again",
            )
        )
    if scales and math.isfinite(alpha):
        shown = ", ".join(f"r={r}: ×{_scale(alpha, r)} ({n} pairs)" for r, n in sorted(scales.items()))
        out.append(make("AD862", f"llama.cpp's scale alpha / rank with alpha {alpha:g}: {shown}", path=path))
    return out


def _scale(alpha: float, rank: int) -> str:
    """llama.cpp's ``alpha ? alpha / rank : 1`` (``llama_adapter_lora_weight::get_scale``), as text."""
    if not alpha:
        return "1"
    return f"{alpha / rank:g}" if rank else "inf"


def _rank_zero(name: str, lb: GgufTensor, alpha: float, path: str) -> list[Finding]:
    """A pair of rank 0 loads: B·A is 0 everywhere, and its scale alpha / 0 is infinite (0 × inf = NaN)."""
    if lb.ne[0] != 0:
        return []
    if alpha:
        what = "its scale alpha / 0 is infinite and 0 × inf is NaN: every output of the layer is NaN"
    else:
        what = "with alpha 0 its scale is 1 and it adds nothing"
    return [
        make(
            "AD868",
            f"`{name}` has rank 0 (lora_b ne {list(lb.shape)}): llama.cpp loads the pair, and {what}",
            severity="error" if alpha else "warning",
            key=name,
            path=path,
            hint=f"drop the pair, or convert the PEFT adapter again ({CONVERT})",
        )
    ]


def _pair(name: str, la: GgufTensor, lb: GgufTensor, b: GgufHeader | None, path: str) -> list[Finding]:
    """llama.cpp's shape checks on one pair (its ne: a dimension the file omits is 1)."""
    embd = name.endswith("token_embd.weight")
    if b is None:
        if not embd and la.ne[1] != lb.ne[0]:
            return [_not_transposed(name, la, lb, path)]
        return []
    model = b.tensors.get(name)
    if model is None:
        return [_missing(name, b, path)]
    ne = model.ne
    if embd:
        bad = ne[0] != lb.ne[1] or ne[1] != la.ne[1]
    else:
        bad = ne[0] != la.ne[0] or ne[1] != lb.ne[1]
    if bad:
        return [
            make(
                "AD856",
                f"`{name}`: base ne {list(model.shape)}, lora_a ne {list(la.shape)}, lora_b ne {list(lb.shape)}: "
                "llama.cpp refuses the adapter ('has incorrect shape')",
                key=name,
                path=path,
                hint="use the base GGUF of the model (and size) the adapter was trained on",
            )
        ]
    if not embd and la.ne[1] != lb.ne[0]:
        return [_not_transposed(name, la, lb, path)]
    if len(model.shape) > 2 and (la.ne[2:] != ne[2:] or lb.ne[2:] != ne[2:]):
        return [_expert_count(name, model.shape, la, lb, path)]
    return []


def _expert_count(name: str, ne: tuple[int, ...], la: GgufTensor, lb: GgufTensor, path: str) -> Finding:
    """Stacked experts (ne [in, out, E]): llama.cpp checks ne[0] and ne[1] only, so another expert count loads."""
    have, want = min((*la.shape, 1, 1)[2], (*lb.shape, 1, 1)[2]), ne[2]  # a 2-D tensor is ggml's ne[2] = 1
    what = (
        f"reads the pairs of experts {have}..{want - 1} past the end of the LoRA tensors (undefined: a crash "
        "or garbage at the first token routed there)"
        if have < want
        else f"uses the first {want} of its {have} expert pairs and ignores the rest"
    )
    return make(
        "AD856",
        f"`{name}`: base ne {list(ne)}, lora_a ne {list(la.shape)}, lora_b ne {list(lb.shape)}: another expert "
        f"count; llama.cpp loads the adapter (it checks ne[0] and ne[1] only) and {what}",
        key=name,
        path=path,
        hint=f"use the base GGUF of the model the adapter was trained on ({want} experts per layer here)",
    )


def _not_transposed(name: str, la: GgufTensor, lb: GgufTensor, path: str) -> Finding:
    return make(
        "AD857",
        f"`{name}`: lora_a ne {list(la.shape)} and lora_b ne {list(lb.shape)} disagree on the rank: llama.cpp "
        "refuses the adapter ('lora_a tensor is not transposed')",
        key=name,
        path=path,
        hint=f"convert the PEFT adapter with {CONVERT} (lora_a holds PEFT's lora_A bytes: ne [in, r])",
    )


def _missing(name: str, b: GgufHeader, path: str) -> Finding:
    hint = "use the base GGUF of the model the adapter was trained on"
    if name == "output.weight" and "token_embd.weight" in b.tensors:
        hint = "the base ties its output to token_embd (no output.weight): drop the lm_head LoRA, or merge"
    parts = name.split(".")
    if len(parts) > 2 and parts[2] in ("attn_q", "attn_k", "attn_v"):
        fused = ".".join([*parts[:2], "attn_qkv", *parts[3:]])
        if fused in b.tensors:
            hint = (
                f"the base was converted with --fuse-qkv ({fused}); convert the base again without --fuse-qkv"
            )
    return make(
        "AD855",
        f"`{name}` does not exist in the base: llama.cpp refuses the adapter ('does not exist in base model')",
        key=name,
        path=path,
        hint=hint,
    )
