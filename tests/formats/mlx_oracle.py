"""Helpers of the MLX oracle tests: tiny transformers bases saved as folders, PEFT adapters with real (non-zero)
lora_B on them and PEFT's logits, and mlx-lm's own ``load_model`` + ``load_adapters`` run in the oracle environment
(``.ci/oracles/mlx.sh``) on the same folders."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

IDS = np.array([[1, 5, 9, 30, 77, 3, 12, 40]], dtype=np.int32)

MLX_LOGITS = """
import json, sys
from pathlib import Path
import numpy as np
import mlx.core as mx
from mlx_lm.utils import load_model
from mlx_lm.tuner.utils import load_adapters
base, adapter, ids, out = sys.argv[1:5]
model, _ = load_model(Path(base))
if adapter != "-":
    load_adapters(model, adapter)
model.eval()
y = model(mx.array(np.load(ids))).astype(mx.float32)
np.save(out, np.array(y))
"""


def generic_config(kind: str) -> Any:
    """A tiny config of a generic decoder mlx-lm has a model for (``llama``, ``qwen2``, ``qwen3``)."""
    import transformers as tf

    common = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config}[kind]
    extra = {"head_dim": 8} if kind == "qwen3" else {}
    return cls(**common, **extra)


def save_base(model: Any, folder: Path) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def peft_adapter(model: Any, folder: Path, targets: list[str], seed: int = 1, **lora: Any) -> Any:
    """Wrap ``model`` with a LoRA (random non-zero lora_B), save it to ``folder``; the PEFT model."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    lora.setdefault("r", 4)
    lora.setdefault("lora_alpha", 8)
    peft_model = get_peft_model(model, LoraConfig(target_modules=targets, **lora))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or "lora_magnitude" in name:
                p.add_(torch.randn_like(p) * 0.1)
    peft_model.eval()
    peft_model.save_pretrained(folder)
    return peft_model


def torch_logits(model: Any) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(IDS, dtype=torch.long)).logits.float().numpy()


def mlx_logits(python: Path, base: Path, adapter: Path | None, work: Path) -> np.ndarray:
    """mlx-lm's logits of ``base`` (a transformers folder) with ``adapter`` (an mlx-lm adapter folder)."""
    ids, out, script = work / "ids.npy", work / "mlx_logits.npy", work / "mlx_logits.py"
    np.save(ids, IDS)
    script.write_text(MLX_LOGITS)
    res = subprocess.run(
        [str(python), str(script), str(base), str(adapter or "-"), str(ids), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if res.returncode != 0:
        raise AssertionError(f"mlx-lm failed:\n{res.stderr[-3000:]}")
    return np.load(out)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


MLX_TEXT_CLASS = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}
"""mlx-lm has no model file for the Qwen3.5 text classes: its ``qwen3_5`` / ``qwen3_5_moe`` ``ModelArgs.from_dict``
takes a config without ``text_config`` as the text config, and ``sanitize`` prefixes ``language_model.`` to every
key, so the text-class checkpoint loads under that model type."""


def mlx_base(base: Path) -> Path:
    """``base`` as mlx-lm 0.32 reads it: the same weights (linked), the config with the older field names
    mlx-lm's ``qwen3_moe`` ``ModelArgs`` requires (``num_experts``, ``rope_theta``), which transformers 5 writes as
    ``num_local_experts`` and ``rope_parameters.rope_theta``."""
    out = base.parent / f"{base.name}-mlx"
    out.mkdir(exist_ok=True)
    for f in base.iterdir():
        if f.name not in ("config.json", "model.safetensors") and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    cfg = read_json(base / "config.json")
    if cfg.get("model_type") in MLX_TEXT_CLASS:  # a text-class checkpoint runs on mlx-lm's VL model type
        cfg["model_type"] = MLX_TEXT_CLASS[cfg["model_type"]]
    if cfg.get("model_type") == "qwen3_5_moe":
        _fused_experts(base / "model.safetensors", out / "model.safetensors")
    elif not (out / "model.safetensors").exists():
        (out / "model.safetensors").symlink_to((base / "model.safetensors").resolve())
    for c in (cfg, cfg.get("text_config") or {}):
        if "num_local_experts" in c:
            c.setdefault("num_experts", c["num_local_experts"])
        rope = c.get("rope_parameters") or {}
        if "rope_theta" in rope:
            c.setdefault("rope_theta", rope["rope_theta"])
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _fused_experts(src: Path, dst: Path) -> None:
    """Copy the weights; per-expert ``language_model`` experts (transformers 5.24 saves Qwen3.5-MoE unfused) are
    written fused (``experts.gate_up_proj`` ``[E, 2I, H]``, ``experts.down_proj`` ``[E, H, I]``), the form
    mlx-lm's ``qwen3_5_moe`` ``sanitize`` reads (the published checkpoints' form)."""
    import re

    from safetensors.numpy import load_file, save_file

    w = load_file(str(src))
    rx = re.compile(
        r"^(.*(?:language_model|model)\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$"
    )
    found: dict[str, dict[tuple[int, str], np.ndarray]] = {}
    for k in list(w):
        m = rx.match(k)
        if m:
            found.setdefault(m[1], {})[(int(m[2]), m[3])] = w.pop(k)
    for owner, parts in found.items():
        n = 1 + max(e for e, _ in parts)
        w[f"{owner}.gate_up_proj"] = np.stack(
            [np.concatenate([parts[(e, "gate")], parts[(e, "up")]], 0) for e in range(n)]
        )
        w[f"{owner}.down_proj"] = np.stack([parts[(e, "down")] for e in range(n)])
    save_file(w, str(dst))


MLX_TRAIN = """
import json, sys, types
from pathlib import Path
import numpy as np
import mlx.core as mx
from mlx_lm.lora import CONFIG_DEFAULTS, train_model
from mlx_lm.utils import load_model
base, out, kind, num_layers, keys, ids, logits = sys.argv[1:8]
mx.random.seed(0)
model, _ = load_model(Path(base))
class Rows:
    def __init__(self, rows): self.rows = rows
    def __len__(self): return len(self.rows)
    def __getitem__(self, i): return self.rows[i]
    def process(self, row): return (row, 0)
rng = np.random.default_rng(0)
rows = [[int(t) for t in rng.integers(1, 100, 12)] for _ in range(8)]
args = dict(CONFIG_DEFAULTS)
args.update(model=base, train=True, fine_tune_type=kind, num_layers=int(num_layers), batch_size=2, iters=4,
            val_batches=1, steps_per_eval=1000, steps_per_report=1000, adapter_path=out, save_every=1000,
            learning_rate=5e-2, lora_parameters={"rank": 4, "dropout": 0.0, "scale": 10.0})
if keys != "-":
    args["lora_parameters"]["keys"] = keys.split(",")
train_model(types.SimpleNamespace(**args), model, Rows(rows), Rows(rows[:2]))
model.eval()
np.save(logits, np.array(model(mx.array(np.load(ids))).astype(mx.float32)))
"""


def mlx_train(
    python: Path,
    base: Path,
    out: Path,
    work: Path,
    *,
    kind: str = "lora",
    num_layers: int = -1,
    keys: str = "-",
) -> np.ndarray:
    """Train a LoRA with mlx-lm's own trainer (``mlx_lm.lora.train_model``, 4 steps) on ``base`` into ``out``;
    the trained model's logits in mlx-lm."""
    ids, logits, script = work / "ids.npy", work / "trained_logits.npy", work / "mlx_train.py"
    np.save(ids, IDS)
    script.write_text(MLX_TRAIN)
    res = subprocess.run(
        [str(python), str(script), str(base), str(out), kind, str(num_layers), keys, str(ids), str(logits)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if res.returncode != 0:
        raise AssertionError(f"mlx-lm training failed:\n{res.stderr[-3000:]}")
    return np.load(logits)
