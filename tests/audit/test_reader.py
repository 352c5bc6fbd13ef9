"""The audit's reader (:class:`adapterdoc.audit.read.Reader`): positioned reads into one reused window, BF16
decoded by a zero-extending copy stored 2 bytes early (float32) or through a float32 scratch (float64). Every
decode is compared bit for bit with the plain one (``(bits << 16).view(float32)``, numpy's own widening) on
tensors that span many windows and end inside one, with the values that break a decode (±0, subnormals, ±Inf,
NaN payloads, the extremes); and ``TensorSource.windows_into`` gives the bytes, offsets and errors of the mmap
windows."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")

import adapterdoc.audit.read as read_mod  # noqa: E402
from adapterdoc.checkpoint import open_checkpoint  # noqa: E402
from adapterdoc.errors import HeaderError  # noqa: E402
from adapterdoc.st.header import read_header  # noqa: E402
from adapterdoc.st.tensors import TensorSource, tensor_windows  # noqa: E402

SPECIAL_BF16 = [
    0x0000,
    0x8000,
    0x0001,
    0x8001,
    0x007F,
    0x0080,
    0x7F7F,
    0xFF7F,
    0x7F80,
    0xFF80,
    0x7FC0,
    0xFFC1,
    0x7F81,
]


def _write(folder: Path, tensors: dict[str, tuple[str, Any]]) -> Path:
    """An adapter file holding each (dtype, raw little-endian array) under its name."""
    folder.mkdir()
    header: dict[str, Any] = {}
    blobs, pos = [], 0
    for name, (dtype, raw) in tensors.items():
        data = raw.tobytes()
        header[name] = {"dtype": dtype, "shape": list(raw.shape), "data_offsets": [pos, pos + len(data)]}
        blobs.append(data)
        pos += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = folder / "adapter_model.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2}))
    return path


def _tensors() -> dict[str, tuple[str, Any]]:
    rng = np.random.default_rng(7)
    bf16 = rng.integers(0, 1 << 16, size=(37, 11), dtype=np.uint16)
    bf16.reshape(-1)[: len(SPECIAL_BF16)] = SPECIAL_BF16
    bf16.reshape(-1)[-1] = 0x8001  # the last value: its zero half lands past the tensor
    return {
        "m.lora_A.weight": ("BF16", bf16.astype("<u2")),
        "m.lora_B.weight": ("BF16", rng.integers(0, 1 << 16, size=(5,), dtype=np.uint16).astype("<u2")),
        "one.lora_A.weight": ("BF16", np.array([[0x3F80]], dtype="<u2")),
        "empty.lora_A.weight": ("BF16", np.zeros((0, 4), dtype="<u2")),
        "h.lora_A.weight": ("F16", rng.standard_normal((9, 7)).astype("<f2")),
        "s.lora_A.weight": ("F32", rng.standard_normal((13, 3)).astype("<f4")),
        "d.lora_A.weight": ("F64", rng.standard_normal((6, 5)).astype("<f8")),
        "q.lora_A.weight": ("F8_E4M3", rng.integers(0, 256, size=(8, 9), dtype=np.uint8)),
    }


def _expected(dtype: str, raw: Any, narrow: bool) -> Any:
    if dtype == "BF16":
        f32 = (raw.astype(np.uint32) << 16).view(np.float32)
        return f32 if narrow else f32.astype(np.float64)
    if dtype == "F8_E4M3":
        return np.array([read_mod.fp8_value(dtype, int(b)) for b in raw.reshape(-1)]).reshape(raw.shape)
    return raw.astype(np.float32 if narrow and dtype != "F64" else np.float64)


@pytest.mark.parametrize("window", [10, 14, 64, 1 << 20])
@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.filterwarnings(
    "ignore:invalid value encountered in cast"
)  # widening a signalling NaN, either route
def test_every_decode_equals_the_plain_one_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int, narrow: bool
) -> None:
    """Windows of 5 and 7 BF16 values (tensors end inside one), a small float64 scratch step (several steps per
    window), and the default; the same reader and slot reused across tensors of every size and dtype."""
    monkeypatch.setattr(read_mod, "_WINDOW", window)
    monkeypatch.setattr(read_mod, "_STEP", 4)
    tensors = _tensors()
    ckpt = open_checkpoint(str(_write(tmp_path / "ad", tensors).parent))
    reader = read_mod.Reader(ckpt, np)
    try:
        for _ in range(2):  # a second pass over the same, now dirty, buffers
            for name, (dtype, raw) in tensors.items():
                got = reader.read(name, 0, narrow=narrow)
                want = _expected(dtype, raw, narrow and dtype in read_mod.NARROW_DTYPES)
                assert got.dtype == want.dtype and got.shape == want.shape, name
                bits = {4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
                assert np.array_equal(got.view(bits), want.view(bits)), (name, window, narrow)
    finally:
        reader.close()
    assert reader.bytes_read == 2 * sum(raw.nbytes for _, raw in tensors.values())


@pytest.mark.parametrize("window", [10, 64, 1 << 20])
@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.filterwarnings("ignore:invalid value encountered")  # NaN payloads and Inf − Inf, either route
def test_subtract_from_equals_the_plain_difference_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: int, narrow: bool
) -> None:
    """``subtract_from`` (extract's tuned − base, one window at a time into the base's buffer) equals numpy's
    difference of the two plain decodes bit for bit, across windows that end inside a tensor, for every dtype the
    reader decodes; a dtype it does not decode leaves the buffer untouched and says so."""
    monkeypatch.setattr(read_mod, "_WINDOW", window)
    tensors = _tensors()
    rng = np.random.default_rng(3)
    other = {n: (d, rng.permutation(raw.reshape(-1)).reshape(raw.shape)) for n, (d, raw) in tensors.items()}
    base = read_mod.Reader(open_checkpoint(str(_write(tmp_path / "base", tensors).parent)), np)
    tuned = read_mod.Reader(open_checkpoint(str(_write(tmp_path / "tuned", other).parent)), np)
    try:
        for name, (dtype, raw) in tensors.items():
            wide = narrow and dtype in read_mod.NARROW_DTYPES
            got = base.read(name, 0, narrow=narrow)
            assert tuned.subtract_from(name, got), name
            want = _expected(dtype, other[name][1], wide) - _expected(dtype, raw, wide)
            bits = {4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
            assert got.dtype == want.dtype and np.array_equal(got.view(bits), want.view(bits)), (name, window)
        kept = np.arange(4.0)
        tuned.ckpt.tensors["one.lora_A.weight"] = tuned.ckpt.tensors["one.lora_A.weight"]._replace(dtype="I8")
        assert not tuned.subtract_from("one.lora_A.weight", kept[:1])
        assert kept.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        base.close()
        tuned.close()


def test_windows_into_gives_the_mapped_windows_bytes(tmp_path: Path) -> None:
    header = read_header(str(_write(tmp_path / "ad", _tensors())))
    with TensorSource(header) as src:
        for name in header.tensors:
            mapped = b"".join(bytes(v) for _, v in tensor_windows(header, name))
            for size in (9, 16, 1 << 20):
                buf = bytearray(size)
                parts = [(off, bytes(v)) for off, v in src.windows_into(name, buf)]
                assert b"".join(p for _, p in parts) == mapped
                assert [off for off, _ in parts] == list(range(0, len(mapped), size - size % _width(name)))[
                    : len(parts)
                ]
        with pytest.raises(ValueError, match="holds no"):
            next(src.windows_into("d.lora_A.weight", bytearray(7)))


def _width(name: str) -> int:
    return {"d": 8, "s": 4, "q": 1}.get(name[0], 2)


def test_a_truncated_file_fails_as_the_mapped_read_does(tmp_path: Path) -> None:
    path = _write(tmp_path / "ad", _tensors())
    header = read_header(str(path))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(HeaderError) as mapped:
        list(tensor_windows(header, "q.lora_A.weight"))
    with TensorSource(header) as src, pytest.raises(HeaderError) as pread:
        list(src.windows_into("q.lora_A.weight", bytearray(64)))
    assert str(pread.value) == str(mapped.value)


def test_a_bin_read_is_a_c_ordered_copy_the_caller_may_change(tmp_path: Path) -> None:
    """A ``.bin`` adapter whose B is the transpose of its A (one storage, as a tied weight is saved): each read is a
    C-ordered float64 copy, so ``extract``-style in-place arithmetic on one leaves the other, and the next read,
    as loaded; ``subtract_from`` refuses an array it could only change through a copy."""
    torch = pytest.importorskip("torch")
    folder = tmp_path / "ad"
    folder.mkdir()
    a = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    torch.save(
        {"base_model.model.m.lora_A.weight": a, "base_model.model.m.lora_B.weight": a.t()},
        folder / "adapter_model.bin",
    )
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2}))
    reader = read_mod.Reader(open_checkpoint(str(folder)), np)
    got = reader.read("base_model.model.m.lora_B.weight")
    assert got is not None and got.flags.c_contiguous and got.tolist() == a.t().tolist()
    got[...] = -1.0
    assert reader.read("base_model.model.m.lora_A.weight").tolist() == a.tolist()
    assert reader.read("base_model.model.m.lora_B.weight").tolist() == a.t().tolist()
    with pytest.raises(ValueError, match="C-contiguous"):
        reader.subtract_from("base_model.model.m.lora_B.weight", np.zeros((2, 3)).T)
