"""Bad inputs to ``--make-canaries`` and ``--local``: a prompts file or an adapter_config.json the canaries cannot
be made from is one exit-3 line, before any model is loaded (was exit 4 by an AttributeError, a RecursionError, a
UnicodeDecodeError, a ValueError or a ZeroDivisionError later)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def _adapter(tmp_path: Path, config: object) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir(exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def _one_line(r: Any, *words: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 3 and len(lines) == 1 and lines[0].startswith("adapterdoc: error: "), r.output
    assert all(w in r.stderr for w in words), r.stderr


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        (b'{"messages": [1, 2]}\n', ["line 1 has no prompt"]),
        (b'{"messages": [{"content": 3}]}\n', ["line 1 has no prompt"]),
        (b'{"prompt": 7}\n', ["line 1 has no prompt"]),
        (b'{"prompt": "ok"}\n[1]\n', ["line 2 has no prompt"]),
        (b"[" * 100_000 + b"\n", ["line 1 is not JSON", "nested too deep"]),
        (b'{"prompt": "caf\xe9"}\n', ["not UTF-8"]),
        (b"\n\n", ["no rows"]),
    ],
    ids=["messages-numbers", "content-number", "prompt-number", "row-list", "deep", "latin-1", "empty"],
)
def test_a_bad_prompts_file_is_one_line(cli: Any, tmp_path: Path, rows: bytes, words: list[str]) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(rows)
    adapter = _adapter(tmp_path, {"r": 4})
    out = tmp_path / "c.json"
    r = cli(
        "probe", "--make-canaries", adapter, "--base", tmp_path / "base", "--out", out, "--prompts", prompts
    )
    _one_line(r, *words)
    assert not out.exists()


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"r": 0}, ["its r is '0'"]),
        ({"r": -4}, ["its r is '-4'"]),
        ({"r": "x"}, ["its r is 'x'"]),
        ({"r": None}, ["its r is 'None'"]),
        ({"r": True}, ["its r is 'True'"]),
        ({"r": 4.5}, ["its r is '4.5'"]),
        ([1, 2], ["not a JSON object"]),
        ("[" * 100_000, []),
    ],
    ids=["0", "-4", "x", "null", "true", "4.5", "list", "deep"],
)
@pytest.mark.parametrize("mode", ["make", "local"])
def test_a_bad_adapter_config_is_one_line(
    cli: Any, tmp_path: Path, config: object, words: list[str], mode: str
) -> None:
    adapter = _adapter(tmp_path, config)
    if isinstance(config, str):
        (adapter / "adapter_config.json").write_text(config)
    base = tmp_path / "base"
    if mode == "make":
        r = cli("probe", "--make-canaries", adapter, "--base", base, "--out", tmp_path / "c.json")
    else:
        r = cli("probe", "http://127.0.0.1:9", "--adapter", "a", "--local", adapter, "--base", base)
    _one_line(r, "adapter_config.json", *words)


def test_the_out_file_is_never_an_input(cli: Any, tmp_path: Path) -> None:
    """``--out`` inside the adapter (even with --force) or the same file as --output-file is refused before any
    model is loaded, and the input is unchanged (it was overwritten after the forwards); a missing folder is said
    first too."""
    adapter = _adapter(tmp_path, {"r": 4, "peft_type": "LORA"})
    config = adapter / "adapter_config.json"
    before = config.read_bytes()
    base = tmp_path / "base"
    base.mkdir()
    args = ["probe", "--make-canaries", adapter, "--base", base]
    _one_line(cli(*args, "--out", config, "--force"), "--out would overwrite or sit inside the input")
    assert config.read_bytes() == before
    _one_line(cli(*args, "--out", tmp_path / "nowhere" / "c.json"), "the folder for --out does not exist")
    same = cli(*args, "--out", tmp_path / "c.json", "--output-file", tmp_path / "c.json")
    assert same.exit_code == 2 and "same file" in same.stderr
    assert cli(*args, "--out", tmp_path / "c.json", "--junit-file", tmp_path / "j.xml").exit_code == 2
