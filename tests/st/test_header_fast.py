"""The bulk header check (:func:`adapterdoc.st.header._fast_header`) against the exact, entry-by-entry checks:
the same metadata and tensors (order, fields, types) on valid random headers, and ``None`` (so the exact route
names the error) on every kind of near-miss."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapterdoc.errors import HeaderError
from adapterdoc.st import header as H
from adapterdoc.st.dtypes import DTYPE_BITS


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


def _both(obj: dict[str, Any], data_bytes: int) -> tuple[Any, Any]:
    text = json.dumps(obj, separators=(",", ":"))
    raw = text.encode()
    pairs = H._load_json_fast(text)
    fast = H._fast_header(pairs, data_bytes) if pairs is not None else None
    try:
        exact: Any = H._split_entries("f", H._load_json("f", text))
        tensors = H._build_tensors("f", exact[1])
        H._check_offsets("f", tensors, data_bytes)
        exact = (exact[0], tensors)
    except HeaderError as e:
        exact = e
    whole = H.parse_header("f", raw, 8 + len(raw) + data_bytes)  # what callers get, through either route
    assert not isinstance(exact, HeaderError) or fast is None
    return fast, (exact, whole)


@pytest.mark.parametrize("seed", range(6))
def test_valid_headers_give_the_exact_result(seed: int) -> None:
    rng = random.Random(seed)
    obj, data_bytes = _valid(rng, rng.randint(0, 40))
    fast, (exact, whole) = _both(obj, data_bytes)
    assert fast is not None
    assert fast[0] == exact[0] and list(fast[1].items()) == list(exact[1].items())
    assert all(type(t.shape) is tuple and type(t) is H.TensorInfo for t in fast[1].values())
    assert list(whole.tensors.items()) == list(exact[1].items()) and whole.metadata == exact[0]


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
def test_near_misses_take_the_exact_route(label: str, mutate: Any) -> None:
    rng = random.Random(label)
    obj, data_bytes = _valid(rng, 5)
    mutate(obj)
    text = json.dumps(obj, separators=(",", ":"))
    pairs = H._load_json_fast(text)
    assert pairs is None or H._fast_header(pairs, data_bytes) is None
    raw = text.encode()
    size = 8 + len(raw) + data_bytes
    try:
        whole = H.parse_header("f", raw, size)
    except HeaderError:
        return  # the exact route named it
    # legal after all (a zero dimension, an extra field, a list entry): the exact route accepted it
    assert label in ("zero dim", "extra field", "list entry") and whole.tensors


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


def test_repeated_metadata_keys_keep_the_last_through_either_route() -> None:
    text = '{"__metadata__":{"a":"b","a":"c"},"x":' + _ENTRY + "}"
    raw = text.encode()
    assert H.parse_header("f", raw, 8 + len(raw) + 4).metadata == {"a": "c"}


@pytest.mark.parametrize("dim", ['"4"', "[4]", "null", "-4", "4.0", "true"])
def test_a_dimension_of_another_type_takes_the_exact_route(dim: str) -> None:
    text = '{"x":{"dtype":"F32","shape":[1,' + dim + '],"data_offsets":[0,16]}}'
    raw = text.encode()
    parsed = H._load_json_fast(text)  # a float fails the parse itself
    assert (parsed is None) == (dim == "4.0") and (parsed is None or H._fast_header(parsed, 16) is None)
    with pytest.raises(HeaderError, match="invalid shape"):
        H.parse_header("f", raw, 8 + len(raw) + 16)


def test_a_header_read_again_is_a_fresh_copy_and_a_changed_one_is_parsed_again(tmp_path: Any) -> None:
    from adapterdoc.st.header import read_header

    def write(shape: list[int], meta: dict[str, str]) -> None:
        obj = {"__metadata__": meta, "x": {"dtype": "F32", "shape": shape, "data_offsets": [0, 16]}}
        text = json.dumps(obj, separators=(",", ":")).encode()
        path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(16))

    path = tmp_path / "a.safetensors"
    write([4], {"k": "v"})
    first = read_header(path)
    first.tensors.clear()  # a caller changing its result changes nothing for the next reader
    assert first.metadata is not None
    first.metadata["k"] = "changed"
    again = read_header(path)
    assert list(again.tensors) == ["x"] and again.tensors["x"].shape == (4,) and again.metadata == {"k": "v"}
    write([2, 2], {"k": "v"})  # same size, other bytes
    assert read_header(path).tensors["x"].shape == (2, 2)
    path.write_bytes(path.read_bytes()[:-1])  # now invalid: the memo never answers for other bytes or sizes
    with pytest.raises(HeaderError, match="file truncated"):
        read_header(path)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("whole_pieces", [False, True])
def test_a_long_header_read_again_is_compared_piece_by_piece(
    tmp_path: Any, where: str, whole_pieces: bool
) -> None:
    """A header read again is compared with the memo's bytes 64 KiB at a time (``_reads_as``): one name changed
    in the first, a middle or the last piece of a header of several (a whole number of pieces long, or not) makes
    it a new parse; the same bytes give the memo's copy, at the right data start."""
    from adapterdoc.st.header import _CHUNK, read_header

    path = tmp_path / "a.safetensors"
    count = 3000
    names = [f"t{i:05d}" for i in range(count)]
    obj = {n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, n in enumerate(names)}
    text = json.dumps(obj, separators=(",", ":")).encode()
    if whole_pieces:
        text += b" " * (-len(text) % _CHUNK)  # trailing spaces: the padding the format allows
    n = len(text)
    assert n > 2 * _CHUNK and (n % _CHUNK == 0) == whole_pieces
    blob = bytearray(len(text).to_bytes(8, "little") + text + bytes(4 * count))
    path.write_bytes(bytes(blob))
    first = read_header(path)
    again = read_header(path)
    assert again.raw == first.raw and again.data_start == 8 + n and list(again.tensors) == names

    name = {"first": names[0], "middle": names[count // 2], "last": names[-1]}[where]
    at = 8 + text.index(f'"{name}"'.encode()) + 1
    assert {"first": at < 8 + _CHUNK, "middle": _CHUNK < at < n - _CHUNK, "last": at > 8 + n - _CHUNK}[where]
    blob[at] = ord("u")  # no other name starts with u
    path.write_bytes(bytes(blob))
    changed = read_header(path)
    renamed = "u" + name[1:]
    assert renamed in changed.tensors and name not in changed.tensors and len(changed.tensors) == count
    assert changed.raw == bytes(blob[8 : 8 + n]) and name in read_header(path).raw.decode().replace(
        renamed, name
    )


def test_a_header_cut_short_after_its_first_read_is_reported(tmp_path: Any) -> None:
    from adapterdoc.st.header import read_header

    path = tmp_path / "a.safetensors"
    obj = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(5000)}
    text = json.dumps(obj, separators=(",", ":")).encode()
    blob = len(text).to_bytes(8, "little") + text + bytes(4 * 5000)
    path.write_bytes(blob)
    read_header(path)
    path.write_bytes(blob[: 8 + 70000])  # the prefix still announces the whole header
    with pytest.raises(HeaderError, match=r"invalid header length|file shrank"):
        read_header(path)


@pytest.mark.parametrize("rounding", ["up", "down"])
@pytest.mark.parametrize("numel", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("dtype", ["F4", "F6_E2M3", "F8_E4M3"])
def test_sub_byte_dtypes_take_the_bulk_route_only_on_whole_bytes(
    dtype: str, numel: int, rounding: str
) -> None:
    """The whole-byte pass runs only when a sub-byte dtype is there: a sub-byte tensor of whole bytes is accepted
    in bulk (the exact result), one that ends inside a byte goes to the exact route, which names it (offsets
    rounded down agree with ``bits >> 3``: then the whole-byte pass alone sends it there)."""
    bits = numel * DTYPE_BITS[dtype]
    size = -(-bits // 8) if rounding == "up" else bits // 8
    obj = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    obj["b"] = {"dtype": dtype, "shape": [numel], "data_offsets": [8, 8 + size]}
    if bits % 8:
        text = json.dumps(obj, separators=(",", ":"))
        parsed = H._load_json_fast(text)
        assert parsed is not None and H._fast_header(parsed, 8 + size) is None
        with pytest.raises(HeaderError, match="byte boundary"):
            H.parse_header("f", text.encode(), 8 + len(text) + 8 + size)
    else:
        fast, (exact, whole) = _both(obj, 8 + size)
        assert fast is not None and list(fast[1].items()) == list(exact[1].items()) == list(
            whole.tensors.items()
        )


@pytest.mark.parametrize("dims", [[2**58], [2**57, 2], [2**29, 2**29, 1]])
def test_the_two_to_the_64_bound_holds_where_a_tiling_entry_can_reach_it(dims: list[int]) -> None:
    """bits < 2^64 is checked only for a data section of 2^61 bytes or more (below, tiling implies it): an entry of
    2^64 bits that tiles such a section still takes the exact route, which refuses it."""
    numel = 1
    for d in dims:
        numel *= d
    size = numel * 8  # F64: 2^64 bits when numel is 2^58
    obj = {"x": {"dtype": "F64", "shape": dims, "data_offsets": [0, size]}}
    text = json.dumps(obj, separators=(",", ":"))
    parsed = H._load_json_fast(text)
    assert parsed is not None
    assert numel * 64 == 2**64 and size > H._U64_MAX >> 3
    assert H._fast_header(parsed, size) is None
    with pytest.raises(HeaderError):
        H.parse_header("f", text.encode(), 8 + len(text) + size)
    small = {"x": {"dtype": "F64", "shape": [2**20], "data_offsets": [0, 2**23]}}  # far below: bulk
    assert H._fast_header(H._load_json_fast(json.dumps(small)), 2**23) is not None


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
def test_a_number_that_is_no_int_never_passes_the_bulk_route(name: str, entry: str) -> None:
    """Bools need the type pass (``"true"``/``"false"`` spelled anywhere, a name too, turns it on); floats fail the
    parse; every other type fails a comparison or a subtraction. Each goes to the exact route, which refuses it."""
    text = '{"' + name + '":{"dtype":"F32",' + entry + "}}"
    parsed = H._load_json_fast(text)
    assert parsed is None or H._fast_header(parsed, 4) is None
    with pytest.raises(HeaderError):
        H.parse_header("f", text.encode(), 8 + len(text) + 4)


def test_one_dtype_and_many_dtypes_give_the_exact_sizes() -> None:
    """The one-dtype shortcut (bytes = numel × width) and the general one agree with the exact route: an entry
    one byte short is refused through both, and a mixed file of whole-byte dtypes is read exactly."""
    for dtypes in (["BF16"] * 3, ["BF16", "F32", "I8"]):
        obj: dict[str, Any] = {}
        pos = 0
        for i, d in enumerate(dtypes):
            nbytes = 6 * DTYPE_BITS[d] // 8
            obj[f"t{i}"] = {"dtype": d, "shape": [2, 3], "data_offsets": [pos, pos + nbytes]}
            pos += nbytes
        fast, (exact, whole) = _both(obj, pos)
        assert fast is not None and list(fast[1].items()) == list(exact[1].items()) == list(
            whole.tensors.items()
        )
        obj["t2"]["data_offsets"][1] -= 1
        text = json.dumps(obj, separators=(",", ":"))
        parsed = H._load_json_fast(text)
        assert parsed is not None and H._fast_header(parsed, pos - 1) is None
        with pytest.raises(HeaderError, match="invalid shape, dtype or offsets"):
            H.parse_header("f", text.encode(), 8 + len(text) + pos - 1)


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


def _fast_agrees(text: str, data_bytes: int) -> None:
    parsed = H._load_json_fast(text)
    fast = H._fast_header(parsed, data_bytes) if parsed is not None else None
    if fast is None:
        return  # the exact route decides: nothing to compare
    exact = H._split_entries(
        "f", H._load_json("f", text)
    )  # raises if the exact route refuses: a failure here
    tensors = H._build_tensors("f", exact[1])
    H._check_offsets("f", tensors, data_bytes)
    assert fast[0] == exact[0] and list(fast[1].items()) == list(tensors.items())
    assert all(type(t.shape) is tuple and all(type(d) is int for d in t.shape) for t in fast[1].values())


@settings(max_examples=300, deadline=None)
@given(_reshaped())
def test_what_the_bulk_route_accepts_the_exact_route_reads_the_same(case: tuple[str, int]) -> None:
    _fast_agrees(*case)


@pytest.mark.slow
@settings(max_examples=20_000, deadline=None)
@given(_reshaped())
def test_what_the_bulk_route_accepts_the_exact_route_reads_the_same_slow(case: tuple[str, int]) -> None:
    _fast_agrees(*case)
