"""mlx-lm's own ``load_adapters`` as the oracle for ``verify`` of MLX adapter folders (``-m oracle``; environment:
.ci/oracles/mlx.sh): a corpus of broken and odd folders, each loaded by mlx-lm on the same tiny base in its own
process, and verified by adapterdoc against that base. Every folder mlx-lm refuses (an exception) fails verify
(exit 1 or 3). Of the folders mlx-lm loads, verify passes those that work and fails those that cannot work as
trained, which each case names with the reason: every lora_b zero (the identity), a NaN or a string ``scale``
(NaN outputs; a TypeError at the first forward), ``dora`` without magnitudes (mlx-lm starts ``m`` at the base
weight's norms, so the output is not the LoRA's). mlx-lm 0.32.2's verdicts, as this test found them, are in the
module's ``MLX_LM`` table and checked on every run.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

from tests.formats.mlx_oracle import generic_config, peft_adapter, save_base

pytestmark = [pytest.mark.oracle, pytest.mark.ml]

DRIVER = """
import json, sys, traceback
from pathlib import Path
from mlx_lm.utils import load_model
from mlx_lm.tuner.utils import load_adapters
base, folders, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
result = {}
for folder in folders:
    model, _ = load_model(Path(base))
    try:
        load_adapters(model, folder)
        result[folder] = "loads"
    except Exception as e:
        result[folder] = f"refuses: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
Path(out).write_text(json.dumps(result))
"""

Mutation = Callable[[Path], None]


def _config(change: Callable[[dict[str, Any]], None]) -> Mutation:
    def apply(folder: Path) -> None:
        path = folder / "adapter_config.json"
        cfg = json.loads(path.read_text())
        change(cfg)
        path.write_text(json.dumps(cfg))

    return apply


def _params(**fields: Any) -> Mutation:
    return _config(lambda c: c["lora_parameters"].update(fields))


def _tensors(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Mutation:
    def apply(folder: Path) -> None:
        from safetensors.numpy import load_file, save_file

        path = folder / "adapters.safetensors"
        save_file(change(load_file(str(path))), str(path))

    return apply


def _drop_param(name: str) -> Mutation:
    return _config(lambda c: c["lora_parameters"].pop(name))


def _zero_b(w: dict[str, Any]) -> dict[str, Any]:
    return {k: v * 0 if k.endswith(".lora_b") else v for k, v in w.items()}


def _extra(w: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    return {**w, "model.layers.0.self_attn.q_proj.bias": np.zeros(4, np.float32)}


def _wide_b(w: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    k = next(k for k in sorted(w) if k.endswith(".lora_b"))
    return {**w, k: np.zeros((w[k].shape[0], w[k].shape[1] + 1), np.float32)}


def _truncate(folder: Path) -> None:
    path = folder / "adapters.safetensors"
    path.write_bytes(path.read_bytes()[:-40])


CASES: dict[str, tuple[Mutation | None, str]] = {
    # name: (the change, what mlx-lm's load_adapters does: "loads" / "loads, cannot work" / "refuses")
    "valid": (None, "loads"),
    "zero-lora-b": (_tensors(_zero_b), "loads, cannot work"),
    "num-layers-too-small": (_config(lambda c: c.update(num_layers=1)), "refuses"),
    "rank-differs": (_params(rank=8), "refuses"),
    "rank-a-string": (_params(rank="4"), "refuses"),
    "rank-a-float": (_params(rank=4.5), "refuses"),
    "scale-nan": (_params(scale=math.nan), "loads, cannot work"),
    "scale-a-string": (_params(scale="2"), "loads, cannot work"),
    "scale-missing": (_drop_param("scale"), "refuses"),
    "dropout-missing": (_drop_param("dropout"), "refuses"),
    "keys-a-string": (_params(keys="self_attn.q_proj"), "refuses"),
    "keys-leave-one-out": (_params(keys=["self_attn.q_proj"]), "refuses"),
    "extra-tensor": (_tensors(_extra), "refuses"),
    "lora-b-wrong-shape": (_tensors(_wide_b), "refuses"),
    "weights-truncated": (_truncate, "refuses"),
    "config-not-json": (lambda f: (f / "adapter_config.json").write_text("{not json"), "refuses"),
    "config-missing": (lambda f: (f / "adapter_config.json").unlink(), "refuses"),
    "dora-without-m": (_config(lambda c: c.update(fine_tune_type="dora")), "loads, cannot work"),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import transformers

    from adapterdoc.cli import main

    d = tmp_path_factory.mktemp("mlx-corpus")
    model = transformers.LlamaForCausalLM(generic_config("llama")).eval()
    base = save_base(model, d / "base")
    peft_adapter(model, d / "peft", ["q_proj", "v_proj"])
    from click.testing import CliRunner

    r = CliRunner().invoke(main, ["convert", str(d / "peft"), "--to", "mlx", "--out", str(d / "mlx")])
    assert r.exit_code == 0, r.output
    folders = {}
    for name, (change, _) in CASES.items():
        folder = Path(shutil.copytree(d / "mlx", d / name))
        if change is not None:
            change(folder)
        folders[name] = folder
    return {"base": base, "folders": folders, "dir": d}


def test_mlx_lm_and_verify_agree_on_every_folder(corpus: dict[str, Any], oracle_env: Any, cli: Any) -> None:
    python = oracle_env("mlx")
    out = corpus["dir"] / "mlx-lm.json"
    folders = [str(p) for p in corpus["folders"].values()]
    subprocess.run(
        [str(python), "-c", DRIVER, str(corpus["base"]), json.dumps(folders), str(out)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    said = json.loads(out.read_text())
    wrong = []
    for name, folder in corpus["folders"].items():
        mlx_lm, want = said[str(folder)], CASES[name][1]
        if (mlx_lm == "loads") != want.startswith("loads"):
            wrong.append(f"{name}: mlx-lm {mlx_lm}, the table says {want}")
        res = cli("verify", folder, "--base", corpus["base"], "--json")
        assert "Traceback" not in res.output
        passes = want == "loads"
        if (res.exit_code == 0) != passes or res.exit_code not in (0, 1, 3):
            wrong.append(f"{name}: mlx-lm {mlx_lm} ({want}); verify exit {res.exit_code}")
    assert wrong == [], "\n".join(wrong) + "\n" + json.dumps(said, indent=1)
