"""`adapterdoc probe` against a real `vllm serve` and `python -m sglang.launch_server` with `--enable-lora`, in one go,
on a machine with a GPU and those engines installed (nothing in the test suite depends on it).

It builds a small Llama (head_dim 64, a word-level tokenizer) and two PEFT LoRAs on it (a plain one, and an rsLoRA
one: SGLang reads `lora_alpha / r` and ignores `use_rslora`, so there the probe must report the factor 1/sqrt(r)),
makes the canaries with `adapterdoc probe --make-canaries`, starts each engine on 127.0.0.1, probes each case with
the request the engine's users send, stops the engine, and prints a table of verdicts beside the expected ones.
Exit 0 when every case gets its expected verdict, 1 otherwise.

    python scripts/gpu_probe.py --work DIR [--engines vllm,sglang] [--vllm-python PY] [--sglang-python PY]
    python scripts/gpu_probe.py --work DIR --dry-run     # build the files, print the commands, start nothing

A case (engine, what the request sends, expected exit and verdict):
- vLLM: model=tuned → applied (0); model=rslora → applied (0); model=missing → HTTP 404, cannot be probed (3);
  model=BASE → base (1).
- SGLang: model=BASE:tuned → applied (0); model=tuned (vLLM's convention) → base (1, with AD922);
  lora_path=tuned beside model=BASE → applied (0); model=BASE:rslora → scale 1/sqrt(r) (1, factor 0.354 for r=8).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

RANK = 8
WORDS = [f"w{i}" for i in range(500)]


@dataclass(frozen=True)
class Case:
    engine: str
    adapter: str
    base_model: str | None
    expected_exit: int
    expected_verdict: str | None
    """None where the probe cannot judge (exit 3)."""
    factor: float | None = None


def build(work: Path) -> dict[str, Path]:
    """The base (bf16, head_dim 64), a plain LoRA, an rsLoRA, their canaries, and prompts."""
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer, models, pre_tokenizers

    base = work / "base"
    if not (base / "config.json").exists():
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(
            vocab_size=512,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
            torch_dtype="bfloat16",
        )
        transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(base)
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
        )
        fast.save_pretrained(base)
    files = {"base": base}
    for name, rslora in (("tuned", False), ("rslora", True)):
        folder = work / name
        if not (folder / "adapter_config.json").exists():
            model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
            torch.manual_seed(1)
            lora = LoraConfig(
                r=RANK,
                lora_alpha=2 * RANK,
                use_rslora=rslora,
                target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                init_lora_weights=False,
            )
            get_peft_model(model, lora).save_pretrained(folder)
        files[name] = folder
    prompts = work / "prompts.jsonl"
    rows = [" ".join(WORDS[(7 * i + 3 * j) % len(WORDS)] for j in range(16)) for i in range(6)]
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows))
    for name in ("tuned", "rslora"):
        out = work / f"canaries-{name}.json"
        if not out.exists():
            made = adapterdoc(
                "probe", "--make-canaries", files[name], "--base", base, "--out", out, "--prompts", prompts
            )
            if made.returncode != 0:
                raise SystemExit(f"probe --make-canaries {name}: {made.stderr.strip()}")
        files[f"canaries-{name}"] = out
    return files


def adapterdoc(*args: object) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "adapterdoc", *map(str, args)], capture_output=True, text=True, timeout=900
    )
    if r.returncode not in (0, 1, 3):
        raise SystemExit(f"adapterdoc {args[0]} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r


def vllm_argv(python: str, files: dict[str, Path], port: int) -> list[str]:
    """``vllm serve`` with both adapters under the names the clients send."""
    return [
        python, "-m", "vllm.entrypoints.cli.main", "serve", str(files["base"]),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
        "--enable-lora", "--max-lora-rank", str(RANK), "--max-model-len", "512",
        "--gpu-memory-utilization", "0.3", "--enforce-eager",
        "--lora-modules", f"tuned={files['tuned']}", f"rslora={files['rslora']}",
    ]  # fmt: skip


def sglang_argv(python: str, files: dict[str, Path], port: int) -> list[str]:
    """``sglang.launch_server`` with both adapters under the names the clients send."""
    return [
        python, "-m", "sglang.launch_server", "--model-path", str(files["base"]),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
        "--enable-lora", "--max-lora-rank", str(RANK), "--context-length", "512",
        "--mem-fraction-static", "0.3", "--disable-cuda-graph",
        "--lora-paths", f"tuned={files['tuned']}", f"rslora={files['rslora']}",
    ]  # fmt: skip


def cases(base: str) -> list[Case]:
    return [
        Case("vllm", "tuned", None, 0, "applied"),
        Case("vllm", "rslora", None, 0, "applied"),
        Case("vllm", "missing", None, 3, None),
        Case("vllm", base, None, 1, "base"),
        Case("sglang", f"{base}:tuned", None, 0, "applied"),
        Case("sglang", "tuned", None, 1, "base"),
        Case("sglang", "tuned", base, 0, "applied"),
        Case("sglang", f"{base}:rslora", None, 1, "scale", RANK**-0.5),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(argv: Sequence[str], port: int, log: Path, ready_s: float = 900.0) -> Iterator[str]:
    """Run a server until the block ends (terminate, then kill); ready when ``/v1/models`` answers."""
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + ready_s
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"the server exited ({proc.returncode}); see {log}")
                with contextlib.suppress(OSError), urllib.request.urlopen(url + "/v1/models", timeout=2):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"the server did not answer in {ready_s:.0f} s; see {log}")
                time.sleep(1.0)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def probe(url: str, case: Case, files: dict[str, Path]) -> tuple[int, str | None, float | None, str]:
    canaries = files["canaries-rslora" if "rslora" in case.adapter else "canaries-tuned"]
    args: list[object] = ["probe", url, "--adapter", case.adapter, "--canaries", canaries]
    args += ["--engine", case.engine, "--served-dtype", "bfloat16", "--json"]
    if case.base_model:
        args += ["--base-model", case.base_model]
    r = adapterdoc(*args)
    try:
        body = json.loads(r.stdout)
    except ValueError:
        return r.returncode, None, None, r.stderr.strip()[-300:]
    return r.returncode, body.get("verdict"), body.get("factor"), r.stderr.strip()[-300:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--engines", default="vllm,sglang")
    ap.add_argument("--vllm-python", default=sys.executable)
    ap.add_argument("--sglang-python", default=sys.executable)
    ap.add_argument("--dry-run", action="store_true", help="Build the files and print the commands only.")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    files = build(args.work)
    base = str(files["base"])
    argv = {
        "vllm": vllm_argv(args.vllm_python, files, 0),
        "sglang": sglang_argv(args.sglang_python, files, 0),
    }
    engines = [e for e in args.engines.split(",") if e]
    if args.dry_run:
        print(json.dumps({e: argv[e] for e in engines} | {"files": {k: str(v) for k, v in files.items()}}))
        return
    failures = 0
    print(f"{'engine':7} {'request':32} {'expected':16} {'got':16} ok")
    for engine in engines:
        port = free_port()
        command = (vllm_argv if engine == "vllm" else sglang_argv)(
            args.vllm_python if engine == "vllm" else args.sglang_python, files, port
        )
        with serving(command, port, args.work / f"{engine}.log") as url:
            for case in (c for c in cases(base) if c.engine == engine):
                code, verdict, factor, err = probe(url, case, files)
                ok = code == case.expected_exit and verdict == case.expected_verdict
                if case.factor is not None:
                    ok = ok and factor is not None and abs(factor / case.factor - 1) <= 0.05
                failures += not ok
                request = f"{case.adapter}" + (f" (model {case.base_model})" if case.base_model else "")
                want = f"{case.expected_exit} {case.expected_verdict or '-'}"
                got = f"{code} {verdict or '-'}" + (f" x{factor:.3f}" if factor else "")
                print(f"{engine:7} {request[-32:]:32} {want:16} {got:16} {'yes' if ok else 'NO: ' + err}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
