"""`inspect` parses a safetensors header once: format detection's header is the checkpoint's (no memo between
them), said of the path as the user spelled it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.checkpoint import open_checkpoint
from adapterdoc.inspection import inspect
from adapterdoc.st import header as st_header
from tests.small_adapters import write_small_adapter


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every header parse from here on."""
    seen: list[str] = []
    real = st_header.parse_header

    def counting(path: str, raw: bytes, file_size: int) -> Any:
        seen.append(path)
        return real(path, raw, file_size)

    monkeypatch.setattr(st_header, "parse_header", counting)
    return seen


@pytest.mark.parametrize("spelling", ["plain", "dot", "double slash"])
def test_inspect_of_a_peft_file_parses_its_header_once(
    tmp_path: Path, parses: list[str], monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    weights = write_small_adapter(tmp_path / "a") / "adapter_model.safetensors"
    monkeypatch.chdir(tmp_path)
    spec = {
        "plain": str(weights),
        "dot": "./a/adapter_model.safetensors",
        "double slash": "a//adapter_model.safetensors",
    }[spelling]
    report = inspect(spec)
    assert len(parses) == 1
    assert [f.path for f in report.files] == [spec] and report.tensors == 2 and report.lora is not None


def test_inspect_of_a_peft_folder_parses_its_header_once(tmp_path: Path, parses: list[str]) -> None:
    folder = write_small_adapter(tmp_path / "a")
    report = inspect(str(folder))
    assert parses == [os.path.join(str(folder), "adapter_model.safetensors")] and report.tensors == 2


def test_a_header_of_another_file_is_not_taken(tmp_path: Path, parses: list[str]) -> None:
    a = write_small_adapter(tmp_path / "a") / "adapter_model.safetensors"
    b = write_small_adapter(tmp_path / "b") / "adapter_model.safetensors"
    other = st_header.read_header(b)
    ckpt = open_checkpoint(str(a), header=other)
    assert parses == [str(b), str(a)] and ckpt.headers[0].path == str(a)
