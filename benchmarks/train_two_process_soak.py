"""Two-process `adapterdoc train` under `accelerate launch --multi_gpu`, many times, with the machine loaded.

    python benchmarks/train_two_process_soak.py [--runs 20] [--busy 2] [--steps 3] [--timeout 900]

Issue 29: on a loaded 2-core machine a two-process run sometimes died at the very end (a child printed
``terminate called without an active exception`` and torchrun raised ``ChildFailedError``). This runs the same
command a user runs, ``python -m accelerate.commands.launch --multi_gpu --num_processes 2 ... -m adapterdoc train``
(torchrun; gloo on CPU), ``--runs`` times on the tiny ``qwen3_5_text`` model of ``fixtures/make_models.py``, with
``--busy`` processes spinning on the CPU beside it the whole time. A run is clean when it exits 0 and its stderr holds
no ``terminate called``, no ``ChildFailedError`` and no ``Traceback``. Every clean run must write the same adapter
(the same ``adapter_model.safetensors`` tensors, byte for byte). Prints one line per run and the totals; exit 1 unless
every run was clean and every adapter identical. The code that runs is this checkout's (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAD = ("terminate called", "ChildFailedError", "Traceback")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME",)}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    env.update({"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    return env


def _fixtures(work: Path) -> tuple[str, str]:
    sys.path.insert(0, str(ROOT))
    from fixtures import make_models

    model = make_models.make(work / "models", ["qwen3_5_text"])["qwen3_5_text"]
    data = make_models.write_data(work / "data")["prompt_completion"]
    return str(model), str(data)


def _tensors_digest(adapter: Path) -> str:
    """The digest of the adapter's tensors: the header's tensor entries and the data bytes (metadata left out)."""
    raw = (adapter / "adapter_model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    h = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    h.update(raw[8 + n :])
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=2, help="CPU-spinning processes beside the runs")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run")
    a = ap.parse_args()

    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    clean, digests, seconds = 0, {}, []
    try:
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            work = Path(tmp)
            base, data = _fixtures(work)
            print(f"{os.cpu_count()} CPUs, {a.busy} busy processes, load average {os.getloadavg()[0]:.2f}")
            for i in range(1, a.runs + 1):
                out = work / f"run-{i:02d}"
                cmd = [*launcher, "-m", "adapterdoc", "train", "--base", base, "--data", data]
                cmd += ["--steps", str(a.steps), "--save-steps", "0", "--json", "--out", str(out)]
                t0 = time.perf_counter()
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=a.timeout)
                    rc, err = proc.returncode, proc.stderr
                except subprocess.TimeoutExpired as e:
                    rc, err = "timeout", (e.stderr or b"").decode(errors="replace") if e.stderr else ""
                dt = time.perf_counter() - t0
                seconds.append(dt)
                bad = [b for b in BAD if b in err]
                ok = rc == 0 and not bad
                clean += ok
                digest = _tensors_digest(out / "adapter") if ok else None
                if digest:
                    digests[digest] = digests.get(digest, 0) + 1
                state = "clean" if ok else f"FAILED (exit {rc}; {', '.join(bad) or 'no marker'})"
                print(
                    f"run {i:2d}/{a.runs}: {state}, {dt:.1f} s, load {os.getloadavg()[0]:.2f}"
                    + (f", adapter {digest[:12]}" if digest else ""),
                    flush=True,
                )
                if not ok:
                    print("  " + "\n  ".join(err.strip().splitlines()[-12:]), flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    same = len(digests) == 1
    print(
        f"clean exits: {clean}/{a.runs}; identical adapters: {'yes' if same else 'NO'} "
        f"({len(digests)} distinct among {sum(digests.values())} clean runs); "
        f"median {sorted(seconds)[len(seconds) // 2]:.1f} s a run"
    )
    return 0 if clean == a.runs and same else 1


if __name__ == "__main__":
    raise SystemExit(main())
