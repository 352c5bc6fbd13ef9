"""adapterdoc's training loop beside TRL's ``SFTTrainer``: the same model, PEFT config, rows, batch and steps.

    python benchmarks/train_vs_trl.py [--steps N] [--batch-size N] [--prompt-words N] [--vocab N] [--device cpu|cuda]

The model is a random Ministral-3-style decoder (hidden 256, 4 layers, a vocabulary of ``--vocab``), built from a
fixed seed in each process; the rows are prompt + completion (long prompt, short JSON completion: the shape of
answer-token SFT), tokenized by the fixtures' offline tokenizer. Both trainers put LoRA r=8 on the registry's
leaves with the same ``LoraConfig`` and supervise only the completion. Each runs in its own fresh process:

- tokens/s: non-padding input tokens per second of optimizer steps (median step time, the first step left out);
- peak memory: CUDA ``max_memory_allocated`` during training, or on CPU the growth of the process's peak RSS
  from just before training to its end (imports and model building excluded).

The anchor is TRL in the same run. Needs ``trl`` (``pip install trl --no-deps`` plus ``datasets``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = "ministral3_text"


def _rss_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_model(vocab: int, device: str):
    import torch
    import transformers as tf

    cfg = tf.Ministral3Config(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = tf.Ministral3ForCausalLM(cfg)
    return model.to(device)


def rows(prompt_words: int) -> list[dict[str, str]]:
    from adapterdoc.train.data import DEFAULT_DATA

    src = [json.loads(x) for x in Path(DEFAULT_DATA).read_text().splitlines() if x.strip()]
    words = " ".join(r["prompt"] for r in src).split()
    out = []
    for i, r in enumerate(src):
        ctx = " ".join(words[(i * 7 + k) % len(words)] for k in range(prompt_words))
        out.append({"prompt": f"{ctx}\n{r['prompt']}\n", "completion": json.dumps(r["answer"])})
    return out


def tokenizer():
    sys.path.insert(0, str(ROOT / "fixtures"))
    import make_models

    return make_models.tokenizer()


def lora_config():
    from adapterdoc.train import lora as L

    return L.lora_config(LAYOUT, r=8, alpha=16)


def run_ours(a: argparse.Namespace) -> dict:
    import torch

    from adapterdoc.train import loop
    from adapterdoc.train import rows as R
    from adapterdoc.train.objectives import CAUSAL
    from adapterdoc.train.settings import Plan, TrainSettings

    tok = tokenizer()
    data = [
        R.UserRow(i + 1, R.PROMPT_COMPLETION, prompt=r["prompt"], completion=r["completion"])
        for i, r in enumerate(rows(a.prompt_words))
    ]
    examples = R.encode(CAUSAL, tok, data, "bench", max_length=None, seed=0, classes=[])
    model = build_model(a.vocab, a.device)  # built before the memory baseline, as for TRL
    plan = Plan(LAYOUT, CAUSAL, "bench", lambda: model, examples, [])
    s = TrainSettings(steps=a.steps, batch_size=a.batch_size, lr=1e-4, threads=None, cpu=a.device == "cpu")
    s.tail_only = not a.full_projection
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = _rss_peak_mb()
    with tempfile.TemporaryDirectory() as out:
        result = loop.run(plan, out, s)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _rss_peak_mb() - before
    steps = result.history[1:] or result.history
    step_s = statistics.median(h["step_s"] for h in steps)
    tokens = statistics.median(h["tokens"] for h in steps)
    return {
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "peak_mb": peak,
        "loss": result.history[-1]["loss"],
    }


def run_trl(a: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    tok = tokenizer()
    model = build_model(a.vocab, a.device)
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if a.device == "cuda":
                torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if a.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)

    ds = Dataset.from_list(rows(a.prompt_words))
    with tempfile.TemporaryDirectory() as out:
        cfg = SFTConfig(
            output_dir=out,
            per_device_train_batch_size=a.batch_size,
            gradient_accumulation_steps=1,
            max_steps=a.steps,
            learning_rate=1e-4,
            lr_scheduler_type="constant",
            warmup_steps=0,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            max_length=None,
            packing=False,
            completion_only_loss=True,
            dataloader_num_workers=0,
            use_cpu=a.device == "cpu",
            bf16=False,
            seed=0,
            disable_tqdm=True,
        )
        trainer = SFTTrainer(
            model=model,
            args=cfg,
            train_dataset=ds,
            processing_class=tok,
            peft_config=lora_config(),
            callbacks=[Clock()],
        )
        lengths = (
            [sum(m) for m in trainer.train_dataset["attention_mask"]]
            if "attention_mask" in trainer.train_dataset.column_names
            else [len(x) for x in trainer.train_dataset["input_ids"]]
        )
        if a.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        before = _rss_peak_mb()
        trainer.train()
        peak = torch.cuda.max_memory_allocated() / 2**20 if a.device == "cuda" else _rss_peak_mb() - before
    loss = next((h["loss"] for h in reversed(trainer.state.log_history) if "loss" in h), float("nan"))
    step_s = statistics.median(times[1:] or times)
    tokens = a.batch_size * statistics.mean(lengths)
    return {"step_s": step_s, "tokens_per_s": tokens / step_s, "peak_mb": peak, "loss": loss}


def child(a: argparse.Namespace) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.manual_seed(0)
    res = {"ours": run_ours, "ours-full": run_ours, "trl": run_trl}[a.child](a)
    print("RESULT " + json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--prompt-words", type=int, default=160)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--full-projection", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    base = [sys.executable, __file__, "--steps", str(a.steps), "--batch-size", str(a.batch_size)]
    base += ["--prompt-words", str(a.prompt_words), "--vocab", str(a.vocab), "--device", a.device]
    results = {}
    for name, extra in (("trl", []), ("ours", []), ("ours-full", ["--full-projection"])):
        proc = subprocess.run([*base, "--child", name, *extra], capture_output=True, text=True, env=env)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
        results[name] = json.loads(line[7:])
    print(
        f"device {a.device}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; vocab {a.vocab}, hidden 256, 4 layers; "
        f"LoRA r=8; batch {a.batch_size}; {a.steps} steps; ~{a.prompt_words}-word prompts, JSON completions"
    )
    print(f"{'trainer':<34}{'step s':>9}{'tokens/s':>11}{'peak MB':>10}{'last loss':>11}")
    labels = {
        "trl": "TRL SFTTrainer (anchor)",
        "ours": "adapterdoc (supervised positions)",
        "ours-full": "adapterdoc (full projection)",
    }
    for name, r in results.items():
        print(
            f"{labels[name]:<34}{r['step_s']:>9.3f}{r['tokens_per_s']:>11.0f}{r['peak_mb']:>10.0f}{r['loss']:>11.4f}"
        )
    t, o = results["trl"], results["ours"]
    print(
        f"adapterdoc / TRL: {o['tokens_per_s'] / t['tokens_per_s']:.2f}x tokens/s, {o['peak_mb'] / max(t['peak_mb'], 1e-9):.2f}x peak memory"
    )


if __name__ == "__main__":
    main()
