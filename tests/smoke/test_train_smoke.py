"""train-smoke: a reference run per layout, then the doctor checks on its output; the CLI around it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from adapterdoc.layouts import LAYOUTS

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from adapterdoc import smoke  # noqa: E402
from adapterdoc.errors import RefusedError  # noqa: E402
from adapterdoc.train import runtime  # noqa: E402
from adapterdoc.train import settings as train_settings  # noqa: E402
from adapterdoc.train.settings import TrainSettings  # noqa: E402

FAST = 8
"""Steps per layout in these tests (the loss already falls after 2)."""

EXPECTED = {
    "qwen3_5_vl": ("qwen3_5_text", 50),
    "qwen3_5_moe_vl": ("qwen3_5_moe_text", 66),
    "qwen3_omni_thinker": ("qwen3_moe_text", 48),
    "qwen3_omni": ("qwen3_omni_thinker", 48),
    "mistral3_vl": ("ministral3_text", 56),
    "modernbert_mlm": ("modernbert", 16),
    "embeddinggemma2": ("embeddinggemma2_text", 28),
}
"""Layout → (text-only counterpart the remap check loads on, LoRA tensors saved)."""


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with runtime.torch_threads(1), runtime.quiet_libraries():
        yield


def test_all_means_every_vl_wrapper_and_encoder_layout() -> None:
    assert smoke.resolve_layouts("all") == list(EXPECTED)
    assert smoke.resolve_layouts("mistral3_vl, qwen3_5_text") == ["mistral3_vl", "qwen3_5_text"]
    with pytest.raises(KeyError, match="qwen_vl_legacy"):
        smoke.resolve_layouts("qwen_vl_legacy")


@pytest.mark.parametrize("layout", list(EXPECTED))
def test_smoke_run_per_layout(tmp_path, layout: str) -> None:
    run = smoke.run_layout(layout, str(tmp_path / layout), TrainSettings(steps=FAST))
    assert run.error is None
    assert [c.name for c in run.checks] == list(smoke.CHECK_NAMES)
    moe = LAYOUTS[layout].experts is not None
    failed = {c.name: c.detail for c in run.checks if c.ok is not True}
    if not moe:  # the expert checks skip, with their reason, where there are no routed experts
        assert {n: failed.pop(n) for n in ("experts", "experts_trip")} == dict.fromkeys(
            ("experts", "experts_trip"), f"{layout} has no routed experts"
        )
    assert not failed, failed
    assert run.ok and not run.findings
    if moe:  # every expert of every MoE block trained; fused → per-expert → fused gives the trained outputs
        assert "4/4 MoE blocks × 4 experts; coverage down 16/16, gate_up 16/16" in run.check("experts").detail
        assert run.check("experts_trip").value == 0.0
        assert "fused→per-expert→fused" in run.check("experts_trip").detail
    # the loss falls on the training rows (fixed seeds: base 0, LoRA 0)
    assert run.train_loss_after < run.train_loss_before - 0.05
    counterpart, n_keys = EXPECTED[layout]
    assert f"-> {counterpart}:" in run.check("remap").detail
    assert run.check("reload").value == 0.0 and run.check("remap").value == 0.0
    assert run.check("merge").value < 1e-4
    assert run.check("lora_b").value == n_keys // 2
    assert (tmp_path / layout / f"adapter-{counterpart}" / "adapter_model.safetensors").is_file()
    # the remapped folder names its class (auto_mapping) and its base (tiny:LAYOUT): verify without --base passes
    from adapterdoc.verify import verify_own_bases

    (own,) = verify_own_bases([str(tmp_path / layout / f"adapter-{counterpart}")]).adapters
    assert own.ok and own.base_layout == counterpart and not (own.missing or own.unexpected), own.findings
    meta = json.loads((tmp_path / layout / "training_metadata.json").read_text())
    assert len(meta["saved_keys"]) == n_keys


def test_omni_wrapper_saved_in_thinker_naming_passes_every_check_as_a_thinker_adapter(tmp_path) -> None:
    """Train the full Omni wrapper through .thinker, save the thinker's adapter (the production Omni trainer's way)."""
    s = TrainSettings(steps=4, unwrap_forward=True)
    run = smoke.run_layout("qwen3_omni", str(tmp_path / "omni"), s)
    assert run.ok, {c.name: c.detail for c in run.checks if not c.ok}
    assert run.check("inspect").detail == "detected qwen3_omni_thinker"
    assert "qwen3_omni_thinker -> qwen3_moe_text" in run.check("remap").detail
    cfg = json.loads((tmp_path / "omni" / "adapter" / "adapter_config.json").read_text())
    assert cfg["auto_mapping"]["base_model_class"] == "Qwen3OmniMoeThinkerForConditionalGeneration"
    from adapterdoc.verify import verify_own_bases

    (own,) = verify_own_bases(
        [str(tmp_path / "omni" / "adapter")]
    ).adapters  # base tiny:qwen3_omni, as the thinker
    assert own.ok and own.base_layout == "qwen3_omni_thinker", own.findings
    meta = json.loads((tmp_path / "omni" / "training_metadata.json").read_text())
    assert isinstance(meta["lora"]["target_modules"], list)


def test_a_run_that_learns_nothing_fails_its_checks(tmp_path) -> None:
    """lr = 0: lora_B stays zero and the loss does not move; the doctor must say so (AD603, AD606, and verify's
    own all-zero lora_B error behind AD610)."""
    report = smoke.run_smoke(["mistral3_vl"], out=tmp_path, settings=TrainSettings(steps=2, lr=0.0))
    assert not report.ok
    run = report.runs[0]
    assert run.check("loss").ok is False and run.check("lora_b").ok is False
    assert run.check("reload").ok is True  # a zero adapter still reloads exactly
    assert run.check("verify").ok is False and "0 missing, 0 unexpected" in run.check("verify").detail
    assert "error findings AD3" in run.check("verify").detail
    assert {f.code for f in report.findings} == {"AD603", "AD606", "AD610"}
    assert all(f.severity == "error" for f in report.findings)


def test_refuses_to_replace_a_folder_it_did_not_write(tmp_path) -> None:
    (tmp_path / "mistral3_vl").mkdir()
    (tmp_path / "mistral3_vl" / "precious.txt").write_text("keep me")
    with pytest.raises(RefusedError, match="did not write"):
        smoke.run_smoke(["mistral3_vl"], out=tmp_path, steps=1)
    assert (tmp_path / "mistral3_vl" / "precious.txt").read_text() == "keep me"


def test_cli_json_contract_and_rerun_into_the_same_folder(cli, tmp_path) -> None:
    for _ in range(2):  # the second run replaces the first run's folder
        res = cli("train-smoke", "--layout", "modernbert_mlm", "--steps", "3", "--out", tmp_path, "--json")
        assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ok"] is True and doc["findings"] == [] and doc["steps"] == 3
    (row,) = doc["layouts"]
    assert row["layout"] == "modernbert_mlm" and row["ok"] is True
    assert row["loss_after"] < row["loss_before"]
    assert set(row["checks"]) == set(smoke.CHECK_NAMES)
    experts = ("experts", "experts_trip")  # skipped: an encoder has no routed experts
    assert all(c["ok"] is True and c["implementation"] for k, c in row["checks"].items() if k not in experts)
    assert all(row["checks"][k]["ok"] is None for k in experts)
    impl = {k: c["implementation"] for k, c in row["checks"].items()}
    assert impl["remap"].startswith("adapterdoc.remap") and impl["verify"] == "adapterdoc.verify"
    assert impl["merge"].startswith("adapterdoc.merge") and impl["lora_b"].startswith("adapterdoc.verify")
    assert row["adapter"] == str(tmp_path / "modernbert_mlm" / "adapter")


def test_cli_human_table_and_failure_exit_code(cli, tmp_path, monkeypatch) -> None:
    res = cli("train-smoke", "--layout", "mistral3_vl", "--steps", "2")
    assert res.exit_code == 0, res.output
    assert "mistral3_vl" in res.stdout and "reload" in res.stdout and "1/1 layout passed" in res.stdout
    assert "outputs were temporary" in res.stdout
    import functools

    monkeypatch.setattr(train_settings, "TrainSettings", functools.partial(TrainSettings, lr=0.0))
    res = cli("train-smoke", "--layout", "mistral3_vl", "--steps", "2", "--json")
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and {f["code"] for f in doc["findings"]} == {"AD603", "AD606", "AD610"}


def test_cli_usage_errors(cli, tmp_path) -> None:
    assert cli("train-smoke", "--layout", "nope").exit_code == 2
    assert cli("train-smoke", "--steps", "0").exit_code == 2
    f = tmp_path / "file"
    f.write_text("x")
    res = cli("train-smoke", "--layout", "mistral3_vl", "--out", f)
    assert res.exit_code in (2, 3)


def test_the_train_command_imports_no_torch() -> None:
    code = (
        "import sys, adapterdoc.commands.smoke_cmd, adapterdoc.codes.training; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_cli_data_file_that_cannot_be_used_is_one_exit_3_line_before_any_training(cli, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"split": "train", "prompt": "p", "answer": {"a": 1}}\nnot json\n')
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"split": "train", "prompt": "caf\u00e9", "answer": {"a": 1}}\n'.encode("latin-1"))
    cases = [
        (tmp_path / "nope.jsonl", "training data file not found"),
        (tmp_path, "is a folder"),
        (bad, "line 2 is not JSON"),
        (latin, "not UTF-8 text"),
    ]
    for data, why in cases:
        out = tmp_path / "runs"
        res = cli("train-smoke", "--layout", "all", "--data", data, "--out", out, "--json")
        assert res.exit_code == 3, res.output
        (line,) = res.stderr.splitlines()
        assert line.startswith("adapterdoc: error: ") and str(data) in line and why in line
        assert "AD609" not in res.stdout and json.loads(res.stdout)["ok"] is False
        assert not out.exists()  # refused before any layout ran


def test_cli_data_option_trains_on_the_given_rows(cli, tmp_path) -> None:
    from adapterdoc.train import data as D

    rows = [line for line in D.DEFAULT_DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    mine = tmp_path / "my rows.jsonl"
    mine.write_text("\n".join(rows[:30]) + "\n", encoding="utf-8")
    expected = D.load_dataset(mine)
    res = cli(
        "train-smoke", "--layout", "modernbert_mlm", "--steps", "2", "--data", mine, "--out", tmp_path / "o"
    )
    assert res.exit_code == 0, res.output
    meta = json.loads((tmp_path / "o" / "modernbert_mlm" / "training_metadata.json").read_text())
    assert meta["data"] == str(mine)
    setup = [
        json.loads(x) for x in (tmp_path / "o" / "modernbert_mlm" / "progress.jsonl").read_text().splitlines()
    ]
    (row,) = [e for e in setup if e.get("event") == "setup"]
    assert row["train_rows"] == len(expected.train) < len(D.load_dataset().train)
