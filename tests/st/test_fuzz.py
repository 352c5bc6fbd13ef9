"""Fuzzing (issue 8): random bytes and mutated headers only ever raise adapterdoc's own error type, and a mutated
header is read or refused as the reference reads or refuses it; remap there and back is the identity on generated
adapters. ~500 examples by default, 20,000 under `-m slow`."""

from __future__ import annotations

import contextlib
import json
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import deserialize
from safetensors.numpy import save

from adapterdoc.errors import AdapterdocError, HeaderError
from adapterdoc.st.header import parse_header, read_header

FAST = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck))


def _valid_file() -> bytes:
    rng = np.random.default_rng(0)
    return save(
        {
            "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight": rng.random(
                (2, 4), np.float32
            ),
            "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros(
                (4, 2), np.float16
            ),
            "e": np.zeros((0, 3), np.int8),
        },
        metadata={"format": "pt"},
    )


VALID = _valid_file()
HEADER_END = 8 + struct.unpack("<Q", VALID[:8])[0]


def _parse(data: bytes) -> None:
    """What read_header does after the bounded read, on in-memory bytes: it reads what the reference
    (``safetensors.deserialize``) reads, alike, and refuses what it refuses (and a repeated tensor name, which the
    reference reads as its last spelling)."""
    if len(data) < 8:
        raise AssertionError("not reached")
    n = struct.unpack("<Q", data[:8])[0]
    if n > len(data) - 8:
        return
    try:
        theirs = {name: (t["dtype"], t["shape"], len(t["data"])) for name, t in deserialize(data)}
    except Exception:
        theirs = None
    try:
        header = parse_header("fuzz.safetensors", data[8 : 8 + n], len(data))
    except HeaderError as e:
        assert theirs is None or e.reason.startswith("duplicate tensor name"), e
        return
    assert theirs == {name: (t.dtype, list(t.shape), t.nbytes) for name, t in header.tensors.items()}


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "length"]))
        pos = draw(st.integers(8, HEADER_END - 1))
        if kind == "flip":
            data[pos] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        else:
            data[:8] = struct.pack("<Q", draw(st.integers(0, 2 * HEADER_END)))
    return bytes(data)


def _check_mutated(data: bytes) -> None:
    _parse(data)


def _check_file(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f.safetensors"
        p.write_bytes(data)
        with contextlib.suppress(AdapterdocError):
            read_header(p)
        assert p.read_bytes() == data


@FAST
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    _check_file(data)


@FAST
@given(mutated())
def test_mutated_headers(data: bytes) -> None:
    _check_mutated(data)


@pytest.mark.slow
@SLOW
@given(st.binary(max_size=512))
def test_random_bytes_slow(data: bytes) -> None:
    _check_file(data)


@pytest.mark.slow
@SLOW
@given(mutated())
def test_mutated_headers_slow(data: bytes) -> None:
    _check_mutated(data)


_LEAVES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@st.composite
def vl_adapters(draw: st.DrawFn) -> dict[str, np.ndarray]:
    layers = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6, unique=True))
    leaves = draw(st.lists(st.sampled_from(_LEAVES), min_size=1, max_size=4, unique=True))
    r = draw(st.sampled_from([1, 2, 4, 8]))
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    out = {}
    for i in layers:
        for leaf in leaves:
            part = "self_attn" if leaf.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            key = f"base_model.model.model.language_model.layers.{i}.{part}.{leaf}"
            out[f"{key}.lora_A.weight"] = np.full((r, 8), i + 1, dtype)
            out[f"{key}.lora_B.weight"] = np.full((8, r), -i, dtype)
    return out


def _remap_there_and_back(tensors: dict[str, np.ndarray]) -> None:
    from adapterdoc.remap import remap

    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "a"
        folder.mkdir()
        original = save(tensors, metadata={"format": "pt"})
        (folder / "adapter_model.safetensors").write_bytes(original)
        cfg = {"peft_type": "LORA", "r": 8, "target_modules": _LEAVES}
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        remap(folder, to="ministral3_text", source="mistral3_vl")
        assert not [
            k for k in read_header(folder / "adapter_model.safetensors").tensors if "language_model" in k
        ]
        remap(folder, to="mistral3_vl", source="ministral3_text")
        assert (folder / "adapter_model.safetensors").read_bytes() == original
        shutil.rmtree(folder)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(vl_adapters())
def test_remap_there_and_back_is_the_identity(tensors: dict[str, np.ndarray]) -> None:
    _remap_there_and_back(tensors)


@pytest.mark.slow
@settings(max_examples=2_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(vl_adapters())
def test_remap_there_and_back_is_the_identity_slow(tensors: dict[str, np.ndarray]) -> None:
    _remap_there_and_back(tensors)
