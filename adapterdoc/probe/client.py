"""A tiny HTTP client for one OpenAI-compatible server: only the URL the user gives (redirects are refused, never
followed), a bounded number of requests, a time limit and a size limit on each answer, and an API key read from an
environment variable that is never printed: wherever a server echoes it (an error body, a header, a status line), its
value is replaced by ``***`` before anything the server wrote is read (standard library only)."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import IO

from adapterdoc.errors import AdapterdocError

MAX_REQUESTS = 12
"""The most requests one probe makes (``/v1/models`` and one per canary)."""
TIMEOUT = 60.0
"""Seconds one request may take, by default (``--timeout``)."""
MAX_TIMEOUT = 3600.0
"""The largest ``--timeout``."""
MAX_BYTES = 8 * 2**20
"""The largest answer read (a canary's answer is a few kB)."""
CHUNK = 2**16


class ProbeError(AdapterdocError):
    """The server cannot be probed (exit 3): it does not answer, refuses the request, or returns no logprobs."""


@dataclass(frozen=True)
class Response:
    """One answer: the HTTP status and the JSON body (None when the body is not JSON)."""

    status: int
    body: object
    text: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Never follow a redirect, nor read where it points: the 3xx answer comes back as an ``HTTPError``."""

    def http_error_302(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
    ) -> None:
        return None

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


@dataclass
class Client:
    """Requests to ``url`` (``http://host:port``, a trailing ``/v1`` is dropped) and nowhere else."""

    url: str
    api_key_env: str | None = None
    timeout: float = TIMEOUT
    max_requests: int = MAX_REQUESTS
    sent: list[str] = field(default_factory=list)
    """``METHOD path`` of each request made."""

    def __post_init__(self) -> None:
        url = self.url.rstrip("/")
        self.url = url[: -len("/v1")] if url.endswith("/v1") else url
        if not self.url.startswith(("http://", "https://")):
            raise ProbeError(self.url, "the URL must start with http:// or https://")
        if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in self.url):
            raise ProbeError(self.url, "the URL holds a space or a control character")
        try:
            parts = urllib.parse.urlsplit(self.url)
            host, _ = parts.hostname, parts.port
        except ValueError as e:  # a port that is no number below 65536, a malformed IPv6 literal
            raise ProbeError(self.url, f"not a URL ({e})") from None
        if not host:
            raise ProbeError(self.url, "the URL names no host")
        if parts.username is not None or parts.password is not None:
            shown = f"{parts.scheme}://{host}"  # never the password
            raise ProbeError(shown, "the URL holds a user or password: give the API key with --api-key-env")
        if parts.query or parts.fragment or "?" in self.url or "#" in self.url:
            raise ProbeError(self.url, "the URL holds a query or a fragment: give the server's root (or /v1)")
        if not 0 < self.timeout <= MAX_TIMEOUT:  # also NaN
            raise ProbeError(
                "--timeout", f"{self.timeout:g} is not a number of seconds in (0, {MAX_TIMEOUT:g}]"
            )
        if self.api_key_env and not os.environ.get(self.api_key_env):
            raise ProbeError(
                self.api_key_env, f"the environment variable {self.api_key_env} is not set or empty"
            )
        key = os.environ.get(self.api_key_env or "", "")
        if not all(
            32 < ord(c) < 127 for c in key
        ):  # the key is never printed, not even in http.client's error
            raise ProbeError(
                self.api_key_env,
                f"the API key in {self.api_key_env} holds a space, a newline or a character beyond ASCII, "
                "which an HTTP header cannot carry",
            )

    def redact(self, text: str) -> str:
        """``text`` with the API key's value (as sent, and as JSON writes it) replaced by ``***``."""
        key = os.environ.get(self.api_key_env or "", "")
        if not key:
            return text
        for form in dict.fromkeys((key, json.dumps(key)[1:-1], key.replace("/", "\\/"))):
            text = text.replace(form, "***")
        return text

    def get(self, path: str) -> Response:
        return self._send("GET", path, None)

    def post(self, path: str, body: dict[str, object]) -> Response:
        return self._send("POST", path, body)

    def _send(self, method: str, path: str, body: dict[str, object] | None) -> Response:
        if len(self.sent) >= self.max_requests:
            raise ProbeError(self.url, f"the probe's request budget ({self.max_requests}) is spent")
        self.sent.append(f"{method} {path}")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key_env:
            headers["Authorization"] = "Bearer " + os.environ[self.api_key_env]
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        where = self.url + path
        outcome: list[Response | BaseException] = []
        worker = threading.Thread(target=self._attempt, args=(request, where, outcome), daemon=True)
        worker.start()
        worker.join(self.timeout)
        if not outcome:  # a server that drips its headers: each socket read is quick, the whole is not
            raise ProbeError(where, self._late())
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _attempt(
        self, request: urllib.request.Request, where: str, outcome: list[Response | BaseException]
    ) -> None:
        """One request in a daemon thread that the caller waits for at most ``timeout`` (one deadline for the
        connection, the headers and the body; a thread left behind ends with the process): its response or its
        error appended to ``outcome``."""
        try:
            outcome.append(self._request(request, where, time.monotonic() + self.timeout))
        except BaseException as e:  # handed to the caller's thread, which raises it
            outcome.append(e)

    def _request(self, request: urllib.request.Request, where: str, deadline: float) -> Response:
        try:
            return self._answer(request, where, deadline)
        except TimeoutError:
            raise ProbeError(where, self._late()) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise ProbeError(where, self._late()) from None
            raise ProbeError(self.url, f"cannot connect ({self.redact(str(e.reason))})") from None
        except OSError as e:
            raise ProbeError(where, f"the connection failed ({self.redact(str(e))})") from None
        except (ValueError, http.client.HTTPException) as e:  # InvalidURL; a reply that is no HTTP
            raise ProbeError(
                self.url, f"no HTTP answer ({type(e).__name__}: {self.redact(str(e))})"
            ) from None

    def _answer(self, request: urllib.request.Request, where: str, deadline: float) -> Response:
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            answer: IO[bytes] = opener.open(request, timeout=self.timeout)
            status = int(answer.status)  # type: ignore[attr-defined]
        except urllib.error.HTTPError as e:
            answer, status = e, e.code
        with answer:
            if 300 <= status < 400:
                location = answer.headers.get("Location", "nowhere")  # type: ignore[attr-defined]
                to = printable(self.redact(str(location)))
                raise ProbeError(
                    where,
                    f"HTTP {status}: the server redirects to {to}; the probe contacts only the URL given "
                    "(give the URL it redirects to)",
                )
            if status in (401, 403):
                raise ProbeError(where, f"HTTP {status}: {self._refused()}")
            return _response(
                status, self.redact(self._read(answer, where, deadline).decode("utf-8", "replace"))
            )

    def _read(self, answer: IO[bytes], where: str, deadline: float) -> bytes:
        """The body, at most :data:`MAX_BYTES`, read before ``deadline`` (a server that drips its answer)."""
        chunks, size = [], 0
        while chunk := answer.read1(CHUNK):  # type: ignore[attr-defined]
            size += len(chunk)
            if size > MAX_BYTES:
                raise ProbeError(
                    where, f"the answer is larger than {MAX_BYTES // 2**20} MiB (a canary's is kB)"
                )
            if time.monotonic() > deadline:
                raise ProbeError(where, self._late())
            chunks.append(chunk)
        return b"".join(chunks)

    def _late(self) -> str:
        return f"no whole answer within {self.timeout:g} s (--timeout)"

    def _refused(self) -> str:
        if not self.api_key_env:
            return "the server wants an API key (give --api-key-env VAR, the variable that holds it)"
        return f"the server refuses the API key in {self.api_key_env} (--api-key-env)"


def printable(text: str, limit: int = 200) -> str:
    """What a server wrote, for one line of stderr: whitespace runs as one space, other control characters (a
    terminal's escape sequences) as ``?``, at most ``limit`` characters."""
    one_line = " ".join(text.split())[:limit]
    return "".join(c if c.isprintable() else "?" for c in one_line)


def _response(status: int, text: str) -> Response:
    try:
        body: object = json.loads(text)
    except (ValueError, RecursionError):  # not JSON; JSON nested too deep to parse
        body = None
    return Response(status, body, text)
