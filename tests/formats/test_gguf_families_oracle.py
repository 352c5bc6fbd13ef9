"""llama.cpp's own code as the oracle for the GGUF families (``-m oracle``; environment: .ci/oracles/llama_cpp.sh).

- The table (``adapterdoc.layouts.gguf.ARCHES``) is llama.cpp's: for each class, its converter package's
  ``get_model_class`` gives the same ``model_arch``, LlamaModel's q/k permutation applies exactly where adapterdoc
  permutes, and every class of its MRO that defines ``modify_tensors`` is one whose effect on LoRA-targeted linear
  weights was read (:data:`READ`).
- Each family, two oracles (:func:`check_family`), and our file equals ``convert_lora_to_gguf.py``'s tensor for tensor:

  1. llama.cpp against itself: llama.cpp's base GGUF (its ``convert_hf_to_gguf.py``) with our LoRA GGUF gives the
     logits of llama.cpp's GGUF of the PEFT-merged model (``merge_and_unload``, same converter, same tokenizer).
     Both run llama.cpp's own forward, so what separates them is the LoRA alone (``W x + s·B(A x)`` against
     ``(W + s·BA) x`` in f32): a wrong q/k permutation, scale or module is an error of the order of the adapter's
     effect (0.46-1.24 here; :func:`test_gguf_oracle_merged_oracle_sees_errors` shows such files fail), while the
     measured differences are ≤ 1.2e-6 (≤ 1.3e-4 with GELU, below).
  2. llama.cpp against transformers: its base gives transformers' logits and base + our LoRA gives PEFT's.

  Tolerance (:func:`tolerance`): the logits are computed with llama.cpp's KV cache in f32 (the driver's ``logits
  ... f32``). With llama.cpp's default f16 cache, the rounding of K and V to f16 (2^-11 relative) alone put
  llama.cpp 5e-4 to 2.7e-3 away from PEFT on these tiny models (OLMo2 2.7e-3, Arcee 8.7e-4, Phi-3 7.6e-4: the
  earlier failures at TOL=5e-4, which the merged-model oracle showed were no conversion error: 3e-7 there); in
  f32 every family without GELU agrees with transformers and PEFT within 1.2e-6, so :data:`TOL_F32` is 1e-5.
  ggml's CPU GELU reads a table indexed by the f16-rounded input and returns an f16 value (``ggml-cpu/vec.h``,
  ``GGML_GELU_FP16``, on by default), so the families whose MLP is GELU (Gemma 1-3, Phi-2, StarCoder2) carry an
  f16-sized error: measured ≤ 3.3e-4 against PEFT, ≤ 1.3e-4 against the merged model; :data:`TOL_GELU` is 1e-3,
  still 400x below the smallest adapter effect, which each case checks is ≥ 100x its tolerance.
- An ``alpha_pattern`` folded into ``lora_B`` gives PEFT's logits in llama.cpp (the script ignores alpha_pattern).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.formats.gguf.load_rules import verify_gguf
from adapterdoc.layouts.gguf import ARCHES
from tests.formats.gguf_families_models import FAMILIES, family_model, linear_targets
from tests.formats.gguf_helpers import LINEAR, generic_model
from tests.formats.test_gguf_oracle import _anchor, _case, _env, codes_of, llama  # noqa: F401

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


TOL_F32 = 1e-5
"""Absolute logit tolerance with llama.cpp's KV cache in f32 (logits of magnitude 0.3-1.4): f32 kernels that sum in
another order than torch's; measured ≤ 1.2e-6 on every family without GELU (see the module docstring)."""

TOL_GELU = 1e-3
"""The same where the MLP is GELU: ggml's CPU GELU is an f16 table lookup (``GGML_GELU_FP16``); measured ≤ 3.3e-4."""


def tolerance(config: Any) -> float:
    """:data:`TOL_GELU` for a model whose MLP activation is a GELU, else :data:`TOL_F32`."""
    acts = (getattr(config, k, None) for k in ("hidden_act", "hidden_activation"))
    return TOL_GELU if any("gelu" in str(a) for a in acts if a) else TOL_F32


def family_case(llama: dict[str, Path], tmp: Path, model: Any, **lora: Any) -> dict[str, Any]:  # noqa: F811
    """:func:`_case` with llama.cpp's merged-model logits, every llama.cpp run with an f32 KV cache."""
    return _case(llama, tmp, model, merged=True, kv="f32", r=4, lora_alpha=8, **lora)


def errors(c: dict[str, Any]) -> dict[str, float]:
    """The adapter's effect and each distance (max absolute logit difference) the oracles compare."""
    import numpy as np

    def dist(a: Any, b: Any) -> float:
        return float(np.abs(a - b).max())

    return {
        "effect": dist(c["want"], c["want_base"]),
        "lora_vs_merged": dist(c["got"], c["got_merged"]),
        "base_vs_transformers": dist(c["got_base"], c["want_base"]),
        "lora_vs_peft": dist(c["got"], c["want"]),
    }


def check_family(c: dict[str, Any], tol: float) -> None:
    e = errors(c)
    assert e["effect"] > 100 * tol, f"the adapter moves the logits by only {e['effect']}"
    assert e["lora_vs_merged"] <= tol, f"llama.cpp: base + our LoRA differs from the merged model: {e}"
    assert e["base_vs_transformers"] <= tol, f"llama.cpp's base is not transformers' base: {e}"
    assert e["lora_vs_peft"] <= tol, f"llama.cpp + our LoRA differs from PEFT: {e}"
    assert codes_of(verify_gguf(c["ours"], c["base_gguf"])) == []


@pytest.mark.parametrize("cls", sorted(FAMILIES))
def test_gguf_oracle_family(llama, tmp_path: Path, cls: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    model = family_model(cls)
    c = family_case(llama, tmp_path, model, target_modules=linear_targets(model))
    check_family(c, tolerance(model.config))
    _anchor(llama, c, tmp_path)


def test_gguf_oracle_merged_oracle_sees_errors(llama, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The merged-model oracle fails a wrong file by the adapter's order of magnitude: on Arcee (q/k rows
    permuted), our file written without the permutation, and with one module's ``lora_B`` doubled (a wrong scale),
    each differs from llama.cpp's merged model by more than 1000x :data:`TOL_F32`."""
    import gguf
    import numpy as np

    from adapterdoc.formats import gguf as fmt
    from adapterdoc.layouts import gguf as facts
    from tests.formats.gguf_helpers import write_gguf
    from tests.formats.test_gguf_oracle import IDS, drive

    model = family_model("ArceeForCausalLM")
    c = family_case(llama, tmp_path, model, target_modules=linear_targets(model))
    check_family(c, TOL_F32)
    unpermuted = tmp_path / "unpermuted.gguf"
    monkeypatch.setitem(facts.ARCHES, "ArceeForCausalLM", facts.GgufArch("ARCEE"))
    fmt.from_peft(c["adapter"], unpermuted, base=str(c["base_dir"]), outtype="f32")
    monkeypatch.undo()
    tensors = {t.name: np.array(t.data) for t in gguf.GGUFReader(c["ours"]).tensors}
    doubled = "blk.1.ffn_down.weight.lora_b"
    rescaled = write_gguf(tmp_path / "rescaled.gguf", "arcee", {**tensors, doubled: 2 * tensors[doubled]})
    for wrong in (unpermuted, rescaled):
        out = tmp_path / f"{wrong.stem}.npy"
        drive(llama["python"], "logits", c["base_gguf"], wrong, ",".join(map(str, IDS)), out, "f32")
        assert np.abs(np.load(out) - c["got_merged"]).max() > 1000 * TOL_F32, wrong.name


def test_gguf_oracle_alpha_pattern_folded(llama, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """alpha_pattern ×4 and ×1/4 folded into lora_B: llama.cpp gives PEFT's logits with one adapter.lora.alpha."""
    c = family_case(
        llama,
        tmp_path,
        generic_model("llama"),
        alpha_pattern={"q_proj": 32, "down_proj": 2},
        target_modules=LINEAR,
    )
    check_family(c, TOL_F32)
