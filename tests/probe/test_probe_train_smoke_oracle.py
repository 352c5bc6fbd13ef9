"""``probe --make-canaries`` then ``probe`` on a ``train-smoke`` adapter (the tiny Ministral 3 text layout), converted
by ``adapterdoc convert`` to GGUF and to MLX, against llama-cpp-python's real server (0.3.36, GGUF arch
``mistral3``) and mlx_lm.server (0.32, its ``ministral3`` model) on 127.0.0.1.

The base the run trained on is the folder train-smoke saves beside the adapter (``<layout>/base``, the tiny
reference model at the run's base seed). Its own tokenizer is a byte-level BPE trained on the rows and kept in
memory; llama.cpp's converter needs a SentencePiece model, so the folder gets the probe tests' character-level one
and its fast tokenizer (tests/probe/llama_server.py): the weights, and so the embedding rows the adapter was
trained with, are unchanged; the served model and the local one tokenize alike, which is all the probe needs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.probe.servers import free_port, serving

pytestmark = [pytest.mark.oracle, pytest.mark.ml]
HERE = Path(__file__).parent
SERVER = HERE / "llama_server.py"
CONVERTERS = HERE.parent / "formats" / "gguf_oracle_driver.py"
LAYOUT = "ministral3_text"
"""A registry text layout both runtimes serve: llama.cpp's MISTRAL3 arch and mlx-lm's ``ministral3`` model."""


def _run(python: Path, script: Path, *args: Any, cwd: Path) -> None:
    r = subprocess.run(
        [str(python), str(script), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


def _same_as_tiny(base: Path, seed: int) -> None:
    """The saved base holds the tiny reference model of the layout at the run's base seed, tensor for tensor."""
    import torch
    from safetensors.torch import load_file

    from adapterdoc.ml.tiny import build_tiny

    saved = load_file(base / "model.safetensors")
    own = build_tiny(LAYOUT, seed=seed).state_dict()
    assert saved and all(torch.equal(t, own[k]) for k, t in saved.items())


@pytest.fixture(scope="module")
def smoke(oracle_env: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """train-smoke's run, its base as a folder with a tokenizer, the adapter as GGUF and MLX, and the canaries."""
    from click.testing import CliRunner

    from adapterdoc.cli import main

    def cli(*args: Any) -> Any:
        return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)

    llama_python, mlx_python = oracle_env("llama_cpp"), oracle_env("mlx")
    tmp = tmp_path_factory.mktemp("probe_train_smoke")
    r = cli("train-smoke", "--layout", LAYOUT, "--out", tmp / "run")
    assert r.exit_code == 0, r.output
    run = tmp / "run" / LAYOUT
    peft = run / "adapter"
    assert (
        json.loads((peft / "adapter_config.json").read_text())["base_model_name_or_path"] == f"tiny:{LAYOUT}"
    )
    base = tmp / "base"
    shutil.copytree(run / "base", base)
    _same_as_tiny(base, json.loads((run / "training_metadata.json").read_text())["settings"]["base_seed"])
    _run(llama_python, SERVER, "spm", tmp, cwd=tmp)
    shutil.copy(tmp / "tokenizer.model", base / "tokenizer.model")
    _run(llama_python, SERVER, "tokenizer", base, cwd=tmp)
    _run(llama_python, CONVERTERS, "base", base, tmp / "base.gguf", cwd=tmp)
    assert cli("convert", peft, "--to", "gguf", "--base", base, "--out", tmp / "lora.gguf").exit_code == 0
    assert cli("convert", peft, "--to", "mlx", "--base", base, "--out", tmp / "mlx").exit_code == 0
    # short rows (under 32 tokens: the yarn config's original context, past which Llama 4's attention scaling starts)
    rows = [" ".join("abcdefghij"[(i + j) % 10] * (1 + (i * j) % 4) for j in range(6)) for i in range(5)]
    _tokenized_inside(base, rows)
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows))
    can = tmp / "canaries.json"
    r = cli("probe", "--make-canaries", peft, "--base", base, "--out", can, "--prompts", prompts)
    assert r.exit_code == 0, r.output
    return {"llama": llama_python, "mlx": mlx_python, "tmp": tmp, "base": base, "canaries": can}


def _tokenized_inside(base: Path, rows: list[str]) -> None:
    """Every row tokenizes to ids of the base's own vocabulary, in fewer than 32 tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    vocab = json.loads((base / "config.json").read_text())["vocab_size"]
    for row in rows:
        ids = tok(row)["input_ids"]
        assert ids[0] == tok.bos_token_id and len(ids) < 32 and max(ids) < vocab, (row, ids)


def _probe(cli: Any, url: str, canaries: Path, *args: Any) -> tuple[int, dict[str, Any]]:
    r = cli("probe", url, "--canaries", canaries, "--json", *args)
    return r.exit_code, json.loads(r.stdout)


def test_llama_cpp_serves_the_train_smoke_adapter(smoke: dict[str, Any], cli: Any) -> None:
    tmp = smoke["tmp"]
    common = {
        "model": str(tmp / "base.gguf"),
        "logits_all": True,
        "n_ctx": 128,
        "n_threads": 1,
        "verbose": False,
    }
    config = tmp / "models.json"
    models = [
        {**common, "model_alias": "base"},
        {**common, "model_alias": "smoke", "lora_path": str(tmp / "lora.gguf")},
    ]
    config.write_text(json.dumps(models))
    port = free_port()
    with serving([smoke["llama"], SERVER, "serve", config, str(port), "1.0"], port, tmp / "llama.log") as url:
        code, out = _probe(cli, url, smoke["canaries"], "--adapter", "smoke")
        assert (code, out["engine"], out["verdict"], out["factor"]) == (0, "llama.cpp", "applied", 1.0), out
        assert out["best"] < 0.5 and out["separation"] > 20, out
        # a typo in the alias: the default model (the base) answers with 200 OK
        code, typo = _probe(cli, url, smoke["canaries"], "--adapter", "smoek")
    assert (code, typo["verdict"]) == (1, "base"), typo
    assert sorted(f["code"] for f in typo["findings"]) == ["AD901", "AD921"]


def test_mlx_lm_serves_the_train_smoke_adapter(smoke: dict[str, Any], cli: Any) -> None:
    tmp, base = smoke["tmp"], smoke["base"]
    (tmp / "hf").mkdir(exist_ok=True)  # its /v1/models reads the Hugging Face cache folder
    port = free_port()
    argv = [smoke["mlx"], "-m", "mlx_lm.server", "--model", base, "--host", "127.0.0.1", "--port", str(port)]
    with serving(argv, port, tmp / "mlx.log", env={"HF_HUB_CACHE": str(tmp / "hf")}) as url:
        adapter = ("--adapter", tmp / "mlx")
        code, out = _probe(cli, url, smoke["canaries"], *adapter, "--base-model", base)
        assert (code, out["engine"], out["verdict"], out["factor"]) == (0, "mlx-lm", "applied", 1.0), out
        assert out["best"] < 0.1 and out["separation"] > 20, out
        # no model in the request: mlx_lm.server answers with the base even though it names the adapters
        code, bare = _probe(cli, url, smoke["canaries"], *adapter)
    assert (code, bare["verdict"], bare["factor"]) == (1, "base", 0.0), bare
    assert sorted(f["code"] for f in bare["findings"]) == ["AD901", "AD920"]
