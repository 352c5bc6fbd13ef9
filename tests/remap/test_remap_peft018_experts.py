"""``remap --experts`` on fused-expert adapters in PEFT 0.18's layout (lora_A over the expert parameter's dim 1, which
today's PEFT reads the other way round on transformers' ``[E, out, in]`` experts; :mod:`adapterdoc.adapter.expert_layout`).

``--experts fused`` rewrites such an adapter into today's layout, exactly (each expert's factors swapped and
transposed, ``peft_version`` raised to 0.19.1), and ``--experts per-expert`` splits it as it was meant. Proven in
the oracle suite against adapters a real ``peft==0.18.1`` wrote (``.ci/oracles/peft018.sh``): today's PEFT's logits
of the converted adapter equal PEFT 0.18.1's logits of the original (float32, ≤ 1e-5 relative); and without the
oracle on adapters put into the old layout from ones today's PEFT wrote (bit-exact round trip)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.adapter.expert_layout import swap_factors

TOL = 1e-5
"""float32, relative to the largest logit; measured: 0 (the same products in the same order)."""

GATE_UP_A = "base_model.model.model.layers.{}.mlp.experts.base_layer.lora_A.weight"


def _remap(cli: Any, adapter: Path, form: str, out: Path) -> tuple[int, dict[str, Any]]:
    res = cli("remap", adapter, "--experts", form, "--out", out, "--json")
    return res.exit_code, json.loads(res.stdout) if res.stdout.strip() else {"stderr": res.stderr}


def _tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def _config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "adapter_config.json").read_text())


# ------------------------------------------------------------------------------------------ without the oracle


def _tiny_moe(tmp_path: Path, hidden: int, inter: int, params: list[str]) -> Path:
    """A tiny Qwen3-MoE base in ``tmp_path/base`` and today's PEFT adapter on ``params`` in ``tmp_path/today``."""
    import torch
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    cfg = tf.Qwen3MoeConfig(vocab_size=64, hidden_size=hidden, intermediate_size=24, moe_intermediate_size=inter,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                            num_experts=4, num_experts_per_tok=2)  # fmt: skip
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(tmp_path / "base")
    lc = LoraConfig(r=2, lora_alpha=3, target_modules=["q_proj"], target_parameters=params)
    pm = get_peft_model(model, lc)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.3)
    pm.save_pretrained(tmp_path / "today")
    return tmp_path / "today"


def _as_peft_018(today: Path, out: Path) -> Path:
    """``today``'s adapter with every fused-expert factor pair put into PEFT 0.18's layout and ``peft_version``
    0.18.1 (:func:`swap_factors` is its own inverse), i.e. what PEFT 0.18 writes for the same deltas."""
    import torch
    from safetensors.torch import save_file

    shutil.copytree(today, out)
    sd = _tensors(today)
    experts = 4
    for a_key in [k for k in sd if ".experts" in k and k.endswith("lora_A.weight")]:
        b_key = a_key.replace("lora_A", "lora_B")
        a, b = sd[a_key], sd[b_key]
        rank = a.shape[0] // experts
        na, nb = swap_factors(a.numpy().tobytes(), b.numpy().tobytes(), 4, experts, rank)
        sd[a_key] = torch.frombuffer(bytearray(na), dtype=torch.float32).reshape(a.shape[0], b.shape[0])
        sd[b_key] = torch.frombuffer(bytearray(nb), dtype=torch.float32).reshape(a.shape[1], b.shape[1])
    save_file(sd, str(out / "adapter_model.safetensors"))
    raw = _config(out)
    raw["peft_version"] = "0.18.1"
    (out / "adapter_config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return out


@pytest.mark.ml
@pytest.mark.parametrize(
    ("inter", "params"),
    [
        (12, ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),  # the shapes say which layout
        (8, ["mlp.experts.gate_up_proj"]),  # [4, 16, 16]: the config's class says it
    ],
    ids=["pair", "square"],
)
def test_fused_rewrites_the_old_layout_bit_exactly(
    tmp_path: Path, cli: Any, inter: int, params: list[str]
) -> None:
    """Before: ``--experts fused`` said "already fused: nothing to do" and left the old layout as it was."""
    today = _tiny_moe(tmp_path, 16, inter, params)
    old = _as_peft_018(today, tmp_path / "old")
    code, rep = _remap(cli, old, "fused", tmp_path / "new")
    assert code == 0, rep
    assert rep["strategy"] == "copy"
    assert rep["experts"]["relayout"]["from"] == "0.18.1"
    assert rep["config_changes"] == [
        {"field": "peft_version", "old": "0.18.1", "new": "0.19.1", "how": "experts"}
    ]
    want, got = _tensors(today), _tensors(tmp_path / "new")
    assert list(got) == list(_tensors(old))
    assert all(got[k].shape == want[k].shape and bool((got[k] == want[k]).all()) for k in want)
    assert _config(tmp_path / "new")["peft_version"] == "0.19.1"
    # and once rewritten, there is nothing left to do
    code, rep = _remap(cli, tmp_path / "new", "fused", tmp_path / "again")
    assert code == 0 and rep["strategy"] == "none"


@pytest.mark.ml
def test_fused_leaves_an_old_version_in_today_s_layout_alone(tmp_path: Path, cli: Any) -> None:
    """``peft_version`` 0.18.1 on factors whose shapes say today's layout (as PEFT 0.18 writes for gpt-oss, whose
    experts are stored ``[E, in, out]``): nothing to do."""
    today = _tiny_moe(tmp_path, 16, 12, ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    raw = _config(today)
    raw["peft_version"] = "0.18.1"
    (today / "adapter_config.json").write_text(json.dumps(raw))
    code, rep = _remap(cli, today, "fused", tmp_path / "new")
    assert code == 0 and rep["strategy"] == "none", rep


@pytest.mark.ml
def test_per_expert_splits_the_old_layout_as_today_s(tmp_path: Path, cli: Any) -> None:
    """Before: ``--experts per-expert`` of the old layout refused ("the inner and outer factors do not fit")."""
    today = _tiny_moe(tmp_path, 16, 12, ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    old = _as_peft_018(today, tmp_path / "old")
    code, rep = _remap(cli, old, "per-expert", tmp_path / "split_old")
    assert code == 0, rep
    assert any("written by PEFT 0.18.1" in n for n in rep["notes"])
    code, _ = _remap(cli, today, "per-expert", tmp_path / "split_today")
    assert code == 0
    a, b = _tensors(tmp_path / "split_old"), _tensors(tmp_path / "split_today")
    assert list(a) == list(b) and all(bool((a[k] == b[k]).all()) for k in a)
    # fused again (PEFT's own construction), it is in today's layout and says so: peft_version 0.19.1, no AD271
    assert _config(tmp_path / "split_old")["peft_version"] == "0.18.1"
    code, rep = _remap(cli, tmp_path / "split_old", "fused", tmp_path / "fused")
    assert code == 0, rep
    assert {"field": "peft_version", "old": "0.18.1", "new": "0.19.1", "how": "experts"} in rep[
        "config_changes"
    ]
    res = cli("verify", tmp_path / "fused", "--base", tmp_path / "base", "--json")
    assert "AD271" not in {f["code"] for f in json.loads(res.stdout)["adapters"][0]["findings"]}


# ------------------------------------------------------------------------------------------ the oracle: PEFT 0.18.1


@pytest.fixture(scope="module")
def cases(oracle_env: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.verify.peft018_helpers import write_cases

    return write_cases(oracle_env("peft018"), tmp_path_factory.mktemp("peft018"))


@pytest.mark.oracle
@pytest.mark.parametrize(
    "name", ["qwen3_moe_pair", "mixtral_pair", "qwen3_moe_square", "qwen3_moe_square_class"]
)
def test_fused_gives_today_s_peft_the_0_18_logits(
    cases: dict[str, Path], cli: Any, tmp_path: Path, name: str
) -> None:
    """After ``remap --experts fused``, today's PEFT's logits equal PEFT 0.18.1's logits of the original; verify
    passes it (no AD271)."""
    from tests.verify.peft018_helpers import logits018, rel, today_logits

    folder = cases[name]
    code, rep = _remap(cli, folder / "adapter", "fused", tmp_path / "new")
    assert code == 0, rep
    assert rep["experts"]["relayout"]["from"] == "0.18.1"
    _, want = logits018(folder)
    assert rel(today_logits(folder, tmp_path / "new"), want) <= TOL
    res = cli("verify", tmp_path / "new", "--base", folder / "base", "--json")
    findings = json.loads(res.stdout)["adapters"][0]["findings"]
    assert res.exit_code == 0 and "AD271" not in {f["code"] for f in findings}, findings


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["gpt_oss_pair", "gpt_oss_down"])
def test_fused_leaves_a_0_18_gpt_oss_adapter_alone(
    cases: dict[str, Path], cli: Any, tmp_path: Path, name: str
) -> None:
    """gpt-oss stores its experts ``[E, in, out]``: PEFT 0.18's layout is today's (the pair's shapes say so; the
    lone ``down_proj`` [4, 16, 16], whose shapes cannot, by its base folder's model_type)."""
    code, rep = _remap(cli, cases[name] / "adapter", "fused", tmp_path / "new")
    assert code == 0 and rep["strategy"] == "none", rep
    new = tmp_path / "new" / "adapter_model.safetensors"
    assert new.read_bytes() == (cases[name] / "adapter" / "adapter_model.safetensors").read_bytes()


@pytest.mark.oracle
@pytest.mark.ml
@pytest.mark.parametrize(
    ("name", "peft_loads_it"),
    [("qwen3_moe_pair", True), ("mixtral_pair", True), ("qwen3_moe_square", False)],
)
def test_per_expert_of_a_0_18_adapter_gives_the_0_18_logits(
    cases: dict[str, Path], cli: Any, tmp_path: Path, name: str, peft_loads_it: bool
) -> None:
    """``--experts per-expert`` of the 0.18 adapter is byte-identical to that of its ``--experts fused`` rewrite;
    every per-expert delta merged into a Qwen3-MoE base by torch (``merged_per_expert``, no adapterdoc code) gives
    PEFT 0.18.1's logits, and so does today's PEFT's own load where it fuses the per-expert keys right: with
    gate_up and down (measured on PEFT 0.21.2: the per-expert split of a gate_up-only adapter on Qwen3-MoE loads
    with no error and logits far off, 1.03 here and 0.89 for one today's PEFT wrote; not a layout question)."""
    import torch
    import transformers as tf

    from tests.remap.test_remap_experts_logits import merged_per_expert
    from tests.verify.peft018_helpers import logits018, rel, today_logits

    folder = cases[name]
    assert _remap(cli, folder / "adapter", "per-expert", tmp_path / "split")[0] == 0
    assert _remap(cli, folder / "adapter", "fused", tmp_path / "new")[0] == 0
    assert _remap(cli, tmp_path / "new", "per-expert", tmp_path / "split_new")[0] == 0
    a, b = (tmp_path / d / "adapter_model.safetensors" for d in ("split", "split_new"))
    assert a.read_bytes() == b.read_bytes()
    ids, want = logits018(folder)
    if name.startswith(
        "qwen3_moe"
    ):  # the merge knows `mlp.experts.N.gate_proj` (Mixtral's are `w1`, `w3`, `w2`)
        model = tf.AutoModelForCausalLM.from_pretrained(str(folder / "base"), dtype=torch.float32).eval()
        with torch.no_grad():
            merged = merged_per_expert(model, tmp_path / "split")(input_ids=ids).logits.float()
        assert rel(merged, want) <= TOL
    if peft_loads_it:
        assert rel(today_logits(folder, tmp_path / "split"), want) <= TOL


@pytest.mark.ml
def test_fused_without_peft_version_trusts_only_the_shapes(tmp_path: Path, cli: Any) -> None:
    """No ``peft_version`` (PEFT 0.17 wrote none): a pair whose shapes are the old layout is rewritten (and no version
    is invented); a lone square module, whose shapes fit either layout, is left as it is."""
    pair = _tiny_moe(tmp_path / "pair", 16, 12, ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    square = _tiny_moe(tmp_path / "square", 16, 8, ["mlp.experts.gate_up_proj"])
    for today in (pair, square):
        old = _as_peft_018(today, today.parent / "old")
        raw = _config(old)
        del raw["peft_version"]
        (old / "adapter_config.json").write_text(json.dumps(raw))
        code, rep = _remap(cli, old, "fused", today.parent / "new")
        assert code == 0, rep
        if today is pair:
            assert rep["config_changes"] == [] and rep["experts"]["relayout"]["from"] is None
            want, got = _tensors(today), _tensors(today.parent / "new")
            assert all(bool((got[k] == want[k]).all()) for k in want)
        else:
            assert rep["strategy"] == "none"
