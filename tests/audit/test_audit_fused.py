"""Fused experts reached through PEFT's ``target_parameters``, however the config spells them: each parameter its
own entries, tables and heat-map panel, with the ``parameter`` PEFT's wrapper nesting gives (issue 25)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from adapterdoc.audit import audit_adapter  # noqa: E402
from adapterdoc.report.heatmap import panels  # noqa: E402

SPELLINGS = {
    "bare": ["gate_up_proj", "down_proj"],
    "bare-reversed": ["down_proj", "gate_up_proj"],
    "dotted-reversed": ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"],
}


def _fused_adapter(tiny_model: Any, folder: Path, target_parameters: list[str]) -> dict[str, str]:
    """A saved Qwen3-MoE-style adapter; returns PEFT's own saved module → wrapped parameter."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import ParamWrapper

    cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], target_parameters=target_parameters)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = get_peft_model(tiny_model("qwen3_moe_text"), cfg)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.randn(p.shape, generator=g))
        pm.save_pretrained(str(folder))
    return {
        n.removeprefix("base_model.model."): m.parameter_name
        for n, m in pm.named_modules()
        if isinstance(m, ParamWrapper)
    }


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_each_fused_parameter_gets_its_own_name_rows_and_panel(
    tmp_path: Path, tiny_model: Any, cli: Any, spelling: str
) -> None:
    truth = _fused_adapter(tiny_model, tmp_path / "a", SPELLINGS[spelling])
    assert set(truth.values()) == {"gate_up_proj", "down_proj"}
    audit = audit_adapter(tmp_path / "a")
    experts = [m for m in audit.modules if m.kind == "experts"]
    assert experts and {m.module: m.parameter for m in experts} == truth
    assert {m.leaf for m in experts} == {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}
    expert_panels = [p for p in panels(audit) if p.xlabel == "expert"]
    assert sorted(p.title for p in expert_panels) == [
        "model.layers.N.mlp.experts.down_proj, per expert",
        "model.layers.N.mlp.experts.gate_up_proj, per expert",
    ]
    n_experts = max(m.expert for m in experts) + 1
    for p in expert_panels:  # every (layer, expert) cell drawn once, none overwritten by the other parameter
        assert len(p.cells) == len(p.rows) * n_experts
    r = cli("inspect", tmp_path / "a", "--weights", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    mods = [m for m in _find_modules(doc) if m.get("kind") == "experts"]
    assert mods and {m["parameter"] for m in mods} == {"gate_up_proj", "down_proj"}
    text = cli("inspect", tmp_path / "a", "--weights").stdout
    assert "mlp.experts.gate_up_proj" in text and "mlp.experts.down_proj" in text
    # one count of modules across the report: inspect's "LoRA: N modules" is the audit's "N LoRA modules measured"
    inspected = re.search(r"LoRA: (\d+) modules", text)
    measured = re.search(r"(\d+) LoRA modules measured as ([\d,]+) entries", text)
    assert inspected and measured and inspected.group(1) == measured.group(1), text
    assert int(measured.group(2).replace(",", "")) == len(audit.modules)


def _find_modules(doc: Any) -> list[dict[str, Any]]:
    """The audit's module entries, wherever the JSON report nests them."""
    if isinstance(doc, dict):
        if isinstance(doc.get("modules"), list) and doc["modules"] and "delta_norm" in doc["modules"][0]:
            return doc["modules"]
        return [m for v in doc.values() for m in _find_modules(v)]
    if isinstance(doc, list):
        return [m for v in doc for m in _find_modules(v)]
    return []
