"""The pre-commit hook with the base install only: torch, transformers and PEFT un-importable in the hook's process,
run the way pre-commit runs it (`entry` + `args` + the changed file names) on a config-only ModernBERT-MLM base:
a clean adapter passes (exit 0), a broken one fails the gate (exit 1) with its missing and reshaped keys, and
`--load` exits 3 with one line naming the ML extra."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("peft")

HOOK = """
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "peft", "accelerate"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NotInstalled())
from adapterdoc.hooks import precommit_main
try:
    precommit_main(sys.argv[1:])
except SystemExit as e:
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "peft"))
    assert not heavy, heavy
    raise
"""
LAYOUT = "modernbert_mlm"
LORA = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["Wqkv", "Wo", "Wi", "head.dense"]}


def _base(root: Path) -> Path:
    from adapterdoc.ml.tiny import model_class, tiny_config

    cfg = tiny_config(LAYOUT)
    cfg.architectures = [model_class(LAYOUT).__name__]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg.save_pretrained(root / "base")
    return root / "base"


def _adapter(folder: Path, keys: dict[str, tuple[int, ...]]) -> list[str]:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps(LORA))
    save_file({k: torch.full(s, 0.01) for k, s in keys.items()}, str(folder / "adapter_model.safetensors"))
    return [str(folder / "adapter_config.json"), str(folder / "adapter_model.safetensors")]


def _hook(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HOOK, *args], capture_output=True, text=True, timeout=1800, cwd=cwd
    )


def test_the_hook_gates_without_torch(tmp_path: Path) -> None:
    from adapterdoc.ml import meta as M

    base = _base(tmp_path)
    spec = M.resolve_base(str(base))
    expected = M.build_meta_adapter(spec, M.lora_config_from_raw(LORA), config=M.load_config(spec)).expected
    clean = _adapter(tmp_path / "clean", dict(expected))
    broken_keys = dict(list(expected.items())[2:])
    first = next(iter(broken_keys))
    broken_keys[first] = (broken_keys[first][0] + 1, *broken_keys[first][1:])
    broken = _adapter(tmp_path / "broken", broken_keys)

    ok = _hook("--base", str(base), "--format", "json", *clean, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(ok.stdout)
    assert report["adapters"][0]["expected_keys_from"] == "registry"

    fail = _hook("--base", str(base), "--format", "json", *clean, *broken, cwd=tmp_path)
    assert fail.returncode == 1, fail.stdout + fail.stderr
    by_path = {Path(a["adapter"]).name: a for a in json.loads(fail.stdout)["adapters"]}
    assert by_path["broken"]["missing"] and by_path["broken"]["shape_mismatch"]
    assert by_path["broken"]["expected_keys_from"] == "registry"

    load = _hook("--base", str(base), "--load", *clean, cwd=tmp_path)
    assert load.returncode == 3
    lines = load.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adapterdoc: error: "), load.stderr
    assert "adapterdoc[ml]" in lines[0]
