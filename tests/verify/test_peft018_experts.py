"""Fused-expert adapters written by PEFT 0.18 (AD271): PEFT 0.18 reads a 3-D expert parameter ``[E, d1, d2]`` as
``[E, in, out]``, PEFT ≥ 0.19.1 swaps in and out for the experts transformers does not mark ``is_transposed``
(:mod:`adapterdoc.adapter.expert_layout`). The facts are pinned here: the rule table against PEFT's own releases (read from
their ``ParamWrapper``), today's PEFT's shapes on tiny Qwen3-MoE / Mixtral / gpt-oss models, the list of transposed
model types against transformers' source, and, in the oracle suite, what today's PEFT does with adapters a real
``peft==0.18.1`` wrote (``.ci/oracles/peft018.sh``): a size mismatch, or silently wrong logits where the two sizes
are equal, or (gpt-oss) the same logits; verify names each case from ``peft_version``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.adapter.expert_layout import (
    TRANSPOSED_MODEL_TYPES,
    differs_from_today,
    peft_release,
    swap_factors,
    transposed_from_hints,
)

TOL = 1e-5
"""float32, relative to the largest logit."""


# ------------------------------------------------------------------------------------------ the rule (torch-free)


def test_peft_release_reads_what_peft_writes() -> None:
    assert peft_release("0.18.1") == (0, 18, 1)
    assert peft_release("0.19") == (0, 19, 0)
    assert peft_release("0.19.1.dev0") == (0, 19, 1)
    assert peft_release("0.18.2.dev0@1a2b3c") == (0, 18, 2)
    assert peft_release(None) is None
    assert peft_release(18) is None
    assert peft_release("main") is None


@pytest.mark.parametrize(
    ("version", "transposed", "differs"),
    [
        # 0.17/0.18: in = d1 always; right for [E, in, out] experts only
        ("0.17.0", False, True),
        ("0.18.1", False, True),
        ("0.18.1", True, False),
        # 0.19.0 swapped for is_transposed experts only: wrong for both kinds
        ("0.19.0", False, True),
        ("0.19.0", True, True),
        # 0.19.1 on: today's rule
        ("0.19.1", False, False),
        ("0.19.1", True, False),
        ("0.21.2", False, False),
    ],
)
def test_which_peft_writes_today_s_layout(version: str, transposed: bool, differs: bool) -> None:
    release = peft_release(version)
    assert release is not None
    assert differs_from_today(release, transposed) is differs


def test_hints_name_transposed_families_only() -> None:
    assert transposed_from_hints(["GptOssForCausalLM"]) is True
    assert transposed_from_hints(["openai/gpt-oss-20b"]) is True
    assert transposed_from_hints(["rhymes-ai/Aria"]) is True
    assert transposed_from_hints(["Qwen3MoeForCausalLM", "Qwen/Qwen3-30B-A3B"]) is False
    assert transposed_from_hints(["Qwen/Qwen3-30B-A3B"]) is None
    assert transposed_from_hints(["/data/bariatric-moe"]) is None


def test_swap_factors_is_each_expert_transposed_and_its_own_inverse() -> None:
    torch = pytest.importorskip("torch")
    E, r, p, q = 4, 3, 5, 7
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(E * r, p, generator=g), torch.randn(q, r * E, generator=g)
    na, nb = swap_factors(a.numpy().tobytes(), b.numpy().tobytes(), 4, E, r)
    new_a = torch.frombuffer(bytearray(na), dtype=torch.float32).reshape(E * r, q)
    new_b = torch.frombuffer(bytearray(nb), dtype=torch.float32).reshape(p, r * E)
    # PEFT 0.18's delta of (a, b) ([E, p, q]) is PEFT 0.21's swapped delta of (new_a, new_b), exactly
    old = torch.einsum("ore,eri->eio", b.reshape(q, r, E), a.reshape(E, r, p))
    new = torch.einsum("ore,eri->eoi", new_b.reshape(p, r, E), new_a.reshape(E, r, q))
    assert torch.equal(old, new)
    assert swap_factors(na, nb, 4, E, r) == (a.numpy().tobytes(), b.numpy().tobytes())


# ------------------------------------------------------------------------------------------ the facts, pinned


def test_transposed_model_types_are_transformers_own() -> None:
    """Every model type whose experts transformers decorates ``@use_experts_implementation(is_transposed=True)``
    (each modeling file's folder, its configuration classes' ``model_type``), and no other."""
    import re

    tf = pytest.importorskip("transformers")
    models = Path(tf.__file__).parent / "models"
    found: set[str] = set()
    for modeling in models.glob("*/modeling_*.py"):
        text = modeling.read_text(encoding="utf-8")
        if not re.search(r"@use_experts_implementation\([^)]*is_transposed=True", text):
            continue
        for configuration in modeling.parent.glob("configuration_*.py"):
            found |= set(re.findall(r'^\s+model_type = "([^"]+)"', configuration.read_text(), re.M))
    assert found == TRANSPOSED_MODEL_TYPES


def _today_shapes(family: str) -> dict[str, tuple[int, ...]]:
    """The fused-expert factors today's PEFT builds on a tiny ``family`` model (gate_up ``[4, 24, 16]`` or, for
    gpt-oss, ``[4, 16, 24]``; down ``[4, 16, 12]`` / ``[4, 12, 16]``)."""
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    common = dict(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8, num_experts_per_tok=2)  # fmt: skip
    cfg = {
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(
            intermediate_size=24, moe_intermediate_size=12, num_experts=4, **common
        ),
        "mixtral": lambda: tf.MixtralConfig(intermediate_size=12, num_local_experts=4, **common),
        "gpt_oss": lambda: tf.GptOssConfig(
            intermediate_size=12, num_local_experts=4, layer_types=["full_attention"], **common
        ),
    }[family]()
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    pm = get_peft_model(
        model, LoraConfig(r=2, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    )
    return {n: tuple(p.shape) for n, p in pm.named_parameters() if "lora_" in n}


@pytest.mark.ml
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_today_s_peft_reads_the_experts_inputs(family: str) -> None:
    """PEFT ≥ 0.19.1 (installed): lora_A of gate_up reads the hidden size (16) and its lora_B writes 2·I (24), on
    experts stored ``[E, out, in]`` (Qwen3-MoE, Mixtral: ``in`` is dim 2, swapped) and ``[E, in, out]`` (gpt-oss:
    dim 1, not swapped) alike; PEFT 0.18 would give Qwen3-MoE and Mixtral lora_A ``[8, 24]``."""
    shapes = _today_shapes(family)
    gate_up = "model.layers.0.mlp.experts.base_layer"
    down = "model.layers.0.mlp.experts"
    assert shapes[f"base_model.model.{gate_up}.lora_A.default.weight"] == (8, 16)
    assert shapes[f"base_model.model.{gate_up}.lora_B.default.weight"] == (24, 8)
    assert shapes[f"base_model.model.{down}.lora_A.default.weight"] == (8, 12)
    assert shapes[f"base_model.model.{down}.lora_B.default.weight"] == (16, 8)


# ------------------------------------------------------------------------------------------ verify, no oracle


def _findings(cli: Any, adapter: Path, base: Path) -> tuple[int, list[dict[str, Any]]]:
    res = cli("verify", adapter, "--base", base, "--json")
    return res.exit_code, json.loads(res.stdout)["adapters"][0]["findings"]


@pytest.mark.ml
def test_verify_names_an_old_layout_it_reconstructs(tmp_path: Path, cli: Any) -> None:
    """No oracle needed: today's PEFT writes a square gate_up adapter on a tiny Qwen3-MoE, its factors are put
    into PEFT 0.18's layout (:func:`swap_factors`, its own inverse) and ``peft_version`` set to 0.18.1: AD271, exit 1;
    the same tensors with today's ``peft_version``: no AD271. Before the check, verify passed both (the shapes fit)."""
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    cfg = tf.Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=4, num_experts_per_tok=2)  # fmt: skip
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(tmp_path / "base")
    pm = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_parameters=["mlp.experts.gate_up_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.3)
    pm.save_pretrained(tmp_path / "today")
    sd = load_file(str(tmp_path / "today" / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.mlp.experts.lora_{}.weight"
    a, b = swap_factors(sd[key.format("A")].numpy().tobytes(), sd[key.format("B")].numpy().tobytes(), 4, 4, 2)
    sd[key.format("A")] = torch.frombuffer(bytearray(a), dtype=torch.float32).reshape(8, 16)
    sd[key.format("B")] = torch.frombuffer(bytearray(b), dtype=torch.float32).reshape(16, 8)
    for name, version in (("old", "0.18.1"), ("relabelled", "0.21.2")):
        shutil.copytree(tmp_path / "today", tmp_path / name)
        save_file(sd, str(tmp_path / name / "adapter_model.safetensors"))
        raw = json.loads((tmp_path / name / "adapter_config.json").read_text())
        raw["peft_version"] = version
        (tmp_path / name / "adapter_config.json").write_text(json.dumps(raw))
    code, findings = _findings(cli, tmp_path / "old", tmp_path / "base")
    assert code == 1
    (f,) = [f for f in findings if f["code"] == "AD271"]
    assert f["severity"] == "error"
    assert "written by PEFT 0.18.1" in f["message"] and "transposed, without an error" in f["message"]
    assert f["hint"] == f"adapterdoc remap {tmp_path / 'old'} --experts fused --out DIR"
    code, findings = _findings(cli, tmp_path / "relabelled", tmp_path / "base")
    assert "AD271" not in {f["code"] for f in findings}


# ------------------------------------------------------------------------------------------ the oracle: PEFT 0.18.1


@pytest.fixture(scope="module")
def cases(oracle_env: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.verify.peft018_helpers import write_cases

    return write_cases(oracle_env("peft018"), tmp_path_factory.mktemp("peft018"))


@pytest.mark.oracle
def test_peft_0_18_writes_lora_a_over_dim_1(cases: dict[str, Path]) -> None:
    """The recorded facts of PEFT 0.18.1's layout: lora_A ``[E·r, d1]`` and lora_B ``[d2, r·E]`` of every 3-D
    parameter, whichever way transformers stores it; ``peft_version`` 0.18.1 in the config."""
    from safetensors import safe_open

    for name in ("qwen3_moe_pair", "mixtral_pair", "gpt_oss_pair"):
        folder = cases[name]
        facts = json.loads((folder / "facts.json").read_text())
        assert facts["peft"] == "0.18.1"
        assert (
            json.loads((folder / "adapter" / "adapter_config.json").read_text())["peft_version"] == "0.18.1"
        )
        base = facts["base_shapes"]
        with safe_open(str(folder / "adapter" / "adapter_model.safetensors"), "np") as f:
            for module, param in (("experts.base_layer", "gate_up_proj"), ("experts", "down_proj")):
                e, d1, d2 = base[f"model.layers.0.mlp.experts.{param}"]
                key = f"base_model.model.model.layers.0.mlp.{module}.lora_{{}}.weight"
                assert f.get_slice(key.format("A")).get_shape() == [e * 2, d1]
                assert f.get_slice(key.format("B")).get_shape() == [d2, 2 * e]


@pytest.mark.oracle
@pytest.mark.ml
@pytest.mark.parametrize("name", ["qwen3_moe_pair", "mixtral_pair"])
def test_today_s_peft_refuses_a_0_18_adapter(cases: dict[str, Path], name: str) -> None:
    from tests.verify.peft018_helpers import today_logits

    with pytest.raises(RuntimeError, match=r"size mismatch for .*experts\.base_layer\.lora_A"):
        today_logits(cases[name], cases[name] / "adapter")


@pytest.mark.oracle
@pytest.mark.ml
@pytest.mark.parametrize("name", ["qwen3_moe_square", "qwen3_moe_square_class"])
def test_today_s_peft_loads_a_square_0_18_adapter_wrongly(cases: dict[str, Path], name: str) -> None:
    """gate_up ``[4, 16, 16]``: today's PEFT loads it without a word and its logits are not PEFT 0.18's."""
    from tests.verify.peft018_helpers import logits018, rel, today_logits

    _, want = logits018(cases[name])
    assert rel(today_logits(cases[name], cases[name] / "adapter"), want) > 0.05


@pytest.mark.oracle
@pytest.mark.ml
@pytest.mark.parametrize("name", ["gpt_oss_pair", "gpt_oss_down"])
def test_today_s_peft_reads_a_0_18_gpt_oss_adapter_as_0_18_did(cases: dict[str, Path], name: str) -> None:
    from tests.verify.peft018_helpers import logits018, rel, today_logits

    _, want = logits018(cases[name])
    assert rel(today_logits(cases[name], cases[name] / "adapter"), want) <= TOL


@pytest.mark.oracle
@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("qwen3_moe_pair", "refuses 4 of them (size mismatch on load)"),
        ("mixtral_pair", "refuses 4 of them (size mismatch on load)"),
        (
            "qwen3_moe_square",
            "loads 2 of them, whose two sizes are equal, and applies every expert's delta transposed",
        ),
        ("qwen3_moe_square_class", "loads 2 of them, whose two sizes are equal"),
    ],
)
def test_verify_names_a_0_18_adapter(cases: dict[str, Path], cli: Any, name: str, says: str) -> None:
    adapter = cases[name] / "adapter"
    code, findings = _findings(cli, adapter, cases[name] / "base")
    assert code == 1
    (f,) = [f for f in findings if f["code"] == "AD271"]
    assert f["severity"] == "error"
    assert f["message"].startswith("written by PEFT 0.18.1 (adapter_config.json peft_version)")
    assert says in f["message"]
    assert f["hint"] == f"adapterdoc remap {adapter} --experts fused --out DIR"


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["gpt_oss_pair", "gpt_oss_down"])
def test_verify_passes_a_0_18_gpt_oss_adapter(cases: dict[str, Path], cli: Any, name: str) -> None:
    code, findings = _findings(cli, cases[name] / "adapter", cases[name] / "base")
    assert "AD271" not in {f["code"] for f in findings}
    assert code == 0, findings


@pytest.mark.ml
def test_verify_without_peft_version_trusts_only_the_shapes(tmp_path: Path, cli: Any) -> None:
    """PEFT 0.17 wrote no ``peft_version``: an old-layout pair whose shapes cannot be today's is named (AD271, "a
    PEFT before 0.18"); a square module, whose shapes fit either layout, is not."""
    from tests.remap.test_remap_peft018_experts import _as_peft_018, _tiny_moe

    for name, inter, params, named in (
        ("pair", 12, ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], True),
        ("square", 8, ["mlp.experts.gate_up_proj"], False),
    ):
        old = _as_peft_018(_tiny_moe(tmp_path / name, 16, inter, params), tmp_path / name / "old")
        raw = json.loads((old / "adapter_config.json").read_text())
        del raw["peft_version"]
        (old / "adapter_config.json").write_text(json.dumps(raw))
        _, findings = _findings(cli, old, tmp_path / name / "base")
        got = [f for f in findings if f["code"] == "AD271"]
        assert bool(got) is named, findings
        if named:
            assert got[0]["message"].startswith(
                "written by a PEFT before 0.18 (adapter_config.json has no peft_version"
            )
            assert "refuses 4 of them" in got[0]["message"]
