"""``verify ADAPTER.gguf --base MODEL.gguf``: llama.cpp's LoRA load checks, header-only, as findings with the fix.

Mirrors ``llama_adapter_lora_init_impl`` (llama.cpp ``src/llama-adapter.cpp``, vendored in llama-cpp-python
0.3.36) in its order: ``general.type``, ``general.architecture``, ``adapter.type``, ``adapter.lora.alpha``, the tensor
suffixes, the pairs, each pair's base tensor and shape, the rank dimension, the data bounds. Each refusal there
("failed to apply lora adapter: ...") is an error finding here; what llama.cpp accepts but serves differently from
PEFT (no alpha, skipped norms) is a warning. A metadata value of the wrong GGUF type (an integer alpha, a
non-string ``general.type``) is an error too: llama.cpp's ``gguf_get_val_*`` asserts on it and the process aborts.
Reads no tensor data, needs neither numpy nor the ``gguf`` package.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from adapterdoc.errors import UnsupportedInputError
from adapterdoc.formats.gguf_header import (
    GgufHeader,
    GgufTensor,
    is_gguf,
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
    out: list[Finding] = []
    gtype = a.get_str("general.type")
    if gtype != "adapter":
        out.append(
            make(
                "AD850",
                _not_string(a, "general.type")
                or f"general.type is {gtype!r}, not 'adapter': llama.cpp refuses it as a LoRA "
                f"('expect general.type to be 'adapter', but got: {gtype or ''}')",
                key="general.type",
                path=path,
                hint="pass the LoRA GGUF; " + CONVERT + " writes one",
            )
        )
    b: GgufHeader | None = None
    if base is not None:
        b = read_base(base)
        if b.get_str("general.type") == "adapter" or lora_pairs(b):
            out.append(
                make(
                    "AD861",
                    f"the base {base} is a LoRA adapter, not a model",
                    path=str(base),
                    hint="pass the base model's GGUF (convert_hf_to_gguf.py's output) as --base",
                )
            )
            b = None
    arch = a.get_str("general.architecture")
    if b is not None and arch != b.get_str("general.architecture"):
        out.append(
            make(
                "AD852",
                _not_string(a, "general.architecture")
                or f"adapter architecture {arch!r}, base {b.get_str('general.architecture')!r}: llama.cpp "
                "refuses ('model arch and LoRA arch mismatch')",
                key="general.architecture",
                path=path,
                hint=f"convert the adapter again against the base's own config.json: {CONVERT}",
            )
        )
    atype = a.get_str("adapter.type")
    if atype != "lora":
        out.append(
            make(
                "AD851",
                _not_string(a, "adapter.type")
                or f"adapter.type is {atype!r}, not 'lora': llama.cpp refuses the adapter "
                f"('expect adapter.type to be 'lora', but got: {atype or ''}')",
                key="adapter.type",
                path=path,
                hint="a control vector loads with --control-vector; a LoRA needs adapter.type = lora",
            )
        )
    alpha = a.kv.get("adapter.lora.alpha")
    alpha_type = a.kv_types.get("adapter.lora.alpha", "FLOAT32")
    if alpha_type != "FLOAT32":
        out.append(
            make(
                "AD858",
                f"adapter.lora.alpha is a {alpha_type}, not a FLOAT32: llama.cpp aborts the process at load "
                "(gguf_get_val_f32: 'GGML_ASSERT(type_to_gguf_type<T>::value == type) failed')",
                severity="error",
                key="adapter.lora.alpha",
                path=path,
                hint=f"write adapter.lora.alpha as a float32 ({CONVERT} does)",
            )
        )
    elif not alpha:
        out.append(
            make(
                "AD858",
                f"adapter.lora.alpha is {alpha!r}: llama.cpp scales every pair by 1, not alpha / rank",
                key="adapter.lora.alpha",
                path=path,
                hint=f"convert again ({CONVERT}) to write the alpha that reproduces PEFT's scaling",
            )
        )
    out += _tensor_findings(a, b, path)
    return out


def _not_string(a: GgufHeader, key: str) -> str | None:
    """The message for a metadata string stored as another type: llama.cpp's ``gguf_get_val_str`` asserts."""
    t = a.kv_types.get(key)
    if t is None or t == "STRING":
        return None
    return (
        f"{key} is a {t}, not a STRING: llama.cpp aborts the process at load "
        "('GGML_ASSERT(type_to_gguf_type<T>::value == type) failed')"
    )


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
    alpha = a.kv.get("adapter.lora.alpha") or 0
    alpha = alpha if isinstance(alpha, (int, float)) else 0
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
        out += _pair(name, la, lb, b, path)
        if lb.shape:
            scales[lb.shape[0]] += 1
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
    if scales:
        shown = ", ".join(
            f"r={r}: ×{(alpha / r if alpha else 1.0):g} ({n} pairs)" for r, n in sorted(scales.items())
        )
        out.append(make("AD862", f"llama.cpp's scale alpha / rank with alpha {alpha:g}: {shown}", path=path))
    return out


def _pair(name: str, la: GgufTensor, lb: GgufTensor, b: GgufHeader | None, path: str) -> list[Finding]:
    embd = name.endswith("token_embd.weight")
    if b is None:
        if not embd and la.shape[1:2] != lb.shape[0:1]:
            return [_not_transposed(name, la, lb, path)]
        return []
    model = b.tensors.get(name)
    if model is None:
        return [_missing(name, b, path)]
    ne = model.shape
    if embd:
        bad = len(ne) < 2 or ne[0] != lb.shape[1] or ne[1] != la.shape[1]
    else:
        bad = len(ne) < 2 or ne[0] != la.shape[0] or ne[1] != lb.shape[1]
    if bad:
        return [
            make(
                "AD856",
                f"`{name}`: base ne {list(ne)}, lora_a ne {list(la.shape)}, lora_b ne {list(lb.shape)}: llama.cpp "
                "refuses the adapter ('has incorrect shape')",
                key=name,
                path=path,
                hint="use the base GGUF of the model (and size) the adapter was trained on",
            )
        ]
    if not embd and la.shape[1] != lb.shape[0]:
        return [_not_transposed(name, la, lb, path)]
    if len(ne) > 2 and (la.shape[2:] != ne[2:] or lb.shape[2:] != ne[2:]):
        return [_expert_count(name, ne, la, lb, path)]
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
