"""``adapterdoc probe`` against llama-cpp-python's real server (0.3.36, the llama.cpp oracle environment with the
server's packages) on 127.0.0.1: a tiny Llama converted by llama.cpp's ``convert_hf_to_gguf.py`` (f32) and a PEFT
adapter converted by ``adapterdoc convert --to gguf``; canaries by ``probe --make-canaries``.

The stock server app serves a config with two aliases: ``base`` (the default) and ``tuned`` (with the adapter's
``lora_path``). An unknown alias is served by the default model; a scaled case rebuilds the default model around
``llama_cpp.Llama(..., lora_scale=S)`` (its settings have no lora_scale)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.probe import tiny
from tests.probe.servers import free_port, serving

pytestmark = [pytest.mark.oracle, pytest.mark.ml]
HERE = Path(__file__).parent
SERVER = HERE / "llama_server.py"
CONVERTERS = HERE.parent / "formats" / "gguf_oracle_driver.py"


def _run(python: Path, script: Path, *args: Any, cwd: Path) -> None:
    r = subprocess.run(
        [str(python), str(script), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


@pytest.fixture(scope="module")
def llama(oracle_env: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The files: base GGUF, our adapter GGUF, canaries, and the server's config (base first, then tuned)."""
    from click.testing import CliRunner

    from adapterdoc.cli import main

    python = oracle_env("llama_cpp")
    tmp = tmp_path_factory.mktemp("probe_llama")
    _run(python, SERVER, "spm", tmp, cwd=tmp)
    base = tiny.base(tmp / "base", words=False)
    (base / "tokenizer.model").write_bytes((tmp / "tokenizer.model").read_bytes())
    _run(python, SERVER, "tokenizer", base, cwd=tmp)
    _run(python, CONVERTERS, "base", base, tmp / "base.gguf", cwd=tmp)
    peft = tiny.adapter(base, tmp / "peft")
    runner = CliRunner()
    r = runner.invoke(
        main, ["convert", str(peft), "--to", "gguf", "--base", str(base), "--out", str(tmp / "lora.gguf")]
    )
    assert r.exit_code == 0, r.output
    rows = [" ".join("abcdefghij"[(i + j) % 10] * (1 + (i * j) % 4) for j in range(8)) for i in range(5)]
    can = tiny.canaries(peft, base, rows, tmp)
    common = {
        "model": str(tmp / "base.gguf"),
        "logits_all": True,
        "n_ctx": 128,
        "n_threads": 1,
        "verbose": False,
    }
    models = [
        {**common, "model_alias": "base"},
        {**common, "model_alias": "tuned", "lora_path": str(tmp / "lora.gguf")},
    ]
    config = tmp / "models.json"
    config.write_text(json.dumps(models))
    (tmp / "tuned.json").write_text(json.dumps(models[1:]))
    (tmp / "no-logits.json").write_text(json.dumps([{**models[1], "logits_all": False}]))
    files = {"config": config, "tuned": tmp / "tuned.json", "no_logits": tmp / "no-logits.json"}
    return {"python": python, "tmp": tmp, "canaries": can, **files}


def _serve(llama: dict[str, Any], config: Path, scale: float = 1.0) -> Any:
    port = free_port()
    argv = [llama["python"], SERVER, "serve", config, port, scale]
    return serving(argv, port, llama["tmp"] / f"server-{port}.log")


def _probe(cli: Any, url: str, llama: dict[str, Any], alias: str) -> tuple[Any, dict[str, Any]]:
    r = cli("probe", url, "--adapter", alias, "--canaries", llama["canaries"], "--json")
    return r, json.loads(r.stdout)


def test_the_alias_with_the_adapter_and_an_unknown_alias(llama: dict[str, Any], cli: Any) -> None:
    with _serve(llama, llama["config"]) as url:
        r, out = _probe(cli, url, llama, "tuned")
        assert r.exit_code == 0, r.stdout
        assert (out["engine"], out["verdict"], out["factor"]) == ("llama.cpp", "applied", 1.0)
        assert out["best"] < 0.5 and out["separation"] > 20
        # a typo in the alias: the default model (the base) answers with 200 OK
        r, out = _probe(cli, url, llama, "tunde")
    assert r.exit_code == 1
    assert out["verdict"] == "base"
    assert sorted(f["code"] for f in out["findings"]) == ["AD901", "AD921"]


@pytest.mark.parametrize("scale", [0.5, 0.7])
def test_a_lora_scale_is_reported_as_the_factor(llama: dict[str, Any], cli: Any, scale: float) -> None:
    with _serve(llama, llama["tuned"], scale) as url:
        r, out = _probe(cli, url, llama, "tuned")
    assert r.exit_code == 1
    assert out["verdict"] == "scale"
    assert abs(out["factor"] - scale) <= 0.05 * scale, out
    assert [f["code"] for f in out["findings"]] == ["AD902"]


def test_a_server_without_prompt_logprobs(llama: dict[str, Any], cli: Any) -> None:
    with _serve(llama, llama["no_logits"]) as url:
        r = cli("probe", url, "--adapter", "tuned", "--canaries", llama["canaries"])
    assert r.exit_code == 3
    assert r.stderr.count("\n") == 1 and "HTTP 500" in r.stderr and "logits_all" in r.stderr


def test_a_trained_adapter_converted_to_gguf(llama: dict[str, Any], cli: Any, tmp_path: Path) -> None:
    # adapterdoc train on the base folder (it writes run/canaries.json from rows of its own data), convert --to gguf,
    # probe with the run's canaries file; then the same with canaries from probe --make-canaries on the same rows
    base = llama["tmp"] / "base"
    rows = [" ".join("abcdefghij"[(3 * i + j) % 7] * (1 + j % 3) for j in range(10)) for i in range(24)]
    peft = tiny.trained(base, rows, tmp_path / "run")
    gguf = tmp_path / "trained.gguf"
    assert cli("convert", peft, "--to", "gguf", "--base", base, "--out", gguf).exit_code == 0
    made = tiny.canaries(peft, base, rows[:6], tmp_path)
    model = json.loads(llama["tuned"].read_text())[0]
    config = tmp_path / "trained.json"
    config.write_text(json.dumps([{**model, "model_alias": "trained", "lora_path": str(gguf)}]))
    with _serve(llama, config) as url:
        for can in (tmp_path / "run" / "canaries.json", made):
            r = cli("probe", url, "--adapter", "trained", "--canaries", can, "--json")
            out = json.loads(r.stdout)
            assert (r.exit_code, out["verdict"], out["canaries"]) == (0, "applied", str(can)), out
            assert out["separation"] > 20


def test_a_vocabulary_without_bos(llama: dict[str, Any], cli: Any, tmp_path: Path) -> None:
    """The same base with a tokenizer that adds no BOS (``add_bos_token`` false, written into the GGUF by llama.cpp's
    converter). llama-cpp-python's echo then scores the logits row of each prompt token at that token itself (its
    ``all_logprobs[idx]`` for ``all_tokens[idx]``, right only when a BOS was dropped from the front): no shift of
    positions matches it, the canaries' ``same`` values do. The probe finds that alignment from the answers (it
    tries each and keeps the one that fits), and the verdicts are the same: applied, and the base for an unknown
    alias."""
    import shutil

    python, tmp = llama["python"], llama["tmp"]
    base = tmp_path / "base"
    shutil.copytree(tmp / "base", base)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (base / name).unlink(missing_ok=True)
    _run(python, SERVER, "tokenizer", base, "no-bos", cwd=tmp_path)
    _run(python, CONVERTERS, "base", base, tmp_path / "base.gguf", cwd=tmp_path)
    meta = subprocess.run(
        [str(python), "-c", "import sys, gguf; r = gguf.GGUFReader(sys.argv[1]); "
         "f = r.fields['tokenizer.ggml.add_bos_token']; print(bool(f.parts[f.data[0]][0]))", tmp_path / "base.gguf"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert meta.stdout.strip() == "False", meta.stderr[-2000:]
    can = tmp_path / "canaries.json"
    prompts = tmp / "prompts.jsonl"
    r = cli("probe", "--make-canaries", tmp / "peft", "--base", base, "--out", can, "--prompts", prompts)
    assert r.exit_code == 0, r.output
    assert json.loads(can.read_text())["bos"] is False
    model = json.loads(llama["tuned"].read_text())[0]
    config = tmp_path / "models.json"
    config.write_text(
        json.dumps(
            [
                {**model, "model": str(tmp_path / "base.gguf"), "model_alias": "base", "lora_path": None},
                {**model, "model": str(tmp_path / "base.gguf"), "model_alias": "tuned"},
            ]
        )
    )
    with _serve(llama, config) as url:
        got = {}
        for alias in ("tuned", "tunde"):
            r = cli("probe", url, "--adapter", alias, "--canaries", can, "--json")
            got[alias] = (r.exit_code, json.loads(r.stdout)["verdict"])
    assert got == {"tuned": (0, "applied"), "tunde": (1, "base")}


def test_the_actions_probe_step_against_the_server(llama: dict[str, Any], tmp_path: Path) -> None:
    """The Action's post-deploy step (action.yml, scripts/action/probe.sh) run as the runner runs it, against the real
    server: annotations on the log, a JUnit file beside them; exit 0 for the adapter's alias, 1 for a typo."""
    import xml.etree.ElementTree as ET

    from tests.commands.test_action import _probe_step

    with _serve(llama, llama["config"]) as url:
        results = {}
        for alias in ("tuned", "tunde"):
            junit = tmp_path / f"{alias}.xml"
            res = _probe_step(
                tmp_path,
                probe_url=url,
                probe_adapter=alias,
                probe_canaries=str(llama["canaries"]),
                junit_file=str(junit),
            )
            suite = ET.parse(junit).getroot().find("testsuite")
            results[alias] = (res.returncode, suite is not None and suite.get("failures"), res.stdout)
    assert results["tuned"][:2] == (0, "0"), results["tuned"]
    assert results["tunde"][:2] == (1, "1"), results["tunde"]
    assert "::error" in results["tunde"][2] and "AD901" in results["tunde"][2]
