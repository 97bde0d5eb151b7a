"""The seeds' crash matrix, one test per row, with real worker processes and real kills.

Each test runs tests/crash_worker.py (the SDK's Worker with a database URL, logged in
as a cyclone_worker role) and stops it at one exact point of its handler, where the
test SIGKILLs it (or SIGSTOPs it, for the slow worker). The handler writes an audit
row outside the completion transaction and a ledger row on it; neither table has a
unique key, so exactly-once ledger rows come from the completion transaction alone.
Time moves by the fake clock (advance_clock) and the sweep runs when the test says.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client, RetryPolicy, Workflow
from tests.helpers import PATIENCE, eventually
from tests.roles import worker_login

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TABLES = """
CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY, run_id uuid NOT NULL,
                     node text NOT NULL, attempt integer NOT NULL);
CREATE TABLE audit  (id bigint GENERATED ALWAYS AS IDENTITY, run_id uuid NOT NULL,
                     node text NOT NULL, attempt integer NOT NULL);
"""
#: The crash worker's default lease (CYCLONE_TEST_LEASE); the clock jumps past it.
LEASE = 5


class WorkerProcess:
    """tests/crash_worker.py in a process of its own, its output followed by threads."""

    def __init__(self, address: str, database_url: str, **env: str) -> None:
        self.markers: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.crash_worker", address, database_url],
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.readers = [
            threading.Thread(target=self._follow, args=(stream, sink), daemon=True)
            for stream, sink in (
                (self.process.stdout, self.markers.put),
                (self.process.stderr, None),
            )
        ]
        for reader in self.readers:
            reader.start()

    def _follow(self, stream: Any, sink: Any) -> None:
        with stream:
            for line in stream:
                self.log.append(line)
                if sink is not None:
                    sink(line.strip())

    def paused(self, point: str) -> tuple[str, int]:
        """Wait until the worker stops at ``point``; returns (run_id, attempt)."""
        try:
            marker = self.markers.get(timeout=PATIENCE)
        except queue.Empty:
            pytest.fail(f"the worker never paused {point}:\n{''.join(self.log)}")
        word, where, run_id, attempt = marker.split()
        assert (word, where) == ("paused", point), marker
        return run_id, int(attempt)

    def resume(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(PATIENCE) == -signal.SIGKILL

    def said(self, *texts: str) -> bool:
        return any(text in line for line in self.log for text in texts)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(PATIENCE)
        for reader in self.readers:
            reader.join(PATIENCE)
        assert self.process.stdin is not None
        self.process.stdin.close()


@pytest.fixture
def world(cyclone_server, postgres_url) -> Iterator[Any]:
    """The server, a client, the business tables, and start(**env) for worker processes."""
    cyclone_server.sql(TABLES)
    started: list[WorkerProcess] = []
    with (
        worker_login(
            cyclone_server.database_url, postgres_url, writes=("ledger", "audit")
        ) as login,
        Client(cyclone_server.address) as client,
    ):

        def start(**env: str) -> WorkerProcess:
            worker = WorkerProcess(cyclone_server.address, login, **env)
            started.append(worker)
            return worker

        class World:
            server = cyclone_server

            def crash_at(self, point: str) -> str:
                """Submit a run; its first attempt is SIGKILLed at ``point``."""
                run_id = self.submit()
                first = start(CYCLONE_TEST_PAUSE_AT=point)
                assert first.paused(point) == (run_id, 1)
                first.kill()
                return run_id

            def submit(self, backoff: float = 0) -> str:
                wf = Workflow("pay")
                wf.node(
                    "charge",
                    retry=RetryPolicy(max_attempts=3, initial_backoff=backoff, max_backoff=backoff),
                )
                return client.submit(wf)

            def step(self, run_id: str) -> tuple[str, int]:
                [row] = cyclone_server.sql(
                    "SELECT status, attempt FROM cyclone.steps WHERE run_id = %s", run_id
                )
                return row

            def run_status(self, run_id: str) -> str:
                return cyclone_server.sql(
                    "SELECT status FROM cyclone.runs WHERE run_id = %s", run_id
                )[0][0]

            def attempts(self, table: str, run_id: str) -> list[int]:
                """The attempts that left a row in ``table`` for the run, in order."""
                rows = cyclone_server.sql(
                    f"SELECT attempt FROM {table} WHERE run_id = %s ORDER BY id", run_id
                )
                return [a for (a,) in rows]

            def errors(self, run_id: str) -> list[tuple[str, int]]:
                return cyclone_server.sql(
                    "SELECT kind, attempt FROM cyclone.step_errors WHERE run_id = %s ORDER BY at",
                    run_id,
                )

            def completed(self, run_id: str) -> None:
                eventually(lambda: self.run_status(run_id) == "completed", f"run {run_id}")

            def expire_leases(self) -> int:
                cyclone_server.advance_clock(LEASE + 1)
                return cyclone_server.sweep()

        yield World(), start
        for worker in started:
            worker.close()


def test_crash_before_the_effect_runs_the_handler_again_and_writes_once(world):
    w, start = world
    run_id = w.crash_at("before_effect")
    assert w.step(run_id) == ("running", 1)  # nobody knows yet
    assert w.attempts("ledger", run_id) == w.attempts("audit", run_id) == []

    assert w.expire_leases() == 1
    assert w.step(run_id) == ("available", 1)
    start()
    w.completed(run_id)
    assert w.step(run_id) == ("completed", 2)
    assert w.errors(run_id) == [("lease_expired", 1)]
    assert w.attempts("ledger", run_id) == [2]
    assert w.attempts("audit", run_id) == [2]


def test_crash_after_the_effect_before_the_commit_rolls_the_ledger_back_and_repeats_the_audit(
    world,
):
    w, start = world
    run_id = w.crash_at("after_effect")
    assert w.step(run_id) == ("running", 1)
    assert w.attempts("ledger", run_id) == []  # died with its uncommitted transaction
    assert w.attempts("audit", run_id) == [1]  # outside it: already there

    assert w.expire_leases() == 1
    start()
    w.completed(run_id)
    assert w.step(run_id) == ("completed", 2)
    assert w.errors(run_id) == [("lease_expired", 1)]
    assert w.attempts("ledger", run_id) == [2]  # exactly once
    assert w.attempts("audit", run_id) == [1, 2]  # at least once: dedupe by (run_id, node)


def test_crash_after_the_commit_leaves_the_step_completed_and_calls_nothing_again(world):
    w, start = world
    run_id = w.crash_at("after_commit")
    assert w.step(run_id) == ("completed", 1)
    assert w.run_status(run_id) == "completed"
    assert w.expire_leases() == 0  # nothing is left to reclaim

    # A new worker runs the next run; the first one is never handed out again.
    start()
    later = w.submit()
    w.completed(later)
    assert w.step(run_id) == ("completed", 1)
    assert w.errors(run_id) == []
    assert w.attempts("ledger", run_id) == w.attempts("audit", run_id) == [1]
    assert w.attempts("ledger", later) == [1]


def test_a_slow_worker_past_its_lease_is_refused_and_its_ledger_write_rolled_back(world):
    w, start = world
    run_id = w.submit()
    # A long lease: no heartbeat is due during the test, so the first attempt learns
    # that it lost the lease from the completion function itself.
    slow = start(CYCLONE_TEST_PAUSE_AT="after_effect", CYCLONE_TEST_LEASE="60")
    assert slow.paused("after_effect") == (run_id, 1)
    slow.process.send_signal(signal.SIGSTOP)  # alive, holding its open transaction
    w.server.advance_clock(61)
    assert w.server.sweep() == 1
    assert w.step(run_id) == ("available", 1)

    start()
    w.completed(run_id)
    assert w.step(run_id) == ("completed", 2)
    assert w.attempts("ledger", run_id) == [2]

    slow.process.send_signal(signal.SIGCONT)
    slow.resume()
    eventually(
        lambda: slow.said("effects rolled back", "outcome not reported: the lease was lost"),
        "the slow worker to learn that its completion was refused",
    )
    assert slow.process.poll() is None  # it lives on, and serves other steps
    assert w.step(run_id) == ("completed", 2)
    assert w.attempts("ledger", run_id) == [2]  # its late write was rolled back
    assert w.attempts("audit", run_id) == [1, 2]
    assert w.errors(run_id) == [("lease_expired", 1)]


def test_a_raising_handler_rolls_back_and_retries_after_a_backoff_in_the_same_worker(world):
    w, start = world
    run_id = w.submit(backoff=60)
    worker = start(CYCLONE_TEST_RAISE="1")
    eventually(lambda: w.errors(run_id), "the first attempt to fail")
    assert w.errors(run_id) == [("handler", 1)]
    assert w.step(run_id) == ("available", 1)
    [(backing_off,)] = w.server.sql(
        "SELECT available_at > cyclone.now() FROM cyclone.steps WHERE run_id = %s", run_id
    )
    assert backing_off
    assert w.attempts("ledger", run_id) == []  # rolled back with the failure
    assert w.attempts("audit", run_id) == [1]

    w.server.advance_clock(61)  # past the backoff
    w.completed(run_id)
    assert worker.process.poll() is None  # the raise did not take the worker down
    assert w.step(run_id) == ("completed", 2)
    [(message,)] = w.server.sql("SELECT message FROM cyclone.step_errors WHERE run_id = %s", run_id)
    assert "timed out after the charge" in message
    assert w.attempts("ledger", run_id) == [2]
    assert w.attempts("audit", run_id) == [1, 2]
