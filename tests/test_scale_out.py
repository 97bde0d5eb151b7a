"""Scale-out: three cyclone-server processes on one database, a worker on each. No step
runs twice where it should not, and the three sweeps never reclaim a lease twice."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from pyclient import Client, Worker, Workflow
from tests.helpers import PATIENCE, claim, eventually
from tests.sdk.conftest import running
from tests.test_metrics import scrape, value
from tests.test_processes import stubs

pytestmark = pytest.mark.slow

RUNS = 30
ABANDONED = 10


def test_three_servers_run_each_step_once_and_reclaim_each_lost_lease_once(
    server_process, database_url
):
    with ThreadPoolExecutor(3) as pool:  # started at once, as a deploy would
        servers = list(pool.map(lambda _: server_process("--sweep-interval", "0.05"), range(3)))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE handler_calls (run_id uuid, node text, attempt int, via int)")

    wf = Workflow("fan")
    root = wf.node("root", action="root")
    wf.node("left", action="leaf", depends_on=root)
    wf.node("right", action="leaf", depends_on=root)
    clients = [Client(s.address) for s in servers]
    runs = [clients[i % 3].submit(wf, {"n": i}) for i in range(RUNS)]

    # A worker claims ten root steps through the first server and vanishes. Once the
    # clock has passed their leases, the three servers' sweeps race to reclaim them.
    lost = claim(stubs(servers[0].address), "root", n=ABANDONED, lease=30, worker="gone")
    assert len(lost) == ABANDONED
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE cyclone.clock SET offset_by = offset_by + interval '60 seconds'")

        def reclaimed() -> int:
            return conn.execute(
                "SELECT count(*) FROM cyclone.step_errors WHERE kind = 'lease_expired'"
            ).fetchone()[0]

        eventually(lambda: reclaimed() >= ABANDONED, "the sweeps to reclaim the lost leases")

    # A worker on each server; every handler call is written down.
    def worker_for(index: int, address: str) -> Worker:
        worker = Worker(address, concurrency=2, lease=30, claim_wait=1, shutdown_grace=5)

        def record(ctx) -> dict:
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO handler_calls VALUES (%s, %s, %s, %s)",
                    (ctx.run_id, ctx.node, ctx.attempt, index),
                )
            time.sleep(0.005)  # a handler takes a moment, so that no worker takes it all
            return {"node": ctx.node, "via": index}

        worker.action("root")(record)
        worker.action("leaf")(record)
        return worker

    workers = [worker_for(i, s.address) for i, s in enumerate(servers)]
    with running(workers[0]), running(workers[1]), running(workers[2]):
        done = [clients[i % 3].wait(run_id, timeout=PATIENCE) for i, run_id in enumerate(runs)]
    assert [r.status for r in done] == ["completed"] * RUNS

    with psycopg.connect(database_url) as conn:
        calls = conn.execute(
            "SELECT run_id::text, node, array_agg(attempt ORDER BY attempt), "
            "array_agg(DISTINCT via) FROM handler_calls GROUP BY run_id, node"
        ).fetchall()
        lease_expired = conn.execute(
            "SELECT run_id::text, node, count(*) FROM cyclone.step_errors "
            "WHERE kind = 'lease_expired' GROUP BY run_id, node"
        ).fetchall()
    # Every step's handler ran exactly once: the lost roots as attempt 2, the rest as 1.
    lost_keys = {(s.run_id, s.node) for s in lost}
    attempts = {(run_id, node): a for run_id, node, a, _ in calls}
    assert len(attempts) == RUNS * 3
    assert {k for k, a in attempts.items() if a == [2]} == lost_keys
    assert {k for k, a in attempts.items() if a == [1]} == set(attempts) - lost_keys
    # Each lost lease was reclaimed once, by one of the three sweeps.
    assert sorted((r, n) for r, n, _ in lease_expired) == sorted(lost_keys)
    assert {count for _, _, count in lease_expired} == {1}
    # The work was spread over the three servers, as their metrics show.
    scrapes = [scrape(s.metrics_port) for s in servers]
    claimed = [
        sum(value(m, "cyclone_steps_claimed_total", action=a) for a in ("root", "leaf"))
        for m in scrapes
    ]
    assert sum(claimed) == RUNS * 3 + ABANDONED
    assert all(n > 0 for n in claimed), claimed
    expiries = [value(m, "cyclone_lease_expiries_total", action="root") for m in scrapes]
    assert sum(expiries) == ABANDONED
    assert {via for _, _, _, v in calls for via in v} == {0, 1, 2}
    for client in clients:
        client.close()
