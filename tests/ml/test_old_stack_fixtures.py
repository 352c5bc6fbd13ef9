"""The old-stack MoE fixtures (fixtures/old_stack: a transformers 4.57 + PEFT 0.17 writer) and what today's stack
(transformers 5, PEFT ≥ 0.19 with ``peft.utils.transformers_weight_conversion``) does with them.

The first half needs nothing but the standard library: the checked-in files are the ones ``make.py`` wrote
(``SHA256SUMS``) and carry the per-expert layout. The second half loads them with torch, transformers and PEFT and pins
what the current stack does: transformers 5 fuses the per-expert base on load (and splits it again on save), PEFT
converts the per-expert adapter to its fused ParamWrapper layout on load (``convert_peft_config_for_transformers`` in
``BaseTuner.inject_adapter``, ``convert_peft_adapter_state_dict_for_transformers`` in ``set_peft_model_state_dict``)
and reproduces the old stack's logits; one-sided gate/up targets are refused; the reverse conversion does not exist.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "old_stack"
QWEN = ROOT / "qwen3_moe"
MIXTRAL = ROOT / "mixtral"
LAYERS, EXPERTS, R, ALPHA = 2, 4, 2, 4
HIDDEN, MOE_INTER = 32, 16
ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}
REL = 1e-5
"""Tolerance: max |current - reference| / max |reference|, float32."""


def header(path: Path) -> dict[str, Any]:
    """The safetensors header (tensor name → dtype/shape/offsets, plus ``__metadata__``), with no dependency."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def shapes(path: Path) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v["shape"]) for k, v in header(path).items() if k != "__metadata__"}


def config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "adapter_config.json").read_text())


# ------------------------------------------------------------------------------------------ the files (no torch)


def test_files_are_what_make_py_wrote() -> None:
    listed = {}
    for line in (ROOT / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        listed[name] = digest
    on_disk = {
        p.relative_to(ROOT).as_posix() for folder in (QWEN, MIXTRAL) for p in folder.rglob("*") if p.is_file()
    }
    assert on_disk == set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((ROOT / name).read_bytes()).hexdigest() == digest, name
    assert sum((ROOT / n).stat().st_size for n in listed) < 2_000_000


def test_base_is_per_expert_on_disk() -> None:
    keys = shapes(QWEN / "base" / "model.safetensors")
    experts = {k: v for k, v in keys.items() if ".mlp.experts." in k}
    assert len(experts) == LAYERS * EXPERTS * 3
    for layer in range(LAYERS):
        for e in range(EXPERTS):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            assert keys[f"{p}.gate_proj.weight"] == (MOE_INTER, HIDDEN)
            assert keys[f"{p}.up_proj.weight"] == (MOE_INTER, HIDDEN)
            assert keys[f"{p}.down_proj.weight"] == (HIDDEN, MOE_INTER)
    assert not any("gate_up_proj" in k for k in keys)
    assert header(QWEN / "base" / "model.safetensors")["__metadata__"] == {"format": "pt"}
    cfg = json.loads((QWEN / "base" / "config.json").read_text())
    assert (cfg["model_type"], cfg["transformers_version"], cfg["num_experts"]) == (
        "qwen3_moe",
        "4.57.6",
        EXPERTS,
    )

    mix = shapes(MIXTRAL / "base" / "model.safetensors")
    assert mix["model.layers.0.block_sparse_moe.experts.3.w1.weight"] == (MOE_INTER, HIDDEN)
    assert mix["model.layers.1.block_sparse_moe.experts.0.w2.weight"] == (HIDDEN, MOE_INTER)
    assert not any(".mlp." in k for k in mix)


def expert_keys(keys: dict[str, tuple[int, ...]], container: str = "mlp") -> dict[str, tuple[int, ...]]:
    return {k: v for k, v in keys.items() if f".{container}.experts." in k}


def test_per_expert_adapter_keys() -> None:
    keys = shapes(QWEN / "adapter_experts" / "adapter_model.safetensors")
    assert len(keys) == LAYERS * (len(ATTENTION) + EXPERTS * 3) * 2
    pattern = re.compile(
        r"base_model\.model\.model\.layers\.(\d)\.mlp\.experts\.(\d)\.(gate_proj|up_proj|down_proj)\.lora_([AB])\.weight"
    )
    seen = set()
    for k, shape in expert_keys(keys).items():
        m = pattern.fullmatch(k)
        assert m, k
        proj, ab = m.group(3), m.group(4)
        fan_in, fan_out = (MOE_INTER, HIDDEN) if proj == "down_proj" else (HIDDEN, MOE_INTER)
        assert shape == ((R, fan_in) if ab == "A" else (fan_out, R)), k
        seen.add(m.groups())
    assert len(seen) == LAYERS * EXPERTS * 3 * 2
    cfg = config(QWEN / "adapter_experts")
    assert set(cfg["target_modules"]) == ATTENTION | {"gate_proj", "up_proj", "down_proj"}
    assert (cfg["r"], cfg["lora_alpha"], cfg["target_parameters"], cfg["rank_pattern"]) == (
        R,
        ALPHA,
        None,
        {},
    )
    assert cfg["base_model_name_or_path"] == "adapterdoc/tiny-qwen3_moe-4.57"
    assert "peft_version" not in cfg  # PEFT 0.17 does not write it; 0.21 does


def test_attention_only_and_one_sided_adapters() -> None:
    attention = shapes(QWEN / "adapter_attention" / "adapter_model.safetensors")
    assert len(attention) == LAYERS * len(ATTENTION) * 2
    assert not expert_keys(attention)  # an "MoE adapter" with no expert LoRA at all
    assert set(config(QWEN / "adapter_attention")["target_modules"]) == ATTENTION

    one_sided = expert_keys(shapes(QWEN / "adapter_one_sided" / "adapter_model.safetensors"))
    projections = {k.split(".")[-3] for k in one_sided}
    assert projections == {"gate_proj", "down_proj"}  # gate without up: half of transformers 5's gate_up_proj
    assert len(one_sided) == LAYERS * EXPERTS * 2 * 2

    mix = shapes(MIXTRAL / "adapter_experts" / "adapter_model.safetensors")
    assert {k.split(".")[-3] for k in expert_keys(mix, "block_sparse_moe")} == {"w1", "w2", "w3"}
    assert len(expert_keys(mix, "block_sparse_moe")) == LAYERS * EXPERTS * 3 * 2


def test_reference_logits_file() -> None:
    for folder, adapters in (
        (QWEN, ("adapter_experts", "adapter_attention", "adapter_one_sided")),
        (MIXTRAL, ("adapter_experts",)),
    ):
        head = header(folder / "reference.safetensors")
        meta = json.loads(head.pop("__metadata__")["adapterdoc"])
        assert meta["versions"] == {
            "torch": "2.13.0",
            "transformers": "4.57.6",
            "peft": "0.17.1",
            "safetensors": "0.8.0",
        }
        want = (
            {"input_ids", "logits.base"}
            | {f"logits.{a}" for a in adapters}
            | {f"logits.merged_{a}" for a in adapters}
        )
        assert set(head) == want
        assert head["input_ids"]["dtype"] == "I64" and head["input_ids"]["shape"] == [2, 8]
        for k in want - {"input_ids"}:
            assert head[k]["dtype"] == "F32" and head[k]["shape"] == [2, 8, 64], k
        # routing is far from a tie (float noise is ~1e-6), so both stacks pick the same experts
        assert min(meta["router_margin_min"].values()) > 5e-4


# ------------------------------------------------------------------------------- the current stack (torch needed)


@pytest.fixture(scope="module")
def stack() -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("these facts are about transformers 5 (fused experts)")
    # PEFT's v4 → v5 conversion (PEFT ≥ 0.19)
    pytest.importorskip("peft.utils.transformers_weight_conversion")
    return torch


def load_base(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder / "base"), dtype=torch.float32).eval()


def load_adapter(folder: Path, adapter: str, base: Any = None) -> Any:
    from peft import PeftModel

    return PeftModel.from_pretrained(
        base if base is not None else load_base(folder), str(folder / adapter)
    ).eval()


def reference(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "reference.safetensors"))


def rel_err(model: Any, ref: dict[str, Any], key: str) -> float:
    import torch

    with torch.no_grad():
        got = model(input_ids=ref["input_ids"]).logits.float()
    want = ref[key]
    return float((got - want).abs().max() / want.abs().max())


ML = pytest.mark.ml


@ML
def test_transformers5_fuses_the_per_expert_base_on_load(stack: Any) -> None:
    """transformers 5's conversion mapping for qwen3_moe (→ the qwen2_moe pattern): MergeModulelist(dim=0) then
    Concatenate(dim=1) into ``mlp.experts.gate_up_proj`` [E, 2I, H], gate rows first; MergeModulelist into
    ``mlp.experts.down_proj`` [E, H, I]."""
    from safetensors.torch import load_file

    torch = stack
    base = load_base(QWEN)
    params = dict(base.named_parameters())
    assert not any(".experts.0." in k for k in params)
    on_disk = load_file(str(QWEN / "base" / "model.safetensors"))
    for layer in range(LAYERS):
        gate_up = params[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
        down = params[f"model.layers.{layer}.mlp.experts.down_proj"]
        assert tuple(gate_up.shape) == (EXPERTS, 2 * MOE_INTER, HIDDEN)
        assert tuple(down.shape) == (EXPERTS, HIDDEN, MOE_INTER)
        for e in range(EXPERTS):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            want = torch.cat([on_disk[f"{p}.gate_proj.weight"], on_disk[f"{p}.up_proj.weight"]], 0)
            assert torch.equal(gate_up[e], want)
            assert torch.equal(down[e], on_disk[f"{p}.down_proj.weight"])
    assert rel_err(base, reference(QWEN), "logits.base") <= REL

    mix = load_base(MIXTRAL)  # Mixtral: block_sparse_moe renamed to mlp, w1/w3 fused into gate_up_proj
    assert tuple(dict(mix.named_parameters())["model.layers.0.mlp.experts.gate_up_proj"].shape) == (
        EXPERTS,
        2 * MOE_INTER,
        HIDDEN,
    )
    assert rel_err(mix, reference(MIXTRAL), "logits.base") <= REL


@ML
def test_transformers5_resave_writes_per_expert_again(stack: Any, tmp_path: Path) -> None:
    """``save_pretrained`` on transformers 5 reverses the load conversion: the resaved base holds the same per-expert
    tensors as the 4.57 file (so a "transformers-5-resaved base" is per-expert on disk too)."""
    from safetensors.torch import load_file

    torch = stack
    load_base(QWEN).save_pretrained(str(tmp_path))
    old = load_file(str(QWEN / "base" / "model.safetensors"))
    new = load_file(str(tmp_path / "model.safetensors"))
    assert set(new) == set(old)
    assert all(torch.equal(old[k], new[k]) for k in old)
    from transformers import AutoModelForCausalLM

    resaved = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    on_resaved = load_adapter(QWEN, "adapter_experts", base=resaved)
    assert rel_err(on_resaved, reference(QWEN), "logits.adapter_experts") <= REL


@ML
@pytest.mark.parametrize("folder", [QWEN, MIXTRAL], ids=["qwen3_moe", "mixtral"])
def test_peft_converts_the_old_adapter_and_reproduces_the_old_logits(stack: Any, folder: Path) -> None:
    """PEFT converts per-expert → fused at load (config: ``_convert_peft_config_moe``; weights:
    ``convert_peft_adapter_state_dict_for_transformers``) and the outputs are the old stack's, within 1e-5."""
    model = load_adapter(folder, "adapter_experts")
    cfg = model.peft_config["default"]
    assert set(cfg.target_modules) == ATTENTION
    assert set(cfg.target_parameters) == {"gate_up_proj", "down_proj"}
    # gate_up: rank and alpha doubled (gate and up concatenated along the rank), scale alpha/r unchanged
    assert cfg.rank_pattern == {r".*\.gate_up_proj": 2 * R}
    assert cfg.alpha_pattern == {r".*\.gate_up_proj": 2 * ALPHA}
    assert (cfg.r, cfg.lora_alpha) == (R, ALPHA)
    for layer in range(LAYERS):
        outer = model.base_model.model.model.layers[layer].mlp.experts
        inner = outer.base_layer
        assert type(outer).__name__ == type(inner).__name__ == "ParamWrapper"
        # PEFT warns "rank_pattern keys did not match any targeted module" for '.*\.gate_up_proj', yet applies it:
        assert (inner.parameter_name, inner.r["default"], inner.scaling["default"]) == (
            "gate_up_proj",
            2 * R,
            2.0,
        )
        assert (outer.parameter_name, outer.r["default"], outer.scaling["default"]) == ("down_proj", R, 2.0)
    ref = reference(folder)
    assert rel_err(model, ref, "logits.adapter_experts") <= REL
    merged = model.merge_and_unload()  # fused merge equals the old stack's per-expert merge
    assert rel_err(merged, ref, "logits.merged_adapter_experts") <= REL


def fused_by_hand(sd: dict[str, Any], prefix: str, gate: str, up: str, down: str) -> dict[str, Any]:
    """PEFT's fused layout built by hand from per-expert tensors: lora_A rows expert-major ([E·r, in], gate_up: gate
    then up per expert, [E·2r, H]); lora_B columns rank-major ([out, r·E], expert e's columns e, e+E, …), gate_up's
    per-expert block diagonal [[B_gate, 0], [0, B_up]]."""
    import torch

    def a(e: int, proj: str) -> Any:
        return sd[f"{prefix}.{e}.{proj}.lora_A.weight"]

    def b(e: int, proj: str) -> Any:
        return sd[f"{prefix}.{e}.{proj}.lora_B.weight"]

    def rank_major(blocks: list[Any]) -> Any:  # [E, out, k] → [out, k·E]
        return torch.stack(blocks, 0).permute(2, 0, 1).flatten(0, 1).T

    es = range(EXPERTS)
    return {
        f"{prefix}.base_layer.lora_A.weight": torch.cat(
            [torch.cat([a(e, gate), a(e, up)], 0) for e in es], 0
        ),
        f"{prefix}.base_layer.lora_B.weight": rank_major(
            [torch.block_diag(b(e, gate), b(e, up)) for e in es]
        ),
        f"{prefix}.lora_A.weight": torch.cat([a(e, down) for e in es], 0),
        f"{prefix}.lora_B.weight": rank_major([b(e, down) for e in es]),
    }


@ML
@pytest.mark.parametrize(
    ("folder", "container", "names"),
    [(QWEN, "mlp", ("gate_proj", "up_proj", "down_proj")), (MIXTRAL, "block_sparse_moe", ("w1", "w3", "w2"))],
    ids=["qwen3_moe", "mixtral"],
)
def test_peft_conversion_oracle_tensor_for_tensor(
    stack: Any, folder: Path, container: str, names: Any, tmp_path: Path
) -> None:
    """``convert_peft_adapter_state_dict_for_transformers`` called as ``set_peft_model_state_dict`` calls it (the
    PeftModel, its converted config, the on-disk state dict, "default"): exactly the hand-built fused layout, and
    PEFT 0.21's ``save_pretrained`` writes those very tensors (the fused layout is what it writes back)."""
    from peft.utils.transformers_weight_conversion import convert_peft_adapter_state_dict_for_transformers
    from safetensors.torch import load_file

    torch = stack
    model = load_adapter(folder, "adapter_experts")
    sd = load_file(str(folder / "adapter_experts" / "adapter_model.safetensors"))
    out = convert_peft_adapter_state_dict_for_transformers(model, model.peft_config["default"], sd, "default")
    assert len(sd) == LAYERS * 2 * (len(ATTENTION) + EXPERTS * 3) and len(out) == LAYERS * 2 * (
        len(ATTENTION) + 2
    )
    for layer in range(LAYERS):
        want = fused_by_hand(sd, f"base_model.model.model.layers.{layer}.{container}.experts", *names)
        for k, v in want.items():
            k = k.replace(f".{container}.", ".mlp.")
            assert torch.equal(out[k], v), k
        p = f"base_model.model.model.layers.{layer}.mlp.experts"
        assert tuple(out[f"{p}.base_layer.lora_A.weight"].shape) == (EXPERTS * 2 * R, HIDDEN)
        assert tuple(out[f"{p}.base_layer.lora_B.weight"].shape) == (2 * MOE_INTER, 2 * R * EXPERTS)
        assert tuple(out[f"{p}.lora_A.weight"].shape) == (EXPERTS * R, MOE_INTER)
        assert tuple(out[f"{p}.lora_B.weight"].shape) == (HIDDEN, R * EXPERTS)
    attention = {k for k in sd if ".self_attn." in k}
    assert all(torch.equal(out[k], sd[k]) for k in attention)  # untouched

    model.save_pretrained(str(tmp_path))
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert set(saved) == set(out) and all(torch.equal(saved[k], out[k]) for k in out)
    cfg = json.loads((tmp_path / "adapter_config.json").read_text())
    assert set(cfg["target_parameters"]) == {"gate_up_proj", "down_proj"}
    assert set(cfg["target_modules"]) == ATTENTION
    assert cfg["rank_pattern"] == {r".*\.gate_up_proj": 2 * R}


@ML
def test_peft_cannot_convert_back(stack: Any) -> None:
    from peft.utils.transformers_weight_conversion import PeftConcatenate

    with pytest.raises(NotImplementedError, match="Reversing PEFT LoRA MoE conversions is not supported yet"):
        _ = PeftConcatenate(dim=1).reverse_op


@ML
def test_attention_only_moe_adapter_loads_untouched(stack: Any) -> None:
    """No expert target: PEFT's conversion changes nothing but ``target_parameters`` (None → empty), the experts stay
    unwrapped, and the outputs are the old stack's."""
    model = load_adapter(QWEN, "adapter_attention")
    cfg = model.peft_config["default"]
    assert set(cfg.target_modules) == ATTENTION
    assert not cfg.target_parameters and not cfg.rank_pattern and not cfg.alpha_pattern
    assert type(model.base_model.model.model.layers[0].mlp.experts).__name__ == "Qwen3MoeExperts"
    ref = reference(QWEN)
    assert rel_err(model, ref, "logits.adapter_attention") <= REL
    assert rel_err(model.merge_and_unload(), ref, "logits.merged_adapter_attention") <= REL


@ML
def test_one_sided_gate_up_is_refused(stack: Any) -> None:
    """gate_proj without up_proj: ``_convert_peft_config_moe`` raises, so the current stack cannot load an adapter
    the old stack loads and runs (the reference logits exist): a case for ``remap --experts`` to report."""
    with pytest.raises(
        ValueError, match=r"Cannot convert PEFT target.*gate_proj without also targeting up_proj"
    ):
        load_adapter(QWEN, "adapter_one_sided")


OLD_VENV = Path(os.environ.get("ADAPTERDOC_OLD_STACK_VENV", Path.home() / ".cache" / "adapterdoc-old-stack"))


@pytest.mark.slow
@pytest.mark.skipif(not (OLD_VENV / ".adapterdoc-requirements").exists(), reason="old-stack venv not built")
def test_make_py_rebuilds_byte_for_byte() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "make.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
