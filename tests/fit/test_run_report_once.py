"""`adapterdoc train` writes RUN_REPORT.md once, after the doctor (the loop is told not to), and runs the weights
audit once for it; train-smoke's loop still writes its own (the loop's default)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

import adapterdoc.audit  # noqa: E402
import adapterdoc.report.run_report  # noqa: E402
from adapterdoc.train import runtime  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "fixtures" / "make_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_models"] = mod
    spec.loader.exec_module(mod)
    return Path(mod.write_data(tmp_path_factory.mktemp("data"))["text"])


def test_train_writes_the_run_report_once_with_one_audit(
    cli, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    calls: dict[str, list[str]] = {"audit": [], "write": []}
    real_audit, real_write = adapterdoc.audit.audit_adapter, adapterdoc.report.run_report.write_run_report

    def audit(spec):  # type: ignore[no-untyped-def]
        calls["audit"].append(str(spec))
        return real_audit(spec)

    def write(folder, text):  # type: ignore[no-untyped-def]
        calls["write"].append(text)
        return real_write(folder, text)

    monkeypatch.setattr(adapterdoc.audit, "audit_adapter", audit)
    monkeypatch.setattr(adapterdoc.report.run_report, "write_run_report", write)
    out = tmp_path / "run"
    with runtime.torch_threads(1):
        res = cli(
            "train", "--base", "tiny:ministral3_text", "--data", data, "--out", out, "--steps", "1",
            "--max-length", "32", "--json",
        )  # fmt: skip
    assert res.exit_code in (0, 1), res.stderr
    assert len(calls["write"]) == 1 and len(calls["audit"]) == 1, {k: len(v) for k, v in calls.items()}
    text = (out / "RUN_REPORT.md").read_text()
    assert text == calls["write"][0]
    assert text.startswith("# Training run: tiny:ministral3_text\n\n- Objective: ")
    assert "## The doctor's verdict" in text and "## What the adapter changes (weights audit)" in text
