"""PEFT ⇄ MLX (mlx-lm's adapter folder) with `adapterdoc convert`: the tensor layout mlx-lm reads, exact round trips,
the refusals, `--out` and `--outtype`, and inspect / verify of MLX folders. Small adapters written with numpy (no
torch); mlx-lm itself runs in tests/formats/test_mlx_oracle.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

W = "base_model.model."
H, INTER, L = 16, 24, 3  # hidden, intermediate, layers


def peft_folder(
    folder: Path,
    modules: dict[str, tuple[int, int, int]],
    config: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    extra: dict[str, np.ndarray] | None = None,
    dtype: Any = np.float32,
) -> Path:
    """A PEFT adapter: ``modules`` maps module path → (r, in, out); random A and B."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for m, (r, din, dout) in modules.items():
        tensors[f"{W}{m}.lora_A.weight"] = rng.standard_normal((r, din)).astype(dtype)
        tensors[f"{W}{m}.lora_B.weight"] = rng.standard_normal((dout, r)).astype(dtype)
    tensors.update(extra or {})
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    cfg.update(config or {})
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def dense(r: int = 4, layers: range = range(L)) -> dict[str, tuple[int, int, int]]:
    out: dict[str, tuple[int, int, int]] = {}
    for n in layers:
        out[f"model.layers.{n}.self_attn.q_proj"] = (r, H, H)
        out[f"model.layers.{n}.self_attn.v_proj"] = (r, H, 8)
        out[f"model.layers.{n}.mlp.down_proj"] = (r, INTER, H)
    return out


def base_folder(folder: Path, *, experts: int = 0) -> Path:
    """A llama-shaped base: config.json and weights (zeros; verify reads only the header)."""
    folder.mkdir(parents=True)
    w: dict[str, np.ndarray] = {}
    for n in range(L):
        p = f"model.layers.{n}"
        w[f"{p}.self_attn.q_proj.weight"] = np.zeros((H, H), np.float32)
        w[f"{p}.self_attn.v_proj.weight"] = np.zeros((8, H), np.float32)
        if experts:
            for e in range(experts):
                for proj, shape in (
                    ("gate_proj", (INTER, H)),
                    ("up_proj", (INTER, H)),
                    ("down_proj", (H, INTER)),
                ):
                    w[f"{p}.mlp.experts.{e}.{proj}.weight"] = np.zeros(shape, np.float32)
        else:
            w[f"{p}.mlp.down_proj.weight"] = np.zeros((H, INTER), np.float32)
    save_file(w, str(folder / "model.safetensors"))
    cfg = {"model_type": "qwen3_moe" if experts else "llama", "num_hidden_layers": L, "hidden_size": H}
    # heads as the weights say (v_proj: 8 rows), so that transformers builds the config for the PEFT checks
    cfg |= {
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": H // 2,
        "intermediate_size": INTER,
    }
    if experts:
        cfg |= {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": experts}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def deltas(folder: Path) -> dict[str, np.ndarray]:
    """Each module's scaling · B @ A (float64), read from a PEFT folder."""
    from adapterdoc.adapter import AdapterConfig

    cfg = AdapterConfig(json.loads((folder / "adapter_config.json").read_text()))
    t = load_file(str(folder / "adapter_model.safetensors"))
    out = {}
    for k in t:
        if k.endswith(".lora_A.weight"):
            m = k[len(W) : -len(".lora_A.weight")]
            b = t[f"{W}{m}.lora_B.weight"].astype(np.float64)
            out[m] = cfg.scaling_for(m) * b @ t[k].astype(np.float64)
    return out


def mlx_json(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "adapter_config.json").read_text())


# ------------------------------------------------------------------------------------------------ the layout


def test_mlx_tensors_are_peft_factors_transposed_and_scale_is_peft_scaling(tmp_path: Path, cli: Any) -> None:
    src = peft_folder(tmp_path / "peft", dense(), {"lora_alpha": 12})
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] and report["source_format"] == "peft" and report["target_format"] == "mlx"
    assert report["tensors"] == 2 * 3 * L and report["out"] == str(tmp_path / "mlx")
    cfg = mlx_json(tmp_path / "mlx")
    assert cfg["fine_tune_type"] == "lora" and cfg["num_layers"] == -1  # layer 0 adapted: all layers
    assert cfg["lora_parameters"]["rank"] == 4 and cfg["lora_parameters"]["scale"] == 3.0
    assert cfg["lora_parameters"]["keys"] == ["mlp.down_proj", "self_attn.q_proj", "self_attn.v_proj"]
    peft, mlx = (
        load_file(str(src / "adapter_model.safetensors")),
        load_file(str(tmp_path / "mlx/adapters.safetensors")),
    )
    for n in range(L):
        m = f"model.layers.{n}.self_attn.v_proj"
        assert mlx[f"{m}.lora_a"].shape == (H, 4) and mlx[f"{m}.lora_b"].shape == (4, 8)
        assert np.array_equal(mlx[f"{m}.lora_a"], peft[f"{W}{m}.lora_A.weight"].T)
        assert np.array_equal(mlx[f"{m}.lora_b"], peft[f"{W}{m}.lora_B.weight"].T)


def test_rslora_scale_and_num_layers_from_base(tmp_path: Path, cli: Any) -> None:
    src = peft_folder(
        tmp_path / "peft", dense(r=4, layers=range(1, L)), {"use_rslora": True, "lora_alpha": 6}
    )
    base = base_folder(tmp_path / "base")
    assert cli("convert", src, "--to", "mlx", "--base", base, "--out", tmp_path / "mlx").exit_code == 0
    cfg = mlx_json(tmp_path / "mlx")
    assert cfg["lora_parameters"]["scale"] == 6 / math.sqrt(4)
    assert cfg["num_layers"] == L - 1  # layers 1..L-1 are the last L-1


def test_uniform_adapter_round_trips_bit_for_bit(tmp_path: Path, cli: Any) -> None:
    src = peft_folder(tmp_path / "peft", dense())
    assert cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx").exit_code == 0
    assert cli("convert", tmp_path / "mlx", "--to", "peft", "--out", tmp_path / "back").exit_code == 0
    a, b = (
        load_file(str(src / "adapter_model.safetensors")),
        load_file(str(tmp_path / "back/adapter_model.safetensors")),
    )
    assert sorted(a) == sorted(b)
    assert all(a[k].tobytes() == b[k].tobytes() and a[k].dtype == b[k].dtype for k in a)
    back = json.loads((tmp_path / "back/adapter_config.json").read_text())
    assert (
        back["r"] == 4
        and back["lora_alpha"] == 8
        and back["target_modules"] == ["down_proj", "q_proj", "v_proj"]
    )


def test_rank_and_alpha_patterns_fold_value_exact(tmp_path: Path, cli: Any) -> None:
    """Ranks 4 and 2 (zero-padded) and scalings 2, 4 (power of two apart: exact) and 0.75 (rounded: AD806)."""
    mods = dense()
    for n in range(L):
        mods[f"model.layers.{n}.self_attn.v_proj"] = (2, H, 8)
    src = peft_folder(
        tmp_path / "peft", mods, {"rank_pattern": {"v_proj": 2}, "alpha_pattern": {"down_proj": 3}}
    )
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert [f["code"] for f in report["findings"]] == ["AD806"]
    assert any("zero-padded to 4" in n for n in report["notes"])
    cfg = mlx_json(tmp_path / "mlx")
    assert cfg["lora_parameters"]["rank"] == 4 and cfg["lora_parameters"]["scale"] == 2.0
    assert cli("convert", tmp_path / "mlx", "--to", "peft", "--out", tmp_path / "back").exit_code == 0
    want, got = deltas(src), deltas(tmp_path / "back")
    assert sorted(want) == sorted(got)
    for m in want:
        if "down_proj" in m:  # folded with ratio 0.375: one float32 rounding per element
            err = np.abs(got[m] - want[m]).max() / np.abs(want[m]).max()
            assert 0 < err < 2**-22, m
        else:  # padded and power-of-two folded: exact
            assert np.array_equal(got[m], want[m]), m


def test_stacked_experts_both_ways(tmp_path: Path, cli: Any) -> None:
    """Per-expert PEFT LoRA ⇄ mlx-lm's LoRASwitchLinear: lora_a [E, r, in], lora_b [E, out, r], the bytes as
    they are; an expert absent from the adapter is zero LoRA."""
    E = 3
    mods: dict[str, tuple[int, int, int]] = {}
    for n in range(L):
        mods[f"model.layers.{n}.self_attn.q_proj"] = (4, H, H)
        for e in range(E):
            if (n, e) == (1, 2):
                continue
            mods[f"model.layers.{n}.mlp.experts.{e}.gate_proj"] = (4, H, INTER)
            mods[f"model.layers.{n}.mlp.experts.{e}.down_proj"] = (4, INTER, H)
    src = peft_folder(tmp_path / "peft", mods, {"target_modules": ["q_proj", "gate_proj", "down_proj"]})
    base = base_folder(tmp_path / "base", experts=E)
    res = cli("convert", src, "--to", "mlx", "--base", base, "--out", tmp_path / "mlx", "--json")
    assert res.exit_code == 0, res.output
    assert any("absent from the adapter written as zero LoRA" in n for n in json.loads(res.stdout)["notes"])
    mlx = load_file(str(tmp_path / "mlx/adapters.safetensors"))
    peft = load_file(str(src / "adapter_model.safetensors"))
    a = mlx["model.layers.0.mlp.switch_mlp.gate_proj.lora_a"]
    b = mlx["model.layers.0.mlp.switch_mlp.gate_proj.lora_b"]
    assert a.shape == (E, 4, H) and b.shape == (E, INTER, 4)
    assert np.array_equal(a[1], peft[f"{W}model.layers.0.mlp.experts.1.gate_proj.lora_A.weight"])
    assert np.array_equal(b[1], peft[f"{W}model.layers.0.mlp.experts.1.gate_proj.lora_B.weight"])
    assert not mlx["model.layers.1.mlp.switch_mlp.gate_proj.lora_b"][2].any()
    assert "mlp.switch_mlp.gate_proj" in mlx_json(tmp_path / "mlx")["lora_parameters"]["keys"]
    # mlx-lm's rules pass; the PEFT view fails as the PEFT folder does: expert gate without up, which PEFT cannot
    # fuse into this base's gate_up_proj (AD241)
    res = cli("verify", tmp_path / "mlx", "--base", base, "--json")
    assert _codes(res) == set() and res.exit_code == 1
    assert {f["code"] for f in json.loads(res.stdout)["findings"] if f["severity"] == "error"} == {
        "AD226",
        "AD241",
    }
    assert cli("convert", tmp_path / "mlx", "--to", "peft", "--out", tmp_path / "back").exit_code == 0
    back = load_file(str(tmp_path / "back/adapter_model.safetensors"))
    for k, v in peft.items():
        assert back[k].tobytes() == v.tobytes(), k
    assert not back[f"{W}model.layers.1.mlp.experts.2.gate_proj.lora_B.weight"].any()


def test_outtype_recasts_and_reports(tmp_path: Path, cli: Any) -> None:
    src = peft_folder(tmp_path / "peft", dense())
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx", "--outtype", "bf16", "--json")
    assert res.exit_code == 0, res.output
    from adapterdoc.st.header import read_header

    assert {t.dtype for t in read_header(tmp_path / "mlx/adapters.safetensors").tensors.values()} == {"BF16"}
    assert any("re-cast to bf16" in n for n in json.loads(res.stdout)["notes"])
    # bf16 → f32 is exact, and back to bf16 gives the same bytes
    assert (
        cli(
            "convert", tmp_path / "mlx", "--to", "peft", "--outtype", "f32", "--out", tmp_path / "f32"
        ).exit_code
        == 0
    )
    assert (
        cli(
            "convert", tmp_path / "f32", "--to", "mlx", "--outtype", "bf16", "--out", tmp_path / "again"
        ).exit_code
        == 0
    )
    one = (tmp_path / "mlx/adapters.safetensors").read_bytes()
    assert one == (tmp_path / "again/adapters.safetensors").read_bytes()


# ------------------------------------------------------------------------------------------------ refusals


REFUSALS = {
    "modules_to_save": ({"lm_head.modules_to_save.weight": np.zeros((8, H), np.float32)}, {}, "AD801"),
    "lora_bias": ({f"{W}model.layers.0.self_attn.q_proj.lora_B.bias": np.zeros(H, np.float32)}, {}, "AD802"),
    "embedding": (
        {
            f"{W}model.embed_tokens.lora_embedding_A": np.zeros((4, 32), np.float32),
            f"{W}model.embed_tokens.lora_embedding_B": np.zeros((H, 4), np.float32),
        },
        {},
        "AD804",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_mlx_cannot_hold_is_refused_before_writing(case: str, tmp_path: Path, cli: Any) -> None:
    extra, config, code = REFUSALS[case]
    if case == "modules_to_save":
        extra = {f"{W}lm_head.weight": extra.pop("lm_head.modules_to_save.weight")}
    src = peft_folder(tmp_path / "peft", dense(), config, extra=extra)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx")
    assert res.exit_code == 3 and f"({code})" in res.stderr and res.stderr.startswith("adapterdoc: error: ")
    assert not (tmp_path / "mlx").exists()
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".adapterdoc")]


def test_dora_on_experts_and_tower_lora_are_refused(tmp_path: Path, cli: Any) -> None:
    mods = {"model.layers.0.mlp.experts.0.gate_proj": (4, H, INTER)}
    mag = {f"{W}model.layers.0.mlp.experts.0.gate_proj.lora_magnitude_vector": np.ones(INTER, np.float32)}
    src = peft_folder(tmp_path / "dora", mods, {"use_dora": True}, extra=mag)
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "o1")
    assert res.exit_code == 3 and "(AD803)" in res.stderr
    vl = {
        "model.language_model.layers.0.self_attn.q_proj": (4, H, H),
        "model.visual.blocks.0.attn.qkv": (4, H, 3 * H),
    }
    src = peft_folder(tmp_path / "vl", vl, {"base_model_name_or_path": "Qwen/Qwen3.5-9B"})
    res = cli("convert", src, "--to", "mlx", "--base", "tiny:qwen3_5_vl", "--out", tmp_path / "o2")
    assert res.exit_code == 3 and "(AD805)" in res.stderr and "model.visual.blocks.0.attn.qkv" in res.stderr


def test_mlx_folders_mlx_lm_cannot_read_are_refused(tmp_path: Path, cli: Any) -> None:
    src = peft_folder(tmp_path / "peft", dense())
    assert cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx").exit_code == 0
    cfg = mlx_json(tmp_path / "mlx")
    (tmp_path / "mlx/adapter_config.json").write_text(json.dumps({**cfg, "fine_tune_type": "full"}))
    res = cli("convert", tmp_path / "mlx", "--to", "peft", "--out", tmp_path / "a")
    assert res.exit_code == 3 and "(AD807)" in res.stderr
    del cfg["num_layers"]
    (tmp_path / "mlx/adapter_config.json").write_text(json.dumps(cfg))
    res = cli("convert", tmp_path / "mlx", "--to", "peft", "--out", tmp_path / "b", "--json")
    assert res.exit_code == 3 and "num_layers" in res.stderr and "(AD815)" in res.stderr
    assert json.loads(res.stdout)["ok"] is False


# ------------------------------------------------------------------------------------------------ --out, --to


def test_out_rules(tmp_path: Path, cli: Any) -> None:
    src = peft_folder(tmp_path / "peft", dense())
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "full")
    assert res.exit_code == 3 and "not empty" in res.stderr
    assert (tmp_path / "full" / "x").read_text() == "keep"
    res = cli("convert", src, "--to", "mlx", "--out", src / "inside")
    assert res.exit_code == 3 and "inside the input" in res.stderr
    res = cli("convert", src, "--to", "mlx", "--out", tmp_path / "no" / "such" / "dir")
    assert res.exit_code == 3 and "parent folder" in res.stderr
    (tmp_path / "empty").mkdir()
    assert cli("convert", src, "--to", "mlx", "--out", tmp_path / "empty").exit_code == 0
    assert cli("convert", src, "--to", "mlx").exit_code == 0  # default: beside the input
    assert (tmp_path / "peft-mlx" / "adapters.safetensors").is_file()
    res = cli("convert", tmp_path / "nothing", "--to", "mlx")
    assert res.exit_code == 3


def test_to_gguf_is_unavailable_or_works(tmp_path: Path, cli: Any) -> None:
    """Until adapterdoc.formats.gguf exists, --to gguf is one exit-3 line naming it."""
    import importlib.util

    src = peft_folder(tmp_path / "peft", dense())
    res = cli(
        "convert", src, "--to", "gguf", "--base", base_folder(tmp_path / "base"), "--out", tmp_path / "a.gguf"
    )
    if importlib.util.find_spec("adapterdoc.formats.gguf") is None:
        assert res.exit_code == 3 and "gguf format is not available" in res.stderr
    else:
        assert res.exit_code in (0, 3), res.output  # the gguf module's own tests pin what it writes


def test_peft_to_peft_is_a_copy(tmp_path: Path, cli: Any) -> None:
    src = peft_folder(tmp_path / "peft", dense())
    assert cli("convert", src, "--to", "peft", "--out", tmp_path / "copy").exit_code == 0
    a = load_file(str(src / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "copy/adapter_model.safetensors"))
    assert all(a[k].tobytes() == b[k].tobytes() for k in a) and sorted(a) == sorted(b)


def test_convert_imports_no_ml_stack(tmp_path: Path) -> None:
    """A header-and-bytes conversion: no torch, transformers or PEFT."""
    src = peft_folder(tmp_path / "peft", dense())
    code = (
        "import sys\n"
        "from adapterdoc.formats.convert import convert\n"
        f"convert({str(src)!r}, 'mlx', out={str(tmp_path / 'mlx')!r})\n"
        f"convert({str(tmp_path / 'mlx')!r}, 'peft', out={str(tmp_path / 'back')!r})\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------------------------------------ inspect, verify


def test_inspect_shows_the_mlx_format_and_its_evidence(tmp_path: Path, cli: Any) -> None:
    from adapterdoc import formats

    src = peft_folder(tmp_path / "peft", dense())
    assert cli("convert", src, "--to", "mlx", "--out", tmp_path / "mlx").exit_code == 0
    assert formats.detect(tmp_path / "mlx").format == "mlx"
    assert formats.detect(src).format == "peft"
    assert formats.detect(tmp_path) is None
    res = cli("inspect", tmp_path / "mlx", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["kind"] == "mlx" and d["format"]["name"] == "mlx"
    assert "adapter_config.json with fine_tune_type, num_layers, lora_parameters" in d["format"]["evidence"]
    assert d["format"]["rank"] == 4 and d["format"]["layers"] == [0, L - 1] and d["tensors"] == 18
    text = cli("inspect", tmp_path / "mlx").stdout
    assert "format mlx" in text and "tensors 9 .lora_a, 9 .lora_b" in text


def _broken(tmp_path: Path, cli: Any, change: Any) -> Path:
    src = peft_folder(tmp_path / "peft", dense())
    out = tmp_path / "mlx"
    assert cli("convert", src, "--to", "mlx", "--out", out).exit_code == 0
    change(out)
    return out


def _codes(res: Any) -> set[str]:
    """mlx-lm's own rules' codes (AD8xx errors and warnings; the PEFT checks of the one doctor run beside them)."""
    return {
        f["code"]
        for a in json.loads(res.stdout)["adapters"]
        for f in a["findings"]
        if f["code"].startswith("AD8") and f["severity"] != "info"
    }


def test_verify_finds_what_load_adapters_refuses(tmp_path: Path, cli: Any) -> None:
    base = base_folder(tmp_path / "base")
    good = _broken(tmp_path, cli, lambda out: None)
    res = cli("verify", good, "--base", base, "--json")
    assert res.exit_code == 0 and _codes(res) == set(), res.output

    def edit(**fields: Any) -> None:
        cfg = mlx_json(good)
        for k, v in fields.items():
            if k == "keys":
                cfg["lora_parameters"]["keys"] = v
            elif k == "rank":
                cfg["lora_parameters"]["rank"] = v
            else:
                cfg[k] = v
        (good / "adapter_config.json").write_text(json.dumps(cfg))

    edit(num_layers=1)
    res = cli("verify", good, "--base", base, "--json")
    assert res.exit_code == 1 and _codes(res) == {"AD810"}
    assert "set num_layers to 3" in res.stdout
    edit(num_layers=-1, keys=["self_attn.q_proj"])
    assert _codes(cli("verify", good, "--base", base, "--json")) == {"AD811"}
    edit(keys=None, rank=8)
    assert _codes(cli("verify", good, "--base", base, "--json")) == {"AD814"}
    edit(rank=4)
    t = load_file(str(good / "adapters.safetensors"))
    t["model.layers.0.self_attn.q_proj.lora_a"] = np.ascontiguousarray(
        t["model.layers.0.self_attn.q_proj.lora_a"].T
    )
    t["model.layers.0.self_attn.k_proj.lora_a"] = np.zeros((H, 4), np.float32)
    t["model.layers.0.self_attn.k_proj.lora_b"] = np.zeros((4, 8), np.float32)
    save_file(t, str(good / "adapters.safetensors"))
    res = cli("verify", good, "--base", base, "--json")
    assert _codes(res) == {"AD812", "AD813", "AD814"}  # the transposed lora_a also carries rank 16
    cfg = mlx_json(good)
    del cfg["lora_parameters"]
    (good / "adapter_config.json").write_text(json.dumps(cfg))
    assert _codes(cli("verify", good, "--base", base, "--json")) == {"AD815"}


def test_roundtrip_covers_peft_mlx_peft(tmp_path: Path) -> None:
    """`roundtrip`'s convert trip (called directly: the whole command runs every other trip too, ~20 s)."""
    from adapterdoc.roundtrip.common import Fail
    from adapterdoc.roundtrip.convert import _compare, convert_roundtrips

    src = peft_folder(tmp_path / "peft", dense())
    (tmp_path / "work").mkdir()
    checks = {c.name: c for c in convert_roundtrips(str(src), str(tmp_path / "work"))}
    assert checks["convert: peft → mlx → peft"].status == "pass", checks
    assert "bit for bit" in checks["convert: peft → mlx → peft"].detail
    # and it fails when a value changes
    back = tmp_path / "work" / "convert-mlx" / "peft"
    t = load_file(str(back / "adapter_model.safetensors"))
    t[f"{W}model.layers.0.self_attn.q_proj.lora_B.weight"][0, 0] += 1.0
    save_file(t, str(back / "adapter_model.safetensors"))
    with pytest.raises(Fail, match="q_proj"):
        _compare(src, back, rounded=False)


def test_lm_head_weight_peft_saves_is_left_out_only_when_it_is_the_bases(tmp_path: Path, cli: Any) -> None:
    """PEFT 0.21 saves `lm_head.base_layer.weight` (the whole weight) beside an lm_head LoRA (probe: real PEFT
    does, see test_mlx_oracle's llama case); mlx-lm has no place for it. Equal to the base's: left out, with a
    note; different (a resized vocabulary): refused."""
    base = base_folder(tmp_path / "base")
    head = np.arange(8 * H, dtype=np.float32).reshape(8, H)
    w = load_file(str(base / "model.safetensors"))
    save_file({**w, "lm_head.weight": head}, str(base / "model.safetensors"))
    mods = {**dense(), "lm_head": (4, H, 8)}
    same = {f"{W}lm_head.base_layer.weight": head}
    src = peft_folder(tmp_path / "same", mods, extra=same)
    res = cli("convert", src, "--to", "mlx", "--base", base, "--out", tmp_path / "a", "--json")
    assert res.exit_code == 0, res.output
    assert any("equal the base's and were left out" in n for n in json.loads(res.stdout)["notes"])
    assert "lm_head" in mlx_json(tmp_path / "a")["lora_parameters"]["keys"]
    src = peft_folder(tmp_path / "other", mods, extra={f"{W}lm_head.base_layer.weight": head + 1})
    res = cli("convert", src, "--to", "mlx", "--base", base, "--out", tmp_path / "b")
    assert res.exit_code == 3 and "(AD801)" in res.stderr


def test_language_model_naming_both_ways(tmp_path: Path, cli: Any) -> None:
    """mlx-lm's Qwen3.5 model is `language_model.model.layers…` for the text class and the VL class alike; back to
    PEFT the VL class is the default (with a note), `--base` a text class gives `model.layers…` again."""
    mods = {
        f"model.layers.{n}.{m}": (4, H, H)
        for n in range(2)
        for m in ("linear_attn.in_proj_qkv", "mlp.down_proj")
    }
    src = peft_folder(tmp_path / "peft", mods, {"target_modules": ["in_proj_qkv", "down_proj"]})
    res = cli("convert", src, "--to", "mlx", "--base", "tiny:qwen3_5_text", "--out", tmp_path / "mlx")
    assert res.exit_code == 0, res.output
    names = sorted(load_file(str(tmp_path / "mlx/adapters.safetensors")))
    assert names[0] == "language_model.model.layers.0.linear_attn.in_proj_qkv.lora_a"
    cfg = mlx_json(tmp_path / "mlx")
    del cfg["adapterdoc"]  # as mlx-lm's own trainer writes it: nothing says the class
    (tmp_path / "mlx/adapter_config.json").write_text(json.dumps(cfg))
    res = cli("convert", tmp_path / "mlx", "--to", "peft", "--out", tmp_path / "vl", "--json")
    assert res.exit_code == 0 and any("VL class" in n for n in json.loads(res.stdout)["notes"])
    assert f"{W}model.language_model.layers.0.mlp.down_proj.lora_A.weight" in load_file(
        str(tmp_path / "vl/adapter_model.safetensors")
    )
    res = cli(
        "convert", tmp_path / "mlx", "--to", "peft", "--base", "tiny:qwen3_5_text", "--out", tmp_path / "text"
    )
    assert res.exit_code == 0, res.output
    back = load_file(str(tmp_path / "text/adapter_model.safetensors"))
    src_t = load_file(str(src / "adapter_model.safetensors"))
    assert sorted(back) == sorted(src_t) and all(back[k].tobytes() == src_t[k].tobytes() for k in back)
