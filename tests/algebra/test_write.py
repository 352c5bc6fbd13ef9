"""The algebra's writer: modules written as they come (``write_stream``) give the same files as written at once
(``write_adapter``), and a module that does not follow the plan fails the write, leaving no folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adapterdoc.algebra.write import OutModule, Planned, write_adapter, write_stream

TEMPLATE = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _modules() -> list[OutModule]:
    rng = np.random.default_rng(0)
    return [
        OutModule(
            "model.layers.0.self_attn.q_proj", rng.standard_normal((6, 2)), rng.standard_normal((2, 5))
        ),
        OutModule(
            "model.layers.0.self_attn.v_proj",
            rng.standard_normal((3, 1)).astype(np.float32),
            rng.standard_normal((1, 5)).astype(np.float32),
        ),
        OutModule(
            "model.embed_tokens", rng.standard_normal((4, 2)), rng.standard_normal((2, 9)), embedding=True
        ),
    ]


def test_streamed_equals_written_at_once(tmp_path: Path) -> None:
    modules = _modules()
    full = {"base_model.model.lm_head.weight": np.ones((9, 4))}
    write_adapter(str(tmp_path / "once"), TEMPLATE, modules, full, command="resize", inputs=[])
    plan = [m.planned for m in modules]
    write_stream(str(tmp_path / "streamed"), TEMPLATE, plan, iter(modules), full, command="resize", inputs=[])
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (tmp_path / "once" / name).read_bytes() == (tmp_path / "streamed" / name).read_bytes()


def test_a_module_off_its_plan_fails_the_write(tmp_path: Path) -> None:
    modules = _modules()
    plan = [m.planned for m in modules]
    plan[1] = Planned(plan[1].name, 2, plan[1].shape)
    with pytest.raises(AssertionError, match="out of its plan"):
        write_stream(str(tmp_path / "out"), TEMPLATE, plan, iter(modules), {}, command="resize", inputs=[])
    assert list(tmp_path.iterdir()) == []  # nor its temporary folder
    with pytest.raises(AssertionError, match="2 of 3 planned"):
        write_stream(
            str(tmp_path / "out"),
            TEMPLATE,
            [m.planned for m in modules],
            iter(modules[:2]),
            {},
            command="resize",
            inputs=[],
        )
    assert not (tmp_path / "out").exists()
