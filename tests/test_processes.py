"""Real cyclone-server processes: several on one database, migrations racing, SIGTERM."""

from __future__ import annotations

import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import grpc
import psycopg
import pytest

from cyclone.v1 import (
    worker_service_pb2,
    worker_service_pb2_grpc,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)
from service.migrate import available, migrate
from tests.helpers import claim, complete, eventually, node, seconds, submit, workflow
from tests.test_metrics import scrape
from tests.test_metrics import value as metric


def stubs(address):
    channel = grpc.insecure_channel(address)
    return SimpleNamespace(
        channel=channel,
        workflows=workflow_service_pb2_grpc.WorkflowServiceStub(channel),
        workers=worker_service_pb2_grpc.WorkerServiceStub(channel),
    )


@pytest.mark.slow
def test_two_servers_on_one_database_share_the_work_and_sweep_without_fighting(
    server_process, database_url
):
    servers = [stubs(server_process("--sweep-interval", "0.05").address) for _ in range(2)]
    runs = [
        submit(servers[i % 2], workflow("w", node("a"), node("b", deps=["a"]))) for i in range(60)
    ]
    # Half the first steps are claimed and abandoned: their leases expire and both
    # servers' sweeps race to reclaim them.
    abandoned = claim(servers[0], n=30, lease=1)
    assert len(abandoned) == 30
    seen: dict[tuple[str, str], list[int]] = {}
    lock = threading.Lock()

    def work(server):
        idle = 0
        while idle < 3:
            steps = claim(server, n=5, wait=2)
            idle = 0 if steps else idle + 1
            for step in steps:
                with lock:
                    seen.setdefault((step.run_id, step.node), []).append(step.attempt)
                complete(server, step)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, servers * 2))
    with psycopg.connect(database_url) as conn:
        done = conn.execute(
            "SELECT count(*) FROM cyclone.runs WHERE status = 'completed'"
        ).fetchone()[0]
        reclaims = conn.execute(
            "SELECT count(*) FROM cyclone.step_errors WHERE kind = 'lease_expired'"
        ).fetchone()[0]
    assert done == len(runs)
    assert reclaims == 30  # each abandoned lease reclaimed exactly once
    # Every step ran once, except the abandoned ones which ran again as attempt 2.
    abandoned_keys = {(s.run_id, s.node) for s in abandoned}
    for key, attempts in seen.items():
        assert attempts == ([2] if key in abandoned_keys else [1]), key
    assert len(seen) == 120


def test_servers_starting_at_once_apply_migrations_once(postgres_url):
    name = "cyclone_test_migrate_race"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = postgres_url.replace("/postgres?", f"/{name}?", 1)
    assert name in url
    try:
        with ThreadPoolExecutor(4) as pool:
            applied = list(pool.map(lambda _: migrate(url), range(4)))
        versions = [m.version for m in available()]
        assert sorted(v for a in applied for v in a) == versions
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT version FROM cyclone.schema_migrations ORDER BY 1")
            assert [r[0] for r in rows] == versions
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_sigterm_releases_a_waiting_claim_and_exits_cleanly(server_process):
    # The claim's periodic re-check is out of reach, so only the wake-up of a stopping
    # server answers it before the grace period (10 s) cancels it.
    server = server_process("--claim-recheck", "3600")
    s = stubs(server.address)
    waiting = s.workers.Claim.future(
        worker_service_pb2.ClaimRequest(
            worker_id="w", actions=[{"name": "never"}], wait=seconds(50)
        )
    )
    eventually(
        lambda: metric(scrape(server.metrics_port), "cyclone_claims_waiting") == 1,
        "the claim to wait on the server",
    )
    server.process.send_signal(signal.SIGTERM)
    reply = waiting.result(timeout=20)
    assert list(reply.steps) == []
    assert server.process.wait(20) == 0


def test_help_lists_the_settings():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "service", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--listen", "--database-url", "--lease", "CYCLONE_DATABASE_URL"):
        assert flag in out


def test_submit_through_a_process_is_visible_to_another(server_process):
    a, b = (stubs(server_process().address) for _ in range(2))
    run_id = submit(a, workflow("w", node("a")))
    reply = b.workflows.GetRun(workflow_service_pb2.GetRunRequest(run_id=run_id))
    assert reply.run.run_id == run_id


def test_migration_versions_are_unique_and_contiguous():
    versions = [m.version for m in available()]
    assert versions == list(range(1, len(versions) + 1))
