"""LoRAX's own adapter loading, run on the CPU against one adapter: the oracle for ``verify --profile lorax``.

Run it with a Python that can import LoRAX's server package (``lorax_server``; see tests/verify/
test_profile_tgi_lorax.py for the venv it needs), from its ``server`` folder on ``PYTHONPATH``:

    python scripts/lorax_oracle.py ADAPTER_DIR NUM_LAYERS [MODEL_FILE]

It prints one JSON object: ``{"ok": bool, "error": str|null, "unused": [...], "wrong": [...], "applied": [...]}``.
LoRAX's own code does the work: ``LoraConfig.load`` (PEFT's ``from_pretrained``), ``map_weights_for_model``,
``LoraWeights.load`` for each of the model's ``ADAPTER_LAYERS`` in order (rank padding with ``pad_rank`` switched
on as on a GPU with the punica kernels, the scaling, ``config.r`` updates, stacking). Only the stand-in model is
ours: the flash model classes need CUDA-only kernels (``dropout_layer_norm``) to import, so the weight names of
``adapter_target_to_layer`` (``model.layers.{i}.self_attn.q_proj`` ..., ``lm_head``) are built here and the
``ADAPTER_LAYERS`` list is read from ``models/flash_<type>.py`` with ``ast``. ``ok`` is false when LoRAX raises,
leaves a tensor unused, or serves any module with a delta other than PEFT's (``scaling · B A``).
"""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def adapter_layers(model_file: Path) -> list[str]:
    """``ADAPTER_LAYERS`` of a LoRAX flash model file, its constants resolved from ``lorax_server``."""
    import lorax_server.utils.lora as names

    tree = ast.parse(model_file.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "ADAPTER_LAYERS" for t in node.targets
        ):
            return [getattr(names, e.id, e.id.lower()) for e in node.value.elts]  # type: ignore[attr-defined]
    raise SystemExit(f"no ADAPTER_LAYERS in {model_file}")


def _peft_scaling(cfg: dict[str, Any], module: str) -> float:
    def pick(pattern: dict[str, Any], default: Any) -> Any:
        for key, value in (pattern or {}).items():
            if module == key or module.endswith("." + key):
                return value
        return default

    r = pick(cfg.get("rank_pattern"), cfg["r"])
    alpha = pick(cfg.get("alpha_pattern"), cfg["lora_alpha"])
    return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def run(adapter: str, nlayers: int, model_file: Path) -> dict[str, Any]:
    import lorax_server.utils.punica as punica
    import torch
    from lorax_server.adapters import lora as lx
    from safetensors.torch import load_file

    punica.HAS_SGMV = True  # pad ranks as a GPU server with the punica kernels does
    layers = adapter_layers(model_file)
    out: dict[str, Any] = {"ok": False, "error": None, "unused": [], "wrong": [], "applied": []}
    try:
        config = lx.LoraConfig.load(adapter, None)
        files = sorted(Path(adapter).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"No local weights found in {adapter} with extension .safetensors")
        weights: dict[str, Any] = {}
        for f in files:
            weights.update(load_file(str(f)))
        base = SimpleNamespace(base_layer=SimpleNamespace(linear=SimpleNamespace(weight=torch.zeros(1))))
        target: dict[tuple[int, str], tuple[str, Any]] = {}
        for i in range(nlayers):
            for t in ("q_proj", "k_proj", "v_proj", "o_proj"):
                target[(i, t)] = (f"model.layers.{i}.self_attn.{t}", base)
            for t in ("gate_proj", "up_proj", "down_proj"):
                target[(i, t)] = (f"model.layers.{i}.mlp.{t}", base)
        target[(0, "lm_head")] = ("lm_head", base)
        model = SimpleNamespace(
            target_to_layer=target,
            dtype=torch.float32,
            world_size=1,
            get_num_layers_for_type=lambda t: 1 if t == "lm_head" else nlayers,
            shard_lora_weights=lambda a, b, t: (a, b),
        )
        module_map, names = config.map_weights_for_model(weights, tuple(v[0] for v in target.values()))
        unused = set(names)
        served_names: set[str] = set()
        raw = json.loads((Path(adapter) / "adapter_config.json").read_text())
        for t in layers:
            got = lx.LoraWeights.load(config, model, module_map, t, unused)
            if got is None:
                continue
            out["applied"].append(t)
            span = 1 if t == "lm_head" else nlayers
            for i in range(span):
                name = "lm_head" if t == "lm_head" else target[(i, t)][0]
                served_names |= {f"base_model.model.{name}.lora_{x}.weight" for x in "AB"}
                a_file = weights[f"base_model.model.{name}.lora_A.weight"].float()
                b_file = weights[f"base_model.model.{name}.lora_B.weight"].float()
                a, b = got.weights_a[i], got.weights_b[i]
                if a.shape[0] != a_file.shape[1]:
                    a = a.T
                served = (a @ b).T  # (out, in)
                peft = _peft_scaling(raw, name) * (b_file @ a_file)
                if not torch.allclose(served, peft, rtol=1e-5, atol=1e-6):
                    out["wrong"].append(name)
        lora = {k for k in weights if ".lora_" in k}
        # LoRAX's own unused set misses a type dropped after its first layers; served_names does not
        out["unused"] = sorted((lora - served_names) | (unused & lora))
        out["ok"] = not out["unused"] and not out["wrong"]
    except Exception as e:  # LoRAX refusing the adapter is an answer, not a crash of the oracle
        out["error"] = f"{type(e).__name__}: {e}"
    return out


if __name__ == "__main__":
    root = Path(__import__("lorax_server").__file__).parent
    model_file = Path(sys.argv[3]) if len(sys.argv) > 3 else root / "models" / "flash_llama.py"
    print(json.dumps(run(sys.argv[1], int(sys.argv[2]), model_file)))
