"""What an opened input is (:class:`Checkpoint`) and the shard-name guard, shared by the local opener
(:mod:`adapterdoc.checkpoint`) and the ``hf://`` reader (:mod:`adapterdoc.remote`), below both.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from adapterdoc.adapter import AdapterConfig
from adapterdoc.errors import ConfigError
from adapterdoc.st.header import Header, TensorInfo

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_BIN = "adapter_model.bin"
MLX_WEIGHTS = "adapters.safetensors"
"""An mlx-lm adapter folder's tensors (``adapterdoc.formats.mlx.folder.WEIGHTS``)."""
GGUF_MAGIC = b"GGUF"
"""The first four bytes of a GGUF file (``adapterdoc.formats.GGUF_MAGIC``)."""


@dataclass
class Checkpoint:
    """An opened input: its weight files' headers and, for adapters, the adapter config."""

    spec: str
    """What the user passed."""
    kind: str
    """``file``, ``adapter`` or ``sharded``."""
    root: str
    """The directory (adapter / sharded / cache snapshot) or the file itself."""
    headers: list[Header] = field(default_factory=list)
    """One per safetensors file, in shard order (empty for a .bin adapter)."""
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    tensor_file: dict[str, str] = field(default_factory=dict)
    """Tensor name → the file holding it."""
    adapter_config: AdapterConfig | None = None
    weights_path: str | None = None
    """The adapter's weights file (adapter kind) or the single file (file kind)."""
    weights_format: str = "safetensors"
    index_path: str | None = None
    repo_id: str | None = None
    extra_in_shards: list[tuple[str, str]] = field(default_factory=list)
    """(file, tensor) pairs present in a shard but not named by the index."""
    original_names: dict[str, str] = field(default_factory=dict)
    """Tensor name as read → name in the file, when a reader renamed keys (merge reads them as PEFT does)."""
    bytes_received: int = 0
    """For ``hf://`` inputs: bytes fetched over HTTP (headers only)."""

    @property
    def is_adapter(self) -> bool:
        return self.adapter_config is not None or self.kind == "adapter"

    @property
    def metadata(self) -> dict[str, str] | None:
        return self.headers[0].metadata if len(self.headers) == 1 else None


def safe_shard_name(index_path: str, name: str) -> str:
    """Refuse absolute paths and ``..`` in a shard file name; return the file's path inside the folder."""
    parts = re.split(r"[/\\]", name)
    if (
        not name
        or os.path.isabs(name)
        or name.startswith(("/", "\\"))
        or ".." in parts
        or re.match(r"^[A-Za-z]:", name)
    ):
        raise ConfigError(index_path, f"shard file name {name!r} points outside the checkpoint folder")
    return os.path.join(os.path.dirname(index_path), *[p for p in parts if p not in ("", ".")])


__all__ = ["ADAPTER_BIN", "ADAPTER_WEIGHTS", "Checkpoint", "safe_shard_name"]
