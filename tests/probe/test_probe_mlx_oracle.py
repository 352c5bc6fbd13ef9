"""``adapterdoc probe`` against a real mlx_lm.server (mlx-lm 0.32, the MLX oracle environment) on 127.0.0.1: a tiny
Llama and a PEFT adapter converted by ``adapterdoc convert --to mlx``; canaries by ``probe --make-canaries``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.probe import tiny
from tests.probe.servers import free_port, serving

pytestmark = [pytest.mark.oracle, pytest.mark.ml]


@pytest.fixture(scope="module")
def mlx(oracle_env: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(url, files): one mlx_lm.server for the module's tests, serving the base; stopped at the end."""
    from click.testing import CliRunner

    from adapterdoc.cli import main

    python = oracle_env("mlx")
    tmp = tmp_path_factory.mktemp("probe_mlx")
    base = tiny.base(tmp / "base")
    peft = tiny.adapter(base, tmp / "peft")
    runner = CliRunner()
    r = runner.invoke(
        main, ["convert", str(peft), "--to", "mlx", "--base", str(base), "--out", str(tmp / "mlx")]
    )
    assert r.exit_code == 0, r.output
    rows = [" ".join(tiny.WORDS[(7 * i + 3 * j) % 120] for j in range(12)) for i in range(5)]
    can = tiny.canaries(peft, base, rows, tmp)
    (tmp / "hf").mkdir()  # its /v1/models reads the Hugging Face cache folder
    port = free_port()
    argv = [python, "-m", "mlx_lm.server", "--model", base, "--host", "127.0.0.1", "--port", str(port)]
    with serving(argv, port, tmp / "server.log", env={"HF_HUB_CACHE": str(tmp / "hf")}) as url:
        yield url, {"base": base, "mlx": tmp / "mlx", "canaries": can}


def _probe(cli: Any, url: str, files: dict[str, Path], *extra: str) -> tuple[Any, dict[str, Any]]:
    r = cli("probe", url, "--adapter", files["mlx"], "--canaries", files["canaries"], "--json", *extra)
    return r, json.loads(r.stdout)


def test_the_adapter_applied(mlx: Any, cli: Any) -> None:
    url, files = mlx
    r, out = _probe(cli, url, files, "--base-model", files["base"])
    assert r.exit_code == 0, r.stdout
    assert (out["engine"], out["engine_detected"], out["verdict"], out["factor"]) == (
        "mlx-lm",
        True,
        "applied",
        1.0,
    )
    assert out["best"] < 0.1 and out["separation"] > 20  # mlx's f32 logprobs equal PEFT's far inside 2e-3
    assert [f["code"] for f in out["findings"]] == ["AD900"]
    assert len(out["requests"]) <= 5


def test_a_request_without_model_gets_the_base(mlx: Any, cli: Any) -> None:
    url, files = mlx
    r, out = _probe(cli, url, files)
    assert r.exit_code == 1
    assert out["verdict"] == "base" and out["factor"] == 0.0
    assert sorted(f["code"] for f in out["findings"]) == ["AD901", "AD920"]


def test_a_server_that_is_down(mlx: Any, cli: Any) -> None:
    _, files = mlx
    r = cli("probe", f"http://127.0.0.1:{free_port()}", "--adapter", "x", "--canaries", files["canaries"])
    assert r.exit_code == 3
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "cannot connect" in r.stderr


def test_an_adapter_the_server_does_not_have(mlx: Any, cli: Any, tmp_path: Path) -> None:
    url, files = mlx
    args = ["--adapter", tmp_path / "absent", "--base-model", files["base"], "--canaries", files["canaries"]]
    r = cli("probe", url, *args)
    assert r.exit_code == 3
    assert r.stderr.count("\n") == 1 and "HTTP 404" in r.stderr and "does not exist" in r.stderr


def test_a_trained_adapter_converted_to_mlx(mlx: Any, cli: Any, tmp_path: Path) -> None:
    # adapterdoc train on the served base (it writes run/canaries.json from rows of its own data), convert --to mlx,
    # probe with the run's canaries file; then the same with canaries from probe --make-canaries on the same rows
    url, files = mlx
    rows = [" ".join(tiny.WORDS[(5 * i + j * j) % 10] for j in range(16)) for i in range(24)]
    peft = tiny.trained(files["base"], rows, tmp_path / "run")
    assert (
        cli("convert", peft, "--to", "mlx", "--base", files["base"], "--out", tmp_path / "mlx").exit_code == 0
    )
    made = tiny.canaries(peft, files["base"], rows[:6], tmp_path)
    for can in (tmp_path / "run" / "canaries.json", made):
        args = ["--adapter", tmp_path / "mlx", "--base-model", files["base"], "--canaries", can, "--json"]
        r = cli("probe", url, *args)
        out = json.loads(r.stdout)
        assert (r.exit_code, out["verdict"], out["canaries"]) == (0, "applied", str(can)), out
        assert out["separation"] > 20


def test_canaries_made_on_the_fly_with_local(mlx: Any, cli: Any) -> None:
    url, files = mlx
    peft = files["mlx"].parent / "peft"
    args = [
        "--adapter",
        files["mlx"],
        "--base-model",
        files["base"],
        "--local",
        peft,
        "--base",
        files["base"],
    ]
    r = cli("probe", url, *args, "--json")
    out = json.loads(r.stdout)
    assert (r.exit_code, out["verdict"], out["canaries"]) == (0, "applied", f"{peft} (local)")


def test_canaries_that_cannot_tell_the_adapter_from_the_base(mlx: Any, cli: Any, tmp_path: Path) -> None:
    # the same adapter with lora_B scaled by 1e-4: it moves no served logprob past float32's tolerance
    import shutil

    from safetensors.numpy import load_file, save_file

    url, files = mlx
    peft = files["mlx"].parent / "peft"
    weak = tmp_path / "weak"
    shutil.copytree(peft, weak)
    tensors = load_file(weak / "adapter_model.safetensors")
    scaled = {k: v * 1e-4 if "lora_B" in k else v for k, v in tensors.items()}
    save_file(scaled, weak / "adapter_model.safetensors")
    assert (
        cli("convert", weak, "--to", "mlx", "--base", files["base"], "--out", tmp_path / "mlx").exit_code == 0
    )
    can = tmp_path / "canaries.json"
    assert cli("probe", "--make-canaries", weak, "--base", files["base"], "--out", can).exit_code == 0
    args = ["--adapter", tmp_path / "mlx", "--base-model", files["base"], "--canaries", can]
    r = cli("probe", url, *args)
    assert r.exit_code == 3
    assert r.stderr.count("\n") == 1 and "tolerances of float32" in r.stderr
