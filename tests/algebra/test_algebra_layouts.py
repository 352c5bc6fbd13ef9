"""combine --method cat on every registry layout's tiny model: PEFT's merged outputs of the combined adapter equal
the base plus the weighted sum (0.5 and -1) of each source's merged delta within 1e-5, one source plain, one rsLoRA
at another rank (a class with no forward of its own: its merged weights, within 1e-5). Targets: ``all-linear``; where PEFT cannot wrap that (an audio encoder layer) or wraps fused expert
parameters (``target_parameters``, refused by the algebra: AD953), the attention's ``q_proj`` / ``v_proj``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from adapterdoc.layouts import tiny_layouts  # noqa: E402
from tests.algebra.peft_helpers import make_adapter, weighted_reference  # noqa: E402

IDS = torch.tensor([[1, 5, 17, 99, 3, 25, 7, 42]])
WEIGHTS = [0.5, -1.0]


def _outputs(base: Any, state: dict[str, Any]) -> Any:
    """The model's logits (or last hidden state) on :data:`IDS`; for a class with no forward of its own (a
    generate-only wrapper), the weights themselves, flattened."""
    model = copy.deepcopy(base)
    model.load_state_dict(state)
    with torch.no_grad():
        try:
            out = model(input_ids=IDS)
        except TypeError:  # torch's _forward_unimplemented
            return torch.cat([v.flatten().float() for _, v in sorted(state.items())])
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _sources(base: Any, tmp: Path) -> list[Path]:
    def pair(targets: Any, tag: str) -> list[Path]:
        return [
            make_adapter(base, tmp / f"a{tag}", 1, target_modules=targets),
            make_adapter(base, tmp / f"b{tag}", 2, target_modules=targets, r=2, use_rslora=True),
        ]

    try:
        made = pair("all-linear", "")
    except ValueError:  # PEFT: a target it cannot wrap
        return pair(["q_proj", "v_proj"], "-attn")
    from adapterdoc.adapter import AdapterConfig

    if AdapterConfig.load(made[0] / "adapter_config.json").target_parameters:
        return pair(["q_proj", "v_proj"], "-attn")
    return made


@pytest.mark.parametrize("layout", tiny_layouts())
def test_cat_on_every_layout(layout: str, tmp_path: Path):
    from peft import PeftModel

    from adapterdoc.algebra import combine
    from adapterdoc.ml.tiny import build_tiny

    base = build_tiny(layout)
    sources = _sources(base, tmp_path)
    report = combine(sources, str(tmp_path / "out"), method="cat", weights=WEIGHTS)
    want = _outputs(base, weighted_reference(base, sources, WEIGHTS))
    merged = PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "out").merge_and_unload().state_dict()
    got = _outputs(base, {k: v.detach() for k, v in merged.items()})
    assert (got - want).abs().max().item() <= 1e-5
    assert report.modules and not [f for f in report.findings if f.severity == "error"]
