"""Open any input as a checkpoint, header only: a .safetensors file, a PEFT adapter directory, a sharded
checkpoint directory, or a repo id in the local Hugging Face cache. ``.bin`` adapters are read with
``torch.load(weights_only=True)`` and only when torch is installed.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import TYPE_CHECKING

from adapterdoc.adapter import ADAPTER_CONFIG, AdapterConfig
from adapterdoc.errors import (
    ConfigError,
    HeaderError,
    InputNotFoundError,
    MissingExtraError,
    UnsupportedInputError,
)
from adapterdoc.opened import (
    ADAPTER_BIN,
    ADAPTER_WEIGHTS,
    GGUF_MAGIC,
    MLX_WEIGHTS,
    Checkpoint,
    safe_shard_name,
)
from adapterdoc.st.header import Header, TensorInfo, read_header
from adapterdoc.st.paths import cannot_read

if TYPE_CHECKING:
    import torch

    from adapterdoc.bases import resolve_cached_repo  # re-exported, imported when first asked (__getattr__)

TORCH_TO_ST = {
    "torch.bool": "BOOL",
    "torch.uint8": "U8",
    "torch.int8": "I8",
    "torch.int16": "I16",
    "torch.uint16": "U16",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int32": "I32",
    "torch.uint32": "U32",
    "torch.float32": "F32",
    "torch.complex64": "C64",
    "torch.float64": "F64",
    "torch.int64": "I64",
    "torch.uint64": "U64",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e8m0fnu": "F8_E8M0",
    "torch.float8_e4m3fnuz": "F8_E4M3FNUZ",
    "torch.float8_e5m2fnuz": "F8_E5M2FNUZ",
}


def open_checkpoint(
    spec: str | os.PathLike[str], *, read_bin: bool = True, header: Header | None = None
) -> Checkpoint:
    """Open ``spec`` (path or ``org/name[@revision]``) header-only; raise an :class:`AdapterdocError` if unusable.

    ``header``: the header of the safetensors file ``spec`` names, already read (format detection reads it), taken
    instead of reading the file again."""
    s = os.fspath(spec)
    if s.startswith("~"):
        s = os.path.expanduser(s)
    if s.startswith("hf://"):
        from adapterdoc.remote import open_remote

        return open_remote(s)
    if os.path.lexists(s):
        return _open_path(s, s, read_bin=read_bin, header=header)
    from adapterdoc.bases import match_repo_id, resolve_cached_repo  # a repo id: not a local path's start

    m = match_repo_id(s)
    if m:
        snapshot = resolve_cached_repo(m["repo"], m["rev"])
        ckpt = _open_path(snapshot, s, read_bin=read_bin)
        ckpt.repo_id = m["repo"]
        return ckpt
    raise InputNotFoundError(s, "no such file or directory")


def _open_path(path: str, spec: str, *, read_bin: bool, header: Header | None = None) -> Checkpoint:
    if os.path.islink(path) and not os.path.exists(path):
        raise InputNotFoundError(spec, "is a broken symlink")
    if os.path.isdir(path):
        if path.endswith(".safetensors"):
            raise UnsupportedInputError(spec, "is a directory named like a safetensors file")
        return _open_dir(path, spec, read_bin=read_bin)
    why = cannot_read(path)  # a FIFO or a device is never opened (a read could block)
    if why is not None:
        raise UnsupportedInputError(spec, why)
    if path.endswith(".bin"):
        return _open_bin_file(path, spec)
    if path.endswith(".json"):
        raise UnsupportedInputError(spec, "is a JSON file; pass the directory that holds it")
    _refuse_gguf(path, spec)
    return _single(spec, "file", path, _header(path, header), weights_path=path)


def _header(path: str, known: Header | None) -> Header:
    """The header of the file at ``path``: ``known`` when it is that file's (read before), said of ``path`` as
    spelled here, else read now."""
    if known is None or os.path.normpath(known.path) != os.path.normpath(path):
        return read_header(path)
    return known if known.path == path else replace(known, path=path)


def _refuse_gguf(path: str, spec: str) -> None:
    """A GGUF file is no safetensors file (its magic would read as a header length): say what it is; a file named
    ``.gguf`` without the magic is said to be no GGUF file (not "no safetensors")."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return  # read_header names why it cannot be read
    if magic == GGUF_MAGIC:
        raise UnsupportedInputError(
            spec,
            "is a GGUF file (llama.cpp), not a PEFT adapter: a GGUF LoRA adapter converts to one with "
            f"`adapterdoc convert {spec} --to peft --base BASE --out DIR` (`inspect` and `verify` read it as it "
            "is); a model GGUF is no adapter",
        )
    if path.endswith(".gguf"):
        raise UnsupportedInputError(
            spec, f"is not a GGUF file: it does not start with the GGUF magic ({os.path.getsize(path)} bytes)"
        )


def _refuse_mlx(path: str, spec: str) -> None:
    """An mlx-lm adapter folder (``adapters.safetensors``) is not a PEFT folder: say so, and how to make one."""
    weights = os.path.join(path, MLX_WEIGHTS)
    if os.path.lexists(weights) and not os.path.lexists(os.path.join(path, ADAPTER_WEIGHTS)):
        why = cannot_read(weights)
        if why is not None:
            raise UnsupportedInputError(weights, why)
        raise UnsupportedInputError(
            spec,
            "is an MLX adapter (mlx-lm), not a PEFT adapter: `adapterdoc inspect` and `verify` read it; for "
            f"this command convert it first: adapterdoc convert {spec} --to peft --base BASE --out DIR",
        )


def _single(spec: str, kind: str, root: str, header: Header, *, weights_path: str) -> Checkpoint:
    return Checkpoint(
        spec=spec,
        kind=kind,
        root=root,
        headers=[header],
        tensors=dict(header.tensors),
        tensor_file={name: header.path for name in header.tensors},
        weights_path=weights_path,
    )


def _open_dir(path: str, spec: str, *, read_bin: bool) -> Checkpoint:
    _refuse_mlx(path, spec)
    cfg_path = os.path.join(path, ADAPTER_CONFIG)
    st_path = os.path.join(path, ADAPTER_WEIGHTS)
    bin_path = os.path.join(path, ADAPTER_BIN)
    if os.path.lexists(cfg_path):
        config = AdapterConfig.load(cfg_path)
        if os.path.lexists(st_path):
            ckpt = _single(spec, "adapter", path, read_header(st_path), weights_path=st_path)
        elif os.path.lexists(bin_path):
            ckpt = _open_bin_file(bin_path, spec, read=read_bin)
            ckpt.kind, ckpt.root = "adapter", path
        else:
            raise InputNotFoundError(
                spec, f"has {ADAPTER_CONFIG} but neither {ADAPTER_WEIGHTS} nor {ADAPTER_BIN}"
            )
        ckpt.adapter_config = config
        return ckpt
    indexes = sorted(f for f in os.listdir(path) if f.endswith(".safetensors.index.json"))
    if indexes:
        if len(indexes) > 1 and "model.safetensors.index.json" not in indexes:
            raise UnsupportedInputError(
                spec, f"has several shard indexes ({', '.join(indexes)}); pass one file"
            )
        index = "model.safetensors.index.json" if len(indexes) > 1 else indexes[0]
        return _open_sharded(path, os.path.join(path, index), spec)
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if os.path.lexists(st_path):
        return _single(spec, "adapter", path, read_header(st_path), weights_path=st_path)
    if len(files) == 1:
        fp = os.path.join(path, files[0])
        return _single(spec, "file", path, read_header(fp), weights_path=fp)
    if files:
        raise UnsupportedInputError(
            spec, f"has {len(files)} .safetensors files but no *.safetensors.index.json"
        )
    if os.path.lexists(bin_path):
        raise ConfigError(spec, f"has {ADAPTER_BIN} but no {ADAPTER_CONFIG}")
    raise UnsupportedInputError(spec, f"holds no {ADAPTER_CONFIG}, shard index or .safetensors file")


def _load_index(index_path: str) -> dict[str, str]:
    try:
        with open(index_path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(index_path, f"invalid shard index: {e}") from e
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise ConfigError(index_path, "invalid shard index: `weight_map` must map tensor names to file names")
    return wm


def _open_sharded(path: str, index_path: str, spec: str) -> Checkpoint:
    weight_map = _load_index(index_path)
    files: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        files.setdefault(safe_shard_name(index_path, shard), []).append(tensor)
    ckpt = Checkpoint(spec=spec, kind="sharded", root=path, index_path=index_path)
    for shard_path, names in files.items():
        if not os.path.exists(shard_path):
            raise InputNotFoundError(
                shard_path, f"shard named by {os.path.basename(index_path)} does not exist"
            )
        header = read_header(shard_path)
        ckpt.headers.append(header)
        for name in names:
            info = header.tensors.get(name)
            if info is None:
                raise HeaderError(
                    shard_path, "the index names this tensor but the shard does not hold it", key=name
                )
            ckpt.tensors[name] = info
            ckpt.tensor_file[name] = shard_path
        listed = set(names)
        ckpt.extra_in_shards.extend((shard_path, t) for t in header.tensors if t not in listed)
    return ckpt


def _open_bin_file(path: str, spec: str, *, read: bool = True) -> Checkpoint:
    ckpt = Checkpoint(spec=spec, kind="file", root=path, weights_path=path, weights_format="bin")
    if read:
        for name, (dtype, shape) in describe_bin(path).items():
            ckpt.tensors[name] = TensorInfo(name, dtype, shape, 0, 0)
            ckpt.tensor_file[name] = path
    return ckpt


def load_bin(path: str) -> dict[str, torch.Tensor]:
    """Load a pickled state dict with ``torch.load(weights_only=True)``; nothing else is ever unpickled."""
    try:
        import torch
    except ImportError as e:
        raise MissingExtraError(path, "torch") from e
    from adapterdoc.ml.quiet import no_warnings

    try:
        # torch's own warnings (pickle protocol, ...) would break the one-line error on stderr
        with no_warnings():
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except Exception as e:  # the unpickler raises many types; all mean "cannot use this file"
        raise UnsupportedInputError(
            path, f"refused by torch.load(weights_only=True): {_torch_reason(e)}"
        ) from e
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    ):
        raise UnsupportedInputError(path, "is not a state dict of named tensors")
    return obj


def _torch_reason(e: Exception) -> str:
    """The useful part of torch.load's error (its first line advises weights_only=False, which we never do)."""
    text = str(e).strip()
    marker = "WeightsUnpickler error:"
    if marker in text:
        text = text.split(marker, 1)[1].split("Check the documentation", 1)[0]
        return " ".join(text.split()) or type(e).__name__
    return text.splitlines()[0] if text else type(e).__name__


def describe_bin(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name → (safetensors dtype, shape) for a ``.bin`` state dict, read without torch by the restricted
    unpickler (:func:`adapterdoc.st.pickled.read_pickled`); the legacy format through :func:`load_bin`."""
    from adapterdoc.st.pickled import LegacyFormatError, read_pickled

    try:
        return {name: (t.dtype, t.shape) for name, t in read_pickled(path).items()}
    except LegacyFormatError:
        pass
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, t in load_bin(path).items():
        dtype = TORCH_TO_ST.get(str(t.dtype))
        if dtype is None:
            raise UnsupportedInputError(path, f"dtype {t.dtype} has no safetensors equivalent", key=name)
        out[name] = (dtype, tuple(t.shape))
    return out


def __getattr__(name: str) -> object:
    """``resolve_cached_repo`` stays importable from here without importing :mod:`adapterdoc.bases` at start."""
    if name == "resolve_cached_repo":
        from adapterdoc.bases import resolve_cached_repo

        return resolve_cached_repo
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADAPTER_BIN",
    "ADAPTER_WEIGHTS",
    "TORCH_TO_ST",
    "Checkpoint",
    "describe_bin",
    "load_bin",
    "open_checkpoint",
    "resolve_cached_repo",
    "safe_shard_name",
]
