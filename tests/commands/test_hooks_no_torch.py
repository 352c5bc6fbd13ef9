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
from typing import Any

import pytest

pytest.importorskip("peft")

HOOK = """
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "peft", "accelerate"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NotInstalled())
from adapterdoc.precommit import precommit_main
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


def test_the_light_hook_gives_the_ml_hooks_verdicts(tmp_path: Path) -> None:
    """A VL adapter committed against a text base, a typo'd config and a `.bin` adapter: the hook without torch
    exits as the ML hook does (registry vs PEFT on the meta device), never "needs torch"."""
    import torch

    from adapterdoc.layouts import LAYOUTS
    from adapterdoc.ml import meta as M
    from adapterdoc.verify import VerifyOptions, verify
    from tests.verify.test_verify_registry import _base as layout_base

    lora = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"]}
    text, vl = layout_base(tmp_path, "ministral3_text"), layout_base(tmp_path, "mistral3_vl")

    def expected(base: Path) -> dict[str, tuple[int, ...]]:
        spec = M.resolve_base(str(base))
        return M.build_meta_adapter(spec, M.lora_config_from_raw(lora), config=M.load_config(spec)).expected

    def write(
        name: str, cfg: dict[str, Any], keys: dict[str, tuple[int, ...]], binary: bool = False
    ) -> list[str]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        state = {k: torch.full(s, 0.01) for k, s in keys.items()}
        if binary:
            torch.save(state, folder / "adapter_model.bin")
            return [str(folder / "adapter_config.json"), str(folder / "adapter_model.bin")]
        from safetensors.torch import save_file

        save_file(state, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        return [str(folder / "adapter_config.json"), str(folder / "adapter_model.safetensors")]

    lay = LAYOUTS["mistral3_vl"]
    auto = {"auto_mapping": {"base_model_class": lay.model_class, "parent_library": lay.model_module}}
    text_keys = expected(text)
    cases = {
        "vl-on-text": write("vl-on-text", {**lora, **auto}, expected(vl)),
        "typo": write("typo", {**lora, "lora_alhpa": 16}, text_keys),
        "bin": write("bin", lora, text_keys, binary=True),
    }
    for name, files in cases.items():
        ml = verify([str(Path(files[0]).parent)], str(text), VerifyOptions(expected_keys="meta-device"))
        hook = _hook("--base", str(text), "--format", "json", *files, cwd=tmp_path)
        assert hook.returncode == ml.exit_code, (name, hook.stdout[-600:], hook.stderr)
        assert "needs `torch`" not in hook.stderr and "this needs" not in hook.stderr, name
        (report,) = json.loads(hook.stdout)["adapters"]
        (theirs,) = ml.to_dict()["adapters"]
        assert report["expected_keys_from"] == "registry", name
        for field in ("missing", "unexpected", "shape_mismatch"):
            assert report[field] == theirs[field], (name, field)
    assert ml.exit_code == 0  # the .bin adapter passes
