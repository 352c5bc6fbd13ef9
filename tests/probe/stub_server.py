"""A loopback HTTP server from the standard library that answers what a broken or hostile server would (each test
gives the replies): for the probe's client and readers, never an engine."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any

Reply = Callable[[http.server.BaseHTTPRequestHandler], None]


def send(status: int, body: object, headers: dict[str, str] | None = None) -> Reply:
    """A reply of ``status`` with ``body`` (bytes as they are, else JSON, NaN written as NaN)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def reply(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return reply


class Stub(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    get: Reply
    post: Reply
    seen: list[str]
    """``METHOD path Authorization`` of each request."""
    bodies: list[object]
    """The JSON body of each POST."""
    stop: threading.Event


class Handler(http.server.BaseHTTPRequestHandler):
    server: Stub

    def do_GET(self) -> None:
        self.server.seen.append(f"GET {self.path} {self.headers.get('Authorization')}")
        self.server.get(self)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.bodies.append(json.loads(data))
        self.server.seen.append(f"POST {self.path} {self.headers.get('Authorization')}")
        self.server.post(self)

    def log_message(self, *args: Any) -> None:
        pass


def start(get: Reply, post: Reply) -> Stub:
    """A stub on a free loopback port answering GET and POST with these replies, serving in a daemon thread."""
    server = Stub(("127.0.0.1", 0), Handler)
    server.get, server.post, server.seen, server.bodies = get, post, [], []
    server.stop = threading.Event()
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def close(server: Stub) -> None:
    server.stop.set()
    server.shutdown()
    server.server_close()


def echo_key(status: int) -> Reply:
    """A reply of ``status`` whose body and a header echo the request's Authorization header (a server that shows
    what it was sent)."""

    def reply(h: http.server.BaseHTTPRequestHandler) -> None:
        sent = str(h.headers.get("Authorization"))
        send(status, {"error": {"message": f"bad request; headers: Authorization: {sent}"}})(h)

    return reply


def url(server: Stub) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"
