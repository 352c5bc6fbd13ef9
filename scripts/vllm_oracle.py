"""vLLM 0.33.0's own adapter loading, run on the CPU against one adapter: the oracle for ``verify --profile vllm``.

Run it with the Python of the oracle environment (``bash .ci/oracles/vllm.sh`` builds
``/opt/adapterdoc-oracles/vllm``):

    python scripts/vllm_oracle.py SPECS.json

``SPECS.json`` is a file holding a list of JSON objects (one import of vLLM for many adapters), each: ``adapter`` (the folder), ``arch`` (the base's ``architectures[0]``), ``leaves``
(the base's Linear leaf names as transformers names them), ``num_experts`` (0 for a dense model), ``vocab_size``
and ``max_lora_rank``. It prints one JSON list, for each: ``{"ok": bool, "error": str|null, "loras": [...]}``.

vLLM's own code does the work: the model class from vLLM's registry (its ``packed_modules_mapping``,
``embedding_modules``, ``is_3d_moe_weight``, ``hf_to_vllm_mapper``, ``lora_skip_prefixes``),
``get_supported_lora_modules`` and ``process_packed_modules_mapping`` (``vllm/lora/utils.py``; the expert mapping
from ``RoutedExperts.build_expert_params_mapping`` with the checkpoint names ``FusedMoEFactory`` defaults to),
then ``WorkerLoRAManager._load_adapter`` (``vllm/lora/worker_manager.py``): the expected modules, ``PEFTHelper``'s
``from_local_dir`` and ``validate_legal``, ``LoRAModel.from_local_checkpoint`` (the name check and the tensors) and
``LoRAModelManager._validate_moe_lora_format``. Only the model instance is a stand-in: building vLLM's model
needs a CUDA build of its kernels and a distributed setup, so a module tree is made whose leaves are vLLM's own
layer classes (``LinearBase``, ``MoERunner``, ``FusedMoEWithLoRA`` / ``FusedMoE3DWithLoRA``, created without
their CUDA buffers) under the names vLLM gives them: the base's Linear leaves through the class's
``packed_modules_mapping`` (``q_proj`` → ``qkv_proj``), and an ``experts`` runner per MoE block the adapter names.
What this does not see: a module path that exists nowhere in the served model (vLLM compares only the last name
component; ``verify`` says that as AD415) and the packing that runs when the adapter is added.
"""

from __future__ import annotations

import copy
import json
import sys
import types
from typing import Any


def model_class(arch: str) -> Any:
    import importlib

    from vllm.model_executor.models.registry import _VLLM_MODELS

    # an architecture name, else the class a registered architecture maps to (the Omni thinker is served under
    # Qwen3OmniMoeForConditionalGeneration)
    hit = _VLLM_MODELS.get(arch) or next((v for v in _VLLM_MODELS.values() if v[1] == arch), None)
    if hit is None:
        return None
    module, name = hit
    return getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)


def stand_in(cls: Any, leaves: list[str], num_experts: int) -> Any:
    """A module tree with vLLM's layer classes under vLLM's leaf names and the class's LoRA attributes."""
    import torch.nn as nn
    from vllm.model_executor.layers.fused_moe import MoERunner
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.linear import LinearBase

    class StandIn(nn.Module):
        packed_modules_mapping = copy.deepcopy(getattr(cls, "packed_modules_mapping", {}))
        embedding_modules = getattr(cls, "embedding_modules", {})
        is_3d_moe_weight = getattr(cls, "is_3d_moe_weight", False)
        is_non_gated_moe = getattr(cls, "is_non_gated_moe", False)
        hf_to_vllm_mapper = getattr(cls, "hf_to_vllm_mapper", None)
        lora_skip_prefixes = getattr(cls, "lora_skip_prefixes", None)

    model = StandIn()
    packed_of = {part: packed for packed, parts in StandIn.packed_modules_mapping.items() for part in parts}
    for leaf in sorted({packed_of.get(leaf, leaf) for leaf in leaves}):
        layer = LinearBase.__new__(LinearBase)
        nn.Module.__init__(layer)
        model.add_module(leaf, layer)
    if num_experts:
        runner = MoERunner.__new__(MoERunner)
        nn.Module.__init__(runner)
        # RoutedExperts.get_expert_mapping with FusedMoEFactory's default checkpoint names, no EPLB redundancy
        runner.get_expert_mapping = lambda: RoutedExperts.build_expert_params_mapping(
            "gate_proj", "down_proj", "up_proj", num_experts=num_experts, routed_experts_prefix=""
        )
        model.add_module("experts", runner)
    return model


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import vllm.lora.lora_model as lora_model_module
    from safetensors import safe_open
    from vllm.config.lora import LoRAConfig
    from vllm.lora.layers import FusedMoE3DWithLoRA, FusedMoEWithLoRA
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.model_manager import LoRAModelManager
    from vllm.lora.request import LoRARequest
    from vllm.lora.utils import (
        get_supported_lora_modules,
        parse_fine_tuned_lora_name,
        process_packed_modules_mapping,
    )

    # the CUDA build of vLLM reports pinned memory available; on this CPU torch pin_memory() raises
    lora_model_module.PIN_MEMORY = False
    cls = model_class(spec["arch"])
    if cls is None:
        return {"ok": None, "served": False, "error": f"vLLM registers no {spec['arch']}", "loras": []}
    model = stand_in(cls, spec["leaves"], spec["num_experts"])
    mapper = model.hf_to_vllm_mapper.get_rename_mapper() if model.hf_to_vllm_mapper is not None else None
    wrapper = FusedMoE3DWithLoRA if model.is_3d_moe_weight else FusedMoEWithLoRA
    modules: dict[str, Any] = {}
    with safe_open(f"{spec['adapter']}/adapter_model.safetensors", "pt") as f:
        for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            try:
                name, _ = parse_fine_tuned_lora_name(key, mapper)
            except ValueError:
                continue  # _load_adapter below raises it where vLLM does
            owner, sep, _ = name.partition(".experts")
            if sep and spec["num_experts"]:
                modules[owner + ".experts"] = object.__new__(wrapper)

    manager = types.SimpleNamespace(
        model=model,
        supported_lora_modules=get_supported_lora_modules(model),
        packed_modules_mapping=process_packed_modules_mapping(model),
        moe_ep_load_spec=None,
        modules=modules,
        is_pooling_model=False,
        _enable_mixed_moe_lora_format=False,
        _classification_head=None,
    )
    for method in ("_validate_moe_lora_format", "_get_lora_layer_weights", "_get_text_lora_name"):
        setattr(manager, method, types.MethodType(getattr(LoRAModelManager, method), manager))
    manager._get_text_lora_names = lambda name: []  # a text-only adapter on a VL class: not modelled here
    manager._validate_classification_head_lora = types.MethodType(
        LoRAModelManager._validate_classification_head_lora, manager
    )
    import torch
    from vllm.lora.worker_manager import WorkerLoRAManager

    lora_config = LoRAConfig(max_lora_rank=spec.get("max_lora_rank", 16))
    lora_config.lora_dtype = (
        torch.float32
    )  # what verify_with_model_config resolves "auto" to for a float32 model
    worker = types.SimpleNamespace(
        _adapter_manager=manager,
        max_position_embeddings=None,
        lora_config=lora_config,
        _lora_model_cls=LoRAModel,
        vocab_size=spec.get("vocab_size"),
    )
    try:
        lora = WorkerLoRAManager._load_adapter(worker, LoRARequest("oracle", 1, spec["adapter"]))
    except Exception as e:  # vLLM's verdict: the request that names the adapter fails with this
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "loras": []}
    return {"ok": True, "error": None, "loras": sorted(lora.loras)}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        specs = json.load(f)
    print(json.dumps([run(spec) for spec in specs]))
