"""The header reader against safetensors' own writer and reader (the differential oracle), and its rules."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapterdoc.errors import AdapterdocError, HeaderError
from adapterdoc.st.dtypes import DTYPE_BITS
from adapterdoc.st.header import (
    MAX_HEADER_SIZE,
    TensorInfo,
    parse_header,
    read_header,
    serialize_header,
)

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402

# Every dtype torch can hand to safetensors' writer, with the name the format uses.
TORCH_DTYPES: dict[Any, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.uint16: "U16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.uint32: "U32",
    torch.float32: "F32",
    torch.complex64: "C64",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.uint64: "U64",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e8m0fnu: "F8_E8M0",
    torch.float8_e4m3fnuz: "F8_E4M3FNUZ",
    torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
}
if hasattr(torch, "float4_e2m1fn_x2"):
    TORCH_DTYPES[torch.float4_e2m1fn_x2] = "F4"  # two F4 values per element: shape [..., k] is F4 [..., 2k]

REFERENCE_DTYPES = [
    *("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8"),
    *("F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"),
    *("I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"),
]


def write_raw(path: Path, header: bytes | str, data: bytes = b"", n: int | None = None) -> Path:
    h = header.encode() if isinstance(header, str) else header
    path.write_bytes(struct.pack("<Q", len(h) if n is None else n) + h + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def reference_accepts(path: Path) -> bool:
    try:
        with safe_open(str(path), framework="pt") as f:
            list(f.keys())
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------- property test


@st.composite
def tensor_dicts(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(
        st.lists(
            st.text(max_size=12).filter(lambda s: s != "__metadata__"),
            min_size=0,
            max_size=6,
            unique=True,
        )
    )
    tensors = {}
    for name in names:
        dtype = draw(st.sampled_from(list(TORCH_DTYPES)))
        min_dims = 1 if TORCH_DTYPES[dtype] == "F4" else 0  # the writer refuses an F4 scalar
        shape = draw(st.lists(st.integers(0, 4), min_size=min_dims, max_size=3))
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * torch.tensor([], dtype=dtype).element_size()
        raw = draw(st.binary(min_size=nbytes, max_size=nbytes))
        flat = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            if nbytes
            else torch.empty(0, dtype=torch.uint8)
        )
        tensors[name] = flat.view(dtype).reshape(shape)
    return tensors


metadata_maps = st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)


def as_bytes(t: Any) -> bytes:
    return bytes(t.reshape(-1).view(torch.uint8).tolist())


def check_against_reference(path: Path, tensors: dict[str, Any], metadata: dict[str, str] | None) -> None:
    if not reference_accepts(path):  # the writer can produce files its reader refuses (see below)
        with pytest.raises(HeaderError):
            read_header(path)
        return
    header = read_header(path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert header.header_len == n
    assert header.data_start == 8 + n
    assert header.file_size == len(raw)
    assert header.data_start % 8 == 0  # the writer pads with spaces
    with safe_open(str(path), framework="pt") as f:
        assert set(header.tensors) == set(f.keys()) == set(tensors)
        assert header.metadata == f.metadata()
        # the reference's offset order is ours (ties between empty tensors at one position aside)
        spans = [(header.tensors[k].begin, header.tensors[k].end) for k in f.offset_keys()]
        assert spans == sorted(spans) and len(spans) == len(header.tensors)
        for name, info in header.tensors.items():
            sl = f.get_slice(name)
            assert info.dtype == sl.get_dtype()
            assert list(info.shape) == sl.get_shape()
            assert info.dtype == TORCH_DTYPES[tensors[name].dtype]
            # offsets: the bytes our offsets point at are exactly the tensor the reference returns
            span = raw[header.data_start + info.begin : header.data_start + info.end]
            assert span == as_bytes(f.get_tensor(name)) == as_bytes(tensors[name])
            assert info.nbytes == len(span)
            bits = info.numel * DTYPE_BITS[info.dtype]
            assert bits == 8 * info.nbytes
    if metadata is not None:
        assert header.metadata == metadata


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tensors=tensor_dicts(), metadata=metadata_maps)
def test_agrees_with_safe_open(
    tmp_path: Path, tensors: dict[str, Any], metadata: dict[str, str] | None
) -> None:
    path = tmp_path / "t.safetensors"
    safetensors_torch.save_file(tensors, str(path), metadata=metadata)
    check_against_reference(path, tensors, metadata)


@settings(max_examples=40, deadline=None)
@given(tensors=tensor_dicts(), metadata=metadata_maps)
def test_parse_header_on_save_bytes(tensors: dict[str, Any], metadata: dict[str, str] | None) -> None:
    """``safetensors.torch.save`` (in memory) and ``parse_header`` on the same bytes."""
    blob = safetensors_torch.save(tensors, metadata=metadata)
    (n,) = struct.unpack("<Q", blob[:8])
    if not tensors and metadata == {}:  # the 0.8 writer bug below
        with pytest.raises(HeaderError):
            parse_header("<memory>", blob[8 : 8 + n], len(blob))
        return
    header = parse_header("<memory>", blob[8 : 8 + n], len(blob))
    # (safetensors.torch.load(bytes) cannot map F4 back to torch in 0.8: compare with the writer's input)
    assert set(header.tensors) == set(tensors)
    for name, info in header.tensors.items():
        assert blob[8 + n + info.begin : 8 + n + info.end] == as_bytes(tensors[name])
        assert info.dtype == TORCH_DTYPES[tensors[name].dtype]


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tensors=tensor_dicts(), metadata=metadata_maps)
def test_agrees_with_safe_open_many(
    tmp_path: Path, tensors: dict[str, Any], metadata: dict[str, str] | None
) -> None:
    path = tmp_path / "t.safetensors"
    safetensors_torch.save_file(tensors, str(path), metadata=metadata)
    check_against_reference(path, tensors, metadata)


def test_writer_bug_empty_dict_with_empty_metadata(tmp_path: Path) -> None:
    """safetensors 0.8 writes `{},"__metadata__":{}}` for save({}, metadata={}): its own reader refuses it,
    and so do we (if this starts failing, the writer was fixed: drop the special cases above)."""
    blob = safetensors_torch.save({}, metadata={})
    assert blob[8:].rstrip(b" ") == b'{},"__metadata__":{}}'
    path = tmp_path / "empty.safetensors"
    path.write_bytes(blob)
    assert not reference_accepts(path)
    with pytest.raises(HeaderError, match="invalid JSON"):
        read_header(path)


# --------------------------------------------------------------------------- dtypes


def test_dtype_table_is_the_reference_list() -> None:
    assert sorted(DTYPE_BITS) == sorted(REFERENCE_DTYPES)


@pytest.mark.parametrize("dtype", REFERENCE_DTYPES)
def test_dtype_sizes_agree_with_reference(tmp_path: Path, dtype: str) -> None:
    """A [2, 4] tensor of each dtype over exactly bits*8/8 bytes: both readers accept; one byte more, both refuse."""
    nbytes = 8 * DTYPE_BITS[dtype] // 8
    good = write_raw(
        tmp_path / "good.safetensors", json.dumps({"t": entry(dtype, [2, 4], 0, nbytes)}), bytes(nbytes)
    )
    assert reference_accepts(good)
    assert read_header(good).tensors["t"].nbytes == nbytes
    bad = write_raw(
        tmp_path / "bad.safetensors",
        json.dumps({"t": entry(dtype, [2, 4], 0, nbytes + 1)}),
        bytes(nbytes + 1),
    )
    assert not reference_accepts(bad)
    with pytest.raises(HeaderError, match="invalid shape, dtype or offsets"):
        read_header(bad)


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes", "ok"),
    [
        ("F4", [4], 2, True),
        ("F4", [2, 3], 3, True),
        ("F4", [0], 0, True),
        ("F4", [3], 2, False),
        ("F4", [3], 1, False),
        ("F4", [], 1, False),
        ("F4", [], 0, False),
        ("F6_E2M3", [4], 3, True),
        ("F6_E3M2", [2, 4], 6, True),
        ("F6_E3M2", [8, 0], 0, True),
        ("F6_E2M3", [3], 3, False),
        ("F6_E3M2", [2], 2, False),
        ("F6_E2M3", [1], 1, False),
    ],
)
def test_sub_byte_dtypes(tmp_path: Path, dtype: str, shape: list[int], nbytes: int, ok: bool) -> None:
    path = write_raw(
        tmp_path / "s.safetensors", json.dumps({"t": entry(dtype, shape, 0, nbytes)}), bytes(nbytes)
    )
    assert reference_accepts(path) is ok
    if ok:
        info = read_header(path).tensors["t"]
        assert info.nbytes == nbytes and info.numel * DTYPE_BITS[dtype] == 8 * nbytes
    else:
        with pytest.raises(HeaderError) as e:
            read_header(path)
        assert e.value.key == "t"


def test_float4_written_by_torch(tmp_path: Path) -> None:
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("torch without float4")
    t = (
        torch.frombuffer(bytearray(b"\x12\x34\x56"), dtype=torch.uint8)
        .view(torch.float4_e2m1fn_x2)
        .reshape(3, 1)
    )
    path = tmp_path / "f4.safetensors"
    safetensors_torch.save_file({"q": t}, str(path))
    info = read_header(path).tensors["q"]
    assert (info.dtype, info.shape, info.nbytes) == ("F4", (3, 2), 3)


# --------------------------------------------------------------------------- the length prefix


def test_header_of_exactly_the_limit_is_accepted(tmp_path: Path) -> None:
    """N = 100,000,000 (a real 100 MB file of `{}` and spaces): both readers accept it."""
    path = tmp_path / "limit.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", MAX_HEADER_SIZE))
        f.write(b"{}")
        f.write(b" " * (MAX_HEADER_SIZE - 2))
    try:
        assert reference_accepts(path)
        h = read_header(path)
        assert h.header_len == MAX_HEADER_SIZE and h.tensors == {} and h.data_bytes == 0
    finally:
        path.unlink()


def test_header_one_over_the_limit_is_refused_before_reading(tmp_path: Path) -> None:
    """N = 100,000,001 with a (sparse) file long enough to hold it: refused as too large, not read."""
    path = tmp_path / "over.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", MAX_HEADER_SIZE + 1) + b"{}")
        os.ftruncate(f.fileno(), 8 + MAX_HEADER_SIZE + 1)
    assert not reference_accepts(path)
    with pytest.raises(HeaderError, match="header too large"):
        read_header(path)


def test_length_past_end_of_file_is_refused_before_reading(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "short.safetensors", b"{}", n=50_000_000)
    with pytest.raises(HeaderError, match="invalid header length"):
        read_header(path)


@pytest.mark.parametrize("content", [b"", b"\x01", b"\x00" * 7])
def test_shorter_than_the_prefix(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(content)
    with pytest.raises(HeaderError, match="header too small"):
        read_header(path)


# --------------------------------------------------------------------------- rules, one by one


def test_duplicate_tensor_names_are_refused(tmp_path: Path) -> None:
    e = json.dumps(entry("U8", [4], 0, 4))
    path = write_raw(tmp_path / "dup.safetensors", '{"w":' + e + ',"w":' + e + "}", b"abcd")
    assert reference_accepts(path)  # the reference keeps the last one, silently
    with pytest.raises(HeaderError) as err:
        read_header(path)
    assert err.value.key == "w"
    assert "duplicate tensor name" in str(err.value)


def test_duplicate_metadata_is_refused(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "m.safetensors", '{"__metadata__":{},"__metadata__":{}}')
    with pytest.raises(HeaderError, match="duplicate field `__metadata__`"):
        read_header(path)


def test_offsets_may_be_listed_out_of_order(tmp_path: Path) -> None:
    hdr = '{"b":' + json.dumps(entry("U8", [2], 2, 4)) + ',"a":' + json.dumps(entry("U8", [2], 0, 2)) + "}"
    h = read_header(write_raw(tmp_path / "o.safetensors", hdr, b"abcd"))
    assert list(h.tensors) == ["b", "a"]  # header order kept
    assert (h.tensors["a"].begin, h.tensors["b"].begin) == (0, 2)


@pytest.mark.parametrize(
    ("tensors", "data", "match"),
    [
        ({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 3, 5)}, 5, "a hole before"),
        ({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}, 3, "overlapping"),
        ({"a": entry("U8", [2], 1, 3)}, 3, "a hole before"),
        ({"a": entry("U8", [2], 0, 2)}, 3, "not fully covered"),
        ({"a": entry("U8", [2], 0, 2)}, 1, "truncated"),
        ({"a": entry("F32", [2], 0, 4)}, 4, "needs 8 bytes"),
        ({"a": entry("F32", [2**32, 2**32], 0, 0)}, 0, "overflow"),
        ({"a": entry("U8", [2**64 - 1], 0, 0)}, 0, "overflow"),
        ({"a": entry("F32", [2**62, 8, 0], 0, 0)}, 0, "overflow"),
        ({"a": entry("U8", [1], 0, 1), "b": entry("U8", [0], 1, 0)}, 1, "before begin"),
    ],
)
def test_offset_and_size_rules(tmp_path: Path, tensors: dict[str, Any], data: int, match: str) -> None:
    path = write_raw(tmp_path / "x.safetensors", json.dumps(tensors), bytes(data))
    assert not reference_accepts(path)
    with pytest.raises(HeaderError, match=match):
        read_header(path)


def test_empty_tensors_and_scalars(tmp_path: Path) -> None:
    tensors = {
        "e": entry("F32", [0, 3], 0, 0),
        "s": entry("F64", [], 0, 8),
        "z": entry("F32", [0, 2**62], 8, 8),
        "b": entry("BOOL", [], 8, 9),
    }
    path = write_raw(tmp_path / "e.safetensors", json.dumps(tensors), bytes(9))
    assert reference_accepts(path)
    h = read_header(path)
    assert h.tensors["e"].numel == 0 and h.tensors["s"].shape == () and h.tensors["s"].numel == 1
    assert h.tensors["z"].nbytes == 0


@pytest.mark.parametrize(
    ("metadata", "ok"),
    [
        ("null", True),
        ("{}", True),
        ('{"format":"pt","k":""}', True),
        ('{"format":1}', False),
        ('{"format":null}', False),
        ('{"format":["pt"]}', False),
        ('{"format":{"a":"b"}}', False),
        ('"pt"', False),
        ("[]", False),
        ("1", False),
    ],
)
def test_metadata_is_a_string_map(tmp_path: Path, metadata: str, ok: bool) -> None:
    path = write_raw(tmp_path / "m.safetensors", '{"__metadata__":' + metadata + "}")
    assert reference_accepts(path) is ok
    if ok:
        h = read_header(path)
        assert h.metadata == json.loads(metadata)
    else:
        with pytest.raises(HeaderError, match="__metadata__"):
            read_header(path)


@pytest.mark.parametrize(
    "header",
    [
        b" \t\r\n{}",
        b"{}\n\t  ",
        b'{\n  "__metadata__": {\n    "format": "pt"\n  }\n}\n',
    ],
)
def test_json_whitespace_is_fine(tmp_path: Path, header: bytes) -> None:
    path = write_raw(tmp_path / "w.safetensors", header)
    assert reference_accepts(path)
    read_header(path)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b"{}\x00\x00", "invalid JSON"),
        (b"{}\x0c", "invalid JSON"),
        (b'{"__metadata__":{"a":"\xff"}}', "invalid UTF-8"),
        (b'{"__metadata__":{"a":"\\ud800"}}', "surrogate"),
        (b"[]", "not a JSON object"),
        (b"", "empty"),
        (
            b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":' + b"[" * 126 + b"]" * 126 + b"}}",
            "nested",
        ),
        (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1e999}}', "out of range"),
        (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[-0,1]}}', "data_offsets"),
        (b'{"a":{"dtype":"f32","shape":[1],"data_offsets":[0,1]}}', "unknown dtype"),
    ],
)
def test_json_level_rules(tmp_path: Path, header: bytes, match: str) -> None:
    path = write_raw(tmp_path / "j.safetensors", header, b"\x00")
    assert not reference_accepts(path)
    with pytest.raises(HeaderError, match=match):
        read_header(path)


def test_errors_carry_path_key_and_one_line(tmp_path: Path) -> None:
    path = write_raw(tmp_path / "k.safetensors", json.dumps({"my.tensor": entry("F32", [3], 0, 8)}), bytes(8))
    with pytest.raises(HeaderError) as err:
        read_header(path)
    e = err.value
    assert isinstance(e, AdapterdocError) and isinstance(e, ValueError)
    assert e.what == str(path) and e.key == "my.tensor" and e.exit_code == 3
    assert "\n" not in str(e) and str(e).startswith(f"{path}: `my.tensor`: ")


def test_directory_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HeaderError, match="directory"):
        read_header(tmp_path)
    with pytest.raises(HeaderError, match="cannot read"):
        read_header(tmp_path / "missing.safetensors")


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(HeaderError, match="not a regular file"):
        read_header(fifo)


def test_serialize_header_round_trip(tmp_path: Path) -> None:
    tensors = {
        "b": TensorInfo("b", "BF16", (2, 2), 0, 8),
        "a": TensorInfo("a", "F4", (4,), 8, 10),
        "é": TensorInfo("é", "U8", (), 10, 11),
    }
    text = serialize_header({"format": "pt"}, tensors)
    assert text.startswith(b'{"__metadata__":{"format":"pt"}')
    path = write_raw(tmp_path / "r.safetensors", text, bytes(11))
    assert reference_accepts(path)
    h = read_header(path)
    assert h.tensors == tensors and h.metadata == {"format": "pt"}
