"""Every output of the algebra passes ``verify`` against its base (issue 43): ``adapterdoc verify OUT --base BASE
--json`` exits 0 with no error finding on what ``combine`` (cat, svd, ties, dare), ``resize`` (``--rank``,
``--energy`` with per-module ranks, ``--to-lora``) and ``extract`` write, on a plain tiny Llama and on a registry
layout (ministral3_text), with LoRA on an embedding among the modules."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from tests.algebra.llama_helpers import tiny_llama  # noqa: E402
from tests.algebra.peft_helpers import LAYOUT, make_adapter  # noqa: E402


class Case(NamedTuple):
    base: Path
    tuned: Path
    a: Path
    b: Path
    dora: Path


def _tuned(base: Any) -> Any:
    """The base with its first q_proj and its embedding changed (the full fine-tune ``extract`` reads)."""
    tuned = copy.deepcopy(base)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in (tuned.model.layers[0].self_attn.q_proj.weight, tuned.model.embed_tokens.weight):
            p += 0.05 * torch.randn(p.shape, generator=gen)
    return tuned


def _dora(base: Any, folder: Path) -> Path:
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "embed_tokens"], use_dora=True)
    pm = get_peft_model(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_magnitude_vector" in name:
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    pm.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["llama", LAYOUT])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    from adapterdoc.ml.tiny import build_tiny

    root = tmp_path_factory.mktemp(request.param)
    base = tiny_llama() if request.param == "llama" else build_tiny(LAYOUT)
    base.save_pretrained(root / "base")
    _tuned(base).save_pretrained(root / "tuned")
    a = make_adapter(base, root / "a", 1, target_modules=["q_proj", "v_proj", "embed_tokens"])
    b = make_adapter(
        base,
        root / "b",
        2,
        r=6,
        lora_alpha=3,
        use_rslora=True,
        rank_pattern={"model.layers.1.self_attn.v_proj": 3},
    )
    return Case(root / "base", root / "tuned", a, b, _dora(base, root / "dora"))


def _command(c: Case, which: str) -> list[Any]:
    """The adapterdoc command line writing output ``which`` (without ``--out``)."""
    pair = ["combine", c.a, c.b, "--weights", "0.7,-0.5", "--method"]
    return {
        "combine_cat": [*pair, "cat"],
        "combine_svd": [*pair, "svd", "--rank", "4"],
        "combine_ties": [*pair, "ties", "--density", "0.5", "--rank", "4"],
        "combine_dare": [*pair, "dare", "--density", "0.5", "--seed", "3"],
        "resize_rank": ["resize", c.a, "--rank", "2"],
        "resize_energy": ["resize", c.b, "--energy", "0.9"],
        "resize_to_lora": ["resize", c.dora, "--to-lora", "--base", c.base, "--rank", "3"],
        "extract": ["extract", "--base", c.base, "--tuned", c.tuned, "--rank", "3"],
    }[which]


OUTPUTS = [
    "combine_cat",
    "combine_svd",
    "combine_ties",
    "combine_dare",
    "resize_rank",
    "resize_energy",
    "resize_to_lora",
    "extract",
]


@pytest.mark.parametrize("which", OUTPUTS)
def test_output_passes_verify_against_the_base(case: Case, which: str, tmp_path: Path, cli: Any):
    out = tmp_path / "out"
    made = cli(*_command(case, which), "--out", out)
    assert made.exit_code == 0, made.stderr
    if which == "resize_energy":
        assert json.loads((out / "adapter_config.json").read_text())["rank_pattern"]  # per-module ranks
    res = cli("verify", out, "--base", case.base, "--json")
    body = json.loads(res.stdout)
    errors = [f for a in body["adapters"] for f in a["findings"] if f["severity"] == "error"]
    assert res.exit_code == 0 and not errors, (res.exit_code, errors, res.stderr)
