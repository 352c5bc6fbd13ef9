"""One doctor for every format: the same adapter as a PEFT folder, an MLX folder and a GGUF file gets the same
verdict and the same codes from ``verify`` (issue 39).

Each defect is made in PEFT form with real PEFT on a tiny real model, then written to MLX and GGUF by
``adapterdoc convert`` (the exact conversions), and each of the three is verified against the same base. The
format's own container codes (AD8xx: what mlx-lm and llama.cpp say of the file itself) are left out of the
comparison: they are added to the doctor's findings, never in their place."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")
pytest.importorskip("gguf")

from tests.formats.gguf_helpers import generic_config, peft_adapter

pytestmark = pytest.mark.ml

FORMATS = ("peft", "mlx", "gguf")
TARGETS = ["q_proj", "v_proj", "down_proj"]


def _llama(folder: Path, seed: int = 0, **overrides: Any) -> Any:
    """A tiny Llama (outside the layout registry, the family most users train) saved with its weights."""
    import torch
    import transformers

    cfg = generic_config("llama")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(folder)
    return model


def _edit(folder: Path, change: Any) -> Path:
    """Rewrite ``folder``'s adapter tensors with ``change(name, tensor)`` (in place)."""
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    tensors = load_file(path)
    for name, t in tensors.items():
        change(name, t)
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """name → (the PEFT adapter folder, the --base config folder its conversions use); and the shared base."""
    d = tmp_path_factory.mktemp("one-doctor")
    base_model = _llama(d / "base")
    out: dict[str, Any] = {"base": d / "base"}
    good = peft_adapter(base_model, d / "good", target_modules=TARGETS)
    out["good"] = (good, d / "base")

    zero = _edit(Path(shutil.copytree(good, d / "zero")), lambda n, t: t.zero_() if "lora_B" in n else None)
    out["zero"] = (zero, d / "base")

    def nan(name: str, t: Any) -> None:
        if name.endswith("layers.0.self_attn.q_proj.lora_A.weight"):
            t[0, 0] = math.nan

    out["nan"] = (_edit(Path(shutil.copytree(good, d / "nan")), nan), d / "base")

    # trained on a wider MLP: down_proj's lora_A is [r, 128] where the base builds [r, 96]
    wide = _llama(d / "wide-base", intermediate_size=128)
    out["shape"] = (peft_adapter(wide, d / "shape", target_modules=TARGETS), d / "wide-base")

    # trained on a deeper model: the keys of layer 2 match nothing on the two-layer base
    deep = _llama(d / "deep-base", num_hidden_layers=3)
    out["extra"] = (peft_adapter(deep, d / "extra", target_modules=TARGETS), d / "deep-base")
    return out


@pytest.fixture(scope="module")
def vl_case(tmp_path_factory: pytest.TempPathFactory, tiny_model: Any) -> tuple[Path, str]:
    """A Qwen3.5 VL adapter (the registry's tiny model, real PEFT) with the text-only base it must not pass on."""
    d = tmp_path_factory.mktemp("one-doctor-vl")
    model = tiny_model("qwen3_5_vl")
    adapter = peft_adapter(model, d / "vl", target_modules=["q_proj", "v_proj"], exclude_modules=["visual"])
    return adapter, "tiny:qwen3_5_text"


def _convert(cli: Any, src: Path, to: str, base: Path | str) -> Path:
    if to == "peft":
        return src
    out = src.parent / (f"{src.name}.gguf" if to == "gguf" else f"{src.name}-mlx")
    if not out.exists():
        r = cli("convert", src, "--to", to, "--base", base, "--out", out)
        assert r.exit_code in (0, 1) and out.exists(), r.output  # 1: convert's weight checks found the defect
    return out


def _verdict(cli: Any, adapter: Path, base: Path | str) -> tuple[int, list[str], dict[str, Any]]:
    r = cli("verify", adapter, "--base", base, "--json")
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(r.stdout)
    (rep,) = doc["adapters"]
    codes = sorted(
        {
            f["code"]
            for f in rep["findings"]
            if f["severity"] in ("error", "warning") and not f["code"].startswith("AD8")
        }
    )
    return r.exit_code, codes, rep


@pytest.mark.parametrize("case", ["good", "zero", "nan", "shape", "extra"])
def test_every_format_gets_the_peft_verdict(cli: Any, cases: dict[str, Any], case: str) -> None:
    src, own_base = cases[case]
    got = {fmt: _verdict(cli, _convert(cli, src, fmt, own_base), cases["base"]) for fmt in FORMATS}
    peft_rc, peft_codes, peft_rep = got["peft"]
    expected_rc = 0 if case == "good" else 1
    assert peft_rc == expected_rc, peft_codes
    for fmt in ("mlx", "gguf"):
        rc, codes, rep = got[fmt]
        assert (rc, codes) == (peft_rc, peft_codes), fmt
        assert rep["lora_b"] == peft_rep["lora_b"], fmt
        assert sorted(rep["missing"]) == sorted(peft_rep["missing"]), fmt
        assert sorted(rep["unexpected"]) == sorted(peft_rep["unexpected"]), fmt
        assert sorted(rep["shape_mismatch"]) == sorted(peft_rep["shape_mismatch"]), fmt
        assert rep["config"]["format"] == fmt
    if case == "zero":
        assert "AD301" in peft_codes and peft_rep["lora_b"]["nonzero"] == 0
    if case == "nan":
        assert peft_rep["nonfinite"]


def test_vl_adapter_on_text_base(cli: Any, vl_case: tuple[Path, str]) -> None:
    """In PEFT form a Qwen3.5 VL adapter fails on the text-only class (AD223: its keys say
    ``model.language_model.``). Neither runtime format carries that distinction: mlx-lm's ``qwen3_5`` model wraps
    the text model as ``language_model.model.`` for a VL and a text config alike (``mlx_lm/models/qwen3_5.py``), and
    llama.cpp writes both classes as one architecture with one set of tensor names (``layouts/gguf.py``). So the
    same file loads on either base, and the doctor, reading it for the base given, passes it on both."""
    src, text_base = vl_case
    peft_rc, peft_codes, _ = _verdict(cli, src, text_base)
    assert peft_rc == 1 and "AD223" in peft_codes
    for fmt in ("mlx", "gguf"):
        converted = _convert(cli, src, fmt, "tiny:qwen3_5_vl")
        for base in (text_base, "tiny:qwen3_5_vl"):
            rc, codes, rep = _verdict(cli, converted, base)
            assert (rc, codes) == (0, []), (fmt, base)
            assert rep["lora_b"] == {"nonzero": 2, "total": 2}
            assert not rep["missing"] and not rep["unexpected"]


@pytest.mark.parametrize("case", ["good", "zero", "nan", "shape", "extra"])
def test_every_case_against_a_gguf_model_gets_the_peft_verdict(
    cli: Any, cases: dict[str, Any], tmp_path: Path, case: str
) -> None:
    """Against a base only llama.cpp reads (the base model's GGUF, with the hyperparameters convert_hf_to_gguf.py
    writes), the same exit code as the PEFT folder on the Hugging Face base: the weight checks run on the PEFT view
    (AD301, NaN/Inf: the same codes), and the keys and shapes by llama.cpp's rules (a wrong shape is AD856, an extra
    layer AD855: llama.cpp's own words for what PEFT calls AD222 / AD221)."""
    from tests.formats.gguf_helpers import base_tensors, write_gguf

    hp = {"llama.block_count": 2, "llama.embedding_length": 64}
    hp |= {"llama.attention.head_count": 4, "llama.attention.head_count_kv": 2}
    base = write_gguf(tmp_path / "base.gguf", "llama", base_tensors(), kv=hp, adapter=False)
    src, own_base = cases[case]
    peft_rc, peft_codes, peft_rep = _verdict(cli, src, cases["base"])
    rc, codes, rep = _verdict(cli, _convert(cli, src, "gguf", own_base), base)
    assert rc == peft_rc, (case, codes, peft_codes)
    weight_codes = {"AD301", "AD302", "AD303", "AD304"}
    assert set(codes) & weight_codes == set(peft_codes) & weight_codes
    if case in ("good", "zero", "nan"):
        assert rep["lora_b"] == peft_rep["lora_b"] and bool(rep["nonfinite"]) == bool(peft_rep["nonfinite"])
    errors = {f["code"] for f in rep["findings"] if f["severity"] == "error"}
    want = {"shape": "AD856", "extra": "AD855"}.get(case)
    assert want is None or want in errors, errors


def test_convert_says_when_what_it_wrote_is_inert(cli: Any, cases: dict[str, Any], tmp_path: Path) -> None:
    """A zero adapter written as GGUF or MLX (or PEFT from either) is AD301, exit 1; the file is still written."""
    zero, own_base = cases["zero"]
    for to, out in (("gguf", tmp_path / "z.gguf"), ("mlx", tmp_path / "z-mlx")):
        r = cli("convert", zero, "--to", to, "--base", own_base, "--out", out, "--json")
        doc = json.loads(r.stdout)
        assert r.exit_code == 1 and not doc["ok"], r.output
        assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["AD301"]
        assert out.exists()
        back = cli("convert", out, "--to", "peft", "--base", own_base, "--out", tmp_path / f"back-{to}")
        assert back.exit_code == 1 and "AD301" in back.output
    good = cli("convert", cases["good"][0], "--to", "gguf", "--base", own_base, "--out", tmp_path / "g.gguf")
    assert good.exit_code == 0 and "AD3" not in good.output


def test_inspect_weights_audits_the_peft_view(cli: Any, cases: dict[str, Any]) -> None:
    zero, own_base = cases["zero"]
    for fmt in ("mlx", "gguf"):
        path = _convert(cli, zero, fmt, own_base)
        r = cli("inspect", path, "--weights", "--json")
        doc = json.loads(r.stdout)
        assert r.exit_code == 1, r.output
        assert doc["weights"]["modules"] == doc["weights"]["inert"] == 6
        assert len(doc["modules"]) == 6 and all(m["inert"] for m in doc["modules"])
        assert "adapterdoc-view" not in r.stdout  # the temporary view is never named
        assert {f["code"] for f in doc["findings"] if f["severity"] == "error"} == {"AD310"}


@pytest.mark.parametrize(
    "command", [("remap", "--vl"), ("roundtrip",), ("merge", "--base", "BASE", "--out", "OUT")]
)
def test_peft_only_commands_name_the_format_and_the_convert(
    cli: Any, cases: dict[str, Any], tmp_path: Path, command: tuple[str, ...]
) -> None:
    good, own_base = cases["good"]
    for fmt, words in (("mlx", "is an MLX adapter (mlx-lm)"), ("gguf", "is a GGUF file (llama.cpp)")):
        path = _convert(cli, good, fmt, own_base)
        args = [
            str(own_base) if a == "BASE" else str(tmp_path / f"out-{fmt}") if a == "OUT" else a
            for a in command
        ]
        r = cli(args[0], path, *args[1:])
        assert r.exit_code == 3, r.output
        assert words in r.stderr and f"adapterdoc convert {path} --to peft" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_a_model_gguf_and_a_foreign_file_say_what_they_are(cli: Any, tmp_path: Path) -> None:
    from tests.formats.gguf_helpers import base_tensors, write_gguf

    model = write_gguf(tmp_path / "model.gguf", "llama", base_tensors(), adapter=False)
    r = cli("inspect", model)
    assert r.exit_code == 3 and "is a model GGUF (llama.cpp), not an adapter" in r.stderr
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    r = cli("inspect", junk)
    assert r.exit_code == 3 and "not a safetensors file" in r.stderr


def test_a_llama_base_is_not_called_ambiguous(cli: Any, cases: dict[str, Any]) -> None:
    """A Llama outside the registry: no AD209 "ambiguous (candidates: qwen3_5_text, ...)", no "base unknown"."""
    good, _ = cases["good"]
    r = cli("verify", good, "--base", cases["base"])
    assert r.exit_code == 0, r.output
    assert "AD209" not in r.output and "base unknown" not in r.output
    assert "a family outside the layout registry" in r.output


def test_the_light_install_gives_the_same_verdict_or_names_the_extra(
    cli: Any, vl_case: tuple[Path, str], cases: dict[str, Any], light_venv: Any, tmp_path: Path
) -> None:
    """No numpy, no torch: an MLX folder is read into its PEFT view with the standard library and gets the full
    install's verdict; a GGUF file's tensors need numpy and gguf-py, so its verify is one exit-3 line naming the
    ``gguf`` extra (the container rules alone would be a thinner doctor)."""
    import subprocess

    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.ml.tiny import tiny_config

    src, _ = vl_case
    cfg = tiny_config("qwen3_5_text")
    cfg.architectures = [LAYOUTS["qwen3_5_text"].model_class]
    cfg.save_pretrained(
        tmp_path / "text-base"
    )  # a config.json base: the light gate decides it from the registry
    text_base = str(tmp_path / "text-base")
    mlx = _convert(cli, src, "mlx", "tiny:qwen3_5_vl")
    zero_mlx = tmp_path / "zero-mlx"
    shutil.copytree(mlx, zero_mlx)
    from safetensors.numpy import load_file, save_file

    w = load_file(str(zero_mlx / "adapters.safetensors"))
    save_file(
        {k: v * 0 if k.endswith("lora_b") else v for k, v in w.items()},
        str(zero_mlx / "adapters.safetensors"),
    )
    for adapter, want in ((mlx, 0), (zero_mlx, 1)):
        full = cli("verify", adapter, "--base", text_base, "--json")
        light = subprocess.run(
            [
                str(light_venv.python),
                "-m",
                "adapterdoc",
                "verify",
                str(adapter),
                "--base",
                text_base,
                "--json",
            ],
            capture_output=True,
            text=True,
            env=light_venv.env,
            timeout=300,
        )
        assert full.exit_code == light.returncode == want, light.stderr
        f, g = json.loads(full.stdout)["adapters"][0], json.loads(light.stdout)["adapters"][0]
        assert [x["code"] for x in f["findings"]] == [x["code"] for x in g["findings"]]
        assert f["lora_b"] == g["lora_b"]
    weights = subprocess.run(
        [str(light_venv.python), "-m", "adapterdoc", "inspect", str(zero_mlx), "--weights"],
        capture_output=True,
        text=True,
        env=light_venv.env,
        timeout=300,
    )
    assert weights.returncode == 3 and "adapterdoc[weights]" in weights.stderr
    assert weights.stderr.startswith(f"adapterdoc: error: {zero_mlx}: ")  # never the temporary view's path
    gguf = _convert(cli, cases["good"][0], "gguf", cases["base"])
    light = subprocess.run(
        [str(light_venv.python), "-m", "adapterdoc", "verify", str(gguf), "--base", text_base],
        capture_output=True,
        text=True,
        env=light_venv.env,
        timeout=300,
    )
    assert light.returncode == 3 and "adapterdoc[gguf]" in light.stderr, light.stderr
    assert len(light.stderr.strip().splitlines()) == 1 and "Traceback" not in light.stderr


def test_a_fifo_is_named_never_opened(tmp_path: Path, cases: dict[str, Any]) -> None:
    """A FIFO where a GGUF, a safetensors file or an MLX folder's tensors should be: one exit-3 line saying so,
    never a read that waits for a writer (it hung before)."""
    import os
    import subprocess
    import sys

    mlx = tmp_path / "mlx"
    mlx.mkdir()
    (mlx / "adapter_config.json").write_text(json.dumps({"fine_tune_type": "lora"}))
    for fifo in (tmp_path / "a.gguf", tmp_path / "a.safetensors", mlx / "adapters.safetensors"):
        os.mkfifo(fifo)
    for target in (tmp_path / "a.gguf", tmp_path / "a.safetensors", mlx):
        for args in (["inspect", target], ["verify", target, "--base", cases["base"]]):
            r = subprocess.run(
                [sys.executable, "-m", "adapterdoc", *map(str, args)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert r.returncode == 3, (args, r.stderr)
            assert "is a FIFO (named pipe), not a regular file" in r.stderr.splitlines()[-1]


def _rewrite_gguf(src: Path, dst: Path, *, alpha: float | None = None, prov: Any = None) -> Path:
    """``src`` written again by gguf-py with ``adapter.lora.alpha`` and/or adapterdoc's metadata changed."""
    import gguf
    import numpy as np

    from adapterdoc.formats.gguf.header import PROVENANCE, read_header

    header = read_header(src)
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, header.get_str("general.architecture"))
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", header.kv["adapter.lora.alpha"] if alpha is None else alpha)
    text = header.kv[PROVENANCE]
    w.add_string(PROVENANCE, text if prov is None else json.dumps(prov(json.loads(text))))
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data).reshape(tuple(reversed([int(d) for d in t.shape]))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_the_gguf_file_wins_over_adapterdoc_metadata(cli: Any, cases: dict[str, Any], tmp_path: Path) -> None:
    """llama.cpp runs the file: an edited adapter.lora.alpha (how its users retune a scale) is what the PEFT view
    and convert --to peft carry, not the stored PEFT config; metadata naming one module twice (which would drop a
    pair) is not trusted."""
    good, own_base = cases["good"]
    src = _convert(cli, good, "gguf", own_base)
    retuned = _rewrite_gguf(src, tmp_path / "alpha16.gguf", alpha=16.0)
    r = cli("convert", retuned, "--to", "peft", "--out", tmp_path / "back", "--json")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "back" / "adapter_config.json").read_text())
    assert cfg["lora_alpha"] == 16.0 and cfg["r"] == 4  # llama.cpp's scale 16 / 4, not the stored 8 / 4
    assert any("rebuilt from the file" in n for n in json.loads(r.stdout)["notes"])
    v = cli("verify", retuned, "--base", cases["base"], "--json")
    assert "scaling lora_alpha / r = 4" in v.stdout

    def twice(p: dict[str, Any]) -> dict[str, Any]:
        mods = p["modules"]
        names = sorted(mods)
        mods[names[1]] = mods[names[0]]  # two pairs onto one module
        return p

    lying = _rewrite_gguf(src, tmp_path / "twice.gguf", prov=twice)
    r = cli("convert", lying, "--to", "peft", "--base", own_base, "--out", tmp_path / "back2")
    assert r.exit_code == 0, r.output
    from safetensors.numpy import load_file

    got = load_file(str(tmp_path / "back2" / "adapter_model.safetensors"))
    want = load_file(str(good / "adapter_model.safetensors"))
    assert set(got) == set(want) and all((got[k] == want[k]).all() for k in want)  # the name map: every pair


def test_a_stranger_s_broken_inputs_get_their_own_reason(
    cli: Any, cases: dict[str, Any], tmp_path: Path
) -> None:
    """The second reader's trial: each broken input is named for what is wrong with it, with the same exit code
    whichever command reads it."""
    from tests.formats.gguf_helpers import base_tensors, write_gguf

    good, own_base = cases["good"]
    mlx = _convert(cli, good, "mlx", own_base)
    bad_json = Path(shutil.copytree(mlx, tmp_path / "bad-json"))
    (bad_json / "adapter_config.json").write_text("{not json")
    cut = Path(shutil.copytree(mlx, tmp_path / "cut"))
    w = cut / "adapters.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    for folder, words in ((bad_json, "adapter_config.json: cannot read"), (cut, "file truncated")):
        for args in (
            ["inspect", folder],
            ["verify", folder, "--base", cases["base"]],
            ["convert", folder, "--to", "peft"],
        ):
            r = cli(*args)
            assert r.exit_code == 3 and words in r.stderr, (args, r.stderr)
    model = write_gguf(tmp_path / "model.gguf", "llama", {**base_tensors()}, adapter=False)
    r = cli("verify", model, "--base", cases["base"])
    assert r.exit_code == 3 and "is a model GGUF (llama.cpp), not an adapter" in r.stderr
    r = cli("remap", model, "--vl")
    assert r.exit_code == 3 and "a model GGUF is no adapter" in r.stderr
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"GGU")
    for args in (["inspect", empty], ["verify", empty, "--base", model]):
        r = cli(*args)
        assert r.exit_code == 3 and "is not a GGUF file: it does not start with the GGUF magic" in r.stderr, (
            args
        )
    # against a GGUF model: a PEFT adapter is named (not the base); a serving profile or --load needs the HF model
    r = cli("verify", good, "--base", model)
    assert r.exit_code == 3 and f"{good}: is not a GGUF adapter" in r.stderr
    gguf = _convert(cli, good, "gguf", own_base)
    for extra in (["--profile", "vllm"], ["--load"]):
        r = cli("verify", gguf, "--base", model, *extra)
        assert r.exit_code == 3 and "needs the Hugging Face model" in r.stderr, extra
    # a file its container rules refuse: exit 1 from inspect, inspect --weights and verify without --base alike
    import gguf as gg
    import numpy as np

    half = tmp_path / "half.gguf"
    wr = gg.GGUFWriter(half, "llama")
    wr.add_type("adapter")
    wr.add_string("adapter.type", "lora")
    wr.add_float32("adapter.lora.alpha", 8.0)
    wr.add_tensor("blk.0.attn_q.weight.lora_a", np.ones((4, 64), np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    codes = set()
    for args in (
        ["inspect", half],
        ["inspect", half, "--weights"],
        ["verify", half],
        ["verify", half, "--base", model],
    ):
        r = cli(*args, "--json")
        assert r.exit_code == 1, (args, r.output)
        codes |= {f["code"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"}
    assert codes == {"AD854"}


def _fp8_base(plain: Path, out: Path) -> Path:
    """``plain`` stored as block FP8 the way transformers' FineGrainedFP8 writes it: every decoder projection's
    weight as F8_E4M3 with its ``weight_scale_inv`` per 128×128 block (``amax / 448``), the rest as it was, and
    ``quantization_config`` in config.json."""
    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir()
    tensors = load_file(plain / "model.safetensors")
    stored: dict[str, Any] = {}
    for name, t in tensors.items():
        if ".layers." in name and name.endswith("_proj.weight"):
            rows, cols = (math.ceil(n / 128) for n in t.shape)
            scale = torch.empty(rows, cols)
            q = torch.empty(t.shape, dtype=torch.float8_e4m3fn)
            for i in range(rows):
                for j in range(cols):
                    block = t[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128].float()
                    s = block.abs().max().clamp(min=1e-12) / 448
                    scale[i, j] = s
                    q[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128] = (block / s).to(torch.float8_e4m3fn)
            stored[name], stored[name + "_scale_inv"] = q, scale
        else:
            stored[name] = t
    save_file(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((plain / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
    }
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("case", ["good", "zero", "nan", "shape", "extra"])
def test_every_format_on_a_quantized_base_gets_the_verdict_of_its_plain_base(
    cli: Any, cases: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, case: str
) -> None:
    """The same base stored as block FP8: every format gets the verdict it gets on the plain base (exit code,
    error and warning codes, missing/unexpected/shape lists, lora_B counts); the quantization only adds its info
    finding (AD280)."""
    quantized = cases.get("fp8-base")
    if quantized is None:
        quantized = cases["fp8-base"] = _fp8_base(cases["base"], tmp_path_factory.mktemp("fp8") / "base")
    src, own_base = cases[case]
    for fmt in FORMATS:
        adapter = _convert(cli, src, fmt, own_base)
        plain_rc, plain_codes, plain_rep = _verdict(cli, adapter, cases["base"])
        rc, codes, rep = _verdict(cli, adapter, quantized)
        assert (rc, codes) == (plain_rc, plain_codes), fmt
        for field in ("lora_b", "missing", "unexpected", "shape_mismatch"):
            assert rep[field] == plain_rep[field], (fmt, field)
        assert "AD280" in {f["code"] for f in rep["findings"]}, fmt
