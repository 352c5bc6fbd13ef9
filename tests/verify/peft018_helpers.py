"""Fused-expert adapters written by a real PEFT 0.18.1 (the ``peft018`` oracle environment, ``.ci/oracles/peft018.sh``)
on tiny transformers-5 MoE models, with the logits that PEFT gives them, and today's PEFT (the one installed here) on
the same bases: shared by ``tests/verify/test_peft018_experts.py`` and ``tests/remap/test_peft018_experts.py``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

BOTH = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
CASES: dict[str, dict[str, Any]] = {
    # gate_up [4, 24, 16], down [4, 16, 12]: every factor's two sizes differ
    "qwen3_moe_pair": {"family": "qwen3_moe", "hidden": 16, "inter": 12, "params": BOTH, "task_type": None},
    # gate_up [4, 16, 16] alone: in == out, today's PEFT loads it transposed; CAUSAL_LM: no auto_mapping in the
    # config, and base_model_name_or_path is the base folder the model was loaded from
    "qwen3_moe_square": {
        "family": "qwen3_moe",
        "hidden": 16,
        "inter": 8,
        "params": ["mlp.experts.gate_up_proj"],
        "task_type": "CAUSAL_LM",
    },
    # the same with the config's auto_mapping only (task_type None; the model built from its config, so
    # base_model_name_or_path is empty)
    "qwen3_moe_square_class": {
        "family": "qwen3_moe",
        "hidden": 16,
        "inter": 8,
        "params": ["mlp.experts.gate_up_proj"],
        "task_type": None,
        "from_config": True,
    },
    "mixtral_pair": {"family": "mixtral", "hidden": 16, "inter": 12, "params": BOTH, "task_type": None},
    # gpt-oss stores its experts [E, in, out] (`is_transposed`): PEFT 0.18 and today's agree
    "gpt_oss_pair": {"family": "gpt_oss", "hidden": 16, "inter": 12, "params": BOTH, "task_type": None},
    "gpt_oss_down": {
        "family": "gpt_oss",
        "hidden": 16,
        "inter": 16,
        "params": ["mlp.experts.down_proj"],
        "task_type": "CAUSAL_LM",
    },
}

WRITER = r"""
import json, sys
from pathlib import Path

import peft
import torch
import transformers as tf
from safetensors.torch import save_file

root, cases = Path(sys.argv[1]), json.loads(sys.argv[2])


def config(family, hidden, inter):
    common = dict(vocab_size=64, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, num_experts_per_tok=2)
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(intermediate_size=24, moe_intermediate_size=inter, num_experts=4, **common)
    if family == "mixtral":
        return tf.MixtralConfig(intermediate_size=inter, num_local_experts=4, **common)
    return tf.GptOssConfig(intermediate_size=inter, num_local_experts=4, layer_types=["full_attention"] * 2,
                           **common)


ids = torch.arange(14).reshape(2, 7) * 5 % 64
for name, case in cases.items():
    out = root / name
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config(case["family"], case["hidden"], case["inter"]))
    model.save_pretrained(out / "base")
    if not case.get("from_config"):
        model = tf.AutoModelForCausalLM.from_pretrained(out / "base", dtype=torch.float32)
    model.eval()
    shapes = {n: list(p.shape) for n, p in model.named_parameters() if ".experts." in n}
    lc = peft.LoraConfig(r=2, lora_alpha=3, target_modules=["q_proj"], target_parameters=case["params"],
                         lora_dropout=0.0, task_type=case["task_type"])
    pm = peft.get_peft_model(model, lc)
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.3)
    pm.save_pretrained(out / "adapter")
    with torch.no_grad():
        logits = pm.eval()(input_ids=ids).logits.float().contiguous()
    save_file({"logits": logits, "ids": ids}, out / "logits018.safetensors")
    (out / "facts.json").write_text(json.dumps({"peft": peft.__version__, "base_shapes": shapes}))
print("written", peft.__version__)
"""


def write_cases(python: Path, root: Path) -> dict[str, Path]:
    """Run PEFT 0.18.1 (``python``, the oracle environment's) once for every case; ``{case: folder}`` holding
    ``base/``, ``adapter/``, ``logits018.safetensors`` and ``facts.json``."""
    res = subprocess.run(
        [str(python), "-c", WRITER, str(root), json.dumps(CASES)], capture_output=True, text=True, timeout=900
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "written 0.18.1" in res.stdout, res.stdout
    return {name: root / name for name in CASES}


def logits018(folder: Path) -> tuple[Any, Any]:
    """(input ids, logits) PEFT 0.18.1 gave base + adapter of one case."""
    from safetensors.torch import load_file

    got = load_file(str(folder / "logits018.safetensors"))
    return got["ids"], got["logits"]


def today_logits(folder: Path, adapter: Path) -> Any:
    """Logits of today's PEFT (the installed one) for the case's base + ``adapter`` on the case's input ids; a
    load error propagates."""
    import torch
    import transformers as tf
    from peft import PeftModel

    ids, _ = logits018(folder)
    model = tf.AutoModelForCausalLM.from_pretrained(str(folder / "base"), dtype=torch.float32).eval()
    pm = PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.no_grad():
        return pm(input_ids=ids).logits.float()


def rel(got: Any, want: Any) -> float:
    return float((got - want).abs().max() / want.abs().max())
