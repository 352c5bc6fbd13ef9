"""The PEFT maths of a streaming merge in float32: adapter tensors on demand, each module's delta weight
(``get_delta_weight``: linear, embedding, fused experts), the edits applied in PEFT's order (LoRA, DoRA, bias,
whole-weight replacements, trainable tokens), and the output bytes of one tensor a block of rows at a time."""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, BinaryIO, Generic, TypeVar

from adapterdoc.checkpoint import Checkpoint
from adapterdoc.errors import UnsupportedInputError
from adapterdoc.merge.edits import Edit, Output, Plan
from adapterdoc.st.dtypes import DTYPE_BITS

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    import torch

    from adapterdoc.merge.fuse_experts import ExpertConversion
    from adapterdoc.ml.names import Piece

_T = TypeVar("_T")
_R = TypeVar("_R")

_BLOCK_BYTES = 1 << 20
"""Float32 working set per row block of a merged tensor."""


_ST_TORCH: dict[str, torch.dtype] = {}


def torch_dtype(st: str) -> torch.dtype:
    import torch

    if not _ST_TORCH:
        from adapterdoc.checkpoint import TORCH_TO_ST

        for tname, sname in TORCH_TO_ST.items():
            t = getattr(torch, tname.split(".", 1)[1], None)
            if t is not None:
                _ST_TORCH[sname] = t
    try:
        return _ST_TORCH[st]
    except KeyError as e:
        raise UnsupportedInputError(None, f"dtype {st} cannot be merged") from e


def read_tensor(
    f: BinaryIO, offset: int, dtype: str, shape: tuple[int, ...], into: bytearray | None = None
) -> torch.Tensor:
    """Read one tensor (or a run of its rows) with plain positioned reads (``os.preadv``: no shared file position,
    so a helper thread may read ahead), into ``into`` (at least as long; reused) or a new buffer.

    No mmap: pages of a mapped file stay resident in the process and count as its memory.
    """
    import torch

    n = 1
    for d in shape:
        n *= d
    nbytes = n * DTYPE_BITS[dtype] // 8
    if not nbytes:
        return torch.empty(shape, dtype=torch_dtype(dtype))
    buf = into if into is not None else bytearray(nbytes)
    view = memoryview(buf)[:nbytes]
    fd = f.fileno()
    got = 0
    while got < nbytes:
        k = os.preadv(fd, [view[got:]], offset + got)
        if not k:
            raise UnsupportedInputError(f.name, "file ended inside a tensor")
        got += k
    return torch.frombuffer(buf, dtype=torch_dtype(dtype), count=n).reshape(shape)


class AdapterTensors:
    """Adapter tensors on demand, each dropped after the last output tensor that needs it (fused-expert
    factors serve every expert), and never more than ``budget`` bytes held."""

    def __init__(
        self,
        ckpt: Checkpoint,
        uses: dict[str, int] | None = None,
        budget: int = 256 << 20,
        experts: ExpertConversion | None = None,
    ) -> None:
        self.ckpt = ckpt
        self.experts = experts
        """The plan's :class:`~adapterdoc.merge.fuse_experts.ExpertConversion`: fused tensors made from per-expert ones."""
        self.budget = budget
        self.uses = dict(uses or {})
        self.cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.size = 0
        self._bin: dict[str, torch.Tensor] | None = None

    def done_with(self, edits: list[Edit]) -> None:
        """One output tensor that used ``edits`` is written."""
        for e in edits:
            for key in e.keys.values():
                self.uses[key] = self.uses.get(key, 1) - 1
                if self.uses[key] <= 0 and key in self.cache:
                    self.size -= self.cache.pop(key).numel() * 4

    def get(self, key: str) -> torch.Tensor:
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        experts = self.experts
        conv = experts.converted.get(key) if experts is not None else None
        if experts is None or conv is None:
            return self._keep(key, self._read(key))
        # PEFT's conversion of one fused layer's per-expert tensors: the sources live only for the call
        made = experts.convert({k: self._read(k) for k in conv.sources})
        # contiguous once: PEFT's lora_B comes back transposed, and each expert's slice would copy it again
        for k, t in made.items():
            if k != key and k in experts.converted and self.uses.get(k, 0) > 0:
                self._keep(k, t.float().contiguous())
        return self._keep(key, made[key].float().contiguous())

    def _keep(self, key: str, t: torch.Tensor) -> torch.Tensor:
        self.cache[key] = t
        self.size += t.numel() * 4
        while self.size > self.budget and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.size -= old.numel() * 4
        return t

    def _read(self, key: str) -> torch.Tensor:
        if self.ckpt.weights_format == "bin":
            if self._bin is None:
                from adapterdoc.checkpoint import load_bin

                assert self.ckpt.weights_path is not None
                self._bin = load_bin(self.ckpt.weights_path)
            t = self._bin[self.ckpt.original_names.get(key, key)].float()
        else:
            path = self.ckpt.tensor_file[key]
            header = next(h for h in self.ckpt.headers if h.path == path)
            info = self.ckpt.tensors[key]
            with open(path, "rb") as f:
                t = read_tensor(f, header.data_start + info.begin, info.dtype, info.shape).float()
        return t


def delta_weight(
    edit: Edit, piece: Piece, tensors: AdapterTensors, rows: tuple[int, int] | None = None
) -> torch.Tensor:
    """PEFT's ``get_delta_weight`` for ``edit``'s module, restricted to ``piece`` (and its ``rows``), float32."""
    t = edit.layer
    a = tensors.get(edit.keys["A"])
    b = tensors.get(edit.keys["B"])
    if t.kind == "embedding":  # lora_embedding_A [r, num_embeddings], lora_embedding_B [dim, r]
        if rows is not None:
            a = a[:, rows[0] : rows[1]]
        return piece.take((b @ a).T.mul_(t.scaling))
    if t.kind == "linear":
        if rows is not None:  # only without fan_in_fan_out (see row_blocks)
            b = b[rows[0] : rows[1]]
        d = b @ a
        if t.fan_in_fan_out:
            d = d.T
        return piece.take(d.mul_(t.scaling))
    # fused experts (PEFT's ParamWrapper): lora_A [r·E, in] is expert-major, lora_B [out, r·E] is rank-major.
    e_count = t.num_experts
    if e_count == 1:
        return piece.take((b @ a).mul_(t.scaling))
    r = a.shape[0] // e_count
    if piece.expert is not None:
        a_e = a.reshape(e_count, r, a.shape[-1])[piece.expert]
        b_e = b.reshape(b.shape[0], r, e_count)[:, :, piece.expert]
        d = (b_e @ a_e).mul_(t.scaling)
        if not t.experts_out_in:
            d = d.T
        return piece.take(d, expert_selected=True)
    import torch

    a3 = a.reshape(e_count, r, a.shape[-1])
    b3 = b.reshape(b.shape[0], r, e_count)
    spec = "o r e, e r i -> e o i" if t.experts_out_in else "o r e, e r i -> e i o"
    return piece.take(torch.einsum(spec, b3, a3).mul_(t.scaling))


def apply_edits(
    w: torch.Tensor,
    edits: list[Edit],
    piece: Piece,
    tensors: AdapterTensors,
    rows: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Apply ``edits`` to ``w`` (float32, the piece's rows ``rows`` or all of it), PEFT's formulas in its order."""
    import torch

    r0, r1 = rows if rows is not None else (0, w.shape[0] if w.dim() else 1)
    for e in edits:
        if e.kind == "replace":
            value = piece.take(tensors.get(e.keys["value"]))
            w = (value[r0:r1] if rows is not None else value).clone()
        elif e.kind == "lora":
            w.add_(delta_weight(e, piece, tensors, rows))
        elif e.kind == "dora":
            d = delta_weight(e, piece, tensors, rows)
            m = tensors.get(e.keys["magnitude"])
            merged = w.add_(d)
            if e.layer.kind == "embedding":  # norm over the vocabulary: whole tensor only
                norm = torch.linalg.norm(merged.T, dim=1).to(merged.dtype)
                w = (m / norm).view(1, -1) * merged
            else:
                norm = torch.linalg.norm(merged, dim=1).to(merged.dtype)
                w = (m[r0:r1] / norm).view(-1, 1) * merged
        elif e.kind == "bias":
            w.add_(tensors.get(e.keys["bias"]) * e.layer.scaling)
        elif e.kind == "tokens":
            idx = torch.tensor(e.layer.token_indices, dtype=torch.long)
            delta = tensors.get(e.keys["delta"]).to(w.dtype)
            keep = (idx >= r0) & (idx < r1)
            w = w.index_copy(0, idx[keep] - r0, delta[keep])
    return w


class Prefetch(Generic[_T, _R]):
    """``fn(item)`` of each item in order, one item ahead on a helper thread."""

    def __init__(self, fn: Callable[[_T], _R], items: list[_T]) -> None:
        self.fn, self.items, self.i = fn, items, 0
        self.pending: Future[_R] | None = None
        self.pool: ThreadPoolExecutor | None = None
        if len(items) > 1:
            from concurrent.futures import ThreadPoolExecutor

            self.pool = ThreadPoolExecutor(1, thread_name_prefix="adapterdoc-merge-reader")
            self.pending = self.pool.submit(fn, items[0])

    def next(self) -> _R:
        i = self.i
        self.i += 1
        if self.pool is None:
            return self.fn(self.items[i])
        assert self.pending is not None
        out = self.pending.result()
        if self.i < len(self.items):
            self.pending = self.pool.submit(self.fn, self.items[self.i])
        else:
            self.pool.shutdown(wait=True)
        return out

    def __del__(self) -> None:  # a consumer that stopped early (an error): let the helper finish
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


class NotFinite(Exception):
    def __init__(self, tensor: str) -> None:
        super().__init__(tensor)
        self.tensor = tensor


def row_blocks(o: Output, piece: Piece | None) -> bool:
    """Whether ``o`` can be computed a run of rows at a time (every edit is row-local)."""
    if not o.shape or piece is None or not piece.whole:
        return False
    for e in o.edits:
        if e.kind in ("replace", "tokens"):
            continue
        t = e.layer
        if e.kind == "lora" and t.kind in ("linear", "embedding") and not t.fan_in_fan_out:
            continue
        if e.kind == "dora" and t.kind == "linear" and not t.fan_in_fan_out:
            continue
        return False
    return True


class Scratch:
    """The reused buffers of row blocks: two read slots (the block being computed and the one read ahead), the
    float32 work block, and ``out_slots`` output slots, one per block the writer may still hold (its queue depth,
    the job it is running, and the block being computed). Reusing them spares an allocation, the kernel's zeroing
    of fresh pages and a page fault per 4 KiB of every block; nothing here reaches numpy."""

    def __init__(self, out_slots: int) -> None:
        self.reads = [bytearray(), bytearray()]
        self.outs = [bytearray() for _ in range(out_slots)]
        self.next_out = 0
        self.work: list[torch.Tensor | None] = [None, None]

    def read_slot(self, i: int, nbytes: int) -> bytearray:
        if len(self.reads[i % 2]) < nbytes:
            self.reads[i % 2] = bytearray(nbytes)
        return self.reads[i % 2]

    def out_slot(self, nbytes: int) -> bytearray:
        """The next output slot, in turn (a slot the writer may still hold is replaced, never written to)."""
        i = self.next_out
        self.next_out = (i + 1) % len(self.outs)
        if len(self.outs[i]) < nbytes:
            self.outs[i] = bytearray(nbytes)
        return self.outs[i]

    def work_block(self, shape: tuple[int, ...], which: int = 0) -> torch.Tensor:
        """Float32 work block ``which`` (0: the update, 1: the base rows widened), reused."""
        import torch

        n = math.prod(shape)
        buf = self.work[which]
        if buf is None or buf.numel() < n:
            buf = self.work[which] = torch.empty(n, dtype=torch.float32)
        return buf[:n].view(shape)


def _plain_lora(o: Output) -> Edit | None:
    """The one edit of ``o`` when it is a plain LoRA update of a whole linear weight (the common case)."""
    if len(o.edits) != 1 or len(o.shape) != 2:
        return None
    e = o.edits[0]
    t = e.target
    if e.kind != "lora" or t is None or t.kind != "linear" or t.fan_in_fan_out:
        return None
    return e


def _lora_rows(e: Edit, tensors: AdapterTensors, r0: int, r1: int, scratch: Scratch) -> torch.Tensor:
    """``scaling · (B[r0:r1] @ A)`` in the work block, PEFT's float32 products and rounding: ``mul_`` after the
    product (a fused ``addmm``/``add(alpha=)`` rounds once and differs), none when the scaling is 1."""
    import torch

    assert e.target is not None
    a = tensors.get(e.keys["A"])
    b = tensors.get(e.keys["B"])[r0:r1]
    d = torch.matmul(b, a, out=scratch.work_block((b.shape[0], a.shape[1])))
    if e.target.scaling != 1.0:
        d.mul_(e.target.scaling)
    return d


def check_finite(name: str, merged: torch.Tensor) -> None:
    """Raise :class:`NotFinite` when ``merged`` (float32) holds inf or nan: one reduction instead of an elementwise
    isfinite pass (inf/nan always reach the sum; a sum that overflowed is then checked element by element).
    Probed: the float32 sum is as fast as the bfloat16 output's and three times faster than its float32-accumulated
    sum."""
    import torch

    if not math.isfinite(float(merged.sum())) and not bool(torch.isfinite(merged).all()):
        raise NotFinite(name)


def blocks(
    o: Output,
    src: BinaryIO,
    start: int,
    plan: Plan,
    tensors: AdapterTensors,
    scratch: Scratch | None = None,
    decoded: torch.Tensor | None = None,
) -> Iterator[memoryview]:
    """The output bytes of one tensor that needs computing (merged, or cast), a block of rows at a time; its rows
    read from ``src`` at ``start``, or taken from ``decoded`` (a quantized module's decoded float32 weight).

    A tensor that is computed whole (an edit that is not row-local) takes fresh buffers; row blocks reuse
    ``scratch``'s, and a plain LoRA update is added in place to its float32 product (``d += W``: the same sum as
    ``W.float() + d``, without a fresh float32 copy of the block)."""
    import torch

    assert o.source is not None
    piece = plan.pieces.get(o.name)
    shape = tuple(o.shape)
    in_dtype = o.source.dtype if decoded is None else "F32"
    rows = shape[0] if shape else 1
    row_elems = math.prod(shape[1:]) if shape else 1
    blocked = not o.edits or row_blocks(o, piece)
    step = max(1, _BLOCK_BYTES // max(4 * row_elems, 1)) if blocked else rows
    row_bytes = row_elems * DTYPE_BITS[in_dtype] // 8
    spans = [(r0, min(rows, r0 + step)) for r0 in range(0, max(rows, 1), step)]
    reuse = scratch if blocked and shape else None
    plain = _plain_lora(o) if reuse is not None else None
    out_dtype = torch_dtype(o.dtype)
    out_bits = DTYPE_BITS[o.dtype]

    def read(item: tuple[int, tuple[int, int]]) -> torch.Tensor:
        i, (r0, r1) = item
        if decoded is not None:
            return decoded[r0:r1] if shape else decoded
        sub = (r1 - r0, *shape[1:]) if shape else shape
        into = reuse.read_slot(i, (r1 - r0) * row_bytes) if reuse is not None else None
        return read_tensor(src, start + r0 * row_bytes, in_dtype, sub, into)

    # the next block is read on a helper thread while this one is computed (reads release the GIL)
    ahead = Prefetch(read, list(enumerate(spans)))
    for r0, r1 in spans:
        w = ahead.next()
        if reuse is None:
            if o.edits:
                assert piece is not None  # every edited tensor is a piece of a parameter
                w = apply_edits(w.float(), o.edits, piece, tensors, (r0, r1) if blocked else None)
                check_finite(o.name, w)
            w = w.to(out_dtype).contiguous()
            yield w.reshape(-1).view(torch.uint8).numpy().data
            continue
        n = w.numel()
        slot = reuse.out_slot(n * out_bits // 8)
        out = torch.frombuffer(slot, dtype=out_dtype, count=n).view(w.shape) if n else w.to(out_dtype)
        if plain is not None:
            # widened in a reused block first: a float32 add_ then beats the mixed-dtype one by ~25% (probed)
            wide = w if w.dtype == torch.float32 else reuse.work_block(tuple(w.shape), 1).copy_(w)
            merged = _lora_rows(plain, tensors, r0, r1, reuse).add_(wide)
        elif o.edits:
            assert piece is not None
            merged = apply_edits(w.float(), o.edits, piece, tensors, (r0, r1))
        else:
            merged = w
        if n:
            out.copy_(merged)
        if o.edits:
            check_finite(o.name, merged)
        yield memoryview(slot)[: n * out_bits // 8]
