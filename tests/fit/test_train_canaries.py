"""`adapterdoc train` leaves ``OUT/canaries.json`` for `adapterdoc probe` (made with PEFT on the saved adapter and
the run's base, prompts from the run's own rows); an adapter that cannot be told from the base, an encoder's run or
``--no-canaries`` leave none, and the run succeeds."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from adapterdoc.fit.canaries import prompts_of  # noqa: E402
from adapterdoc.probe.canaries import load  # noqa: E402
from adapterdoc.probe.fit import SEPARATION  # noqa: E402
from adapterdoc.probe.make import separation  # noqa: E402
from adapterdoc.train import rows as R  # noqa: E402
from adapterdoc.train import runtime  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BASE = "tiny:ministral3_text"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "fixtures" / "make_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_models"] = mod
    spec.loader.exec_module(mod)
    files: dict[str, Path] = mod.write_data(tmp_path_factory.mktemp("data"))
    return files


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    with runtime.torch_threads(1):
        yield


def _train(cli: Any, data: Path, out: Path, *extra: str, base: str = BASE) -> tuple[Any, dict[str, Any]]:
    args = ["--data", data, "--out", out, "--steps", "2", "--max-length", "32", "--json", *extra]
    r = cli("train", "--base", base, *args)
    assert r.exit_code == 0, r.stderr + r.stdout
    return r, json.loads(r.stdout)


def test_a_run_leaves_canaries_the_probe_reads(cli: Any, data: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    _, d = _train(cli, data["messages"], out, "--lr", "5e-3")
    assert d["canaries"] == str(out / "canaries.json")
    assert "AD629" not in [f["code"] for f in d["findings"]]
    c = load(d["canaries"])  # the probe's own reader: version, scales 0 and 1, one value per scale
    assert (c.adapter, c.base, c.rank, c.dtype) == (str(out / "adapter"), BASE, 8, "float32")
    assert 0.0 in c.scales and 1.0 in c.scales
    assert 1 <= len(c.canaries) <= 4 and all(c.positions for c in c.canaries)
    rows = R.read_rows(data["messages"])
    assert {k.text for k in c.canaries} <= set(prompts_of(rows))  # the run's own rows, not the built-in set
    assert separation(c) >= SEPARATION


def test_no_canaries_when_they_cannot_tell_the_adapter_from_the_base(
    cli: Any, data: dict[str, Path], tmp_path: Path
) -> None:
    # lr 1e-9: lora_B is non-zero (the doctor passes) but moves no logprob by a tolerance; a re-run with --force
    # must not leave the earlier run's canaries behind
    out = tmp_path / "run"
    _train(cli, data["text"], out, "--lr", "5e-3")
    assert (out / "canaries.json").is_file()
    _, d = _train(cli, data["text"], out, "--lr", "1e-9", "--force")
    assert d["ok"] and d["verify"]["ok"] and d["canaries"] is None
    assert not (out / "canaries.json").exists() and (out / "adapter" / "adapter_model.safetensors").is_file()
    warned = [f for f in d["findings"] if f["code"] == "AD629"]
    assert len(warned) == 1 and warned[0]["severity"] == "warning"
    assert (
        "no canaries: the adapter moves the logprobs of its own rows by 0.0 tolerances"
        in warned[0]["message"]
    )
    text = cli(
        "train",
        "--base",
        BASE,
        "--data",
        data["text"],
        "--out",
        out,
        "--steps",
        "2",
        "--lr",
        "1e-9",
        "--force",
    )
    assert text.exit_code == 0
    lines = [x for x in text.stdout.splitlines() if x.strip().startswith(("canaries ", "AD629"))]
    assert len(lines) == 1 and lines[0].strip().startswith("AD629 warning: no canaries: ")


def test_no_canaries_option_and_encoders(cli: Any, data: dict[str, Path], tmp_path: Path) -> None:
    _, d = _train(cli, data["text"], tmp_path / "off", "--no-canaries")
    assert d["canaries"] is None and "AD629" not in [f["code"] for f in d["findings"]]
    assert not (tmp_path / "off" / "canaries.json").exists()
    # a masked-LM encoder is not served by completions: no file and no warning
    _, d = _train(cli, data["prompt_completion"], tmp_path / "mlm", base="tiny:modernbert_mlm")
    assert d["canaries"] is None and "AD629" not in [f["code"] for f in d["findings"]]


def test_prompts_are_distinct_rows_as_trained() -> None:
    rows = [R.UserRow(n, R.TEXT, text="same") for n in range(3)]
    rows += [R.UserRow(3, R.PROMPT_COMPLETION, prompt="Q: a", completion=" b")]
    rows += [R.UserRow(4, R.MESSAGES, messages=(("user", "hi"), ("assistant", "yo")))]
    rows += [R.UserRow(5 + i, R.TEXT, text=f"t{i}") for i in range(10)]
    picked = prompts_of(rows, count=6)
    assert picked == ["same", "hi\nyo", "t1", "t3", "t5", "t7"]  # 13 distinct texts: 0, 2, 4, 6, 8, 10
    assert prompts_of(rows, count=20)[:3] == ["same", "Q: a b", "hi\nyo"]
