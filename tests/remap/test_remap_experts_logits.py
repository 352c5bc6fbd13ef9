"""``remap --experts`` both ways on tiny transformers-5 MoE models (Qwen3.5-MoE text and VL, the Qwen3-Omni
thinker): logits of base + converted adapter equal logits of base + original (float32, ≤ 1e-5 relative).

The fused side is read by real PEFT 0.21 (its ParamWrapper on the 3-D experts). The per-expert side needs a reader
of its own, because PEFT 0.21 converts per-expert expert LoRA only for the model types whose config it rewrites
(Qwen3-MoE, Qwen3-Omni; not Qwen3.5-MoE, where the per-expert targets match nothing and the keys are dropped): the oracle here
merges every per-expert delta ``scaling · B_e @ A_e`` into the base's fused 3-D expert parameters with torch (gate's
rows then up's in ``gate_up_proj[e]``, as transformers' forward chunks them) and every other LoRA delta into its
Linear, then runs the plain base model. That merge shares no code with adapterdoc; scaling follows PEFT's own
pattern resolution (``peft.utils.other.get_pattern_key``). Where PEFT does load per-expert (the Omni thinker), PEFT's
load of the per-expert adapter is checked too; where PEFT's own state-dict conversion fuses the keys, it must equal
our fused tensors exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.ml
torch = pytest.importorskip("torch")

REL = 1e-5
LAYOUTS = ["qwen3_5_moe_text", "qwen3_5_moe_vl", "qwen3_omni_thinker"]
PEFT_CONVERTS = {"qwen3_5_moe_text": False, "qwen3_5_moe_vl": False, "qwen3_omni_thinker": True}
"""Whether PEFT 0.21 loads a per-expert adapter on this tiny model (its config is rewritten at injection only for
qwen3_moe / qwen3_omni_moe*; on Qwen3.5-MoE the per-expert targets match nothing)."""
PEFT_CONVERTS_STATE_DICT = {"qwen3_5_moe_text": True, "qwen3_5_moe_vl": False, "qwen3_omni_thinker": True}
"""Whether ``convert_peft_adapter_state_dict_for_transformers`` fuses the per-expert keys (probed on PEFT 0.21.2 +
transformers 5.24: it does for qwen3_5_moe_text, whose load then still drops them because the config is not
rewritten, and not for the VL model, whose ``model.language_model.`` keys its mapping does not reach)."""


def ids_for(model: Any) -> Any:
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(3))


def logits(model: Any, ids: Any) -> Any:
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits.float()


def rel(got: Any, want: Any) -> float:
    return float((got - want).abs().max() / want.abs().max())


def scaling(cfg: dict[str, Any], module: str) -> float:
    """PEFT's rank and alpha for ``module`` (``get_pattern_key`` over rank_pattern / alpha_pattern)."""
    from peft.utils.other import get_pattern_key

    def pick(pattern: dict[str, Any], default: Any) -> Any:
        if not pattern:
            return default
        key = get_pattern_key(list(pattern), module)
        return pattern.get(key, default)

    r = pick(cfg.get("rank_pattern") or {}, cfg["r"])
    alpha = pick(cfg.get("alpha_pattern") or {}, cfg["lora_alpha"])
    return alpha / (r**0.5) if cfg.get("use_rslora") else alpha / r


def merged_per_expert(model: Any, folder: Path) -> Any:
    """``model`` with every LoRA delta of the per-expert adapter in ``folder`` merged by torch (independent of
    adapterdoc): per-expert deltas into the fused 3-D expert parameters, the others into their Linear."""
    import re

    from safetensors.torch import load_file

    sd = load_file(str(folder / "adapter_model.safetensors"))
    cfg = json.loads((folder / "adapter_config.json").read_text())
    per = re.compile(r"^(?P<owner>.+\.experts)\.(?P<e>\d+)\.(?P<leaf>gate_proj|up_proj|down_proj)$")
    modules = {k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in sd}
    with torch.no_grad():
        for module in sorted(modules):
            a = sd[f"base_model.model.{module}.lora_A.weight"].double()
            b = sd[f"base_model.model.{module}.lora_B.weight"].double()
            delta = scaling(cfg, module) * (b @ a)
            m = per.match(module)
            if m is None:
                w = model.get_submodule(module).weight
                w += delta.to(w.dtype)
                continue
            experts, e = model.get_submodule(m["owner"]), int(m["e"])
            if m["leaf"] == "down_proj":
                experts.down_proj[e] += delta.to(experts.down_proj.dtype)
            else:
                half = experts.gate_up_proj.shape[1] // 2
                rows = slice(0, half) if m["leaf"] == "gate_proj" else slice(half, 2 * half)
                experts.gate_up_proj[e, rows] += delta.to(experts.gate_up_proj.dtype)
    return model


def fused_adapter(model: Any, out: Path) -> Path:
    """A fused adapter as PEFT 0.21 writes it (q_proj plus both 3-D expert parameters), every factor random."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=2, lora_alpha=3, target_modules=["q_proj"], lora_dropout=0.0,
                     target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])  # fmt: skip
    pm = get_peft_model(model, cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.2)
    pm.save_pretrained(str(out))
    return out


def randomised(src: Path, out: Path, seed: int) -> Path:
    """``src``'s keys, shapes and config with fresh random factors (a per-expert adapter none of our conversions
    wrote the numbers of)."""
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(seed)
    sd = load_file(str(src / "adapter_model.safetensors"))
    out.mkdir()
    save_file({k: torch.randn(v.shape, generator=g) * 0.2 for k, v in sd.items()},
              str(out / "adapter_model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    (out / "adapter_config.json").write_text((src / "adapter_config.json").read_text())
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_both_ways(tiny_model: Any, layout: str, tmp_path: Path) -> None:
    from peft import PeftModel

    from adapterdoc.remap import remap

    base = tiny_model(layout)
    ids = ids_for(base)
    # fused (PEFT's forward) → per-expert (torch's merge of per-expert deltas)
    fused = fused_adapter(tiny_model(layout), tmp_path / "fused")
    want = logits(PeftModel.from_pretrained(tiny_model(layout), str(fused)), ids)
    assert rel(want, logits(base, ids)) > 1e-3  # the adapter moves the logits
    per = tmp_path / "per"
    remap(str(fused), experts="per-expert", out=str(per))
    assert rel(logits(merged_per_expert(tiny_model(layout), per), ids), want) <= REL
    if PEFT_CONVERTS[layout]:
        assert rel(logits(PeftModel.from_pretrained(tiny_model(layout), str(per)), ids), want) <= REL

    # per-expert (fresh numbers; torch's merge) → fused (PEFT's forward)
    src = randomised(per, tmp_path / "src", seed=7)
    want = logits(merged_per_expert(tiny_model(layout), src), ids)
    assert rel(want, logits(base, ids)) > 1e-3
    again = tmp_path / "again"
    remap(str(src), experts="fused", out=str(again))
    assert rel(logits(PeftModel.from_pretrained(tiny_model(layout), str(again)), ids), want) <= REL
    if PEFT_CONVERTS[layout]:
        assert rel(logits(PeftModel.from_pretrained(tiny_model(layout), str(src)), ids), want) <= REL


@pytest.mark.parametrize("layout", LAYOUTS)
def test_peft_state_dict_conversion_agrees_where_it_applies(
    tiny_model: Any, layout: str, tmp_path: Path
) -> None:
    """PEFT's own per-expert → fused conversion, called as ``set_peft_model_state_dict`` calls it: equal to ours
    tensor for tensor where PEFT converts (Qwen3.5-MoE text, the Omni thinker); where it does not (Qwen3.5-MoE VL),
    it returns the per-expert keys unchanged, which pins that PEFT 0.21 fact."""
    from peft import LoraConfig, PeftModel
    from peft.utils.transformers_weight_conversion import convert_peft_adapter_state_dict_for_transformers
    from safetensors.torch import load_file

    from adapterdoc.remap import remap

    fused = fused_adapter(tiny_model(layout), tmp_path / "fused")
    per, ours = tmp_path / "per", tmp_path / "ours"
    remap(str(fused), experts="per-expert", out=str(per))
    src = randomised(per, tmp_path / "src", seed=11)
    remap(str(src), experts="fused", out=str(ours))
    model = PeftModel.from_pretrained(tiny_model(layout), str(fused))  # a PEFT model on this base
    sd = load_file(str(src / "adapter_model.safetensors"))
    cfg = LoraConfig.from_pretrained(str(src))
    got = convert_peft_adapter_state_dict_for_transformers(model, cfg, dict(sd), "default")
    if not PEFT_CONVERTS_STATE_DICT[layout]:
        assert set(got) == set(sd)
        return
    mine = load_file(str(ours / "adapter_model.safetensors"))
    assert set(got) == set(mine)
    assert all(torch.equal(got[k], mine[k]) for k in mine), [
        k for k in mine if not torch.equal(got[k], mine[k])
    ]
