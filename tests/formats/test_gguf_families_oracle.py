"""llama.cpp's own code as the oracle for the GGUF families (``-m oracle``; environment: .ci/oracles/llama_cpp.sh).

- The table (``adapterdoc.layouts.gguf.ARCHES``) is llama.cpp's: for each class, its converter package's
  ``get_model_class`` gives the same ``model_arch``, LlamaModel's q/k permutation applies exactly where adapterdoc
  permutes, and every class of its MRO that defines ``modify_tensors`` is one whose effect on LoRA-targeted linear
  weights was read (:data:`READ`).
- Each family: llama.cpp's base GGUF (its ``convert_hf_to_gguf.py``) with our LoRA GGUF gives PEFT's logits, and our
  file equals ``convert_lora_to_gguf.py``'s tensor for tensor.
- An ``alpha_pattern`` folded into ``lora_B`` gives PEFT's logits in llama.cpp (the script ignores alpha_pattern).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.layouts.gguf import ARCHES
from tests.formats.gguf_families_models import FAMILIES, family_model, linear_targets
from tests.formats.gguf_helpers import LINEAR, generic_model
from tests.formats.test_gguf_oracle import _anchor, _case, _check_logits, _env, llama  # noqa: F401

pytestmark = [pytest.mark.oracle, pytest.mark.ml]

DRIVER = Path(__file__).with_name("gguf_families_driver.py")

READ: dict[str, str] = {
    "LlamaModel": "q/k rows permuted when undo_permute; block_sparse_moe experts stacked",
    "OlmoModel": "q/k rows permuted (LlamaModel.permute)",
    "Mistral3Model": "q/k rows permuted (its own undo_permute path)",
    "Qwen2Model": "Qwen2Model's bare names get `model.`",
    "Qwen3Model": "a reranker's head only",
    "Qwen2MoeModel": "fused experts split/stacked",
    "Qwen3NextModel": "linear-attention tensors split as the base",
    "_LinearAttentionVReorderBase": "V heads grouped → tiled (adapterdoc's v_head_tiling)",
    "StableLMModel": "per-head q/k layernorms stacked",
    "GemmaModel": "norm.weight + 1",
    "Gemma2Model": "norm.weight + 1",
    "Gemma3Model": "embedding rows cut to the vocabulary; norm shift",
    "NemotronModel": "norm.weight + 1",
    "HunYuanModel": "a tied lm_head skipped",
    "Cohere2Model": "zero biases skipped",
    "Ernie4_5Model": "a fused qkv_proj / up_gate_proj split (HF's Ernie4_5ForCausalLM has them separate)",
    "ApertusModel": "xIELU activation scalars into metadata",
}
"""Converter classes whose ``modify_tensors`` was read, and what it does (none rewrites a LoRA-targeted linear weight
beyond a q/k row permutation, which adapterdoc writes)."""

PERMUTING = {"OlmoModel", "Mistral3Model"}


def table_facts(python: Path, root: Path) -> dict[str, Any]:
    """The driver's JSON for every class of ARCHES, from llama.cpp's converter at ``root``."""
    r = subprocess.run(
        [str(python), str(DRIVER), str(root), *ARCHES],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_table(facts: dict[str, Any]) -> None:
    for cls, arch in ARCHES.items():
        f = facts[cls]
        assert "error" not in f, (cls, f)
        assert f["arch"] == arch.arch, (cls, f)
        permutes = f["llama_permute"] or bool(PERMUTING & set(f["modify_tensors"]))
        assert permutes is arch.rope_unpermute, (cls, f)
        assert set(f["modify_tensors"]) <= set(READ), (cls, f)


def test_gguf_families_table_is_llama_cpps(oracle_env) -> None:  # type: ignore[no-untyped-def]
    python = oracle_env("llama_cpp")
    check_table(table_facts(python, python.parent.parent / "llama.cpp"))


@pytest.mark.parametrize("cls", sorted(FAMILIES))
def test_gguf_oracle_family(llama, tmp_path: Path, cls: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    model = family_model(cls)
    c = _case(llama, tmp_path, model, r=4, lora_alpha=8, target_modules=linear_targets(model))
    _check_logits(c)
    _anchor(llama, c, tmp_path)


def test_gguf_oracle_alpha_pattern_folded(llama, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """alpha_pattern ×4 and ×1/4 folded into lora_B: llama.cpp gives PEFT's logits with one adapter.lora.alpha."""
    c = _case(
        llama,
        tmp_path,
        generic_model("llama"),
        r=4,
        lora_alpha=8,
        alpha_pattern={"q_proj": 32, "down_proj": 2},
        target_modules=LINEAR,
    )
    _check_logits(c)
