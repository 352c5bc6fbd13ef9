"""The names and config fields of the MLX format against mlx-lm's facts (issue #39 items 4, 11, 13): mlx-lm's model
types come from its package (adapterdoc/layouts/mlx_models.py), a family whose mlx-lm model renames transformers'
modules is written under mlx-lm's names or refused, a config field ``load_adapters`` fails on is named with what it
must be, and embedding LoRA converts onto an untied base. Small adapters written with numpy; mlx-lm itself is
tests/formats/test_mlx_names_oracle.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.formats.test_mlx import INTER, H, L, W, dense, mlx_json, peft_folder


def _config(folder: Path, model_type: str, **extra: Any) -> Path:
    """A base given as config.json alone."""
    folder.mkdir(parents=True)
    cfg = {"model_type": model_type, "num_hidden_layers": L, "hidden_size": H, **extra}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json"


def _neox(tmp_path: Path) -> Path:
    return _config(
        tmp_path / "neox",
        "gpt_neox",
        architectures=["GPTNeoXForCausalLM"],
        num_attention_heads=4,
        intermediate_size=INTER,
        vocab_size=32,
    )


def _mlx_findings(folder: Path, base: Path) -> list[Any]:
    """The MLX format's own findings (mlx-lm's load_adapters rules) on ``folder`` against ``base``."""
    from adapterdoc.formats.mlx.load_rules import check

    return check(folder, str(base))


NEOX = {
    **{f"gpt_neox.layers.{n}.attention.query_key_value": (4, H, 3 * H) for n in range(L)},
    **{f"gpt_neox.layers.{n}.mlp.dense_4h_to_h": (4, INTER, H) for n in range(L)},
    "embed_out": (4, H, 32),
}


@pytest.mark.parametrize("with_base", [True, False], ids=["base", "no-base"])
def test_gpt_neox_is_written_under_mlx_lms_names_and_back(with_base: bool, tmp_path: Path, cli: Any) -> None:
    """Before: `gpt_neox.layers.0.attention.query_key_value.lora_a`, which mlx-lm refuses (its gpt_neox model is
    `model.h.N`, `model.embed_out`)."""
    src = peft_folder(
        tmp_path / "peft", NEOX, {"target_modules": ["query_key_value", "dense_4h_to_h", "embed_out"]}
    )
    base = ["--base", _neox(tmp_path)] if with_base else []
    res = cli("convert", src, "--to", "mlx", *base, "--out", tmp_path / "mlx")
    assert res.exit_code == 0, res.output
    names = sorted(load_file(str(tmp_path / "mlx/adapters.safetensors")))
    assert "model.h.0.attention.query_key_value.lora_a" in names and "model.embed_out.lora_b" in names
    assert not [n for n in names if n.startswith("gpt_neox.")]
    keys = mlx_json(tmp_path / "mlx")["lora_parameters"]["keys"]
    assert keys == ["attention.query_key_value", "mlp.dense_4h_to_h", "model.embed_out"]
    if with_base:
        assert _mlx_findings(tmp_path / "mlx", base[1]) == []
    res = cli("convert", tmp_path / "mlx", "--to", "peft", *base, "--out", tmp_path / "back")
    assert res.exit_code == 0, res.output
    back = load_file(str(tmp_path / "back/adapter_model.safetensors"))
    want = load_file(str(src / "adapter_model.safetensors"))
    assert sorted(back) == sorted(want) and all(np.array_equal(back[k], want[k]) for k in want)


def test_verify_flags_gpt_neox_names_mlx_lm_refuses(tmp_path: Path, cli: Any) -> None:
    """Before: the old converter's `gpt_neox.layers.N` names passed verify against a gpt_neox base."""
    src = peft_folder(tmp_path / "peft", NEOX)
    base = _neox(tmp_path)
    assert cli("convert", src, "--to", "mlx", "--base", base, "--out", tmp_path / "mlx").exit_code == 0
    t = load_file(str(tmp_path / "mlx/adapters.safetensors"))
    t = {
        k.replace("model.h.", "gpt_neox.layers.").replace("model.embed_out", "embed_out"): v
        for k, v in t.items()
    }
    save_file(t, str(tmp_path / "mlx/adapters.safetensors"))
    found = [f for f in _mlx_findings(tmp_path / "mlx", base) if f.code == "AD812"]
    assert len(found) == 2 * L + 1  # (and AD811: `embed_out` is not the `model.embed_out` of keys)
    assert "mlx-lm's `gpt_neox` model's modules start with `model.`" in found[0].message


def test_a_family_whose_names_adapterdoc_does_not_map_is_refused(tmp_path: Path, cli: Any) -> None:
    """GPT-2 (`transformer.h.N`): mlx-lm's gpt2 model is `model.h.N` and its sanitize reads only prefix-less
    checkpoints; nothing maps it, so it is refused naming the family (with --base) or asking for --base."""
    mods = {f"transformer.h.{n}.attn.c_attn": (4, H, 3 * H) for n in range(L)}
    src = peft_folder(tmp_path / "peft", mods, {"target_modules": ["c_attn"]})
    res = cli(
        "convert", src, "--to", "mlx", "--base", _config(tmp_path / "gpt2", "gpt2"), "--out", tmp_path / "a"
    )
    assert res.exit_code == 3 and "mlx-lm's `gpt2` model" in res.stderr and "(AD809)" in res.stderr
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "b")
    assert res.exit_code == 3 and "give --base" in res.stderr and "(AD809)" in res.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("model_type", ["granite", "olmo2", "stablelm", "phi3", "qwen3_5", "mistral"])
def test_model_types_mlx_lm_has_get_no_ad816(model_type: str, tmp_path: Path, cli: Any) -> None:
    """Before: AD816 "has no mlx-lm model file" for granite, olmo2, stablelm, phi3 (a hand list)."""
    src = peft_folder(tmp_path / "peft", dense())
    assert cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx").exit_code == 0
    assert "AD816" not in {
        f.code for f in _mlx_findings(tmp_path / "mlx", _config(tmp_path / "b", model_type))
    }


def test_a_model_type_mlx_lm_lacks_is_ad816_in_verify_and_convert(tmp_path: Path, cli: Any) -> None:
    src = peft_folder(tmp_path / "peft", dense())
    base = _config(tmp_path / "b", "no_such_family")
    res = cli("convert", src, "--to", "mlx", "--base", base, "--out", tmp_path / "mlx", "--json")
    assert res.exit_code == 0 and "AD816" in {f["code"] for f in json.loads(res.stdout)["findings"]}
    assert [f.code for f in _mlx_findings(tmp_path / "mlx", base)] == ["AD816"]


BAD = {
    "rank-string": ("rank", "4", "lora_parameters.rank must be a positive integer, got '4'"),
    "rank-fraction": ("rank", 4.5, "lora_parameters.rank must be a positive integer, got 4.5"),
    "scale-nan": ("scale", float("nan"), "lora_parameters.scale must be a finite number, got nan"),
    "scale-string": ("scale", "x", "lora_parameters.scale must be a finite number, got 'x'"),
    "keys-string": ("keys", "self_attn.q_proj", "lora_parameters.keys must be a list of module paths"),
    "keys-numbers": ("keys", [1, 2], "lora_parameters.keys must be a list of module paths"),
    "dropout-one": ("dropout", 1.0, "lora_parameters.dropout must be a number in [0, 1)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_config_fields_mlx_lm_fails_on_say_what_they_must_be(case: str, tmp_path: Path, cli: Any) -> None:
    """Before: `rank: "4"` / `scale: NaN` said "lacks lora_parameters.rank"; a string `keys` passed."""
    src = peft_folder(tmp_path / "peft", dense())
    assert cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx").exit_code == 0
    field, value, message = BAD[case]
    cfg = mlx_json(tmp_path / "mlx")
    cfg["lora_parameters"][field] = value
    (tmp_path / "mlx/adapter_config.json").write_text(json.dumps(cfg))
    res = cli("verify", tmp_path / "mlx")
    assert res.exit_code != 0 and message in res.stdout and "(AD815)" in res.stdout
    res = cli("convert", tmp_path / "mlx", "--to", "peft", "--out", tmp_path / "back")
    assert res.exit_code == 3 and message in res.stderr and "(AD815)" in res.stderr


EMBED = {
    f"{W}model.embed_tokens.lora_embedding_A": np.ones((4, 32), np.float32),
    f"{W}model.embed_tokens.lora_embedding_B": np.ones((H, 4), np.float32),
}


@pytest.mark.parametrize("tied", [True, None, False], ids=["tied", "unsaid", "untied"])
def test_embedding_lora_converts_onto_an_untied_base_only(
    tied: bool | None, tmp_path: Path, cli: Any
) -> None:
    """Before: refused on every base "also changes a tied lm_head", the untied one included."""
    src = peft_folder(tmp_path / "peft", dense(), extra=EMBED)
    extra = {} if tied is None else {"tie_word_embeddings": tied}
    base = _config(tmp_path / "b", "llama", vocab_size=32, **extra)
    res = cli("convert", src, "--to", "mlx", "--base", base, "--out", tmp_path / "mlx")
    if tied is not False:
        assert res.exit_code == 3 and "(AD804)" in res.stderr
        assert ("ties lm_head" if tied else "does not say tie_word_embeddings false") in res.stderr
        return
    assert res.exit_code == 0, res.output
    t = load_file(str(tmp_path / "mlx/adapters.safetensors"))
    assert t["model.embed_tokens.lora_a"].shape == (32, 4) and t["model.embed_tokens.lora_b"].shape == (4, H)
    assert "model.embed_tokens" in mlx_json(tmp_path / "mlx")["lora_parameters"]["keys"]
    res = cli("convert", tmp_path / "mlx", "--to", "peft", "--base", base, "--out", tmp_path / "back")
    assert res.exit_code == 0, res.output
    back = load_file(str(tmp_path / "back/adapter_model.safetensors"))
    assert all(np.array_equal(back[k], v) for k, v in EMBED.items())
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "nobase")
    assert res.exit_code == 3 and "give --base" in res.stderr and "(AD804)" in res.stderr
