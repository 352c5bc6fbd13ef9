"""Remote header-only inspect against a real HTTP server on 127.0.0.1 that speaks the Hub's resolve endpoint."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save

REV = "main"


class _Hub:
    """Files keyed by (repo, filename); counts the body bytes it serves."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes] = {}
        self.served = 0
        self.lock = threading.Lock()
        self.requests: list[str] = []
        self.auth: list[str | None] = []


def _handler(hub: _Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            hub.requests.append(self.path)
            hub.auth.append(self.headers.get("Authorization"))
            m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", self.path)
            data = hub.files.get((m[1], m[3])) if m else None
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            rng = self.headers.get("Range")
            if rng:
                a, b = rng.removeprefix("bytes=").split("-")
                start, end = int(a), min(int(b), len(data) - 1)
                body = data[start : end + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            else:
                body = data
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # counted before the body goes out: the test reads the count as soon as the client has the bytes
            with hub.lock:
                hub.served += len(body)
            self.wfile.write(body)

    return Handler


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Hub]:
    state = _Hub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_TOKEN", "hf_test_token_not_real")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield state
    server.shutdown()
    server.server_close()


def _big_file(n_tensors: int, numel: int) -> bytes:
    rng = np.random.default_rng(0)
    return save(
        {f"model.layers.{i}.w": rng.standard_normal(numel).astype(np.float32) for i in range(n_tensors)},
        metadata={"format": "pt"},
    )


def test_remote_single_file_reads_only_the_header(hub: _Hub, cli: Any) -> None:
    data = _big_file(4, 1_000_000)  # 16 MB of data
    hub.files[("org/model", "model.safetensors")] = data
    res = cli("inspect", "hf://org/model", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["tensors"] == 4 and out["files"][0]["bytes"] == len(data)
    header_len = 8 + int.from_bytes(data[:8], "little")
    assert hub.served <= header_len + 4  # exactly the header, plus the 1-byte probes for adapter/index files
    assert out["bytes_received"] == hub.served
    # HF_TOKEN is sent on every file request. (huggingface_hub 2.4 itself may also fetch /api/agent-harnesses once a
    # day, without auth, to build its user agent: that request is the library's, not ours.)
    ours = [a for r, a in zip(hub.requests, hub.auth) if "/resolve/" in r]
    assert ours and set(ours) == {"Bearer hf_test_token_not_real"}


def test_remote_sharded_and_adapter(hub: _Hub, cli: Any) -> None:
    s1, s2 = (
        _big_file(2, 300_000),
        save({"lm_head.weight": np.zeros((1000, 64), np.float32)}, {"format": "pt"}),
    )
    hub.files[("org/sharded", "model-00001-of-00002.safetensors")] = s1
    hub.files[("org/sharded", "model-00002-of-00002.safetensors")] = s2
    wm = {
        "model.layers.0.w": "model-00001-of-00002.safetensors",
        "model.layers.1.w": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors",
    }
    hub.files[("org/sharded", "model.safetensors.index.json")] = json.dumps({"weight_map": wm}).encode()
    res = cli("inspect", "hf://org/sharded@main", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["kind"] == "sharded" and out["tensors"] == 3 and len(out["files"]) == 2
    assert hub.served < (len(s1) + len(s2)) / 10

    key = "base_model.model.model.layers.0.self_attn.q_proj"
    adapter = save(
        {
            f"{key}.lora_A.weight": np.ones((4, 64), np.float32),
            f"{key}.lora_B.weight": np.ones((64, 4), np.float32),
        },
        {"format": "pt"},
    )
    hub.files[("org/adapter", "adapter_model.safetensors")] = adapter
    hub.files[("org/adapter", "adapter_config.json")] = json.dumps(
        {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    ).encode()
    res = cli("inspect", "hf://org/adapter", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["lora"]["modules"] == 1


def test_remote_errors_are_one_line(hub: _Hub, cli: Any) -> None:
    res = cli("inspect", "hf://org/missing")
    assert res.exit_code == 3
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("adapterdoc: error: hf://org/missing")
    hub.files[("org/bad", "model.safetensors")] = b"\xff" * 7
    res = cli("inspect", "hf://org/bad/model.safetensors")
    assert res.exit_code == 3 and "header too small" in res.stderr
