"""``verify --load`` on the tiny bases the real libraries wrote (``-m oracle``; environment: .ci/oracles/quant.sh):
exit 0 or 3, never 4, and stderr holds adapterdoc's lines only (no progress bars, loguru or bitsandbytes lines).

In the quant environment (compressed-tensors, bitsandbytes) the compressed-tensors bases load dequantized, the
bitsandbytes ones as 4-bit / int8 layers; GPTQ and AWQ need gptqmodel (sdist-only here) and DeepSeek's block FP8 with
a ceil-divided scale grid is refused by transformers' own FP8 conversion: one exit-3 line each. The main interpreter
(neither library) gives the install line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.oracle]
ROOT = Path(__file__).resolve().parents[2]
ADAPTER = """
import sys, torch
from transformers import LlamaForCausalLM
from peft import LoraConfig, get_peft_model
torch.manual_seed(0)
m = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
get_peft_model(m, cfg).save_pretrained(sys.argv[2])
"""
LOADS = ("ct-fp8-block", "ct-fp8-dynamic", "ct-nvfp4", "ct-w4a16", "bnb-nf4", "bnb-fp4", "bnb-int8")
"""Bases the quant environment loads (exit 0)."""
TRANSFORMERS_ONLY = ("fp8-transformers", "fp8-transformers-576")
"""Block FP8 that transformers dequantizes itself (exit 0 in every environment)."""
REFUSED = {
    "gptq": "loading it needs `optimum`, `gptqmodel` (not installed): pip install optimum gptqmodel",
    "awq": "loading it needs `gptqmodel` (not installed): pip install gptqmodel",
    "fp8-deepseek": "transformers (FineGrainedFP8) could not load it: RuntimeError: ",
}
INSTALL = {
    "ct": "pip install 'compressed-tensors>=0.15.0'",
    "bnb": "pip install 'bitsandbytes>=0.46.1'",
}


@pytest.fixture(scope="module")
def made(real_bases: tuple[Path, Path]) -> tuple[Path, Path]:
    python, root = real_bases
    for width in ("576", "768"):
        r = subprocess.run(
            [str(python), "-c", ADAPTER, str(root / f"_bf16-{width}"), str(root / f"adapter-{width}")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-4000:]
    return python, root


def _verify(python: Path, root: Path, name: str) -> subprocess.CompletedProcess[str]:
    width = "576" if name in ("ct-fp8-block", "fp8-deepseek", "fp8-transformers-576") else "768"
    cmd = [
        str(python),
        "-m",
        "adapterdoc",
        "verify",
        str(root / f"adapter-{width}"),
        "--base",
        str(root / name),
    ]
    return subprocess.run([*cmd, "--load"], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize("name", [*LOADS, *TRANSFORMERS_ONLY])
def test_loads_with_its_library_and_stderr_stays_clean(made: tuple[Path, Path], name: str) -> None:
    python, root = made
    r = _verify(python, root, name)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr[-3000:]
    assert "AD235 real PEFT load: 6 LoRA module(s), 0 missing, 0 unexpected" in r.stdout


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_cannot_load_here_is_one_exit_3_line(made: tuple[Path, Path], name: str) -> None:
    python, root = made
    r = _verify(python, root, name)
    assert r.returncode == 3, r.stderr[-3000:]
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"adapterdoc: error: {root / name}: the base is quantized: {name.split('-')[0]}")
    assert REFUSED[name] in line


@pytest.mark.parametrize("name", [*LOADS, *TRANSFORMERS_ONLY])
def test_without_the_library_the_line_names_the_install(made: tuple[Path, Path], name: str) -> None:
    _, root = made
    r = _verify(Path(sys.executable), root, name)
    if name in TRANSFORMERS_ONLY:
        assert (r.returncode, r.stderr) == (0, ""), r.stderr[-3000:]
        return
    if importlib.util.find_spec("compressed_tensors" if name.startswith("ct") else "bitsandbytes"):
        pytest.skip("the main interpreter has the library")
    assert r.returncode == 3, r.stderr[-3000:]
    (line,) = r.stderr.splitlines()
    assert "the base is quantized: " in line and line.endswith(INSTALL[name.split("-")[0]])
