"""SGLang's own adapter checks, run on the CPU against adapter folders: the import oracle for ``verify --profile sglang``.

Run it with the Python of a venv that has ``pip install --no-deps sglang==0.5.23`` plus CPU ``torch``,
``safetensors`` and ``huggingface_hub`` (e.g. ``/tmp/sglang-venv/bin/python``)::

    python scripts/sglang_oracle.py [--vocab N] [--max-lora-rank N] [--lora-target-modules M ...] PATH=NAME ...

``sglang.srt.lora.lora_manager`` cannot be imported on a CPU-only machine (its import chain reaches
``sglang.srt.configs`` → torchvision, tvm_ffi and the CUDA kernels), so this script loads SGLang's own function
bodies from its installed source files instead: ``lora_config.py`` whole; from ``utils.py``
``get_normalized_target_modules``, ``get_target_module_name``, ``get_stacked_multiply`` and the name tables; the
weight handling methods of ``LoRAAdapter`` (``lora.py``: ``_process_weight``, ``_normalize_weights`` and the
normalisers it calls, and the ``peft_type`` assert of ``__init__``); ``LoRAManager.validate_new_adapter`` and
``init_lora_shapes`` (``lora_manager.py``); ``LoRAMemoryPool.can_support`` (``mem_pool.py``). Each runs unchanged
on stand-ins for the GPU objects. Two checks are this script's own, each a few lines that mirror SGLang's
(``load_lora_weight_to_buffer``'s skipped-weight scan and its buffer shape assertion, and ``init_lora_modules``'
fused-MoE condition).

Prints one JSON object: NAME → ``{"refused": bool, "reasons": [...]}``; ``refused`` also counts weights SGLang
would skip (not applied). ``--probe`` only checks that the sources load.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import logging
import os
import re
import sys
import types
from types import SimpleNamespace
from typing import Any


def _root() -> str:
    spec = importlib.util.find_spec("sglang")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed in this Python (pip install --no-deps sglang==0.5.23)")
    return os.path.join(next(iter(spec.submodule_search_locations)), "srt")


def _tree(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _pick(path: str, names: set[str], ns: dict[str, Any]) -> None:
    """Exec the top-level functions and assignments called ``names`` from ``path`` into ``ns``."""
    body = []
    for node in _tree(path).body:
        named = {node.name} if isinstance(node, ast.FunctionDef) else set()
        if isinstance(node, ast.Assign):
            named = {getattr(t, "id", None) for t in node.targets}
        if named & names:
            body.append(node)
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)


def _methods(path: str, cls: str, names: set[str], ns: dict[str, Any]) -> type:
    """A class holding only the methods ``names`` of class ``cls`` in ``path``, their bodies unchanged."""
    node = next(n for n in _tree(path).body if isinstance(n, ast.ClassDef) and n.name == cls)
    keep = [m for m in node.body if isinstance(m, ast.FunctionDef) and m.name in names]
    missing = names - {m.name for m in keep}
    if missing:
        raise SystemExit(f"{cls} in {path} has no {sorted(missing)}: the SGLang source moved on")
    new = ast.ClassDef(name=cls, bases=[], keywords=[], body=keep, decorator_list=[], type_params=[])
    exec(compile(ast.fix_missing_locations(ast.Module(body=[new], type_ignores=[])), path, "exec"), ns)
    return ns[cls]


def _peft_type_assert(path: str) -> ast.Module:
    node = next(n for n in _tree(path).body if isinstance(n, ast.ClassDef) and n.name == "LoRAAdapter")
    init = next(m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "__init__")
    stmt = next(s for s in init.body if isinstance(s, ast.Assert))
    return ast.Module(body=[stmt], type_ignores=[])


def load_sources() -> dict[str, Any]:
    import torch

    srt = _root()
    ns: dict[str, Any] = {"__name__": "sglang_oracle_ns", "logger": logging.getLogger("sglang")}
    exec("from typing import *\nimport re, torch", ns)
    _pick(os.path.join(srt, "layers", "utils", "common.py"), {"get_layer_id"}, ns)
    utils_names = {
        "get_normalized_target_modules",
        "get_target_module_name",
        "get_stacked_multiply",
        "EMBEDDING_NAMES",
        "DSA_INDEXER_LORA_NAMES",
        "_KNOWN_LORA_TARGET_MODULES",
    }
    _pick(os.path.join(srt, "lora", "utils.py"), utils_names, ns)
    # lora.py's methods import get_normalized_target_modules from sglang.srt.lora.utils: serve the extracted one
    for name in ("sglang", "sglang.srt", "sglang.srt.lora"):
        sys.modules.setdefault(name, types.ModuleType(name))
    fake_utils = types.ModuleType("sglang.srt.lora.utils")
    fake_utils.__dict__.update({k: ns[k] for k in utils_names})
    sys.modules["sglang.srt.lora.utils"] = fake_utils
    spec = importlib.util.spec_from_file_location(
        "sglang_lora_config", os.path.join(srt, "lora", "lora_config.py")
    )
    assert spec and spec.loader
    cfg_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cfg_mod)
    ns["LoRAConfig"] = cfg_mod.LoRAConfig
    ns["_ROUTED_EXPERT_PATTERN"] = re.compile(r"\.experts\.")
    lora_py = os.path.join(srt, "lora", "lora.py")
    adapter_methods = {
        "_process_weight",
        "_normalize_weights",
        "normalize_inkling_qkvr_proj",
        "normalize_qkv_proj",
        "_normalize_shared_expert_moe",
        "_rename_expert_w_to_proj",
        "_normalize_in_proj",
        "_normalize_in_proj_qkvz",
        "normalize_gate_up_proj",
        "normalize_fused_qkv_a_proj",
        "_is_non_gated_moe_weight",
    }
    ns["Adapter"] = _methods(lora_py, "LoRAAdapter", adapter_methods, ns)
    ns["peft_type_assert"] = compile(_peft_type_assert(lora_py), lora_py, "exec")
    ns["auto_detect_lora_target_modules"] = lambda model: set(ns["_KNOWN_LORA_TARGET_MODULES"])
    manager = {"validate_new_adapter", "init_lora_shapes"}
    ns["Manager"] = _methods(os.path.join(srt, "lora", "lora_manager.py"), "LoRAManager", manager, ns)
    ns["Pool"] = _methods(os.path.join(srt, "lora", "mem_pool.py"), "LoRAMemoryPool", {"can_support"}, ns)
    ns["torch"] = torch
    return ns


def check(
    ns: dict[str, Any], path: str, name: str, vocab: int, rank: int | None, targets: Any
) -> dict[str, Any]:
    from safetensors.torch import load_file

    reasons: list[str] = []
    ref = SimpleNamespace(lora_name=name, lora_path=path, lora_id=name, pinned=False)
    try:
        cfg = ns["LoRAConfig"](path, base_vocab_size=vocab)
        exec(ns["peft_type_assert"], {"self": SimpleNamespace(config=cfg)})
        mgr = ns["Manager"]()
        mgr.attn_dp_enabled, mgr.lora_refs, mgr.memory_pool = False, {}, None
        mgr.validate_new_adapter(cfg, ref)
        mgr.configs, mgr.lora_refs, mgr.lora_added_tokens_size = {name: cfg}, {name: ref}, None
        mgr.base_model = SimpleNamespace(named_modules=lambda: [])
        mgr.init_lora_shapes(max_lora_rank=rank, target_modules=set(targets) if targets else None)
        pool = ns["Pool"]()
        pool.max_lora_rank, pool.target_modules = mgr.max_lora_rank, mgr.target_modules
        pool.lora_added_tokens_size = mgr.lora_added_tokens_size
        if not pool.can_support(cfg):
            reasons.append("memory pool: can_support is False (rank or target modules)")
        layers = 1 + max(
            (
                int(m.group(1))
                for k in load_file(os.path.join(path, "adapter_model.safetensors"))
                if (m := re.search(r"layers\.(\d+)\.", k))
            ),
            default=0,
        )
        adapter = ns["Adapter"]()
        adapter.uid, adapter.config = name, cfg
        adapter.base_hf_config = SimpleNamespace(architectures=[], model_type="", num_hidden_layers=layers)
        adapter._moe_is_gated_by_layer = {}
        adapter.layers = [SimpleNamespace(weights={}) for _ in range(layers)]
        adapter.embedding_layers, adapter.added_tokens_embeddings = {}, {}
        for key, tensor in load_file(os.path.join(path, "adapter_model.safetensors")).items():
            adapter._process_weight(key, tensor)
        adapter._normalize_weights()
    except Exception as e:  # SGLang refuses the adapter: the load returns success=False with this message
        return {"refused": True, "reasons": [*reasons, f"{type(e).__name__}: {e}"]}
    # load_lora_weight_to_buffer: names matching no target are skipped (a warning; an error under strict loading)
    names = [n for layer in adapter.layers for n in layer.weights] + list(adapter.embedding_layers)
    skipped = []
    for n in names:
        try:
            ns["get_target_module_name"](n, pool.target_modules)
        except ValueError:
            skipped.append(n)
    if skipped:
        reasons.append(f"{len(skipped)} weight(s) skipped (match no target module), e.g. {skipped[0]}")
    # the buffer views are lora_rank * stacked_multiply rows: anything else fails its shape assertion
    for layer in adapter.layers:
        for n, w in layer.weights.items():
            if n in skipped:
                continue
            t = ns["get_target_module_name"](n, pool.target_modules)
            if (
                t
                and "lora_A" in n
                and "experts" not in n
                and w.shape[0] != cfg.r * ns["get_stacked_multiply"](t)
            ):
                reasons.append(
                    f"buffer shape assertion: {n} has {w.shape[0]} rows, the buffer {cfg.r} x stack"
                )
            if t and "lora_B" in n and "experts" not in n and w.dim() == 2 and w.shape[1] != cfg.r:
                reasons.append(f"buffer shape assertion: {n} is {tuple(w.shape)}, rank {cfg.r}")
    # init_lora_modules: a fused-MoE layer gets LoRA only when gate_up_proj and down_proj are both targets
    expert = [n for n in names if re.search(r"experts\.(\d+)\.", n) and "shared_experts" not in n]
    if expert and not all(x in pool.target_modules for x in ("gate_up_proj", "down_proj")):
        reasons.append(f"expert LoRA with targets {sorted(pool.target_modules)}: no fused-MoE LoRA layer")
    return {"refused": bool(reasons), "reasons": reasons}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("adapters", nargs="*", metavar="PATH=NAME")
    p.add_argument("--vocab", type=int, default=32000, help="the base's vocab_size (added tokens)")
    p.add_argument("--max-lora-rank", type=int)
    p.add_argument("--lora-target-modules", nargs="*")
    p.add_argument("--jobs", help="a JSON file: [{path, name, vocab, max_lora_rank, lora_target_modules}]")
    p.add_argument("--probe", action="store_true")
    a = p.parse_args(argv)
    logging.disable(logging.WARNING)
    ns = load_sources()
    if a.probe:
        return 0
    jobs = []
    if a.jobs:
        with open(a.jobs, encoding="utf-8") as f:
            jobs = json.load(f)
    for spec in a.adapters:
        path, _, name = spec.partition("=")
        jobs.append(
            dict(
                path=path,
                name=name or path,
                vocab=a.vocab,
                max_lora_rank=a.max_lora_rank,
                lora_target_modules=a.lora_target_modules,
            )
        )
    out = {
        j["name"]: check(
            ns,
            j["path"],
            j["name"],
            j.get("vocab", a.vocab),
            j.get("max_lora_rank"),
            j.get("lora_target_modules"),
        )
        for j in jobs
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
