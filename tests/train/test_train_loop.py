"""The training loop: tail-only projection equals the full one, records, accumulation, and two processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from adapterdoc.train import data as D  # noqa: E402
from adapterdoc.train import loop, models, objectives, runtime  # noqa: E402
from adapterdoc.train import lora as L  # noqa: E402
from adapterdoc.train.settings import TrainSettings  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with runtime.torch_threads(1):
        yield


@pytest.fixture(scope="module")
def rows() -> D.Dataset:
    return D.load_dataset()


def _trained_like(model, seed: int = 0):
    """LoRA with non-zero B, so the adapter changes the outputs (as after training)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


@pytest.mark.parametrize(
    "layout", ["qwen3_5_vl", "qwen3_omni_thinker", "qwen3_omni", "mistral3_vl", "modernbert_mlm"]
)
def test_tail_only_projection_gives_the_full_projection_loss_and_gradients(rows, layout: str) -> None:
    objective = objectives.objective_for(layout)
    tok = D.build_tokenizer(rows.train + rows.val)
    batch = D.collate(objectives.encode_rows(objective, tok, rows.train[:4], rows.classes, 0))
    model = _trained_like(L.inject(models.build_base(layout), layout, r=2))
    head = models.output_head(model)
    seen: list[int] = []
    handle = head.register_forward_hook(lambda m, a, out: seen.append(a[0].shape[0] * a[0].shape[1]))
    loss_fn = objectives.LOSSES[objective]
    results = []
    for tail in (True, False):
        model.zero_grad()
        t = loss_fn(model, batch, head, tail_only=tail)
        t.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((t, grads))
    handle.remove()
    (tail_t, tail_g), (full_t, full_g) = results
    labels = batch["labels"]
    every = labels.numel()
    supervised = (
        int((labels[:, 1:] != D.IGNORE).sum())
        if objective == objectives.CAUSAL
        else int((labels != -100).sum())
    )
    assert seen[1] == every and seen[0] == supervised < every  # only the supervised positions were projected
    assert float(tail_t.count) == float(full_t.count) > 0
    assert float(tail_t.correct) == float(full_t.correct)
    assert torch.allclose(tail_t.loss, full_t.loss, rtol=0, atol=1e-6)
    for n in tail_g:
        assert torch.allclose(tail_g[n], full_g[n], rtol=1e-4, atol=1e-7), n


def test_loss_ignores_prompt_padding_and_zero_weight_rows(rows) -> None:
    tok = D.build_tokenizer(rows.train + rows.val)
    model = _trained_like(L.inject(models.build_base("mistral3_vl"), "mistral3_vl", r=2)).eval()
    head = models.output_head(model)
    ex = [D.encode_chat(tok, r) for r in rows.val[:3]]
    with torch.no_grad():
        alone = objectives.answer_token_loss(model, D.collate(ex[:1]), head)
        ex[1].weight = ex[2].weight = 0.0
        padded = objectives.answer_token_loss(model, D.collate(ex), head)
    assert float(padded.count) == float(alone.count) == sum(v != D.IGNORE for v in ex[0].labels)
    assert torch.allclose(padded.loss, alone.loss, atol=1e-6)


def test_run_records_and_gradient_accumulation(tmp_path) -> None:
    s = TrainSettings(steps=3, grad_accum=2, batch_size=2)
    result = loop.train("mistral3_vl", tmp_path, s)
    events = [json.loads(line)["event"] for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert events[:3] == ["setup", "model_ready", "eval"]
    assert events.count("step") == 3 and events[-1] == "complete"
    assert events.index("save_start") < events.index("save_done") < events.index("complete")
    meta = json.loads((tmp_path / "training_metadata.json").read_text())
    assert meta["settings"]["grad_accum"] == 2 and meta["num_processes"] == 1
    assert meta["loss"] == "answer-token cross-entropy"
    assert len(meta["history"]) == 3 and all(h["grad_norm"] is not None for h in meta["history"])
    assert sorted(meta["saved_keys"]) == result.saved_keys and len(result.saved_keys) == 56
    report = (tmp_path / "RUN_REPORT.md").read_text()
    assert "mistral3_vl" in report and "supervised tail" in report
    assert "28 LoRA module(s), 0 inert" in report  # 56 tensors; 3 steps move every lora_B off zero
    assert "![LoRA delta norm per layer and module](delta_heatmap.png)" in report
    assert (tmp_path / "delta_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {p.name for p in (tmp_path / "adapter").iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".adapterdoc-tmp-")]


def test_pooled_head_is_saved_with_its_config_and_reloads(tmp_path) -> None:
    result = loop.train("embeddinggemma2", tmp_path, TrainSettings(steps=4))
    assert result.objective == objectives.POOLED and result.head_dir
    cfg = json.loads((tmp_path / "head" / models.HEAD_CONFIG).read_text())
    assert cfg["classes"] == ["cancel", "order", "return", "track"] and cfg["in_features"] == 32
    head = models.load_head(result.head_dir)
    for k, v in result.model.head.state_dict().items():
        assert torch.equal(head.state_dict()[k], v)


def _launch(args: list[str], out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,  # the running interpreter's accelerate, not whatever `accelerate` is first on PATH
        "-m",
        "accelerate.commands.launch",
        *args,
        "-m",
        "adapterdoc.train.loop",
        "--layout",
        "qwen3_5_moe_vl",
        "--steps",
        "4",
        "--out",
        out,
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)


def test_two_process_run_shards_gathers_and_saves_once(tmp_path) -> None:
    """Two CPU processes (torchrun under ``accelerate launch --multi_gpu``): same validation loss as one process
    before training (LoRA B = 0), identical replicas after, one adapter that reloads with the trained outputs."""
    base = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    proc = _launch([*base, "--dynamo_backend", "no"], str(tmp_path), "--processes", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / "training_metadata.json").read_text())
    assert meta["num_processes"] == 2
    sums = meta["replica_checksums"]
    assert len(sums) == 2 and sums[0] == sums[1]
    single = loop.train("qwen3_5_moe_vl", tmp_path / "single", TrainSettings(steps=0))
    assert meta["val_before"]["count"] == single.val_before.count
    assert meta["val_before"]["loss"] == pytest.approx(single.val_before.loss, abs=1e-5)
    assert meta["train_before"]["count"] == single.train_before.count
    assert meta["train_after"]["loss"] < meta["train_before"]["loss"]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1 and lines[0]["num_processes"] == 2  # only the main process reports
    events = [json.loads(x)["event"] for x in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert events.count("save_done") == 1

    from peft import PeftModel

    model = PeftModel.from_pretrained(models.build_base("qwen3_5_moe_vl"), tmp_path / "adapter").eval()
    n_nonzero = sum(bool(p.any()) for n, p in model.named_parameters() if ".lora_B." in n)
    assert n_nonzero == len(meta["saved_keys"]) // 2


def test_cpu_flag_launches_one_process_and_the_guard_says_so(tmp_path) -> None:
    """accelerate 1.x: ``launch --cpu --num_processes 2`` without an MPI hostfile starts ONE process."""
    proc = _launch(["--cpu", "--num_processes", "2"], str(tmp_path), "--processes", "2")
    assert proc.returncode != 0
    assert "2 processes asked, 1 started" in proc.stderr
    assert not (tmp_path / "adapter").exists()


def test_loop_module_runs_single_process_from_python(tmp_path) -> None:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "adapterdoc.train.loop", "--layout", "modernbert_mlm", "--steps", "2"]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=1800
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1])["num_processes"] == 1
