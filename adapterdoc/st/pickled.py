"""PEFT's ``adapter_model.bin`` (a ``torch.save`` zip archive) read without torch and without executing pickle.

A restricted :class:`pickle.Unpickler` resolves only the globals a tensor state dict uses (the tensor and
parameter rebuilds of ``torch._utils``, the typed storage classes, ``collections.OrderedDict``) and maps them onto
plain stand-ins: each tensor becomes a :class:`PickledTensor` (safetensors dtype, shape, C-order little-endian
bytes cut from its storage record). Any other global, opcode target or persistent id is refused (exit 3) before
anything is called, so no payload of a malicious pickle ever runs: the same files ``torch.load(weights_only=True)``
refuses are refused here, numpy or not. The legacy (torch < 1.6, not zip) format is not read here.
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import struct
import zipfile
from dataclasses import dataclass
from typing import Any

from adapterdoc.errors import UnsupportedInputError

STORAGE_DTYPES = {
    "DoubleStorage": ("F64", 8),
    "FloatStorage": ("F32", 4),
    "HalfStorage": ("F16", 2),
    "BFloat16Storage": ("BF16", 2),
    "LongStorage": ("I64", 8),
    "IntStorage": ("I32", 4),
    "ShortStorage": ("I16", 2),
    "CharStorage": ("I8", 1),
    "ByteStorage": ("U8", 1),
    "BoolStorage": ("BOOL", 1),
    "ComplexFloatStorage": ("C64", 8),
}
"""torch's typed storage classes (``torch.FloatStorage``, ...) → (safetensors dtype, bytes per element)."""
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
REFUSAL = "refused by the restricted unpickler (what torch.load(weights_only=True) allows)"


@dataclass(frozen=True)
class PickledTensor:
    """One tensor of a pickled state dict: its safetensors dtype, shape and C-order little-endian bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class _Storage:
    """One storage of a pickled checkpoint: its dtype, element width and raw bytes."""

    dtype: str
    width: int
    data: bytes


class _Refused(Exception):
    pass


class LegacyFormatError(UnsupportedInputError):
    """The legacy (torch < 1.6, not zip) format: only ``torch.load(weights_only=True)`` reads it."""


def _rebuild_tensor_v2(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False, hooks: Any = None, *_: Any
) -> PickledTensor:
    if not isinstance(storage, _Storage):
        raise _Refused("a tensor rebuilt from something that is not a storage record")
    for v in (offset, *size, *stride):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise _Refused("a tensor with a non-integer size, stride or offset")
    if len(size) != len(stride):
        raise _Refused("a tensor whose size and stride differ in length")
    return PickledTensor(storage.dtype, tuple(size), _gather(storage, offset, tuple(size), tuple(stride)))


def _rebuild_parameter(data: Any, requires_grad: Any = False, hooks: Any = None, *_: Any) -> PickledTensor:
    if not isinstance(data, PickledTensor):
        raise _Refused("a parameter wrapping something that is not a tensor")
    return data


def _gather(storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    """The elements a (size, stride, offset) view of ``storage`` reads, in C order."""
    w = storage.width
    n = 1
    for d in size:
        n *= d
    if n == 0:
        return b""
    last = max(offset + sum((d - 1) * s for d, s in zip(size, stride)), offset)
    if (last + 1) * w > len(storage.data):
        raise _Refused("a tensor reaching past the end of its storage")
    contiguous, expect = True, 1
    for d, s in zip(reversed(size), reversed(stride)):
        if d != 1 and s != expect:
            contiguous = False
        expect *= d
    buf = storage.data
    if contiguous:
        return bytes(buf[offset * w : (offset + n) * w])
    out = bytearray()
    rows = [offset]
    for d, s in zip(size[:-1], stride[:-1]):
        rows = [r + i * s for r in rows for i in range(d)]
    inner, step = (size[-1], stride[-1]) if size else (1, 1)
    for r in rows:
        if step == 1:
            out += buf[r * w : (r + inner) * w]
        else:
            for i in range(inner):
                p = (r + i * step) * w
                out += buf[p : p + w]
    return bytes(out)


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, storages: Any) -> None:
        super().__init__(io.BytesIO(data))
        self._storages = storages

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in STORAGE_DTYPES:
            return ("storage-type", name)
        found = _ALLOWED.get((module, name))
        if found is None:
            raise _Refused(f"unsupported global {module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise _Refused("an unsupported persistent id")
        kind, key = pid[1], pid[2]
        if not (isinstance(kind, tuple) and kind[:1] == ("storage-type",)) or not isinstance(key, str):
            raise _Refused("a storage record of an unsupported type")
        return self._storages(STORAGE_DTYPES[kind[1]], key)


def read_pickled(path: str) -> dict[str, PickledTensor]:
    """The named tensors of a ``torch.save`` zip archive at ``path``; exit 3 for anything else."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UnsupportedInputError(path, f"cannot read: {e.strerror or e}") from e
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return _not_zip(path, data)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = z.namelist()
            pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pkl) != 1:
                raise UnsupportedInputError(
                    path, "is a zip archive without one data.pkl: not a torch.save file"
                )
            prefix = pkl[0][: -len("data.pkl")]
            order = (
                z.read(prefix + "byteorder").decode().strip() if prefix + "byteorder" in names else "little"
            )
            if order != "little":
                raise UnsupportedInputError(path, f"a {order}-endian torch archive is not read")
            cache: dict[str, _Storage] = {}

            def storage(spec: tuple[str, int], key: str) -> _Storage:
                if key not in cache:
                    member = f"{prefix}data/{key}"
                    if member not in names:
                        raise _Refused(f"storage {key!r} is not in the archive")
                    cache[key] = _Storage(spec[0], spec[1], z.read(member))
                return cache[key]

            obj = _Unpickler(z.read(pkl[0]), storage).load()
    except _Refused as e:
        raise UnsupportedInputError(path, f"{REFUSAL}: {e}") from None
    except UnsupportedInputError:
        raise
    except Exception as e:  # the unpickler raises many types on a damaged or hostile stream: all refusals
        raise UnsupportedInputError(path, f"{REFUSAL}: {type(e).__name__}: {e}") from None
    return _state_dict(path, obj)


def _not_zip(path: str, data: bytes) -> dict[str, PickledTensor]:
    """A file that is not a zip archive: a plain pickle is only looked at far enough to refuse it (its first
    global is refused before anything is called); the legacy torch format needs torch."""
    try:
        first = _Unpickler(data, None).load()
    except _Refused as e:
        raise UnsupportedInputError(path, f"{REFUSAL}: {e}") from None
    except Exception as e:  # any unpickling failure: not a file we can read
        raise UnsupportedInputError(
            path, f"{REFUSAL}: not a torch.save archive ({type(e).__name__})"
        ) from None
    if first == LEGACY_MAGIC:
        raise LegacyFormatError(path, "the legacy (torch < 1.6) format is read only with torch installed")
    raise UnsupportedInputError(path, f"{REFUSAL}: a plain pickle, not a torch.save archive")


def _state_dict(path: str, obj: Any) -> dict[str, PickledTensor]:
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, PickledTensor) for k, v in obj.items()
    ):
        raise UnsupportedInputError(path, "is not a state dict of named tensors")
    return dict(obj)


_DTYPE_ORDER = [
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
]
"""The safetensors crate's ``Dtype`` order: its serializer lays tensors out by dtype (descending), then name."""


def safetensors_bytes(tensors: dict[str, PickledTensor], metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors file holding ``tensors``, laid out as :func:`safetensors.torch.save` lays them out."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    order = sorted(tensors, key=lambda n: (-_DTYPE_ORDER.index(tensors[n].dtype), n))
    pos = 0
    for name in order:
        t = tensors[name]
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [pos, pos + len(t.data)]}
        pos += len(t.data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(tensors[n].data for n in order)


__all__ = ["STORAGE_DTYPES", "LegacyFormatError", "PickledTensor", "read_pickled", "safetensors_bytes"]
