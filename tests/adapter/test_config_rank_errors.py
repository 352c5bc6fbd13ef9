"""A bad ``r`` names the error PEFT itself raises for it (issue 25: ``r: -8`` said TypeError; PEFT raises
ValueError), checked against PEFT 0.21's own ``get_peft_model`` where it is installed."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.small_adapters import write_small_adapter

CASES = [(-8, "ValueError"), (0, "ValueError"), ("8", "TypeError"), (2.5, "TypeError"), (True, "TypeError")]


def _with_rank(tmp_path: Path, r: Any) -> Path:
    ad = write_small_adapter(tmp_path / "a")
    cfg = json.loads((ad / "adapter_config.json").read_text())
    (ad / "adapter_config.json").write_text(json.dumps({**cfg, "r": r}))
    return ad


@pytest.mark.parametrize(("r", "raised"), CASES)
def test_the_message_names_the_error_peft_raises(tmp_path: Path, cli: Any, r: Any, raised: str) -> None:
    res = cli("inspect", _with_rank(tmp_path, r))
    assert res.exit_code == 3
    line = res.stderr.strip()
    assert "`r` must be a positive integer" in line and f"raises {raised}" in line, line
    other = {"ValueError", "TypeError"} - {raised}
    assert not any(o in line for o in other)


@pytest.mark.parametrize(("r", "raised"), CASES)
def test_peft_raises_that_error(r: Any, raised: str) -> None:
    """The premise, from PEFT itself: the error type each bad rank meets when PEFT builds a LoRA layer."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")

    class One(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(4, 4)

    with warnings.catch_warnings(), pytest.raises(Exception) as info:
        warnings.simplefilter("ignore")
        peft.get_peft_model(One(), peft.LoraConfig(r=r, target_modules=["q_proj"]))
    assert type(info.value).__name__ == raised
