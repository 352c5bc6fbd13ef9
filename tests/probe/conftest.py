"""Fixtures shared by the probe tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.probe.stub_server import Reply, Stub, close, start


@pytest.fixture
def stubs() -> Iterator[Callable[[Reply, Reply], Stub]]:
    """``stubs(get, post)``: a loopback stub server (:func:`tests.probe.stub_server.start`); every one started in
    the test is closed after it."""
    servers: list[Stub] = []

    def run(get: Reply, post: Reply) -> Stub:
        servers.append(start(get, post))
        return servers[-1]

    yield run
    for server in servers:
        close(server)
