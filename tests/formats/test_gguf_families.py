"""PEFT → GGUF for the decoder families llama.cpp's converter maps 1:1 or with LlamaModel's q/k permutation
(``adapterdoc.layouts.gguf.ARCHES``), on real PEFT adapters of tiny real models: the names and
``general.architecture`` are the ones llama.cpp's ``convert_lora_to_gguf.py`` writes for the same adapter (pinned
here from that script's output; the oracle suite compares byte for byte live), q/k rows permuted exactly where
llama.cpp permutes them, and back to PEFT byte-exact, with adapterdoc's metadata or through llama.cpp's name map
alone. Then ``alpha_pattern``: a ratio that is a power of two is folded into ``lora_B``, exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gguf")
pytest.importorskip("peft")

from adapterdoc.errors import AdapterdocError
from adapterdoc.formats import gguf as fmt
from adapterdoc.formats.gguf import write as gguf_write
from adapterdoc.formats.gguf.header import PROVENANCE, read_header
from tests.formats.gguf_families_models import FAMILIES, family_model, linear_targets
from tests.formats.gguf_helpers import generic_model, peft_adapter, save_config

pytestmark = pytest.mark.ml

LLAMA_CPP: dict[str, tuple[str, str]] = {
    "GraniteForCausalLM": ("granite", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "OlmoForCausalLM": ("olmo", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "Olmo2ForCausalLM": ("olmo2", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "Olmo3ForCausalLM": ("olmo2", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "StableLmForCausalLM": ("stablelm", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "Phi3ForCausalLM": ("phi3", "attn_output attn_qkv ffn_down ffn_up"),
    "Starcoder2ForCausalLM": ("starcoder2", "attn_k attn_output attn_q attn_v ffn_down ffn_up"),
    "CohereForCausalLM": ("command-r", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "GemmaForCausalLM": ("gemma", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "Gemma2ForCausalLM": ("gemma2", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "Gemma3ForCausalLM": ("gemma3", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "SmolLM3ForCausalLM": ("smollm3", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "SeedOssForCausalLM": ("seed_oss", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "Exaone4ForCausalLM": ("exaone4", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "NemotronForCausalLM": ("nemotron", "attn_k attn_output attn_q attn_v ffn_down ffn_up"),
    "HunYuanDenseV1ForCausalLM": (
        "hunyuan-dense",
        "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up",
    ),
    "ArceeForCausalLM": ("arcee", "attn_k attn_output attn_q attn_v ffn_down ffn_up"),
    "MistralForCausalLM": ("llama", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "Cohere2ForCausalLM": ("cohere2", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "Ernie4_5ForCausalLM": ("ernie4_5", "attn_k attn_output attn_q attn_v ffn_down ffn_gate ffn_up"),
    "GlmForCausalLM": ("chatglm", "attn_k attn_output attn_q attn_v ffn_down ffn_up"),
    "PhiForCausalLM": ("phi2", "attn_k attn_output attn_q attn_v ffn_down ffn_up"),
    "Jais2ForCausalLM": ("jais2", "attn_k attn_output attn_q attn_v ffn_down ffn_up"),
    "ApertusForCausalLM": ("apertus", "attn_k attn_output attn_q attn_v ffn_down ffn_up"),
    "Qwen2MoeForCausalLM": (
        "qwen2moe",
        "attn_k attn_output attn_q attn_v ffn_down_shexp ffn_gate_inp_shexp ffn_gate_shexp ffn_up_shexp",
    ),
}
"""``general.architecture`` and the block-0 tensor names llama.cpp's ``convert_lora_to_gguf.py`` (llama-cpp-python
0.3.36's llama.cpp) writes for a LoRA on every linear layer of :func:`family_model` (read from its output)."""

PERMUTED = {
    "GraniteForCausalLM",
    "OlmoForCausalLM",
    "SmolLM3ForCausalLM",
    "ArceeForCausalLM",
    "MistralForCausalLM",
}
"""Families whose converter permutes q/k rows (LlamaModel's ``undo_permute``, OlmoModel's copy of it)."""


def _tensors(path: Path) -> dict[str, Any]:
    import gguf
    import numpy as np

    return {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}


def _without_provenance(src: Path, out: Path) -> Path:
    """The same GGUF as a tool without adapterdoc's metadata writes it (llama.cpp's script): tensors and alpha."""
    from tests.formats.gguf_helpers import write_gguf

    h = read_header(src)
    kv = {"adapter.type": "lora", "adapter.lora.alpha": float(h.kv["adapter.lora.alpha"])}
    return write_gguf(out, h.kv["general.architecture"], _tensors(src), kv=kv)


def test_families_cover_the_table() -> None:
    from adapterdoc.layouts.gguf import ARCHES

    assert set(LLAMA_CPP) == set(FAMILIES)
    assert set(FAMILIES) <= set(ARCHES)
    assert {c for c in FAMILIES if ARCHES[c].rope_unpermute} == PERMUTED


@pytest.mark.parametrize("cls", sorted(LLAMA_CPP))
def test_family_names_permutation_and_roundtrip(tmp_path: Path, cls: str) -> None:
    import numpy as np
    from safetensors.numpy import load_file

    model = family_model(cls)
    base = save_config(model, tmp_path / "base")
    adapter = peft_adapter(model, tmp_path / "peft", target_modules=linear_targets(model))
    out = tmp_path / "a.gguf"
    fmt.from_peft(adapter, out, base=str(base), outtype=None)
    h = read_header(out)
    arch, blk0 = LLAMA_CPP[cls]
    assert h.kv["general.architecture"] == arch
    n_layers = model.config.num_hidden_layers
    want = {f"blk.{i}.{t}.weight.lora_{s}" for i in range(n_layers) for t in blk0.split() for s in "ab"}
    assert set(h.tensors) == want
    got = _tensors(out)
    src = load_file(adapter / "adapter_model.safetensors")
    attn = "qkv_proj" if cls == "Phi3ForCausalLM" else "q_proj"
    q = src[f"base_model.model.model.layers.0.self_attn.{attn}.lora_B.weight"]
    mine = got[f"blk.0.attn_{'qkv' if attn == 'qkv_proj' else 'q'}.weight.lora_b"]
    assert np.array_equal(np.sort(mine, axis=0), np.sort(q, axis=0))  # the same rows
    assert (not np.array_equal(mine, q)) is (cls in PERMUTED)
    # back to PEFT: with adapterdoc's metadata byte-exact; through llama.cpp's name map alone, the same tensors
    back = tmp_path / "back"
    fmt.to_peft(out, back, base=None, outtype=None)
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        assert (back / f).read_bytes() == (adapter / f).read_bytes(), f
    plain = _without_provenance(out, tmp_path / "plain.gguf")
    assert PROVENANCE not in read_header(plain).kv
    fmt.to_peft(plain, tmp_path / "plain", base=str(base), outtype=None)
    again = load_file(tmp_path / "plain" / "adapter_model.safetensors")
    assert set(again) == set(src) and all(np.array_equal(again[k], src[k]) for k in src)


def _refused(tmp: Path, adapter: Path, base: str, code: str) -> str:
    out = tmp / "x.gguf"
    with pytest.raises(AdapterdocError) as e:
        fmt.from_peft(adapter, out, base=base, outtype=None)
    assert code in str(e.value)
    assert not out.exists()
    return str(e.value)


def test_refused_families_say_why(tmp_path: Path) -> None:
    """A class llama.cpp converts with a rewrite adapterdoc does not write is refused naming that rewrite; a class
    in neither table says it is not checked."""
    model = generic_model("llama")
    adapter = peft_adapter(model, tmp_path / "p", target_modules=["q_proj"])
    base = save_config(model, tmp_path / "base")
    cfg = json.loads((base / "config.json").read_text())
    for cls, phrase in (
        ("GPTNeoXForCausalLM", "query_key_value's rows"),
        ("BitnetForCausalLM", "ternary"),
        ("MadeUpForCausalLM", "not checked against llama.cpp's converter"),
    ):
        (base / "config.json").write_text(json.dumps({**cfg, "architectures": [cls]}))
        assert phrase in _refused(tmp_path, adapter, str(base), "AD870")


# ------------------------------------------------------------------------------- alpha_pattern folded into lora_B


def _peft_logits(model: Any, adapter: Path) -> Any:
    import torch
    from peft import PeftModel

    pm = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        out = pm(torch.tensor([[3, 17, 42, 5, 99]])).logits[0].float().numpy()
    pm.unload()
    return out


def test_alpha_pattern_power_of_two_folded_exactly(tmp_path: Path) -> None:
    """lora_alpha 8 with alpha_pattern q_proj: 32 (×4) and down_proj: 2 (×1/4): adapter.lora.alpha 8, q_proj's and
    down_proj's lora_b are PEFT's times 4 and 1/4 exactly, the others untouched; back in PEFT (alpha_pattern
    dropped, one lora_alpha) the model computes what the source adapter computes."""
    import numpy as np
    from safetensors.numpy import load_file

    model = generic_model("qwen3")
    base = save_config(model, tmp_path / "base")
    adapter = peft_adapter(
        model, tmp_path / "peft", lora_alpha=8, alpha_pattern={"q_proj": 32, "down_proj": 2}
    )
    out = tmp_path / "a.gguf"
    res = fmt.from_peft(adapter, out, base=str(base), outtype=None)
    assert read_header(out).kv["adapter.lora.alpha"] == 8.0
    assert any("folded into lora_B" in n and "×0.25" in n and "×4" in n for n in res.notes), res.notes
    got, src = _tensors(out), load_file(adapter / "adapter_model.safetensors")
    for gname, module, factor in (("attn_q", "self_attn.q_proj", 4), ("ffn_down", "mlp.down_proj", 0.25),
                                  ("attn_v", "self_attn.v_proj", 1)):  # fmt: skip
        b = src[f"base_model.model.model.layers.1.{module}.lora_B.weight"]
        assert np.array_equal(got[f"blk.1.{gname}.weight.lora_b"], b * np.float32(factor)), gname
        a = src[f"base_model.model.model.layers.1.{module}.lora_A.weight"]
        assert np.array_equal(got[f"blk.1.{gname}.weight.lora_a"], a)
    back = tmp_path / "back"
    fmt.to_peft(out, back, base=None, outtype=None)
    cfg = json.loads((back / "adapter_config.json").read_text())
    assert cfg["alpha_pattern"] == {} and cfg["lora_alpha"] == 8.0
    want = _peft_logits(model, adapter)
    base_logits = _peft_logits(generic_model("qwen3"), _zero_adapter(adapter, tmp_path / "zero"))
    assert np.abs(want - base_logits).max() > 1e-2  # the adapter does something
    assert np.abs(want - _peft_logits(generic_model("qwen3"), back)).max() <= 1e-5


def _zero_adapter(adapter: Path, out: Path) -> Path:
    """``adapter`` with every lora_B zero (the base's logits through the same PEFT path)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(adapter, out)
    sd = load_file(out / "adapter_model.safetensors")
    save_file({k: v * 0 if "lora_B" in k else v for k, v in sd.items()}, out / "adapter_model.safetensors")
    return out


def test_alpha_fold_bf16_exact(tmp_path: Path) -> None:
    """bf16 lora_B times a power of two stays bf16 and exact (the bits only change exponent)."""
    import torch
    from safetensors.torch import load_file

    model = generic_model("qwen3").to(torch.bfloat16)
    base = save_config(model, tmp_path / "base")
    adapter = peft_adapter(
        model,
        tmp_path / "peft",
        autocast=False,
        target_modules=["q_proj", "v_proj"],
        alpha_pattern={"v_proj": 2},
    )
    out = tmp_path / "a.gguf"
    fmt.from_peft(adapter, out, base=str(base), outtype=None)
    fmt.to_peft(out, tmp_path / "back", base=None, outtype=None)
    src, got = (
        load_file(adapter / "adapter_model.safetensors"),
        load_file(tmp_path / "back" / "adapter_model.safetensors"),
    )
    key = "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"
    assert got[key].dtype == torch.bfloat16 and torch.equal(got[key], src[key] * 0.25)
    q = key.replace("v_proj", "q_proj")
    assert torch.equal(got[q], src[q])


def test_alpha_pattern_other_ratios_and_overflow_refused(tmp_path: Path) -> None:
    """A ratio that is not a power of two (24 / 16 = 1.5) is still AD875; rsLoRA with ranks 4 and 16 (alpha·√r
    ratio 2) folds; a fold that would overflow F16 is AD875."""
    import numpy as np

    model = generic_model("qwen3")
    base = str(save_config(model, tmp_path / "base"))
    odd = peft_adapter(model, tmp_path / "odd", lora_alpha=16, alpha_pattern={"q_proj": 24},
                       target_modules=["q_proj", "v_proj"])  # fmt: skip
    assert "not a power of two" in _refused(tmp_path, odd, base, "AD875")
    rs = peft_adapter(model, tmp_path / "rs", use_rslora=True, r=4, lora_alpha=3, rank_pattern={"v_proj": 16},
                      target_modules=["q_proj", "v_proj"])  # fmt: skip
    res = fmt.from_peft(rs, tmp_path / "rs.gguf", base=base, outtype=None)
    assert any("folded into lora_B" in n for n in res.notes)
    assert read_header(tmp_path / "rs.gguf").kv["adapter.lora.alpha"] == 12.0  # 3·√16; q_proj's 3·√4 is ×0.5
    with pytest.raises(AdapterdocError, match="AD875"):
        gguf_write.fold(tmp_path, "m", np.array([[60000.0]], np.float16), "F16", 2.0)
    with pytest.raises(AdapterdocError, match="AD875"):
        gguf_write.fold(tmp_path, "m", np.array([[1e-7]], np.float16), "F16", 0.25)
    ok = gguf_write.fold(tmp_path, "m", np.array([[3.0]], np.float16), "F16", 0.5)
    assert ok.dtype == np.float16 and float(ok[0, 0]) == 1.5
