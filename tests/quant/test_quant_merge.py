"""merge into a quantized base (adapterdoc.merge.quantized, .decoded, .survival), on a tiny real Llama whose
projections are stored as block FP8 by the rule transformers' FineGrainedFP8 writes (``s = amax / 448`` per 128×128
block as ``1 / (448 / amax)``, ``q = clamp(W · 448 / amax, ±448)`` in e4m3, ``weight_scale_inv = s``), written here by a transcription independent
of adapterdoc's codec, and a real PEFT adapter: the decoded merge against PEFT's own merge on the decoded base,
``--requantize`` against the same rule applied to ``W + Δ``, the survival verdict, the refusals and the CLI.
The formats' libraries themselves are the oracle in test_quant_merge_real.py."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from adapterdoc.cli import main
from adapterdoc.errors import UnsupportedInputError
from adapterdoc.merge.run import merge
from tests.quant.quant_bases import LLAMA

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
st = pytest.importorskip("safetensors.torch")

BLOCK = 128
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_QC = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]}


def quantize_block_fp8(w: Any) -> tuple[Any, Any]:
    """(e4m3 codes, weight_scale_inv) of a float32 weight, per 128×128 block on the ceil-divided grid."""
    out, inn = w.shape
    rows, cols = -(-out // BLOCK), -(-inn // BLOCK)
    padded = torch.zeros(rows * BLOCK, cols * BLOCK)
    padded[:out, :inn] = w
    blocks = padded.reshape(rows, BLOCK, cols, BLOCK).permute(0, 2, 1, 3)
    amax = blocks.abs().amax(dim=(2, 3))
    forward = torch.where(
        amax > 0, 448.0 / torch.where(amax > 0, amax, 1.0), 1.0
    )  # transformers' Fp8Quantize
    q = (blocks * forward[:, :, None, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    codes = q.permute(0, 2, 1, 3).reshape(rows * BLOCK, cols * BLOCK)[:out, :inn].contiguous()
    return codes, 1.0 / forward


def dequantize_block_fp8(codes: Any, scale: Any) -> Any:
    out, inn = codes.shape
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:out, :inn]
    return codes.float() * full


def _model() -> Any:
    config = transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "architectures"})
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def fp8_base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """(the block-FP8 base folder, its decoded weights by name)."""
    folder = tmp_path_factory.mktemp("fp8-base")
    model = _model()
    stored: dict[str, Any] = {}
    decoded: dict[str, Any] = {}
    for name, t in model.state_dict().items():
        t = t.to(torch.bfloat16)
        if name.endswith("_proj.weight"):
            codes, scale = quantize_block_fp8(t.float())
            stored[name] = codes
            stored[name.removesuffix(".weight") + ".weight_scale_inv"] = scale
            decoded[name] = dequantize_block_fp8(codes, scale)
        else:
            stored[name] = t
            decoded[name] = t.float()
    st.save_file(stored, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {**LLAMA, "quantization_config": FP8_QC, "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder, decoded


def _adapter(folder: Path, scale: float) -> Path:
    """A PEFT LoRA on every projection; ``scale`` sets ‖ΔW‖ against the weights (1.0: about 50%)."""
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=list(PROJ)))
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05 * scale)
    pm.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def strong(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _adapter(tmp_path_factory.mktemp("strong"), 1.0)


@pytest.fixture(scope="module")
def weak(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _adapter(tmp_path_factory.mktemp("weak"), 0.01)


def _peft_merged(decoded: dict[str, Any], adapter: Path) -> dict[str, Any]:
    """PEFT's merge_and_unload on the decoded base, in float32."""
    model = _model().float()
    model.load_state_dict(decoded)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = peft.PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    return {k: v.detach().clone() for k, v in merged.state_dict().items()}


def test_decoded_merge_equals_peft_on_the_decoded_base(fp8_base: Any, strong: Path, tmp_path: Path) -> None:
    base, decoded = fp8_base
    report = merge(strong, base, tmp_path / "out", dtype="float32")
    assert report.ok, report.findings
    assert report.quantization == "fp8-block (8-bit, block 128×128, symmetric)"
    assert [f.code for f in report.findings] == ["AD521"]
    assert report.merged_tensors == len(PROJ)
    ours = st.load_file(str(tmp_path / "out" / "model.safetensors"))
    want = _peft_merged(decoded, strong)
    assert set(ours) == set(want)  # the scales are gone, every weight under its unquantized name
    for name, t in ours.items():
        assert t.dtype == torch.float32
        err = float((t - want[name]).abs().max()) / max(float(want[name].abs().max()), 1e-30)
        assert err <= 1e-6, name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "float32"


def test_default_output_is_the_configs_float_dtype(fp8_base: Any, strong: Path, tmp_path: Path) -> None:
    base, _ = fp8_base
    report = merge(strong, base, tmp_path / "out")
    assert report.ok
    ours = st.load_file(str(tmp_path / "out" / "model.safetensors"))
    assert {t.dtype for t in ours.values()} == {torch.bfloat16}
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"


def test_requantize_writes_the_base_format_bit_for_bit(fp8_base: Any, strong: Path, tmp_path: Path) -> None:
    base, decoded = fp8_base
    report = merge(strong, base, tmp_path / "out", requantize=True)
    assert report.ok, report.findings
    assert report.survival and all(r["survives"] for r in report.survival)
    ours = st.load_file(str(tmp_path / "out" / "model.safetensors"))
    stored = st.load_file(str(base / "model.safetensors"))
    assert {k: (v.dtype, v.shape) for k, v in ours.items()} == {
        k: (v.dtype, v.shape) for k, v in stored.items()
    }
    want = _peft_merged(decoded, strong)
    for name, t in ours.items():
        raw = t.view(-1).view(torch.uint8)
        if not name.endswith(("_proj.weight", "weight_scale_inv")):
            assert torch.equal(raw, stored[name].view(-1).view(torch.uint8)), name  # copied byte for byte
        elif name.endswith(".weight"):
            codes, scale = quantize_block_fp8(want[name])
            assert torch.equal(raw, codes.view(-1).view(torch.uint8)), name
            assert torch.equal(ours[name.removesuffix(".weight") + ".weight_scale_inv"], scale), name
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"] == FP8_QC


def test_dry_run_measures_survival_and_writes_nothing(fp8_base: Any, weak: Path, tmp_path: Path) -> None:
    base, _ = fp8_base
    report = merge(weak, base, None, dry_run=True)
    assert report.out is None and report.tensors == 0
    assert len(report.survival) == len(PROJ)
    row = report.survival[0]
    assert set(row) == {
        "module",
        "group",
        "scheme",
        "codes_changed",
        "delta_kept",
        "cosine",
        "delta_rms_steps",
        "survives",
        "not_encodable",
    }
    assert not any(r["survives"] for r in report.survival)
    for r in report.survival:
        assert isinstance(r["delta_kept"], float) and r["delta_kept"] < 0.9
        assert isinstance(r["delta_rms_steps"], float) and r["delta_rms_steps"] < 1
    codes = {f.code: f.severity for f in report.findings}
    assert codes == {"AD521": "info", "AD522": "warning"}
    assert report.ok  # a warning: the default merge (decoded) keeps the update exactly


def test_requantize_refuses_an_update_that_does_not_survive(
    fp8_base: Any, weak: Path, tmp_path: Path
) -> None:
    base, _ = fp8_base
    out = tmp_path / "out"
    report = merge(weak, base, out, requantize=True)
    assert not report.ok and report.out is None
    lost = [f for f in report.findings if f.code == "AD522"]
    assert len(lost) == len(PROJ) and all(f.severity == "error" for f in lost)  # one per module group
    assert lost[0].key is not None and "*" in lost[0].key
    assert not out.exists() or not any(out.iterdir())


def test_survival_of_a_strong_update(fp8_base: Any, strong: Path) -> None:
    base, _ = fp8_base
    report = merge(strong, base, None, dry_run=True)
    for r in report.survival:
        assert r["survives"] and isinstance(r["delta_kept"], float) and abs(r["delta_kept"] - 1) < 0.1
        assert isinstance(r["codes_changed"], float) and r["codes_changed"] > 0.5
    assert [f.code for f in report.findings] == ["AD521"]


def test_an_undecodable_quantization_is_refused(tmp_path: Path, strong: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    st.save_file({"model.embed_tokens.weight": torch.zeros(320, 256)}, str(base / "model.safetensors"))
    (base / "config.json").write_text(json.dumps({**LLAMA, "quantization_config": {"quant_method": "hqq"}}))
    report = merge(strong, base, tmp_path / "out")
    assert [f.code for f in report.findings] == ["AD520"]
    assert "quant_method 'hqq'" in report.findings[0].message
    assert report.out is None and not (tmp_path / "out").exists()


def test_requantize_needs_a_quantized_base(fp8_base: Any, strong: Path, tmp_path: Path) -> None:
    base = tmp_path / "plain"
    base.mkdir()
    model = _model()
    st.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(base / "model.safetensors"))
    (base / "config.json").write_text(json.dumps(LLAMA))
    with pytest.raises(UnsupportedInputError, match="--requantize needs a quantized base"):
        merge(strong, base, tmp_path / "out", requantize=True)


def test_cli_dry_run_needs_no_out_and_prints_the_table(fp8_base: Any, weak: Path) -> None:
    base, _ = fp8_base
    runner = CliRunner()
    r = runner.invoke(main, ["merge", str(weak), "--base", str(base), "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout)
    assert body["dry_run"] is True and body["out"] is None and len(body["survival"]) == len(PROJ)
    r = runner.invoke(main, ["merge", str(weak), "--base", str(base), "--dry-run"], env={"COLUMNS": "80"})
    assert r.exit_code == 0
    assert "dry run: nothing written" in r.stdout
    assert "self_attn.q_proj" in r.stdout and "lost" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    r = runner.invoke(main, ["merge", str(weak), "--base", str(base), "--requantize", "--out", "x"])
    assert r.exit_code == 1 and "AD522" in r.stdout
    r = runner.invoke(main, ["merge", str(weak), "--base", str(base)])
    assert r.exit_code == 2 and "--out" in r.output


def test_the_decoded_update_matches_the_reference_rule() -> None:
    """The test's own FP8 transcription round-trips (guards the reference above)."""
    torch.manual_seed(3)
    w = torch.randn(200, 300)
    codes, scale = quantize_block_fp8(w)
    assert tuple(scale.shape) == (2, 3)
    back = dequantize_block_fp8(codes, scale)
    assert float((back - w).abs().max()) <= float(w.abs().max()) * 2**-3
    assert math.isclose(float(back.abs().max()), float(w.abs().max()), rel_tol=1e-6)


def test_inspect_weights_on_a_quantized_base_shows_the_same_table(fp8_base: Any, weak: Path) -> None:
    from adapterdoc.inspection import inspect

    base, _ = fp8_base
    report = inspect(weak, base=base)
    assert report.weights is not None  # --base implies --weights
    assert report.requantized is not None
    dry = merge(weak, base, None, dry_run=True)
    assert report.requantized["modules"] == dry.survival
    assert report.requantized["quantization"] == dry.quantization
    assert {f.code for f in report.findings if f.code.startswith("AD52")} == {"AD522"}
    r = CliRunner().invoke(main, ["inspect", str(weak), "--base", str(base)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "requantized on" in r.stdout and "self_attn.q_proj" in r.stdout
    r = CliRunner().invoke(main, ["inspect", str(weak), "--base", str(base), "--json"])
    assert json.loads(r.stdout)["requantized"]["modules"] == dry.survival


def test_the_light_install_names_the_extra(
    fp8_base: Any, strong: Path, light_venv: Any, tmp_path: Path
) -> None:
    """Without torch, merge (plain or quantized base, dry run or not) is one exit-3 line naming the ML extra (it was
    exit 4, `No module named 'torch'`, on a plain base too), and nothing is written."""
    import subprocess

    base, _ = fp8_base
    plain = tmp_path / "plain"
    plain.mkdir()
    st.save_file(
        {k: v.contiguous() for k, v in _model().state_dict().items()}, str(plain / "model.safetensors")
    )
    (plain / "config.json").write_text(json.dumps(LLAMA))
    for args in (
        ("merge", strong, "--base", plain, "--out", tmp_path / "o1"),
        ("merge", strong, "--base", base, "--out", tmp_path / "o2"),
        ("merge", strong, "--base", base, "--dry-run"),
    ):
        cmd = [str(light_venv.python), "-m", "adapterdoc", *map(str, args)]
        res = subprocess.run(
            cmd, capture_output=True, text=True, env=light_venv.env, cwd=tmp_path, timeout=300
        )
        assert res.returncode == 3, res.stdout + res.stderr
        assert res.stderr.count("\n") == 1 and "pip install torch==2.13.0 'adapterdoc[ml]'" in res.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
