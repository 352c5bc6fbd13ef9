"""Header-only access to adapters and checkpoints on the Hugging Face Hub (``hf://org/name[@rev][/file]``).

Only headers travel: 8 bytes + the JSON header per safetensors file, fetched with HTTP range requests through
huggingface_hub's session, URL builder and auth headers (``HF_TOKEN`` and ``HF_ENDPOINT`` honoured), then
validated by our own header parser. Small JSON files (adapter_config.json, the shard index) are read whole.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

from adapterdoc.adapter import ADAPTER_CONFIG, AdapterConfig
from adapterdoc.bases import REPO_PATTERN
from adapterdoc.errors import (
    AdapterdocError,
    ConfigError,
    HeaderError,
    InputNotFoundError,
    UnsupportedInputError,
)
from adapterdoc.opened import ADAPTER_WEIGHTS, Checkpoint, safe_shard_name
from adapterdoc.st.header import MAX_HEADER_SIZE, Header, parse_header

if TYPE_CHECKING:
    import httpx2  # huggingface_hub's HTTP client (``get_session()``)

SCHEME = "hf://"
_SPEC = re.compile(rf"^hf://(?P<repo>{REPO_PATTERN})(?:@(?P<rev>[\w.-]+))?(?:/(?P<file>.+))?$")


def is_remote(spec: str) -> bool:
    return spec.startswith(SCHEME)


class _Repo:
    def __init__(self, spec: str) -> None:
        m = _SPEC.match(spec)
        if not m:
            raise UnsupportedInputError(spec, "expected hf://org/name[@revision][/filename]")
        self.spec = spec
        self.repo: str = m["repo"]
        self.revision: str | None = m["rev"]
        self.file: str | None = m["file"]
        self.bytes_received = 0

    def label(self, filename: str) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"hf://{self.repo}{rev}/{filename}"

    def _get(self, filename: str, byte_range: str | None = None) -> httpx2.Response:
        from huggingface_hub import constants, get_session, hf_hub_url
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # exported lazily

        endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
        url = hf_hub_url(self.repo, filename, revision=self.revision, endpoint=endpoint)
        headers = build_hf_headers(token=os.environ.get("HF_TOKEN") or None)
        if byte_range:
            headers["Range"] = f"bytes={byte_range}"
        try:
            response = get_session().get(url, headers=headers, timeout=30, follow_redirects=True)
        except Exception as e:  # network failures come in many types; all mean "cannot reach it"
            raise UnsupportedInputError(
                self.label(filename), f"cannot reach the Hub: {type(e).__name__}: {e}"
            ) from e
        status = response.status_code
        if status == 404:
            raise InputNotFoundError(self.label(filename), "not found on the Hub (404)")
        if status in (401, 403):
            raise UnsupportedInputError(self.label(filename), f"access denied ({status}); set HF_TOKEN")
        if status >= 400:
            raise UnsupportedInputError(self.label(filename), f"the Hub answered HTTP {status}")
        self.bytes_received += len(response.content)
        return response

    def exists(self, filename: str) -> bool:
        try:
            self._get(filename, "0-0")
        except InputNotFoundError:
            return False
        return True

    def json(self, filename: str) -> bytes:
        return bytes(self._get(filename).content)

    def header(self, filename: str) -> Header:
        """The validated header of ``filename``: two range requests, the 8-byte length and then exactly the JSON."""
        label = self.label(filename)
        first = self._get(filename, "0-7")
        data = bytes(first.content)
        size = _total_size(first, len(data), label)
        if len(data) < 8:
            raise HeaderError(label, f"header too small: file is {size} bytes")
        n = int.from_bytes(data[:8], "little")
        if n > MAX_HEADER_SIZE:
            raise HeaderError(label, f"header too large: {n} bytes announced, the limit is {MAX_HEADER_SIZE}")
        if n + 8 > size:
            raise HeaderError(
                label, f"invalid header length: {n} bytes announced but the file has {size - 8}"
            )
        raw = data[8 : 8 + n]  # a server that ignored the range sent everything: use it
        if len(raw) < n:
            raw += bytes(self._get(filename, f"{8 + len(raw)}-{8 + n - 1}").content)
        if len(raw) != n:
            raise HeaderError(label, f"the server sent {len(raw)} header bytes, {n} announced")
        return parse_header(label, raw, size)


def _total_size(response: httpx2.Response, got: int, label: str) -> int:
    cr = response.headers.get("content-range")
    if cr and "/" in cr and cr.rsplit("/", 1)[1].strip().isdigit():
        return int(cr.rsplit("/", 1)[1])
    if response.status_code == 200:  # the server ignored the range and sent everything
        return got
    raise UnsupportedInputError(label, "the server did not report the file size (no Content-Range)")


def open_remote(spec: str) -> Checkpoint:
    """Open ``hf://...`` header-only as a :class:`~adapterdoc.opened.Checkpoint`."""
    repo = _Repo(spec)
    ckpt: Checkpoint
    if repo.file:
        if not repo.file.endswith(".safetensors"):
            raise UnsupportedInputError(spec, "remote inspect reads .safetensors files (or a whole repo)")
        h = repo.header(repo.file)
        ckpt = Checkpoint(spec=spec, kind="file", root=spec, headers=[h], weights_path=h.path)
    elif repo.exists(ADAPTER_CONFIG):
        config = AdapterConfig.parse(repo.json(ADAPTER_CONFIG), repo.label(ADAPTER_CONFIG))
        h = repo.header(ADAPTER_WEIGHTS)
        ckpt = Checkpoint(
            spec=spec, kind="adapter", root=spec, headers=[h], weights_path=h.path, adapter_config=config
        )
    elif repo.exists("model.safetensors.index.json"):
        index_label = repo.label("model.safetensors.index.json")
        try:
            weight_map = json.loads(repo.json("model.safetensors.index.json"))["weight_map"]
            assert isinstance(weight_map, dict)
        except (ValueError, KeyError, TypeError, AssertionError) as e:
            raise ConfigError(index_label, "invalid shard index: no `weight_map` object") from e
        ckpt = Checkpoint(spec=spec, kind="sharded", root=spec, index_path=index_label)
        shards: dict[str, list[str]] = {}
        for tensor, shard in weight_map.items():
            safe_shard_name(index_label, str(shard))
            shards.setdefault(str(shard), []).append(tensor)
        for shard, names in shards.items():
            h = repo.header(shard)
            ckpt.headers.append(h)
            for name in names:
                if name not in h.tensors:
                    raise HeaderError(
                        h.path, "the index names this tensor but the shard does not hold it", key=name
                    )
            ckpt.extra_in_shards.extend((h.path, t) for t in h.tensors if t not in set(names))
    elif repo.exists("model.safetensors"):
        h = repo.header("model.safetensors")
        ckpt = Checkpoint(spec=spec, kind="file", root=spec, headers=[h], weights_path=h.path)
    else:
        raise InputNotFoundError(
            spec, "no adapter_config.json, model.safetensors.index.json or model.safetensors"
        )
    for h in ckpt.headers:
        for name, info in h.tensors.items():
            ckpt.tensors[name] = info
            ckpt.tensor_file[name] = h.path
    ckpt.repo_id = repo.repo
    ckpt.bytes_received = repo.bytes_received
    return ckpt


__all__ = ["AdapterdocError", "is_remote", "open_remote"]
