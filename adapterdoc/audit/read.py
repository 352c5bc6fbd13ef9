"""Reading LoRA factors for the audit: the A/B pairs in file order, and one tensor at a time decoded exactly to
float64 (BF16 and the FP8 formats by bit manipulation; ``.bin`` through torch)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from adapterdoc.adapter import parse_key
from adapterdoc.checkpoint import Checkpoint, load_bin
from adapterdoc.st.tensors import TensorSource

if TYPE_CHECKING:
    import torch
    from numpy import ndarray as NDArray

DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
"""dtypes the audit decodes (others are reported as not read, AD304)."""
NARROW_DTYPES = ("F32", "F16", "BF16")
"""dtypes whose every value float32 holds exactly (``read(..., narrow=True)`` gives them as float32)."""


@dataclass(frozen=True)
class FactorPair:
    """One LoRA module's factor names (A, B), its kind, and where its first factor sits in the files."""

    module: str
    a: str | None = None
    b: str | None = None
    embedding: bool = False
    magnitude: bool = False
    order: tuple[int, int] = (0, 0)


@dataclass
class _Found:
    """What :func:`factor_pairs` has found of one module so far."""

    a: str | None = None
    b: str | None = None
    embedding: bool = False
    magnitude: bool = False


def factor_pairs(ckpt: Checkpoint) -> dict[str, FactorPair]:
    """LoRA modules in file order, so the reads stream through each file once (each pair built once)."""
    acc: dict[str, _Found] = {}
    for name in ckpt.tensors:
        k = parse_key(name)
        if k.role == "magnitude":
            acc.setdefault(k.module, _Found()).magnitude = True
            continue
        if not k.is_lora:
            continue
        slot = acc.setdefault(k.module, _Found())
        if k.is_a:
            slot.a = name
        else:
            slot.b = name
        slot.embedding = slot.embedding or k.role.startswith("lora_embedding")
    files = {p: i for i, p in enumerate(dict.fromkeys(ckpt.tensor_file.values()))}

    def position(name: str) -> tuple[int, int]:
        return files.get(ckpt.tensor_file.get(name, ""), 0), ckpt.tensors[name].begin

    out = [
        FactorPair(
            module,
            f.a,
            f.b,
            f.embedding,
            f.magnitude,
            min((position(n) for n in (f.a, f.b) if n), default=(0, 0)),
        )
        for module, f in acc.items()
    ]
    return {g.module: g for g in sorted(out, key=lambda g: g.order)}


class Reader:
    """Decode one tensor at a time to a float64 numpy array (exact for every dtype in :data:`DTYPES`). Reads are
    positioned reads into one small reused buffer (no mapping, no fresh pages); :meth:`close` closes the files."""

    def __init__(self, ckpt: Checkpoint, np: ModuleType) -> None:
        self.ckpt = ckpt
        self.np = np
        self.headers = {h.path: h for h in ckpt.headers}
        self.bytes_read = 0
        self._bin: dict[str, torch.Tensor] | None = None
        self._slots: dict[tuple[int, bool], NDArray] = {}
        self._sources: dict[str, TensorSource] = {}
        self._window = bytearray(_WINDOW)
        self._scratch = np.zeros(_STEP + 1, dtype=np.uint32)

    def close(self) -> None:
        for src in self._sources.values():
            src.close()
        self._sources.clear()

    def _buffer(self, slot: int, n: int, narrow: bool = False) -> NDArray:
        """``n`` float64s (float32s when ``narrow``) of slot ``slot``'s buffer, grown as needed and reused (no
        fresh pages per tensor); one more element lies past them (the BF16 decode writes two bytes into it)."""
        dtype = self.np.float32 if narrow else self.np.float64
        key = (slot, narrow)
        buf = self._slots.get(key)
        if buf is None or buf.size < n + 1:
            buf = self._slots[key] = self.np.empty(n + 1, dtype=dtype)
        return buf[: n + 1]

    def _source(self, path: str) -> TensorSource:
        src = self._sources.get(path)
        if src is None:
            src = self._sources[path] = TensorSource(self.headers[path])
        return src

    def read(self, name: str, slot: int = 0, *, narrow: bool = False) -> NDArray | None:
        """The tensor as float64 (its own shape), or ``None`` when its dtype is not one the audit decodes. The
        array is slot ``slot``'s buffer: valid until the next read into the same slot. ``narrow``: the dtypes of
        :data:`NARROW_DTYPES` come as float32 instead (exact too, half the memory traffic), for callers that widen
        to float64 as they compute (:func:`adapterdoc.audit.stacked.stacked_grams`)."""
        info = self.ckpt.tensors[name]
        if self.ckpt.weights_format == "bin":
            return self._read_bin(name)
        if info.dtype not in DTYPES:
            return None
        np = self.np
        narrow = narrow and info.dtype in NARROW_DTYPES
        n = info.numel
        buf = self._buffer(slot, n, narrow)
        out = buf[:n]
        if n == 0:
            return out.reshape(info.shape)
        width = _WIDTH[info.dtype]
        # bfloat16 is the top half of a float32: on a little-endian host, each value zero-extended to 32 bits and
        # stored 2 bytes early lands in the top half of its float32 (the zero half in the next one's bottom half)
        bf16 = info.dtype == "BF16" and _LITTLE
        if bf16 and narrow:
            wide = buf.view(np.uint8)[2 : 2 + 4 * n].view(np.uint32)
            buf.view(np.uint16)[0] = 0  # the first value's bottom half
        elif bf16:
            wide = self._scratch.view(np.uint8)[2 : 2 + 4 * _STEP].view(np.uint32)  # bytes 0-1 stay zero
            floats = self._scratch[:_STEP].view(np.float32)
        for offset, window in self._source(self.ckpt.tensor_file[name]).windows_into(name, self._window):
            start = offset // width
            raw = np.frombuffer(window, dtype=_RAW[info.dtype])
            if bf16 and narrow:
                np.copyto(wide[start : start + raw.size], raw, casting="unsafe")
            elif bf16:  # through a cache-sized float32 scratch
                for i in range(0, raw.size, _STEP):
                    part = raw[i : i + _STEP]
                    np.copyto(wide[: part.size], part, casting="unsafe")
                    out[start + i : start + i + part.size] = floats[: part.size]
            elif info.dtype == "BF16" and narrow:  # big-endian host
                np.left_shift(raw, 16, out=out[start : start + raw.size].view(np.uint32), dtype=np.uint32)
            else:
                out[start : start + raw.size] = _decode(np, raw, info.dtype)
            self.bytes_read += raw.size * width
        return out.reshape(info.shape)

    def subtract_from(self, name: str, other: NDArray) -> bool:
        """``other`` ← tensor ``name`` − ``other``, in place, one read window at a time (the tensor is never decoded
        whole beside ``other``: ``extract`` holds one copy of a tensor, not two). ``other`` is a C-contiguous array of
        the tensor's size; the difference is exact where its dtype holds it (float32 for two BF16/F16 tensors, as
        ``read(..., narrow=True)`` gives them). False, with ``other`` untouched, when the dtype is not one the audit
        decodes."""
        np = self.np
        if not other.flags.c_contiguous:
            raise ValueError("subtract_from needs a C-contiguous array (a reshape of any other is a copy)")
        flat = other.reshape(-1)
        if self.ckpt.weights_format == "bin":
            mine = self._read_bin(name)
            if mine is None:
                return False
            np.subtract(mine.reshape(-1), flat, out=flat)
            return True
        info = self.ckpt.tensors[name]
        if info.dtype not in DTYPES:
            return False
        width = _WIDTH[info.dtype]
        for offset, window in self._source(self.ckpt.tensor_file[name]).windows_into(name, self._window):
            start = offset // width
            raw = np.frombuffer(window, dtype=_RAW[info.dtype])
            part = flat[start : start + raw.size]
            np.subtract(_decode(np, raw, info.dtype), part, out=part)
            self.bytes_read += raw.size * width
        return True

    def _read_bin(self, name: str) -> NDArray | None:
        if self._bin is None:
            self._bin = load_bin(self.ckpt.weights_path or self.ckpt.root)
        t = self._bin[name].detach()
        self.bytes_read += t.numel() * t.element_size()
        if not t.is_floating_point():
            return None
        # a copy, C-ordered: the caller may change it in place, and a float64 tensor's own memory (or a tied
        # weight's) must stay as loaded
        copied: NDArray = self.np.array(t.double().numpy(), copy=True, order="C")
        return copied


_WINDOW = 1 << 20
"""Bytes read at a time (1 MiB: the window stays in the L2 cache while it is decoded)."""
_LITTLE = sys.byteorder == "little"
_STEP = 1 << 15
"""Elements decoded per step through the BF16 scratch (128 KiB: stays in cache)."""
_WIDTH = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_RAW = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
for _d in DTYPES:
    _WIDTH.setdefault(_d, 1)
    _RAW.setdefault(_d, "u1")
_FP8_TABLES: dict[str, NDArray] = {}


def _decode(np: ModuleType, raw: NDArray, dtype: str) -> NDArray:
    if dtype in ("F64", "F32", "F16"):
        return raw  # numpy's IEEE types are exact; the assignment widens to float64 exactly
    if dtype == "BF16":  # bfloat16 is the top half of a float32
        widened: NDArray = np.left_shift(raw, 16, dtype=np.uint32).view(np.float32)
        return widened
    table = _FP8_TABLES.get(dtype)
    if table is None:
        table = _FP8_TABLES[dtype] = np.array([fp8_value(dtype, b) for b in range(256)], dtype=np.float64)
    decoded: NDArray = table[raw]
    return decoded


_FP8 = {  # exponent bits, mantissa bits, bias, NaN/Inf convention
    "F8_E4M3": (4, 3, 7, "fn"),
    "F8_E5M2": (5, 2, 15, "ieee"),
    "F8_E4M3FNUZ": (4, 3, 8, "fnuz"),
    "F8_E5M2FNUZ": (5, 2, 16, "fnuz"),
}


def fp8_value(dtype: str, byte: int) -> float:
    """The exact value of one FP8 byte (OCP E4M3FN / E5M2, and the FNUZ variants: no -0, 0x80 is NaN)."""
    e_bits, m_bits, bias, style = _FP8[dtype]
    sign = -1.0 if byte & 0x80 else 1.0
    exp = (byte >> m_bits) & ((1 << e_bits) - 1)
    man = byte & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    if style == "fnuz" and byte == 0x80:
        return math.nan
    if style == "fn" and exp == top and man == (1 << m_bits) - 1:
        return math.nan
    if style == "ieee" and exp == top:
        return sign * math.inf if man == 0 else math.nan
    if exp == 0:
        return sign * math.ldexp(man, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) + man, exp - bias - m_bits)
