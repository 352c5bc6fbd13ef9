"""Writing a planned merge: every output shard (header computed up front, untouched tensors copied in the kernel,
merged ones streamed), the shard index, and the side files (``config.json`` edited for ``--dtype`` and untied
weights), in a temp folder swapped into place (:func:`adapterdoc.st.atomic.atomic_folder`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import threading
from collections.abc import Callable

from adapterdoc.merge.background_writer import Writer
from adapterdoc.merge.decoded import Reencoder, decoded_weight
from adapterdoc.merge.delta import AdapterTensors, Prefetch, Scratch, blocks
from adapterdoc.merge.edits import Output, Plan
from adapterdoc.st.atomic import TEMP_PREFIX, atomic_folder, fsync, slow_point, write_marker
from adapterdoc.st.dtypes import CAST_DTYPES, CONFIG_DTYPES
from adapterdoc.st.header import TensorInfo, serialize_header

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx")

Progress = Callable[[int, int], None]
"""Called with (bytes written, bytes in all) as the merge writes."""

COMPUTE_THREADS = 1
"""torch intra-op threads while merging. The row blocks are memory-bound passes beside a reader and a writer
thread: a second OpenMP thread buys little, and on a busy machine its spin-waits tripled the CPU time and doubled
the wall time of a 1.1 GiB merge (10 s / 44 s with one thread, 30 s / 110 s with two, load ~12). The bytes are the
same (the products split rows between threads, never a sum)."""


def _header_bytes(metadata: dict[str, str] | None, outs: list[Output]) -> bytes:
    infos = []
    pos = 0
    for o in outs:
        infos.append(TensorInfo(o.name, o.dtype, tuple(o.shape), pos, pos + o.nbytes))
        pos += o.nbytes
    raw = serialize_header(metadata if metadata is not None else {"format": "pt"}, infos)
    raw += b" " * ((8 - (8 + len(raw)) % 8) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write(
    plan: Plan, out_path: str, dtype: str, *, force: bool, progress: Progress | None
) -> tuple[int, int, int]:
    """Write the merged checkpoint to ``out_path``; (tensors written, tensors merged, bytes written)."""
    from adapterdoc.train.runtime import torch_threads

    with atomic_folder(out_path, force=force) as tmp, torch_threads(COMPUTE_THREADS):
        counts = _fill(plan, tmp, dtype, progress)
        write_marker(tmp, "merge", adapter=plan.adapter.spec, base=plan.base.spec, dtype=dtype)
        slow_point("merge-before-rename")
    return counts


def return_freed_memory() -> None:
    """Make glibc hand large freed blocks back to the system (a fixed mmap threshold).

    The merge allocates and frees blocks of a few MiB on two threads; with glibc's default dynamic threshold
    they end up in the heap, which then grows to a large fraction of the model size without being trimmed
    (measured: 1.6 GB peak for a 1.1 GiB merge, 0.48 GB with the threshold fixed). No-op elsewhere.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD = 1 MiB (also turns the dynamic adjustment off)


def _fill(plan: Plan, folder: str, dtype: str, progress: Progress | None) -> tuple[int, int, int]:
    return_freed_memory()
    uses: dict[str, int] = {}
    for _, _, outs in plan.shards:
        for o in outs:
            for e in o.edits:
                for key in e.keys.values():
                    uses[key] = uses.get(key, 0) + 1
    tensors = AdapterTensors(plan.adapter, uses, experts=plan.experts)
    reencoder = Reencoder(plan, tensors) if plan.requantize else None
    total = sum(sum(o.nbytes for o in outs) for _, _, outs in plan.shards)
    done = 0
    n_tensors = n_merged = 0
    weight_map: dict[str, str] = {}
    written_bytes = 0
    writer = Writer()
    flushing: list[threading.Thread] = []
    scratch = Scratch(writer.depth + 2)  # the writer's queue, its running job, and the block being computed
    try:
        for rel, header, outs in plan.shards:
            dest = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            head = _header_bytes(header.metadata, outs)
            # each decoded weight is read and decoded on a helper thread while the one before it is merged
            decoding = [o for o in outs if o.quantized is not None and reencoder is None]
            decoded = Prefetch(lambda o: decoded_weight(plan, o)[0], decoding)
            with open(dest, "wb", buffering=0) as f, open(header.path, "rb") as src:
                writer.put(f, head)
                for o in outs:
                    assert o.source is not None
                    start = header.data_start + o.source.begin
                    if o.quantized is not None:  # a module of a quantized base: decoded, or encoded again
                        if reencoder is not None:
                            writer.put(f, reencoder.tensor_bytes(o))
                        else:
                            w = decoded.next()
                            for block in blocks(o, src, start, plan, tensors, scratch, decoded=w):
                                writer.put(f, block)
                        n_merged += 1 if o.edits else 0
                        tensors.done_with(o.edits)
                    elif o.source_file != header.path:  # a module's tensor kept from another shard
                        writer.put(f, _read_bytes(plan, o))
                    elif not o.edits and o.dtype == o.source.dtype:
                        writer.copy(f, src, start, o.source.nbytes)  # in the kernel, no buffers here
                    else:
                        for block in blocks(o, src, start, plan, tensors, scratch):
                            writer.put(f, block)
                        n_merged += 1 if o.edits else 0
                        tensors.done_with(o.edits)
                    done += o.nbytes
                    n_tensors += 1
                    weight_map[o.name] = rel
                    if progress:
                        progress(done, total)
                writer.flush()
            written_bytes += len(head) + sum(o.nbytes for o in outs)
            flushing.append(_flush_early(dest))
            slow_point("merge-shard")
    finally:
        writer.close()
        for t in flushing:
            t.join()
    _write_index(plan, folder, weight_map, total)
    _copy_side_files(plan, folder, dtype)
    return n_tensors, n_merged, written_bytes


def _read_bytes(plan: Plan, o: Output) -> bytes:
    """The stored bytes of ``o``'s source tensor, from the shard that holds it."""
    assert o.source is not None and o.source_file is not None
    header = next(h for h in plan.base.headers if h.path == o.source_file)
    with open(header.path, "rb") as f:
        f.seek(header.data_start + o.source.begin)
        return f.read(o.source.nbytes)


def _flush_early(path: str) -> threading.Thread:
    """Start writing a finished shard back to disk on a helper thread while the next one is computed. Only a head
    start: the output folder's own fsync before its rename (:func:`adapterdoc.st.atomic.fsync_tree`) is the
    guarantee, and then finds the pages clean (measured: 2 s of a 1.1 GiB merge's wall time spent in it)."""
    t = threading.Thread(target=fsync, args=(path,), name="adapterdoc-merge-fsync", daemon=True)
    t.start()
    return t


def _write_index(plan: Plan, folder: str, weight_map: dict[str, str], total: int) -> None:
    base = plan.base
    if base.index_path is None:
        return
    with open(base.index_path, "rb") as f:
        data = json.loads(f.read().decode("utf-8"))
    meta = dict(data.get("metadata") or {}) if isinstance(data.get("metadata"), dict) else {}
    meta["total_size"] = total
    new_map = dict(data["weight_map"])
    for name in plan.added:
        new_map[name] = weight_map[name]
    if plan.quantization is not None and not plan.requantize:  # decoded weights replace the stored tensors
        new_map = dict(weight_map)
    out = {**data, "metadata": meta, "weight_map": new_map}
    with open(os.path.join(folder, os.path.basename(base.index_path)), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


def _copy_side_files(plan: Plan, folder: str, dtype: str) -> None:
    """config.json, tokenizer, generation and processor files: every top-level regular file but weights."""
    root = plan.base.root
    for name in sorted(os.listdir(root)):
        src = os.path.join(root, name)
        if name.startswith(".") or not os.path.isfile(src):
            continue
        if name.endswith(_WEIGHT_SUFFIXES) or name.endswith(".index.json") or name.startswith(TEMP_PREFIX):
            continue
        dst = os.path.join(folder, name)
        decoded = plan.quantization is not None and not plan.requantize
        if name == "config.json" and (dtype != "auto" or plan.untie or decoded):
            with open(src, "rb") as f:
                cfg = json.loads(f.read().decode("utf-8"))
            _edit_config(
                cfg, CONFIG_DTYPES.get(dtype) or (_decoded_dtype(plan) if decoded else None), plan.untie
            )
            if decoded and isinstance(cfg, dict):
                cfg.pop("quantization_config", None)
            with open(dst, "w", encoding="utf-8") as f:
                json.dump(cfg, f, indent=2, sort_keys=True)
                f.write("\n")
        else:
            shutil.copyfile(src, dst)


def _decoded_dtype(plan: Plan) -> str | None:
    """The config spelling of the dtype the decoded weights were written in."""
    dtypes = {o.dtype for _, _, outs in plan.shards for o in outs if o.quantized is not None}
    names = {v: k for k, v in CAST_DTYPES.items()}
    return CONFIG_DTYPES.get(names.get(dtypes.pop(), "")) if len(dtypes) == 1 else None


def _edit_config(cfg: object, dtype: str | None, untie: bool) -> None:
    if isinstance(cfg, dict):
        for k in list(cfg):
            if dtype and k in ("dtype", "torch_dtype") and isinstance(cfg[k], str):
                cfg[k] = dtype
            elif untie and k == "tie_word_embeddings":
                cfg[k] = False
            else:
                _edit_config(cfg[k], dtype, untie)
        if untie and "tie_word_embeddings" not in cfg and "architectures" in cfg:
            cfg["tie_word_embeddings"] = False
