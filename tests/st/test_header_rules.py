"""The header rules one by one (:func:`adapterdoc.st.header.parse_header`): valid random headers read back exactly
(order, fields, types), every kind of near-miss refused with its reason, and random reshapes of a valid header
accepted or refused as the reference (``safetensors.deserialize``) accepts or refuses them."""

from __future__ import annotations

import json
import random
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapterdoc.errors import HeaderError
from adapterdoc.st import header as H
from adapterdoc.st.dtypes import DTYPE_BITS

safetensors = pytest.importorskip("safetensors")


def _valid(rng: random.Random, n: int) -> tuple[dict[str, Any], int]:
    obj: dict[str, Any] = {}
    if rng.random() < 0.7:
        obj["__metadata__"] = rng.choice([None, {}, {"format": "pt", "k": "v"}])
    spans = []
    for i in range(n):
        dtype = rng.choice([d for d, b in DTYPE_BITS.items() if b % 8 == 0])
        shape = [rng.randint(1, 9) for _ in range(rng.randint(0, 3))]
        numel = 1
        for d in shape:
            numel *= d
        spans.append((f"t{i}.{rng.random():.6f}", dtype, shape, numel * DTYPE_BITS[dtype] // 8))
    order = list(range(n))
    rng.shuffle(order)  # data order differs from header order
    pos, offsets = 0, {}
    for i in order:
        offsets[i] = [pos, pos + spans[i][3]]
        pos += spans[i][3]
    for i, (name, dtype, shape, _) in enumerate(spans):
        obj[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets[i]}
    return obj, pos


def _read(obj: dict[str, Any], data_bytes: int) -> H.Header:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return H.parse_header("f", raw, 8 + len(raw) + data_bytes)


def _expected(obj: dict[str, Any]) -> list[tuple[str, H.TensorInfo]]:
    """The tensors a valid header ``obj`` describes, in its order."""
    return [
        (k, H.TensorInfo(k, v["dtype"], tuple(v["shape"]), *v["data_offsets"]))
        for k, v in obj.items()
        if k != "__metadata__"
    ]


@pytest.mark.parametrize("seed", range(6))
def test_valid_headers_read_back_exactly(seed: int) -> None:
    rng = random.Random(seed)
    obj, data_bytes = _valid(rng, rng.randint(0, 40))
    header = _read(obj, data_bytes)
    assert list(header.tensors.items()) == _expected(obj) and header.metadata == obj.get("__metadata__")
    assert all(type(t.shape) is tuple and type(t) is H.TensorInfo for t in header.tensors.values())


def _mutations() -> list[tuple[str, Any]]:
    def entry(obj: dict[str, Any]) -> dict[str, Any]:
        return next(v for k, v in obj.items() if k != "__metadata__")

    return [
        ("bool dim", lambda o: entry(o)["shape"].append(True)),
        ("float dim", lambda o: entry(o)["shape"].append(1.0)),
        ("negative dims", lambda o: entry(o).__setitem__("shape", [-1, -1] + entry(o)["shape"])),
        ("zero dim", lambda o: entry(o)["shape"].append(0)),
        ("huge dim", lambda o: entry(o)["shape"].extend([2**40, 2**40])),
        (
            "float offset",
            lambda o: entry(o)["data_offsets"].__setitem__(1, entry(o)["data_offsets"][1] + 0.0),
        ),
        ("three offsets", lambda o: entry(o)["data_offsets"].append(0)),
        ("shape string", lambda o: entry(o).__setitem__("shape", "12")),
        ("unknown dtype", lambda o: entry(o).__setitem__("dtype", "f32")),
        ("list dtype", lambda o: entry(o).__setitem__("dtype", ["F32"])),
        ("extra field", lambda o: entry(o).__setitem__("extra", 1)),
        ("missing field", lambda o: entry(o).pop("shape")),
        ("list entry", lambda o: o.__setitem__("x", ["F32", [1], [0, 4]])),
        ("metadata number", lambda o: o.__setitem__("__metadata__", {"a": 1})),
        ("metadata list", lambda o: o.__setitem__("__metadata__", ["a"])),
        ("hole", lambda o: entry(o)["data_offsets"].__setitem__(1, entry(o)["data_offsets"][1] + 1)),
        # no type pass over the entries or the offsets: each of these must fail a field read or the transposition
        ("empty object shape", lambda o: entry(o).__setitem__("shape", {})),
        ("empty object offsets", lambda o: entry(o).__setitem__("data_offsets", {})),
        ("number offsets", lambda o: entry(o).__setitem__("data_offsets", 4)),
        ("null offsets", lambda o: entry(o).__setitem__("data_offsets", None)),
        ("one offset", lambda o: entry(o)["data_offsets"].pop()),
        ("no offsets", lambda o: entry(o).__setitem__("data_offsets", [])),
        ("every offsets list empty", lambda o: [v.__setitem__("data_offsets", []) for v in _entries(o)]),
        ("every offsets list of three", lambda o: [v["data_offsets"].append(0) for v in _entries(o)]),
        ("number entry", lambda o: o.__setitem__("x", 5)),
        ("null entry", lambda o: o.__setitem__("x", None)),
        ("empty object entry", lambda o: o.__setitem__("x", {})),
        # the first tensor in the data: `false` for its 0 tiles as well as 0 does, only the type pass sees it
        (
            "bool offset",
            lambda o: next(v for v in _entries(o) if v["data_offsets"][0] == 0)["data_offsets"].__setitem__(
                0, False
            ),
        ),
    ]


def _entries(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for k, v in obj.items() if k != "__metadata__"]


@pytest.mark.parametrize("label,mutate", _mutations(), ids=[m[0] for m in _mutations()])
def test_near_misses_are_refused(label: str, mutate: Any) -> None:
    rng = random.Random(label)
    obj, data_bytes = _valid(rng, 5)
    mutate(obj)
    raw = json.dumps(obj, separators=(",", ":")).encode()
    try:
        header = H.parse_header("f", raw, 8 + len(raw) + data_bytes)
    except HeaderError:
        return
    assert label in ("zero dim", "extra field", "list entry") and header.tensors  # legal after all


_ENTRY = '{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'


@pytest.mark.parametrize(
    "text,reason",
    [
        # the first spelling of a repeated name holds no tensor fields: the literal field counts cannot see it
        ('{"x":5,"x":' + _ENTRY + "}", "duplicate tensor name"),
        ('{"x":"F32","x":' + _ENTRY + "}", "duplicate tensor name"),
        ('{"x":[],"x":' + _ENTRY + "}", "duplicate tensor name"),
        ('{"x":null,"x":' + _ENTRY + "}", "duplicate tensor name"),
        ('{"x":{},"x":' + _ENTRY + "}", "duplicate tensor name"),
        ('{"__metadata__":null,"__metadata__":{},"x":' + _ENTRY + "}", "duplicate field `__metadata__`"),
        ('{"x":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "duplicate field"),
    ],
)
def test_a_repeated_key_is_refused_whatever_its_first_value(text: str, reason: str) -> None:
    raw = text.encode()
    with pytest.raises(HeaderError, match=reason):
        H.parse_header("f", raw, 8 + len(raw) + 4)


def test_repeated_metadata_keys_keep_the_last() -> None:
    text = '{"__metadata__":{"a":"b","a":"c"},"x":' + _ENTRY + "}"
    raw = text.encode()
    assert H.parse_header("f", raw, 8 + len(raw) + 4).metadata == {"a": "c"}


@pytest.mark.parametrize("dim", ['"4"', "[4]", "null", "-4", "4.0", "true"])
def test_a_dimension_of_another_type_is_refused(dim: str) -> None:
    raw = ('{"x":{"dtype":"F32","shape":[1,' + dim + '],"data_offsets":[0,16]}}').encode()
    with pytest.raises(HeaderError, match="invalid shape"):
        H.parse_header("f", raw, 8 + len(raw) + 16)


def test_a_header_read_again_reads_the_file_again(tmp_path: Any) -> None:
    def write(shape: list[int]) -> None:
        obj = {"__metadata__": {"k": "v"}, "x": {"dtype": "F32", "shape": shape, "data_offsets": [0, 16]}}
        text = json.dumps(obj, separators=(",", ":")).encode()
        path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(16))

    path = tmp_path / "a.safetensors"
    write([4])
    assert H.read_header(path).tensors["x"].shape == (4,)
    write([2, 2])  # same size, other bytes
    assert H.read_header(path).tensors["x"].shape == (2, 2)


def test_a_header_cut_short_after_its_first_read_is_reported(tmp_path: Any) -> None:
    path = tmp_path / "a.safetensors"
    obj = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(5000)}
    text = json.dumps(obj, separators=(",", ":")).encode()
    blob = len(text).to_bytes(8, "little") + text + bytes(4 * 5000)
    path.write_bytes(blob)
    assert len(H.read_header(path).tensors) == 5000
    path.write_bytes(blob[: 8 + 70000])  # the prefix still announces the whole header
    with pytest.raises(HeaderError, match=r"invalid header length|file shrank"):
        H.read_header(path)


@pytest.mark.parametrize("rounding", ["up", "down"])
@pytest.mark.parametrize("numel", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("dtype", ["F4", "F6_E2M3", "F8_E4M3"])
def test_sub_byte_dtypes_must_end_on_a_byte(dtype: str, numel: int, rounding: str) -> None:
    """A sub-byte tensor of whole bytes is read; one that ends inside a byte is refused, whether its offsets round
    its size up or down."""
    bits = numel * DTYPE_BITS[dtype]
    size = -(-bits // 8) if rounding == "up" else bits // 8
    obj = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    obj["b"] = {"dtype": dtype, "shape": [numel], "data_offsets": [8, 8 + size]}
    if bits % 8:
        with pytest.raises(HeaderError, match="byte boundary"):
            _read(obj, 8 + size)
    else:
        assert list(_read(obj, 8 + size).tensors.items()) == _expected(obj)


@pytest.mark.parametrize("dims", [[2**58], [2**57, 2], [2**29, 2**29, 1], [2**40, 2**40, 0]])
def test_the_two_to_the_64_bound(dims: list[int]) -> None:
    """A tensor of 2^64 bits or more is refused even where its offsets tile the data section, and so is a shape
    whose running product passes 2^64 before a zero dimension (the reference multiplies dimension by dimension)."""
    numel = 1
    for d in dims:
        numel *= d
    size = numel * 8  # F64: 2^64 bits when numel is 2^58
    obj = {"x": {"dtype": "F64", "shape": dims, "data_offsets": [0, size]}}
    with pytest.raises(HeaderError, match="overflow"):
        _read(obj, size)
    small = {"x": {"dtype": "F64", "shape": [2**20], "data_offsets": [0, 2**23]}}
    assert list(_read(small, 2**23).tensors.items()) == _expected(small)


@pytest.mark.parametrize("name", ["x", "x.true", "falsehood"])
@pytest.mark.parametrize(
    "entry",
    [
        '"shape":[1,true],"data_offsets":[0,4]',
        '"shape":[false],"data_offsets":[0,0]',
        '"shape":[1],"data_offsets":[false,4]',
        '"shape":[1],"data_offsets":[0,"4"]',
        '"shape":[1],"data_offsets":[null,4]',
        '"shape":[1],"data_offsets":[[0],[4]]',
        '"shape":[1],"data_offsets":[{},{}]',
        '"shape":["a","b"],"data_offsets":[0,4]',
        '"shape":[null],"data_offsets":[0,4]',
        '"shape":[[1]],"data_offsets":[0,4]',
        '"shape":[{}],"data_offsets":[0,4]',
        '"shape":[1,"1"],"data_offsets":[0,4]',
        '"shape":[1],"data_offsets":[0,4e0]',
        # an empty object where a list goes reads as one (iterated, it is empty): a scalar shape here, 4 bytes
        '"shape":{},"data_offsets":[0,4]',
        '"shape":[1],"data_offsets":{}',
        '"shape":[1],"data_offsets":4',
        '"shape":[1],"data_offsets":null',
        '"shape":[1],"data_offsets":[0]',
        '"shape":[1],"data_offsets":[0,4,4]',
    ],
)
def test_a_number_that_is_no_int_is_refused(name: str, entry: str) -> None:
    """A bool, a float, a string, null, a list or an object where a dimension or an offset goes (``true`` or
    ``false`` spelled in a name too)."""
    text = '{"' + name + '":{"dtype":"F32",' + entry + "}}"
    with pytest.raises(HeaderError):
        H.parse_header("f", text.encode(), 8 + len(text) + 4)


def test_one_dtype_and_many_dtypes_give_the_exact_sizes() -> None:
    """A file of one dtype and a mixed one are read exactly; an entry one byte short is refused."""
    for dtypes in (["BF16"] * 3, ["BF16", "F32", "I8"]):
        obj: dict[str, Any] = {}
        pos = 0
        for i, d in enumerate(dtypes):
            nbytes = 6 * DTYPE_BITS[d] // 8
            obj[f"t{i}"] = {"dtype": d, "shape": [2, 3], "data_offsets": [pos, pos + nbytes]}
            pos += nbytes
        assert list(_read(obj, pos).tensors.items()) == _expected(obj)
        obj["t2"]["data_offsets"][1] -= 1
        with pytest.raises(HeaderError, match="invalid shape, dtype or offsets"):
            _read(obj, pos - 1)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _reshaped(draw: st.DrawFn) -> tuple[str, int]:
    """A valid random header with one to three of its values (an entry, a field, a dimension, an offset, the
    metadata) replaced by random JSON, or a field added or dropped: the text and its data section's size."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    obj, data_bytes = _valid(rng, draw(st.integers(1, 6)))
    names = [k for k in obj if k != "__metadata__"]
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names))
        entry = obj[name]
        where = draw(st.sampled_from(["entry", "field", "dim", "offset", "add", "drop", "metadata"]))
        value = draw(_JSON)
        if where == "entry":
            obj[name] = value
        elif not isinstance(entry, dict):
            continue
        elif where == "field":
            entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = value
        elif where in ("dim", "offset"):
            seq = entry.get("shape" if where == "dim" else "data_offsets")
            if isinstance(seq, list) and seq:
                seq[draw(st.integers(0, len(seq) - 1))] = value
        elif where == "add":
            entry[draw(st.text(max_size=4))] = value
        elif where == "drop" and entry:
            entry.pop(draw(st.sampled_from(sorted(entry))))
        else:
            obj["__metadata__"] = value
    return json.dumps(obj, separators=(",", ":")), data_bytes


def _reference(blob: bytes) -> dict[str, tuple[str, list[int], int]] | None:
    """What ``safetensors.deserialize`` reads from ``blob`` (name → dtype, shape, byte count); ``None``: it refuses."""
    try:
        return {n: (t["dtype"], t["shape"], len(t["data"])) for n, t in safetensors.deserialize(blob)}
    except Exception:
        return None


def _agrees_with_reference(text: str, data_bytes: int) -> None:
    raw = text.encode()
    blob = struct.pack("<Q", len(raw)) + raw + bytes(data_bytes)
    theirs = _reference(blob)
    try:
        header = H.parse_header("f", raw, len(blob))
    except HeaderError as e:
        assert theirs is None, f"refused what the reference reads: {e}"
        return
    assert theirs is not None, "read what the reference refuses"
    assert {n: (t.dtype, list(t.shape), t.nbytes) for n, t in header.tensors.items()} == theirs


@settings(max_examples=300, deadline=None)
@given(_reshaped())
def test_reshaped_headers_are_read_as_the_reference_reads_them(case: tuple[str, int]) -> None:
    _agrees_with_reference(*case)


@pytest.mark.slow
@settings(max_examples=20_000, deadline=None)
@given(_reshaped())
def test_reshaped_headers_are_read_as_the_reference_reads_them_slow(case: tuple[str, int]) -> None:
    _agrees_with_reference(*case)
