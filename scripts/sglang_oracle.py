"""SGLang 0.5.23's own LoRA-loading code, run on the CPU: the oracle for ``verify --profile sglang`` and
``remap --for sglang``.

Run with the Python of the oracle environment that ``.ci/oracles/sglang.sh`` builds::

    /opt/adapterdoc-oracles/sglang/bin/python scripts/sglang_oracle.py JOBS.json OUT_DIR

``JOBS.json`` is a list of ``{"name", "adapter", "base", "max_lora_rank", "lora_target_modules", "ids"}``: an adapter
folder, a base folder (``config.json`` + ``model.safetensors``), the server's options (``null``: inferred from the
adapter, as for a startup ``--lora-paths`` adapter) and the token ids to run. Prints one JSON object, name →
``{"verdict", "stage", "error", "targets"}``, and writes ``OUT_DIR/NAME.safetensors`` (``logits``) for each adapter
SGLang serves.

The modules are SGLang's own, imported whole (``sglang.srt.lora.lora_config``, ``lora``, ``lora_manager``,
``mem_pool``, ``layers``, ``utils``, ``torch_ops``), with only the imports that cannot work without a GPU stubbed
(:data:`STUBS`). The startup path of a ``--lora-paths`` adapter is followed step by step:

1. ``LoRAConfig(path, base_vocab_size=...)`` and ``LoRAManager.validate_new_adapter`` (``_load_lora_adapter``);
2. ``LoRAAdapter(...).initialize_weights()`` (SGLang's ``DefaultModelLoader`` reads the safetensors, then
   ``_process_weight`` and ``_normalize_weights``);
3. ``LoRAManager.init_lora_shapes`` (server targets and rank), ``LoRAMemoryPool(...)`` (``init_buffers``).
   An exception in 1-3 is ``refused`` (the server does not start; a dynamic load answers an error);
4. the first request: ``LoRAMemoryPool.load_lora_weight_to_buffer`` copies the adapter into its pool slot. An
   exception here is ``first-request``;
5. the served delta: the pool slot's buffers applied with SGLang's own ``torch_native`` kernels
   (``sgemm_lora_a_fwd``, ``sgemm_lora_b_fwd``, ``sgemm_lora_a_embedding_fwd``) on the modules SGLang wraps
   (``init_lora_modules``' rule: the leaf name is a target; a fused-MoE layer when both ``gate_up_proj`` and
   ``down_proj`` are), added to the outputs of the transformers base model; the expert slots are added to the
   expert weights (their deltas are linear per expert, which is what SGLang's fused-MoE LoRA computes).

What stands in for the GPU model is a module tree with SGLang's module names (``qkv_proj``, ``gate_up_proj``,
``experts``, ...) made of SGLang's own classes (``QKVParallelLinear``, ``RowParallelLinear``, ``FusedMoE``,
``VocabParallelEmbedding``, ``ParallelLMHead``, created without their CUDA set-up), so ``auto_detect_lora_target_modules``
and the pool's ``isinstance`` checks run unchanged; the LoRA wrappers' weight slicing is the identity at one
tensor-parallel rank (``layers.py``), and the layer's output offsets (q/k/v, gate/up) are computed from the config
as ``QKVParallelLinearWithLoRA`` / ``MergedColumnParallelLinearWithLoRA`` do at TP 1.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import traceback
import types
from types import SimpleNamespace
from typing import Any

STUBS = {
    "torchvision": "image transforms of the multimodal processors (sglang.srt.multimodal, reached through "
    "sglang.srt.configs); the LoRA modules never call them, and the CPU torch has no matching torchvision",
    "tvm_ffi": "the TVM FFI of SGLang's JIT CUDA kernels (apache-tvm-ffi, reached through the custom all-reduce "
    "of sglang.srt.distributed): it loads CUDA libraries, and one GPU rank needs no all-reduce",
}
"""Top-level packages replaced by empty modules (any attribute is a stub), and why each cannot work or is not
needed on a CPU. Only what the LoRA import chain reaches and cannot import is listed."""


class _Stub(types.ModuleType):
    """A module whose every attribute is another stub (classes, functions and submodules alike)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, _Finder, is_package=True)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        sub = _stub_class(f"{self.__name__}.{attr}")
        setattr(self, attr, sub)
        return sub


class _StubMeta(type):
    """Attribute access on a stub class gives another stub class (``triton.language.dtype`` is a type)."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _stub_class(f"{cls.__qualname__}.{attr}")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __call__(cls, *a: Any, **k: Any) -> Any:
        if len(a) == 1 and callable(a[0]) and not k:  # used as a decorator: the function itself
            return a[0]
        return type.__call__(cls)

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


def _stub_class(name: str) -> Any:
    return _StubMeta(name.rpartition(".")[2] or name, (), {"__qualname__": name, "__module__": "stub"})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in STUBS:
            return importlib.machinery.ModuleSpec(fullname, _Finder, is_package=True)
        return None

    @staticmethod
    def create_module(spec: Any) -> Any:
        return _Stub(spec.name)

    @staticmethod
    def exec_module(module: Any) -> None:
        return None


def install_stubs() -> None:
    """Make the :data:`STUBS` importable, after transformers has looked for the real packages (it checks their
    availability once, and must see them missing: it then never uses them)."""
    import transformers
    from transformers.utils import import_utils

    for name in dir(import_utils):
        if name.startswith("is_") and name.endswith("_available"):
            with contextlib.suppress(Exception):  # a check that needs arguments or hardware
                getattr(import_utils, name)()
    transformers.AutoProcessor  # noqa: B018 - resolves the lazy module before the stubs exist
    transformers.AutoImageProcessor  # noqa: B018
    sys.meta_path.insert(0, _Finder())


def load_sglang() -> SimpleNamespace:
    """SGLang's modules, imported for real."""
    install_stubs()
    logging.disable(logging.WARNING)
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.utils import get_layer_id
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from sglang.srt.lora import layers as lora_layers
    from sglang.srt.lora.lora import LoRAAdapter
    from sglang.srt.lora.lora_config import LoRAConfig
    from sglang.srt.lora.lora_manager import LoRAManager
    from sglang.srt.lora.mem_pool import LoRAMemoryPool
    from sglang.srt.lora.torch_ops import lora_ops
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    # one CPU rank, published the way SGLang's own test fixtures do (sglang/test/test_utils.py)
    reset_context()
    publish(
        ServerArgs(model_path="dummy", device="cpu"),
        role="test",
        ranks=SpawnRanks(world_rank=0, dp_rank=None),
    )
    return SimpleNamespace(
        LoadConfig=LoadConfig,
        MergedColumnParallelLinear=MergedColumnParallelLinear,
        QKVParallelLinear=QKVParallelLinear,
        RowParallelLinear=RowParallelLinear,
        FusedMoE=FusedMoE,
        get_layer_id=get_layer_id,
        ParallelLMHead=ParallelLMHead,
        VocabParallelEmbedding=VocabParallelEmbedding,
        lora_layers=lora_layers,
        LoRAAdapter=LoRAAdapter,
        LoRAConfig=LoRAConfig,
        LoRAManager=LoRAManager,
        LoRAMemoryPool=LoRAMemoryPool,
        lora_ops=lora_ops,
    )


def _bare(cls: Any, **attrs: Any) -> Any:
    """An instance of SGLang's class ``cls`` without its constructor (which allocates CUDA weights and needs a
    tensor-parallel group): only ``isinstance`` and the attributes given are used."""
    import torch

    obj = cls.__new__(cls)
    torch.nn.Module.__init__(obj)
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


def served_tree(S: SimpleNamespace, hf: Any, text: Any) -> Any:
    """The module tree SGLang's model class builds for this base: its module names and classes."""
    import torch

    root = torch.nn.Module()
    root.config = hf.config
    root.dummy = torch.nn.Parameter(torch.zeros(1))
    model = torch.nn.Module()
    root.model = model
    model.embed_tokens = _bare(
        S.VocabParallelEmbedding, org_vocab_size=text.vocab_size, embedding_dim=text.hidden_size
    )
    model.layers = torch.nn.ModuleList()
    for layer in hf.model.layers:
        sl = torch.nn.Module()
        if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "q_proj"):
            sl.self_attn = torch.nn.Module()
            sl.self_attn.qkv_proj = _bare(S.QKVParallelLinear)
            sl.self_attn.o_proj = _bare(S.RowParallelLinear)
        mlp = getattr(layer, "mlp", None)
        sl.mlp = torch.nn.Module()
        if mlp is not None and hasattr(mlp, "experts"):
            sl.mlp.experts = _bare(
                S.FusedMoE,
                moe_runner_config=SimpleNamespace(is_gated=True),
                is_shared_fused_moe=False,
                moe_tp_rank=0,
                moe_tp_size=1,
            )
        elif mlp is not None and hasattr(mlp, "gate_proj"):
            sl.mlp.gate_up_proj = _bare(S.MergedColumnParallelLinear)
            sl.mlp.down_proj = _bare(S.RowParallelLinear)
        model.layers.append(sl)
    tied = bool(getattr(text, "tie_word_embeddings", False))
    # SGLang's model classes tie by sharing the module (``self.lm_head = self.model.embed_tokens``)
    root.lm_head = (
        model.embed_tokens
        if tied
        else _bare(S.ParallelLMHead, org_vocab_size=text.vocab_size, embedding_dim=text.hidden_size)
    )
    return root


class _Wrapped:
    """A LoRA-wrapped dense module in ``lora_modules``: what the pool reads of it (its weight slicing, the
    identity at one TP rank)."""

    def slice_lora_a_weights(self, a: Any) -> Any:
        return a

    def slice_lora_b_weights(self, b: Any) -> Any:
        return b


def wrap(
    S: SimpleNamespace, tree: Any, targets: set[str], layers: int
) -> tuple[list[dict[str, Any]], Any, Any]:
    """``init_lora_modules``' choice of modules, on the served tree: (per-layer modules, embed, lm_head)."""
    lora_modules: list[dict[str, Any]] = [{} for _ in range(layers)]
    both = all(x in targets for x in ("gate_up_proj", "down_proj"))
    for name, module in tree.named_modules():
        layer = S.get_layer_id(name)
        if layer is None:
            continue
        parts = name.split(".")
        if parts[-1] in targets or ".".join(parts[-2:]) in targets:
            lora_modules[layer][name] = _Wrapped()
        elif isinstance(module, S.FusedMoE) and both:
            wrapper = _bare(S.lora_layers.FusedMoEWithLoRA, base_layer=module, tp_size=1)
            wrapper._uses_interleaved_gate_up = False
            lora_modules[layer][name] = wrapper
    embed = _bare(S.lora_layers.VocabParallelEmbeddingWithLoRA) if "embed_tokens" in targets else None
    lm_head = None
    if "lm_head" in targets:  # a tied lm_head is split off for LoRA (init_lora_modules)
        lm_head = _bare(S.lora_layers.ParallelLMHeadWithLoRA, base_layer=SimpleNamespace(tp_size=1))
    return lora_modules, embed, lm_head


def run_job(S: SimpleNamespace, job: dict[str, Any], out_dir: str) -> dict[str, Any]:
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(job["base"], dtype=torch.float32).eval()
    text = hf.config.get_text_config()
    tree = served_tree(S, hf, text)
    name = job["name"]
    ref = SimpleNamespace(lora_name=name, lora_path=job["adapter"], lora_id=name, pinned=False)
    targets_given = job.get("lora_target_modules")
    stage = "load"
    try:
        # LoRAManager's state as its constructor leaves it on one GPU (no DP attention), before init_state
        mgr = S.LoRAManager.__new__(S.LoRAManager)
        mgr.base_model, mgr.base_hf_config = tree, text
        mgr.attn_dp_enabled, mgr.lora_added_tokens_size = False, None
        mgr.configs, mgr.loras, mgr.lora_refs, mgr.num_pinned_loras = {}, {}, {}, 0
        mgr.max_loras_per_batch = 2
        # init_lora_adapters → _load_lora_adapter
        config = S.LoRAConfig(job["adapter"], base_vocab_size=text.vocab_size)
        mgr.validate_new_adapter(config, ref)
        mgr.configs[name] = config
        adapter = S.LoRAAdapter(name, config, text, S.LoadConfig(), None, base_model=tree)
        adapter.initialize_weights()
        mgr.loras[name], mgr.lora_refs[name] = adapter, ref
        # init_lora_shapes, then init_memory_pool
        mgr.init_lora_shapes(
            max_lora_rank=job.get("max_lora_rank"),
            target_modules=set(targets_given) if targets_given else None,
        )
        pool = S.LoRAMemoryPool(
            base_hf_config=text,
            max_loras_per_batch=2,
            dtype=torch.float32,
            max_lora_rank=mgr.max_lora_rank,
            target_modules=mgr.target_modules,
            base_model=tree,
            eviction_policy="lru",
            lora_added_tokens_size=mgr.lora_added_tokens_size,
        )
        lora_modules, embed, lm_head = wrap(S, tree, mgr.target_modules, text.num_hidden_layers)
        # the first request: the adapter copied into pool slot 1 (slot 0 holds the base)
        stage = "first-request"
        pool.load_lora_weight_to_buffer(name, 1, adapter, lora_modules, embed, lm_head)
    except Exception as e:
        return {
            "verdict": "refused" if stage == "load" else "first-request",
            "stage": stage,
            "error": f"{type(e).__name__}: {e}"[:600],
            "where": traceback.format_exc().strip().splitlines()[-3][:300],
        }
    logits = served_logits(S, hf, text, pool, adapter, lora_modules, embed, lm_head, job["ids"])
    from safetensors.torch import save_file

    save_file({"logits": logits.contiguous()}, os.path.join(out_dir, f"{name}.safetensors"))
    return {"verdict": "served", "stage": "served", "error": None, "targets": sorted(mgr.target_modules)}


def served_logits(
    S: SimpleNamespace,
    hf: Any,
    text: Any,
    pool: Any,
    adapter: Any,
    lora_modules: list[dict[str, Any]],
    embed: Any,
    lm_head: Any,
    ids: list[list[int]],
) -> Any:
    """The base's logits with the pool's slot 1 applied the way SGLang's LoRA layers apply it."""
    import torch

    ops = S.lora_ops
    slot, r = 1, adapter.config.r
    ranks = torch.tensor([0, r], dtype=torch.int32)
    scalings = torch.tensor([0.0, adapter.scaling], dtype=torch.float32)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    q_out, kv_out = head_dim * text.num_attention_heads, head_dim * text.num_key_value_heads

    def delta(x: Any, a: Any, b: Any, offsets: list[int], slices: int) -> Any:
        flat = x.reshape(-1, x.shape[-1])
        seg = (torch.tensor([slot]), torch.tensor([flat.shape[0]]))
        mid = ops.sgemm_lora_a_fwd(flat, a, *seg, ranks, scalings, num_slices=slices)
        out = ops.sgemm_lora_b_fwd(mid, b, *seg, ranks, torch.tensor(offsets))
        return out.reshape(*x.shape[:-1], -1)

    hooks = []

    def add(module: Any, fn: Any) -> None:
        hooks.append(module.register_forward_hook(fn))

    for i, layer in enumerate(hf.model.layers):
        wrapped = {n.rsplit(".", 1)[-1]: m for n, m in lora_modules[i].items()}
        attn = getattr(layer, "self_attn", None)
        if "qkv_proj" in wrapped and attn is not None:
            a, b = pool.A_buffer["qkv_proj"][i], pool.B_buffer["qkv_proj"][i]
            offs = [0, q_out, q_out + kv_out, q_out + 2 * kv_out]
            for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                add(
                    getattr(attn, proj),
                    lambda m, inp, out, a=a, b=b, j=j, offs=offs: (
                        out + delta(inp[0], a, b, offs, 3)[..., offs[j] : offs[j + 1]]
                    ),
                )
        if "o_proj" in wrapped and attn is not None:
            a, b = pool.A_buffer["o_proj"][i], pool.B_buffer["o_proj"][i]
            add(attn.o_proj, lambda m, inp, out, a=a, b=b: out + delta(inp[0], a, b, [0, out.shape[-1]], 1))
        mlp = getattr(layer, "mlp", None)
        if "gate_up_proj" in wrapped and mlp is not None and hasattr(mlp, "gate_proj"):
            a, b = pool.A_buffer["gate_up_proj"][i], pool.B_buffer["gate_up_proj"][i]
            inter = mlp.gate_proj.out_features
            offs = [0, inter, 2 * inter]
            for j, proj in enumerate(("gate_proj", "up_proj")):
                add(
                    getattr(mlp, proj),
                    lambda m, inp, out, a=a, b=b, j=j, offs=offs: (
                        out + delta(inp[0], a, b, offs, 2)[..., offs[j] : offs[j + 1]]
                    ),
                )
        if "down_proj" in wrapped and mlp is not None and hasattr(mlp, "down_proj"):
            a, b = pool.A_buffer["down_proj"][i], pool.B_buffer["down_proj"][i]
            add(mlp.down_proj, lambda m, inp, out, a=a, b=b: out + delta(inp[0], a, b, [0, out.shape[-1]], 1))
        if "experts" in wrapped and mlp is not None:
            _merge_experts(mlp.experts, pool, i, r)
    if embed is not None:
        a, b = pool.embedding_A_buffer["embed_tokens"], pool.embedding_B_buffer["embed_tokens"]

        def embed_hook(m: Any, inp: Any, out: Any) -> Any:
            flat = inp[0].reshape(-1)
            seg = (torch.tensor([slot]), torch.tensor([flat.shape[0]]))
            mid = ops.sgemm_lora_a_embedding_fwd(flat, a, *seg, ranks, scalings, text.vocab_size)
            d = ops.sgemm_lora_b_fwd(mid, b, *seg, ranks, torch.tensor([0, out.shape[-1]]))
            return out + d.reshape(out.shape)

        add(hf.get_input_embeddings(), embed_hook)
    if lm_head is not None:
        a, b = pool.lm_head_A_buffer["lm_head"], pool.lm_head_B_buffer["lm_head"]
        add(hf.get_output_embeddings(), lambda m, inp, out: out + delta(inp[0], a, b, [0, out.shape[-1]], 1))
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor(ids)).logits.float()
    for h in hooks:
        h.remove()
    return logits


def _merge_experts(experts: Any, pool: Any, layer: int, r: int) -> None:
    """Add each expert's LoRA from the pool slot to its weights: gate/up at the ``max_r``-spaced A slices the MoE
    kernel reads, lora_B already scaled (``load_lora_weight_to_buffer``)."""
    import torch

    slot, max_r = 1, pool.max_lora_rank
    a_gu, b_gu = (
        pool.A_buffer["gate_up_proj_moe"][layer][slot],
        pool.B_buffer["gate_up_proj_moe"][layer][slot],
    )
    a_d, b_d = pool.A_buffer["down_proj_moe"][layer][slot], pool.B_buffer["down_proj_moe"][layer][slot]
    with torch.no_grad():
        for e in range(experts.gate_up_proj.shape[0]):
            inter = experts.gate_up_proj.shape[1] // 2
            gate = b_gu[e, :inter, :r] @ a_gu[e, :r]
            up = b_gu[e, inter:, :r] @ a_gu[e, max_r : max_r + r]
            experts.gate_up_proj[e] += torch.cat([gate, up])
            experts.down_proj[e] += b_d[e, :, :r] @ a_d[e, :r]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--probe"]:
        load_sglang()
        print(json.dumps({"ok": True}))
        return 0
    jobs_path, out_dir = args
    with open(jobs_path, encoding="utf-8") as f:
        jobs = json.load(f)
    S = load_sglang()
    out = {job["name"]: run_job(S, job, out_dir) for job in jobs}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
