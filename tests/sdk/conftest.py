"""Helpers for the SDK's end-to-end tests. The server itself is the ``cyclone_server``
fixture of tests/conftest.py: a real server on a fresh database, with ``address``,
``database_url``, ``advance_clock(seconds)`` and ``sweep()``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pyclient import Client, Worker
from tests.helpers import PATIENCE


@contextlib.contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Run ``worker`` in a thread for the block; stop it and check it ended cleanly."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(handle_signals=False)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(PATIENCE)
        assert not thread.is_alive(), "the worker did not stop"
        assert not failure, f"the worker crashed: {failure[0]!r}"


@pytest.fixture
def client(cyclone_server) -> Iterator[Client]:
    with Client(cyclone_server.address, actor="sdk-tests") as c:
        yield c


@pytest.fixture
def make_worker(cyclone_server) -> Callable[..., Worker]:
    """A Worker on the test server with test-friendly defaults (short lease and polls)."""

    def make(**kwargs: Any) -> Worker:
        settings = {
            "concurrency": 2,
            "lease": 3.0,
            "claim_wait": 2.0,
            "shutdown_grace": 5.0,
            "reconnect_max_delay": 0.5,
            **kwargs,
        }
        return Worker(cyclone_server.address, **settings)

    return make
