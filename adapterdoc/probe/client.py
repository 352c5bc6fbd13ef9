"""A tiny HTTP client for one OpenAI-compatible server: only the URL the user gives, a bounded number of requests,
timeouts, and an API key read from an environment variable that is never printed (standard library only)."""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from adapterdoc.errors import AdapterdocError

MAX_REQUESTS = 12
"""The most requests one probe makes (``/v1/models`` and one per canary)."""
TIMEOUT = 60.0
"""Seconds one request may take."""


class ProbeError(AdapterdocError):
    """The server cannot be probed (exit 3): it does not answer, refuses the request, or returns no logprobs."""


@dataclass(frozen=True)
class Response:
    """One answer: the HTTP status and the JSON body (None when the body is not JSON)."""

    status: int
    body: object
    text: str


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
        if self.api_key_env and not os.environ.get(self.api_key_env):
            raise ProbeError(
                self.api_key_env, f"the environment variable {self.api_key_env} is not set or empty"
            )

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
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as r:
                return _response(r.status, r.read())
        except urllib.error.HTTPError as e:
            return _response(e.code, e.read())
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ProbeError(self.url, f"cannot connect ({reason})") from e
        except (ValueError, http.client.HTTPException) as e:  # InvalidURL; a reply that is no HTTP
            raise ProbeError(self.url, f"no HTTP answer ({type(e).__name__}: {e})") from e


def _response(status: int, raw: bytes) -> Response:
    text = raw.decode("utf-8", errors="replace")
    try:
        body: object = json.loads(text)
    except ValueError:
        body = None
    return Response(status, body, text)
