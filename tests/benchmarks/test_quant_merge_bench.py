"""benchmarks/quant_merge.py --quick: both rows in the table, the anchor ran, and its check catches a wrong merge."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "quant_merge.py"

pytestmark = [pytest.mark.slow, pytest.mark.ml]


def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quant_merge_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("bench-quant")
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--work", str(work), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return work, r.stdout


def test_the_table_has_both_rows_and_the_anchor_ran(quick_run: tuple[Path, str]) -> None:
    _, out = quick_run
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| tool")]
    rows = [line for line in rows if not line.startswith("| ---")]
    assert [r.split(" | ")[0] for r in rows] == ["| transformers+PEFT (anchor)", "| adapterdoc merge"]
    assert rows[0].split(" | ")[1] == "ok"
    ours = rows[1].split(" | ")[1]
    assert ours == "ok" or ours.startswith("refused (AD"), ours
    assert "wall vs anchor:" in out and "peak RSS vs anchor:" in out
    if ours == "ok":
        assert "equality: PASS" in out, out


def test_the_check_fails_a_merge_that_dropped_the_delta(quick_run: tuple[Path, str], tmp_path: Path) -> None:
    """The anchor's output with one merged projection put back to the dequantized base: the check must say no."""
    import torch
    from safetensors.torch import load_file, save_file

    work, _ = quick_run
    qm = bench_module()
    (folder,) = [p for p in work.iterdir() if p.name.startswith("llama-fp8-")]
    built = json.loads((folder / "built.json").read_text())
    anchor = work / "out-anchor"
    wrong = tmp_path / "wrong"
    shutil.copytree(anchor, wrong)
    name = "model.layers.1.mlp.down_proj.weight"
    base_map, out_map = qm.weight_map(built["base"]), qm.weight_map(str(wrong))
    base_shard = load_file(str(Path(built["base"]) / base_map[name]))
    q, s = base_shard[name], base_shard[name + "_scale_inv"]
    rows, cols = q.shape
    w = q.float().reshape(s.shape[0], 128, s.shape[1], 128) * s[:, None, :, None]
    shard = load_file(str(wrong / out_map[name]))
    shard[name] = w.reshape(rows, cols).to(torch.bfloat16)
    save_file(shard, str(wrong / out_map[name]), {"format": "pt"})
    assert qm.check(str(anchor), str(anchor), built["base"], built["adapter"])["ok"]
    result = qm.check(str(wrong), str(anchor), built["base"], built["adapter"])
    assert not result["ok"]
    assert result["merged_beyond_tolerance"] == 1
    assert min(result["kept"]["ours"]) < 0.01


def test_a_refusal_is_a_row_of_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    qm = bench_module()
    finding = {"code": "AD520", "severity": "error", "message": "the base is quantized", "path": "b"}
    refused = qm.Run(0.4, 200 << 20, 0.3, 1, json.dumps({"ok": False, "findings": [finding]}), "")
    assert qm.refusal(refused) == "refused (AD520)"
    assert qm.refusal(refused._replace(stdout="Traceback", code=4)) == "failed (exit 4)"
    row = {"wall_s": 0.4, "cpu_s": 0.3, "peak_rss_bytes": 200 << 20, "runs": []}
    anchor = {"wall_s": 10.0, "cpu_s": 9.0, "peak_rss_bytes": 3 << 30, "runs": []}
    res = {
        "base_bytes": 1 << 30,
        "layers": 20,
        "shards": 3,
        "build_s": 0.0,
        "load_before": "1",
        "load_after": "1",
        "rows": {qm.ANCHOR: {**anchor, "result": "ok"}, qm.OURS: {**row, "result": "refused (AD520)"}},
        "plan": None,
        "wall_ratio": None,
        "peak_ratio": None,
        "wall_verdict": "n/a",
        "peak_verdict": "n/a",
        "equality": None,
    }
    qm.print_table(res)
    out = capsys.readouterr().out
    assert "| adapterdoc merge | refused (AD520) | 0.4 |" in out
    assert "wall vs anchor: — (goal <= 0.5x) n/a (adapterdoc refused (AD520))" in out
    assert "equality: n/a" in out
