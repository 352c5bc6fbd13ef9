"""`adapterdoc convert ... --to gguf`, `inspect X.gguf` and `verify X.gguf --base MODEL.gguf` as CLI.md writes them
(in-process runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("peft")

from adapterdoc.formats.gguf.header import read_header
from tests.formats.gguf_helpers import base_tensors, generic_model, peft_adapter, save_config, write_gguf

pytestmark = [pytest.mark.ml]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    model = generic_model("llama")
    return {
        "base": save_config(model, d / "base"),
        "peft": peft_adapter(model, d / "peft", target_modules=["q_proj", "k_proj", "down_proj"]),
        "dora": peft_adapter(model, d / "dora", use_dora=True, target_modules=["q_proj"]),
        "dir": d,
    }


def test_gguf_cli_convert_both_ways(cli, made: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    (made["dir"] / "g").mkdir()
    out = made["dir"] / "g" / "a.gguf"  # a GGUF input's folder may not hold the output (convert's rule)
    r = cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", out, "--json")
    assert r.exit_code == 0, r.output
    json.loads(r.stdout)
    assert read_header(out).kv["general.type"] == "adapter"
    back = made["dir"] / "back"
    r = cli("convert", out, "--to", "peft", "--out", back)
    assert r.exit_code == 0, r.output
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        assert (back / f).read_bytes() == (made["peft"] / f).read_bytes()
    r = cli(
        "convert",
        made["peft"],
        "--to",
        "gguf",
        "--base",
        made["base"],
        "--out",
        made["dir"] / "h.gguf",
        "--outtype",
        "f16",
    )
    assert r.exit_code == 0, r.output
    assert {t.type_name for t in read_header(made["dir"] / "h.gguf").tensors.values()} == {"F16"}


def test_gguf_cli_refusal_is_one_line_exit_3(cli, made: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    before = (made["dora"] / "adapter_model.safetensors").read_bytes()
    out = made["dir"] / "dora.gguf"
    r = cli("convert", made["dora"], "--to", "gguf", "--base", made["base"], "--out", out)
    assert r.exit_code == 3
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adapterdoc: error: ") and "AD871" in lines[0]
    assert not out.exists() and (made["dora"] / "adapter_model.safetensors").read_bytes() == before
    r = cli("convert", made["peft"], "--to", "gguf", "--out", made["dir"] / "nobase.gguf")
    assert r.exit_code == 3 and "--base is needed" in r.stderr


def test_gguf_cli_inspect_and_verify(cli, made: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    out = made["dir"] / "v.gguf"
    assert cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", out).exit_code == 0
    r = cli("inspect", out, "--json")
    assert r.exit_code == 0, r.output
    assert "gguf" in r.stdout.lower()
    base = write_gguf(made["dir"] / "base.gguf", "llama", base_tensors(), adapter=False)
    r = cli("verify", out, "--base", base, "--format", "json")
    assert r.exit_code == 0, r.output
    tensors = {k: v for k, v in base_tensors().items() if not k.startswith("blk.1.attn_k")}
    short = write_gguf(made["dir"] / "short.gguf", "llama", tensors, adapter=False)
    r = cli("verify", out, "--base", short, "--format", "json")
    assert r.exit_code == 1 and "AD855" in r.stdout


def test_gguf_cli_gguf_to_gguf_through_peft(cli, made: dict[str, Path]) -> None:  # type: ignore[no-untyped-def]
    """GGUF → GGUF goes through a temporary PEFT folder: --outtype re-casts; a refusal in the second hop names the
    input, not the temporary folder, which is gone either way."""
    d = made["dir"] / "gg"
    d.mkdir()
    src = d / "a.gguf"
    assert cli("convert", made["peft"], "--to", "gguf", "--base", made["base"], "--out", src).exit_code == 0
    r = cli("convert", src, "--to", "gguf", "--out", d / "again.gguf")
    assert r.exit_code == 3 and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith(f"adapterdoc: error: {src}: --base is needed"), r.stderr
    assert ".adapterdoc-convert-" not in r.stderr and sorted(p.name for p in d.iterdir()) == ["a.gguf"]
    r = cli(
        "convert", src, "--to", "gguf", "--base", made["base"], "--out", d / "f16.gguf", "--outtype", "f16"
    )
    assert r.exit_code == 0, r.output
    assert {t.type_name for t in read_header(d / "f16.gguf").tensors.values()} == {"F16"}
    assert sorted(p.name for p in d.iterdir()) == ["a.gguf", "f16.gguf"]
