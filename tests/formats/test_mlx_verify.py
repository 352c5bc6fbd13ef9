"""`verify` of mlx-lm adapter folders against a base of another architecture: with the base's weights (every
module and shape is known) and without them (a config.json, ``tiny:LAYOUT``: the layer count and the prefix mlx-lm
gives the model still tell). numpy only, in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from tests.formats.test_mlx import INTER, H, L, base_folder, dense, peft_folder


def _findings(res: Any, container: bool = True) -> list[dict[str, Any]]:
    """The error and warning findings (``container``: only mlx-lm's own rules, AD8xx; the PEFT checks of the
    one doctor run beside them and are tested in tests/verify/test_one_doctor.py)."""
    return [
        f
        for a in json.loads(res.stdout)["adapters"]
        for f in a["findings"]
        if f["severity"] != "info" and (not container or f["code"].startswith("AD8"))
    ]


def _config(folder: Path, architecture: str, model_type: str, layers: int = L) -> Path:
    """A config-only base (``verify`` with ``tiny:`` bases loads PEFT for its other checks: slow here)."""
    folder.mkdir()
    cfg = {"architectures": [architecture], "model_type": model_type, "num_hidden_layers": layers}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "config.json"


def _mlx(tmp_path: Path, cli: Any, modules: dict[str, tuple[int, int, int]], base: str | None = None) -> Path:
    src = peft_folder(tmp_path / "peft", modules, {"target_modules": ["q_proj", "v_proj", "down_proj"]})
    args = ["--base", base] if base else []
    assert cli("convert", src, "--to", "mlx", *args, "--out", tmp_path / "mlx").exit_code == 0
    return tmp_path / "mlx"


def test_an_adapter_of_another_architecture_is_found_without_base_weights(tmp_path: Path, cli: Any) -> None:
    """Before: a llama-named adapter verified against Qwen3.5 (or a base with fewer layers) passed with at most a
    warning, though mlx-lm's load_adapters refuses every tensor."""
    mlx = _mlx(tmp_path, cli, dense())
    qwen = _config(tmp_path / "qwen3_5", "Qwen3_5ForCausalLM", "qwen3_5_text")
    res = cli("verify", mlx, "--base", qwen, "--json")
    found = _findings(res)
    assert res.exit_code == 1 and {f["code"] for f in found} == {"AD812", "AD816"}
    wrong = [f for f in found if f["code"] == "AD812"]
    assert len(wrong) == 3 * L and "language_model.model." in wrong[0]["message"]
    assert "adapterdoc convert ADAPTER --to mlx --base BASE" in wrong[0]["message"]
    # a config.json with fewer layers than the adapter covers
    (tmp_path / "two").mkdir()
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": H, "intermediate_size": INTER}
    cfg |= {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": H // 2}
    (tmp_path / "two" / "config.json").write_text(json.dumps(cfg))
    res = cli("verify", mlx, "--base", tmp_path / "two" / "config.json", "--json")
    found = _findings(res)
    assert res.exit_code == 1 and {f["code"] for f in found} == {"AD812"} and len(found) == 3
    assert all("sits in layer 2" in f["message"] for f in found)
    cfg["num_hidden_layers"] = L
    (tmp_path / "two" / "config.json").write_text(json.dumps(cfg))
    assert cli("verify", mlx, "--base", tmp_path / "two" / "config.json").exit_code == 0


def test_a_wrapped_language_model_adapter_on_a_plain_decoder_is_found(tmp_path: Path, cli: Any) -> None:
    """mlx-lm's Qwen3.5 names (`language_model.model.…`) on a base mlx-lm builds as a plain decoder."""
    mods = {f"model.layers.{n}.self_attn.q_proj": (4, H, H) for n in range(2)}
    mlx = _mlx(tmp_path, cli, mods, base="tiny:qwen3_5_text")
    assert next(iter(load_file(str(mlx / "adapters.safetensors")))).startswith("language_model.model.")
    plain = _config(tmp_path / "ministral3", "Ministral3ForCausalLM", "ministral3")
    res = cli("verify", mlx, "--base", plain, "--json")
    found = _findings(res)
    assert res.exit_code == 1 and {f["code"] for f in found} == {"AD812"}
    assert "`ministral3` model's modules start with `lm_head.`, `model.`" in found[0]["message"]
    vl = _config(tmp_path / "vl", "Qwen3_5ForConditionalGeneration", "qwen3_5")
    # the VL class: the same names, so mlx-lm's rules pass (this config.json is too thin for the PEFT checks)
    assert _findings(cli("verify", mlx, "--base", vl, "--json")) == []


def test_a_base_of_another_size_gives_shape_findings_with_the_expected_shape(
    tmp_path: Path, cli: Any
) -> None:
    mlx = _mlx(tmp_path, cli, dense())
    base = base_folder(tmp_path / "base")
    assert cli("verify", mlx, "--base", base).exit_code == 0
    w = load_file(str(base / "model.safetensors"))  # the same model, twice as wide in v_proj's output
    for n in range(L):
        w[f"model.layers.{n}.self_attn.v_proj.weight"] = np.zeros((16, H), np.float32)
    save_file(w, str(base / "model.safetensors"))
    res = cli("verify", mlx, "--base", base, "--json")
    found = _findings(res)
    assert res.exit_code == 1 and {f["code"] for f in found} == {"AD813"} and len(found) == L
    assert all("v_proj.lora_b" in f["message"] and "mlx-lm builds [4, 16]" in f["message"] for f in found)


def test_inspect_shows_the_format_and_its_evidence_for_mlx_folders_and_gguf_files(
    tmp_path: Path, cli: Any
) -> None:
    """The same PEFT adapter as an mlx-lm folder and as a GGUF LoRA: `inspect` names each format with the
    evidence that decided it (the `format` object of `inspect --json`) and says it in text."""
    src = peft_folder(tmp_path / "peft", dense())
    base = _config(tmp_path / "base", "LlamaForCausalLM", "llama")  # llama.cpp's names need only the config
    cfg = json.loads(base.read_text()) | {
        "hidden_size": H,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    base.write_text(json.dumps(cfg))
    assert cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx").exit_code == 0
    res = cli("convert", src, "--to", "gguf", "--base", base, "--out", tmp_path / "a.gguf")
    assert res.exit_code == 0, res.output
    want = {
        tmp_path / "mlx": (
            "mlx",
            ["adapters.safetensors", "adapter_config.json with fine_tune_type, num_layers, lora_parameters"],
        ),
        tmp_path / "a.gguf": (
            "gguf",
            ["general.type = adapter", "adapter.type = lora", "general.architecture = llama"],
        ),
    }
    for path, (name, evidence) in want.items():
        res = cli("inspect", path, "--json")
        assert res.exit_code == 0, res.output
        d = json.loads(res.stdout)
        assert d["kind"] == name and d["format"]["name"] == name
        assert set(evidence) <= set(d["format"]["evidence"]), d["format"]["evidence"]
        text = cli("inspect", path).stdout
        assert f"format {name}" in text and all(f"• {e}" in text for e in evidence)
    assert cli("inspect", src, "--json").exit_code == 0
    assert json.loads(cli("inspect", src, "--json").stdout)["kind"] != "mlx"
