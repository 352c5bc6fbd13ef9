"""The API key never shows and the time limit holds, whatever the server does: a server that echoes the
Authorization header (in an error body, a redirect's Location, its model list, its status line), and one that drips
its headers. Loopback stubs from the standard library; the thing under test is adapterdoc's client."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapterdoc.probe.canaries import Canaries, Canary, Position, save, scale_grid
from tests.probe.stub_server import Reply, Stub, echo_key, send, url

KEY = "sekret-123/abc"
SCALES = scale_grid(4)
CANARY = Canary("w1 w2", [5, 6], [Position(1, 6, [-2.0 - s for s in SCALES])])
VLLM_MODELS = {"data": [{"id": "a", "owned_by": "vllm"}]}


@pytest.fixture
def stub(stubs: Callable[[Reply, Reply], Stub]) -> Callable[..., Stub]:
    def run(get: Reply = send(200, VLLM_MODELS), post: Reply = send(200, {})) -> Stub:
        return stubs(get, post)

    return run


@pytest.fixture
def canaries(tmp_path: Path) -> Path:
    path = tmp_path / "c.json"
    save(Canaries("a", "b", 4, "float32", list(SCALES), [CANARY]), path)
    return path


def _probe(cli: Any, server: Stub, canaries: Path, *more: str) -> Any:
    args = ["probe", url(server), "--adapter", "a", "--canaries", canaries, "--api-key-env", "K", *more]
    return cli(*args, env={"K": KEY})


@pytest.mark.parametrize("status", [400, 404, 500])
def test_an_error_body_that_echoes_the_key_is_shown_without_it(
    cli: Any, stub: Any, canaries: Path, status: int
) -> None:
    r = _probe(cli, stub(post=echo_key(status)), canaries)
    assert r.exit_code == 3 and f"HTTP {status}" in r.stderr and "Authorization: Bearer ***" in r.stderr, (
        r.stderr
    )
    assert "sekret" not in r.output


def test_a_redirect_that_echoes_the_key_is_shown_without_it(cli: Any, stub: Any, canaries: Path) -> None:
    def redirect(h: http.server.BaseHTTPRequestHandler) -> None:
        key = str(h.headers.get("Authorization")).split()[-1]
        send(302, b"", {"Location": f"http://elsewhere/?token={key}"})(h)

    r = _probe(cli, stub(get=redirect), canaries)
    assert r.exit_code == 3 and "redirects to http://elsewhere/?token=***" in r.stderr, r.stderr
    assert "sekret" not in r.output


def test_a_model_list_that_echoes_the_key_is_reported_without_it(cli: Any, stub: Any, canaries: Path) -> None:
    """llama.cpp's AD921 lists /v1/models' ids: a server that puts the key there has it replaced in the report."""

    def models(h: http.server.BaseHTTPRequestHandler) -> None:
        sent = str(h.headers.get("Authorization"))
        send(200, {"data": [{"id": sent, "owned_by": "me"}]})(h)

    echo = {"choices": [{"logprobs": {"token_logprobs": [None, -2.0 - 1.0]}}]}
    for fmt in ("text", "json"):
        r = _probe(cli, stub(get=models, post=send(200, echo)), canaries, "--format", fmt)
        assert r.exit_code == 0 and "AD921" in r.stdout and "***" in r.stdout, r.output
        assert "sekret" not in r.output


def _raw_server(answer: Callable[[socket.socket], None]) -> tuple[str, threading.Event]:
    """A loopback socket server that hands each connection to ``answer`` (for what http.server cannot send)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        with listener:
            while not stop.is_set():
                listener.settimeout(0.1)
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                threading.Thread(target=_handle, args=(conn, answer), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", stop


def _handle(conn: socket.socket, answer: Callable[[socket.socket], None]) -> None:
    with conn:
        try:
            conn.recv(65536)
            answer(conn)
        except OSError:
            pass


def test_a_status_line_that_echoes_the_key_is_shown_without_it(cli: Any, canaries: Path) -> None:
    """A reply that is no HTTP: http.client's error quotes the server's first line, key and all."""

    def no_http(conn: socket.socket) -> None:
        conn.sendall(b"SEKRET " + KEY.encode() + b"\r\n\r\n")

    where, stop = _raw_server(no_http)
    try:
        r = cli(
            "probe", where, "--adapter", "a", "--canaries", canaries, "--api-key-env", "K", env={"K": KEY}
        )
    finally:
        stop.set()
    assert r.exit_code == 3 and "no HTTP answer" in r.stderr, r.stderr
    assert KEY not in r.output and "***" in r.stderr


def test_a_server_that_drips_its_headers_times_out(cli: Any, canaries: Path) -> None:
    """One header byte every 0.3 s keeps each socket read within the time limit: the request as a whole has it."""

    def drip(conn: socket.socket) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
            if stop.wait(0.3):
                return
            conn.sendall(bytes([byte]))

    where, stop = _raw_server(drip)
    started = time.monotonic()
    try:
        r = cli("probe", where, "--adapter", "a", "--canaries", canaries, "--timeout", "1")
    finally:
        stop.set()
    assert r.exit_code == 3 and "no whole answer within 1 s (--timeout)" in r.stderr, r.stderr
    assert time.monotonic() - started < 5
