"""`adapterdoc train` / `adapterdoc eval` on model folders written by fixtures/make_models.py (save_pretrained
weights + an offline chat tokenizer with {% generation %} markers), built once per session."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

from safetensors.torch import load_file  # noqa: E402

from adapterdoc.fit import session as S  # noqa: E402
from adapterdoc.layouts import tower_segment  # noqa: E402
from adapterdoc.train import data as D  # noqa: E402
from adapterdoc.train import models, runtime  # noqa: E402
from adapterdoc.train import rows as R  # noqa: E402
from adapterdoc.train.settings import TrainSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _make_models_module():
    spec = importlib.util.spec_from_file_location("make_models", ROOT / "fixtures" / "make_models.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def fx(tmp_path_factory):
    """``fx.model(name)`` builds a fixture folder on first use; ``fx.data[kind]`` the JSONL files."""
    mm = _make_models_module()
    root = tmp_path_factory.mktemp("models")

    class Fx:
        data = mm.write_data(root / "data")

        @staticmethod
        def model(name: str) -> Path:
            return mm.make(root, [name])[name]

    return Fx


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with runtime.torch_threads(1):
        yield


def _train(cli, base, data, out, *extra: str):
    res = cli("train", "--base", base, "--data", data, "--out", out, "--lr", "5e-3", "--json", *extra)
    return res, (json.loads(res.stdout) if res.stdout.strip().startswith("{") else None)


@pytest.fixture(scope="module")
def vl_run(fx, tmp_path_factory):
    from click.testing import CliRunner

    from adapterdoc.cli import main

    out = tmp_path_factory.mktemp("vl") / "run"
    args = ["train", "--base", fx.model("qwen3_5_vl"), "--data", fx.data["messages"], "--out", out]
    args += ["--lr", "5e-3", "--steps", "4", "--save-steps", "2", "--val-split", "0.2", "--json"]
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr + res.stdout
    return out, json.loads(res.stdout)


def test_vl_folder_trains_verifies_and_keeps_the_towers_out(vl_run, fx) -> None:
    out, d = vl_run
    assert d["ok"] and d["steps"] == 4 and d["layout"] == "qwen3_5_vl"
    assert d["train_loss"]["after"] < d["train_loss"]["before"]
    assert d["val_loss"]["after"] < d["val_loss"]["before"]
    v = d["verify"]
    assert v["ok"] and v["missing"] == v["unexpected"] == v["shape_mismatch"] == 0
    assert v["lora_b"]["total"] > 0 and v["lora_b"]["nonzero"] == v["lora_b"]["total"]
    keys = list(load_file(out / "adapter" / "adapter_model.safetensors"))
    assert keys and all(".language_model." in k for k in keys)
    assert not [k for k in keys if tower_segment(k) is not None]  # no LoRA on model.visual
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(fx.model("qwen3_5_vl").resolve())
    assert cfg["exclude_modules"]  # the registry's tower regex


def test_a_run_leaves_its_records(vl_run) -> None:
    out, _ = vl_run
    steps = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    steps = [e for e in steps if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    assert all(e["loss"] > 0 and e["lr"] == 5e-3 and e["tokens_per_s"] > 0 for e in steps)
    meta = json.loads((out / "training_metadata.json").read_text())
    assert meta["rows"] == "messages" and meta["chat_mask"] == "generation markers"
    assert meta["lora"]["r"] == 8 and meta["settings"]["steps"] == 4
    report = (out / "RUN_REPORT.md").read_text()
    assert "The doctor's verdict" in report and "passed" in report and "towers untouched: yes" in report
    assert "supervised tail" in report and "## What the adapter changes (weights audit)" in report
    if importlib.util.find_spec("matplotlib"):
        assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "![loss curve](loss_curve.png)" in report
        assert (out / "delta_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "![LoRA delta norm per layer and module](delta_heatmap.png)" in report
    else:
        assert "Skipped: matplotlib is not installed" in report
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    assert not [p for p in out.rglob("*") if p.name.startswith(".adapterdoc-")]


def test_eval_of_a_remapped_adapter_on_the_text_counterpart_gives_the_same_numbers(vl_run, fx, cli) -> None:
    out, _ = vl_run
    data = fx.data["messages"]
    vl = cli("eval", out / "adapter", "--base", fx.model("qwen3_5_vl"), "--data", data, "--json")
    assert vl.exit_code == 0, vl.stderr
    a = json.loads(vl.stdout)
    assert a["adapter"]["loss"] < a["base"]["loss"] and a["adapter"]["accuracy"] > a["base"]["accuracy"]
    assert a["base"]["tokens"] == a["adapter"]["tokens"] > 0
    text = out / "adapter-text"
    assert cli("remap", out / "adapter", "--vl", "--out", text).exit_code == 0
    counterpart = fx.model("qwen3_5_vl_text")
    t = json.loads(cli("eval", text, "--base", counterpart, "--data", data, "--json").stdout)
    for side in ("base", "adapter"):
        assert t[side]["tokens"] == a[side]["tokens"]
        assert t[side]["loss"] == pytest.approx(a[side]["loss"], abs=1e-5)
        assert t[side]["accuracy"] == pytest.approx(a[side]["accuracy"], abs=1e-9)
    # the gate, and the unmapped adapter on the text base: PEFT's missing keys are an error, not base numbers
    gate = cli("eval", text, "--base", counterpart, "--data", data, "--min-improvement", "100", "--json")
    assert gate.exit_code == 1 and [f["code"] for f in json.loads(gate.stdout)["findings"]] == ["AD625"]
    wrong = cli("eval", out / "adapter", "--base", counterpart, "--data", data, "--json")
    assert wrong.exit_code == 1 and "AD624" in [f["code"] for f in json.loads(wrong.stdout)["findings"]]


def test_resume_continues_from_the_saved_step(fx, tmp_path) -> None:
    base, data = str(fx.model("qwen3_5_text")), str(fx.data["prompt_completion"])
    s = dict(batch_size=2, lr=5e-3, save_steps=2, cpu=True)
    whole = S.train_on_base(base, data, str(tmp_path / "whole"), TrainSettings(steps=4, **s))
    S.train_on_base(base, data, str(tmp_path / "cut"), TrainSettings(steps=2, **s))
    again = S.train_on_base(base, data, str(tmp_path / "cut"), TrainSettings(steps=4, resume=True, **s))
    events = [json.loads(x) for x in (tmp_path / "cut" / "progress.jsonl").read_text().splitlines()]
    resume = [e for e in events if e["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == 2
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3, 4]
    assert again.train_loss["before"] == whole.train_loss["before"]
    a = load_file(tmp_path / "whole" / "adapter" / "adapter_model.safetensors")
    b = load_file(tmp_path / "cut" / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_a_finished_run_is_not_overwritten_without_force(fx, tmp_path, cli) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "progress.jsonl").write_text("")
    (out / "training_metadata.json").write_text("{}")
    res, _ = _train(cli, "tiny:ministral3_text", fx.data["text"], out, "--steps", "1")
    assert res.exit_code == 3 and "holds a finished run; pass --force" in res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["progress.jsonl", "training_metadata.json"]


def test_malformed_row_exits_3_naming_the_line_and_writes_nothing(fx, tmp_path, cli) -> None:
    rows = fx.data["messages"].read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([rows[0], rows[1], '{"messages": [{"role": "user"}]}', rows[2]]) + "\n")
    out = tmp_path / "out"
    res, _ = cli("train", "--base", fx.model("qwen3_5_text"), "--data", bad, "--out", out), None
    assert res.exit_code == 3
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adapterdoc: error: ")
    assert str(bad) in lines[0] and "line 3" in lines[0] and "Traceback" not in res.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("layout", "rows", "extra"),
    [
        ("mistral3_vl", "messages", ("--gradient-checkpointing",)),
        ("qwen3_omni_thinker", "messages", ()),
        ("modernbert_mlm", "prompt_completion", ("--warmup", "1")),
        ("embeddinggemma2", "classes", ("--val-data", "VAL")),
    ],
)
def test_each_fixture_layout_trains_and_verifies(fx, tmp_path, cli, layout: str, rows: str, extra) -> None:
    extra = [str(fx.data[rows]) if x == "VAL" else x for x in extra]
    out = tmp_path / "run"
    res, d = _train(cli, fx.model(layout), fx.data[rows], out, "--steps", "3", "--max-length", "64", *extra)
    assert res.exit_code == 0, res.stderr + res.stdout
    assert d["layout"] == layout and d["verify"]["ok"] and d["verify"]["tower_lora"] == 0
    assert d["train_loss"]["after"] < d["train_loss"]["before"]
    assert (d["val_loss"] is not None) == ("--val-data" in extra)
    if layout == "embeddinggemma2":
        head = json.loads((out / "head" / models.HEAD_CONFIG).read_text())
        assert head["classes"] == ["cancel", "order", "return", "track"]
        ev = cli("eval", d["adapter"], "--base", fx.model(layout), "--data", fx.data[rows], "--json")
        assert ev.exit_code == 0, ev.stderr
        e = json.loads(ev.stdout)
        assert e["base"]["tokens"] == e["adapter"]["tokens"] == 48  # pooled: one per row
    if "--warmup" in extra:
        events = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
        assert [e["lr"] for e in events if e["event"] == "step"] == [5e-3 / 2, 5e-3, 5e-3]


# ----------------------------------------------------------------------------------- row encodings (no model)


@pytest.fixture(scope="module")
def tok():
    return _make_models_module().tokenizer()


def test_chat_mask_from_generation_markers_equals_the_prefix_difference(tok) -> None:
    row = R.UserRow(
        1,
        R.MESSAGES,
        messages=(
            ("system", "be brief"),
            ("user", "two mugs"),
            ("assistant", "ok: 2"),
            ("user", "and"),
            ("assistant", "3"),
        ),
    )
    ids, marked = R.encode_messages(tok, row, "f")
    import copy

    bare = copy.deepcopy(tok)
    bare.chat_template = tok.chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    assert (
        R.chat_mask_method(tok) == "generation markers" and R.chat_mask_method(bare) == "prefix differences"
    )
    ids2, diffed = R.encode_messages(bare, row, "f")
    assert ids == ids2
    # the prefix difference also takes the separator the template writes after a turn ("\n"), nothing else
    assert all(d for m, d in zip(marked, diffed) if m)
    extra = [t for t, m, d in zip(ids, marked, diffed) if d and not m]
    assert extra and tok.decode(extra).strip() == ""
    supervised = tok.decode([t for t, m in zip(ids, marked) if m])
    assert supervised == "ok: 2<|end|>3<|end|>"


def test_prompt_completion_and_text_label_rules(tok) -> None:
    pc = R.causal_example(
        tok, R.UserRow(1, R.PROMPT_COMPLETION, prompt="cancel it", completion="done"), "f", None
    )
    n_prompt = len(tok("cancel it")["input_ids"])
    assert pc.labels[:n_prompt] == [D.IGNORE] * n_prompt
    assert pc.labels[n_prompt:] == pc.input_ids[n_prompt:] and pc.input_ids[-1] == tok.eos_token_id
    text = R.causal_example(tok, R.UserRow(1, R.TEXT, text="all of it"), "f", 3)
    assert text.labels == text.input_ids and len(text.input_ids) == 3


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json", "line 2 is not JSON"),
        ('{"prompt": "x"}', "line 2: `prompt` and `completion`"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "line 2: no assistant message"),
        ('{"foo": 1}', "line 2: a row needs"),
        ('{"text": "mixed"}', "line 2: a `text` row in a file of `prompt_completion` rows"),
    ],
)
def test_malformed_rows_name_their_line(tmp_path, line: str, needle: str) -> None:
    from adapterdoc.errors import ConfigError

    p = tmp_path / "rows.jsonl"
    p.write_text('{"prompt": "a", "completion": "b"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("`", "`")):
        R.read_rows(p)


# ----------------------------------------------------------------------------------- two processes


def _launch(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return subprocess.run(
        [*launcher, "-m", "adapterdoc", "train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.mark.slow
def test_two_processes_give_the_adapter_of_one_for_the_same_global_batch(fx, tmp_path) -> None:
    """``accelerate launch --multi_gpu --num_processes 2`` (torchrun, gloo on CPU): batch 2 per process equals
    batch 4 in one process, to float tolerance; only rank 0 prints and writes."""
    base, data = str(fx.model("qwen3_5_text")), str(fx.data["prompt_completion"])
    common = ["--base", base, "--data", data, "--steps", "3", "--lr", "5e-3", "--save-steps", "0", "--json"]
    proc = _launch(*common, "--batch-size", "2", "--out", str(tmp_path / "two"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count('"adapter"') == 1 and json.loads(proc.stdout)["num_processes"] == 2
    one = S.train_on_base(
        base, data, str(tmp_path / "one"), TrainSettings(steps=3, batch_size=4, lr=5e-3, cpu=True)
    )
    assert one.num_processes == 1
    a = load_file(tmp_path / "one" / "adapter" / "adapter_model.safetensors")
    b = load_file(tmp_path / "two" / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4), k
    events = [json.loads(x)["event"] for x in (tmp_path / "two" / "progress.jsonl").read_text().splitlines()]
    assert events.count("save_done") == 1


def test_ctrl_c_leaves_the_last_complete_checkpoint_and_resume_finishes(fx, tmp_path) -> None:
    """A tiny base (tokenizer trained on the rows, saved with the adapter); interrupted at step 3 with a
    checkpoint every 2 steps; --epochs derives the steps."""
    data, out = str(fx.data["text"]), tmp_path / "run"

    def stop(event: dict) -> None:
        if event.get("event") == "step" and event["step"] == 3:
            raise KeyboardInterrupt

    s = dict(batch_size=4, lr=5e-3, save_steps=2, cpu=True, max_length=48)
    with pytest.raises(KeyboardInterrupt):
        S.train_on_base("tiny:ministral3_text", data, str(out), TrainSettings(steps=4, **s), on_event=stop)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002"]
    assert (out / "checkpoints" / "step-000002" / "trainer_state.json").is_file()
    assert not (out / "adapter").exists()
    events = [json.loads(x)["event"] for x in (out / "progress.jsonl").read_text().splitlines()]
    assert events[-1] == "interrupted"
    # 48 rows / batch 4 = 12 steps per epoch: 1/3 epoch is 4 steps
    done = S.train_on_base(
        "tiny:ministral3_text", data, str(out), TrainSettings(epochs=1 / 3, resume=True, **s)
    )
    assert done.ok and done.steps == 4 and done.verify["ok"]
    assert (out / "adapter" / "tokenizer.json").is_file()


def test_targets_that_match_nothing_are_an_input_error(fx, tmp_path, cli) -> None:
    res, _ = _train(
        cli, "tiny:ministral3_text", fx.data["text"], tmp_path / "run", "--steps", "1", "--targets", "nope"
    )
    assert res.exit_code == 3 and "--targets: PEFT refused" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run" / "adapter").exists()
