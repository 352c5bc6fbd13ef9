"""PEFT → GGUF → PEFT through the format module, on real PEFT adapters of tiny real models of every supported
family: llama.cpp's names (the gguf package's map), its permutations undone exactly, byte-exact round trips, and
each refusal (exit 3) with its code. The runtime itself is the oracle suite (test_gguf_oracle.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("peft")

from adapterdoc.errors import AdapterdocError
from adapterdoc.formats import gguf as fmt
from adapterdoc.formats.gguf.header import PROVENANCE, read_header
from tests.formats.gguf_helpers import (
    LINEAR,
    LINEAR_ATTN,
    fused_expert_peft,
    generic_model,
    peft_adapter,
    save_config,
)

pytestmark = pytest.mark.ml


def _roundtrip(tmp: Path, adapter: Path, base: str, outtype: str | None = None) -> tuple[Path, Path]:
    g = tmp / "a.gguf"
    fmt.from_peft(adapter, g, base=base, outtype=outtype)
    back = tmp / "back"
    fmt.to_peft(g, back, base=None, outtype=None)
    return g, back


def _same_files(a: Path, b: Path) -> None:
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_gguf_generic_decoders_roundtrip_byte_exact(tmp_path: Path, kind: str) -> None:
    model = generic_model(kind)
    base = save_config(model, tmp_path / "base")
    adapter = peft_adapter(model, tmp_path / "peft")
    g, back = _roundtrip(tmp_path, adapter, str(base))
    _same_files(adapter, back)
    h = read_header(g)
    assert h.kv["general.type"] == "adapter" and h.kv["adapter.type"] == "lora"
    assert h.kv["general.architecture"] == kind
    assert h.kv["adapter.lora.alpha"] == 8.0
    names = set(h.tensors)
    assert "blk.1.attn_q.weight.lora_a" in names and "blk.0.ffn_down.weight.lora_b" in names
    assert len(names) == 2 * 7 * 2
    # ggml's ne: lora_a [in, r], lora_b [r, out]
    assert h.tensors["blk.0.attn_k.weight.lora_a"].shape == (64, 4)
    assert h.tensors["blk.0.attn_k.weight.lora_b"].shape == (4, 32)


def test_gguf_llama_q_k_rows_are_permuted_and_restored(tmp_path: Path) -> None:
    """llama.cpp permutes llama's q/k rows (undo_permute); qwen3 is not permuted: the bytes show both."""
    import numpy as np
    from safetensors.numpy import load_file

    for kind, permuted in (("llama", True), ("qwen3", False)):
        model = generic_model(kind)
        base = save_config(model, tmp_path / kind / "base")
        adapter = peft_adapter(model, tmp_path / kind / "peft")
        g = tmp_path / kind / "a.gguf"
        fmt.from_peft(adapter, g, base=str(base), outtype=None)
        import gguf

        r = gguf.GGUFReader(g)
        got = {t.name: np.array(t.data) for t in r.tensors}
        src = load_file(adapter / "adapter_model.safetensors")
        peft_b = src["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
        ours = got["blk.0.attn_q.weight.lora_b"]
        assert ours.shape == peft_b.shape
        assert np.array_equal(np.sort(ours, axis=0), np.sort(peft_b, axis=0))  # same rows
        assert (not np.array_equal(ours, peft_b)) is permuted
        v = src["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"]
        assert np.array_equal(got["blk.0.attn_v.weight.lora_b"], v)  # v is never permuted


@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16"])
def test_gguf_outtype_values_exact_in_f32(tmp_path: Path, outtype: str) -> None:
    """--outtype changes the dtype; back in PEFT the values equal the source's rounded to that dtype."""
    import numpy as np
    import torch
    from safetensors.torch import load_file

    model = generic_model("qwen3")
    base = save_config(model, tmp_path / "base")
    adapter = peft_adapter(model, tmp_path / "peft", target_modules=["q_proj", "down_proj"])
    g, back = _roundtrip(tmp_path, adapter, str(base), outtype=outtype)
    src, got = load_file(adapter / "adapter_model.safetensors"), load_file(back / "adapter_model.safetensors")
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[outtype]
    assert set(src) == set(got)
    for k in src:
        assert got[k].dtype == dt
        assert torch.equal(got[k], src[k].to(dt)), k  # torch's own rounding = llama.cpp's (nearest even)
    assert {t.type_name for t in read_header(g).tensors.values()} == {outtype.upper()}
    assert np.isfinite(1.0)


def test_gguf_bf16_adapter_kept_byte_exact(tmp_path: Path) -> None:
    import torch

    model = generic_model("llama").to(torch.bfloat16)
    base = save_config(model, tmp_path / "base")
    adapter = peft_adapter(
        model, tmp_path / "peft", autocast=False, target_modules=["q_proj", "k_proj", "up_proj"]
    )
    g, back = _roundtrip(tmp_path, adapter, str(base))
    _same_files(adapter, back)
    assert {t.type_name for t in read_header(g).tensors.values()} == {"BF16"}


def test_gguf_rank_pattern_exact_and_rslora_folded(tmp_path: Path) -> None:
    """Differing ranks: llama.cpp's alpha / rank per pair is PEFT's; rsLoRA with one rank: alpha·√r."""
    model = generic_model("qwen3")
    base = save_config(model, tmp_path / "base")
    a1 = peft_adapter(model, tmp_path / "p1", rank_pattern={"down_proj": 8})
    g1, back1 = (
        _roundtrip(tmp_path / "1", a1, str(base)) if (tmp_path / "1").mkdir() is None else (None, None)
    )
    _same_files(a1, back1)
    h1 = read_header(g1)
    assert h1.kv["adapter.lora.alpha"] == 8.0
    assert h1.tensors["blk.0.ffn_down.weight.lora_b"].shape[0] == 8
    a2 = peft_adapter(model, tmp_path / "p2", use_rslora=True, r=4, lora_alpha=3)
    (tmp_path / "2").mkdir()
    res = fmt.from_peft(a2, tmp_path / "2" / "a.gguf", base=str(base), outtype=None)
    assert read_header(tmp_path / "2" / "a.gguf").kv["adapter.lora.alpha"] == 6.0  # 3·√4
    assert any("rsLoRA folded" in n for n in res.notes)


def _refused(tmp: Path, adapter: Path, base: str, code: str) -> str:
    out = tmp / "x.gguf"
    with pytest.raises(AdapterdocError) as e:
        fmt.from_peft(adapter, out, base=base, outtype=None)
    assert code in str(e.value)
    assert not out.exists()
    return str(e.value)


def test_gguf_refusals(tmp_path: Path) -> None:
    model = generic_model("llama")
    base = str(save_config(model, tmp_path / "base"))
    before = {}
    cases = {
        "AD871": {"use_dora": True, "target_modules": ["q_proj"]},
        "AD873": {"lora_bias": True, "target_modules": ["q_proj"]},
        "AD875": {"alpha_pattern": {"q_proj": 24}, "target_modules": ["q_proj", "v_proj"]},  # ratio 3
    }
    for code, kw in cases.items():
        a = peft_adapter(model, tmp_path / code, **kw)
        before[code] = (a / "adapter_model.safetensors").read_bytes()
        _refused(tmp_path, a, base, code)
        assert (a / "adapter_model.safetensors").read_bytes() == before[code]
    a = peft_adapter(
        model,
        tmp_path / "rs",
        use_rslora=True,
        rank_pattern={"v_proj": 8},
        target_modules=["q_proj", "v_proj"],
    )
    _refused(tmp_path, a, base, "AD875")


def test_gguf_modules_to_save_dropped_only_when_equal_to_base(tmp_path: Path) -> None:
    """A saved copy equal to the base's weight is dropped (needs the base's weights); a trained one is refused."""
    import torch

    model = generic_model("llama")
    with_weights = tmp_path / "base_w"
    model.save_pretrained(with_weights)
    config_only = save_config(model, tmp_path / "base_c")
    a = peft_adapter(model, tmp_path / "mts", target_modules=["q_proj"], modules_to_save=["lm_head"])
    msg = _refused(tmp_path, a, str(config_only), "AD872")
    assert "lm_head" in msg
    res = fmt.from_peft(a, tmp_path / "ok.gguf", base=str(with_weights), outtype=None)
    assert any("equals the base's weight" in n for n in res.notes)
    assert not any(t.startswith("output.weight") for t in read_header(tmp_path / "ok.gguf").tensors)
    # a trained copy: change the saved lm_head
    from safetensors.torch import load_file, save_file

    sd = load_file(a / "adapter_model.safetensors")
    key = next(k for k in sd if k.endswith("lm_head.weight"))
    sd[key] = sd[key] + 1
    save_file(sd, a / "adapter_model.safetensors", metadata={"format": "pt"})
    _refused(tmp_path, a, str(with_weights), "AD872")
    assert torch.is_tensor(sd[key])


def test_gguf_tied_lm_head_refused(tmp_path: Path) -> None:
    import torch
    import transformers

    from tests.formats.gguf_helpers import generic_config

    cfg = generic_config("llama")
    cfg.tie_word_embeddings = True
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    base = str(save_config(model, tmp_path / "base"))
    a = peft_adapter(model, tmp_path / "p", target_modules=["q_proj", "lm_head"])
    _refused(tmp_path, a, base, "AD876")


def test_gguf_needs_base_config_and_a_known_architecture(tmp_path: Path) -> None:
    model = generic_model("llama")
    a = peft_adapter(model, tmp_path / "p", target_modules=["q_proj"])
    with pytest.raises(AdapterdocError, match="--base is needed"):
        fmt.from_peft(a, tmp_path / "x.gguf", base=None, outtype=None)
    base = save_config(model, tmp_path / "base")
    cfg = json.loads((base / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (base / "config.json").write_text(json.dumps(cfg))
    _refused(tmp_path, a, str(base), "AD870")


def test_gguf_to_peft_without_provenance_uses_llama_cpp_names(tmp_path: Path) -> None:
    """A GGUF from another tool (no adapterdoc metadata): names from llama.cpp's map, alpha → lora_alpha; the
    tensors are the source's exactly (the config is rebuilt, so only the tensors compare)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    model = generic_model("llama")
    base = save_config(model, tmp_path / "base")
    a = peft_adapter(model, tmp_path / "p", rank_pattern={"o_proj": 2})
    g = tmp_path / "a.gguf"
    fmt.from_peft(a, g, base=str(base), outtype=None)
    stripped = tmp_path / "stripped.gguf"
    r = gguf.GGUFReader(g)
    w = gguf.GGUFWriter(stripped, "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert PROVENANCE not in read_header(stripped).kv
    with pytest.raises(AdapterdocError, match="--base is needed"):
        fmt.to_peft(stripped, tmp_path / "nobase", base=None, outtype=None)
    fmt.to_peft(stripped, tmp_path / "back", base=str(base), outtype=None)
    src, got = (
        load_file(a / "adapter_model.safetensors"),
        load_file(tmp_path / "back" / "adapter_model.safetensors"),
    )
    assert set(src) == set(got)
    assert all(np.array_equal(src[k], got[k]) for k in src)
    cfg = json.loads((tmp_path / "back" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    assert cfg["rank_pattern"] == {f"model.layers.{i}.self_attn.o_proj": 2 for i in range(2)}
    assert sorted(cfg["target_modules"]) == sorted(LINEAR)


# ------------------------------------------------------------------------------- the registry's families


def _registry_base(tiny_model, layout: str, folder: Path):  # type: ignore[no-untyped-def]
    model = tiny_model(layout)
    return model, save_config(model, folder)


@pytest.mark.parametrize("layout", ["qwen3_5_text", "qwen3_5_moe_text"])
def test_gguf_qwen3_5_linear_attention_v_heads(tmp_path: Path, tiny_model, layout: str) -> None:  # type: ignore[no-untyped-def]
    """Qwen3.5 (linear_num_key_heads 2 ≠ value heads 4): llama.cpp tiles the V heads; exact both ways. The MoE
    text model's shared expert converts (its routed experts are fused: see the Qwen3-MoE test)."""
    model, base = _registry_base(tiny_model, layout, tmp_path / "base")
    a = peft_adapter(model, tmp_path / "p", target_modules=[*LINEAR, *LINEAR_ATTN])
    g, back = _roundtrip(tmp_path, a, str(base))
    _same_files(a, back)
    h = read_header(g)
    assert h.kv["general.architecture"] == ("qwen35moe" if "moe" in layout else "qwen35")
    if "moe" in layout:
        assert "blk.0.ffn_down_shexp.weight.lora_a" in h.tensors
    assert "blk.0.attn_qkv.weight.lora_a" in h.tensors and "blk.0.attn_gate.weight.lora_b" in h.tensors
    assert "blk.0.ssm_out.weight.lora_a" in h.tensors and "blk.3.attn_q.weight.lora_a" in h.tensors


@pytest.mark.parametrize("layout", ["qwen3_5_vl", "mistral3_vl", "ministral3_text"])
def test_gguf_vl_text_part_and_ministral(tmp_path: Path, tiny_model, layout: str) -> None:  # type: ignore[no-untyped-def]
    """A VL wrapper's text part (``model.language_model.``) converts; the tower is refused (AD877)."""
    model, base = _registry_base(tiny_model, layout, tmp_path / "base")
    text_only = (
        r".*(language_model\.|^model\.)?layers\.\d+\.(self_attn|mlp)\.(q_proj|k_proj|v_proj|o_proj|down_proj)"
    )
    a = peft_adapter(model, tmp_path / "p", target_modules=text_only)
    g, back = _roundtrip(tmp_path, a, str(base))
    _same_files(a, back)
    arch = read_header(g).kv["general.architecture"]
    assert arch == ("qwen35" if layout.startswith("qwen") else "mistral3")
    if layout.endswith("_vl"):
        tower = r".*(visual|vision_tower)\..*(qkv|q_proj)"
        t = peft_adapter(model, tmp_path / "tower", target_modules=tower)
        _refused(tmp_path, t, str(base), "AD877")


@pytest.mark.parametrize("layout", ["qwen3_moe_text", "qwen3_5_moe_text"])
def test_gguf_moe_experts_stacked(tmp_path: Path, tiny_model, cli, layout: str) -> None:  # type: ignore[no-untyped-def]
    """PEFT's fused expert LoRA (target_parameters) is refused with the fix (AD874); after `remap --experts
    per-expert` every expert's pair is stacked into llama.cpp's ``ffn_*_exps`` [E, ...] tensors, exactly. On
    Qwen3.5-MoE the per-expert adapter keeps ``target_parameters`` (PEFT loads it through transformers' expert
    conversion): its per-expert pairs convert, the attention pairs beside them too."""

    model, base = _registry_base(tiny_model, layout, tmp_path / "base")
    fused = tmp_path / "fused"
    fused_expert_peft(model, fused, r=3, std=0.3)
    msg = _refused(tmp_path, fused, str(base), "AD874")
    assert "--experts per-expert" in msg
    per = tmp_path / "per"
    r = cli("remap", fused, "--experts", "per-expert", "--out", per)
    assert r.exit_code == 0, r.output
    g, back = _roundtrip(tmp_path, per, str(base))
    _same_files(per, back)
    h = read_header(g)
    assert h.kv["general.architecture"] == ("qwen35moe" if layout.startswith("qwen3_5") else "qwen3moe")
    assert "blk.3.attn_q.weight.lora_a" in h.tensors
    n_exp = (
        model.config.num_local_experts
        if hasattr(model.config, "num_local_experts")
        else model.config.num_experts
    )
    for proj in ("gate", "up", "down"):
        a, b = (
            h.tensors[f"blk.0.ffn_{proj}_exps.weight.lora_a"],
            h.tensors[f"blk.0.ffn_{proj}_exps.weight.lora_b"],
        )
        assert a.shape[1:] == (3, n_exp) and b.shape[0] == 3 and b.shape[2] == n_exp


def test_gguf_embedding_and_lm_head_lora(tmp_path: Path) -> None:
    """An embedding LoRA becomes token_embd with lora_a transposed ([vocab, r] in numpy order, as llama.cpp's
    llm_build_inp_embd reads it); an lm_head LoRA on an untied base becomes output.weight; both exact back. PEFT
    saves the two base layers whole beside them (save_embedding_layers turns itself on): equal to the base's, they
    are dropped when --base has the weights."""
    import numpy as np
    from safetensors.numpy import load_file

    model = generic_model("llama")
    base = tmp_path / "base"
    model.save_pretrained(base)
    a = peft_adapter(model, tmp_path / "p", target_modules=["q_proj", "embed_tokens", "lm_head"])
    src = load_file(a / "adapter_model.safetensors")
    assert "base_model.model.lm_head.base_layer.weight" in src  # PEFT's own choice, pinned
    g, back = _roundtrip(tmp_path, a, str(base))
    h = read_header(g)
    assert h.tensors["token_embd.weight.lora_a"].shape == (4, 256)  # ne: [r, vocab]
    assert h.tensors["token_embd.weight.lora_b"].shape == (4, 64)  # ne: [r, hidden]
    assert h.tensors["output.weight.lora_a"].shape == (64, 4) and h.tensors["output.weight.lora_b"].shape == (
        4,
        256,
    )
    got = load_file(back / "adapter_model.safetensors")
    lora = {k: v for k, v in src.items() if "lora_" in k}
    assert set(got) == set(lora) and all(np.array_equal(got[k], lora[k]) for k in lora)
