"""Several servers on several nodes: a server may connect to a worker node of the cluster
instead of the coordinator (every node has Citus's metadata) and serve the same runs;
wake-ups reach servers on every node (docs/scaling.md)."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from service.migrate import available, migrate
from tests.conftest import TEST_SETTINGS, RunningServer
from tests.helpers import claim, complete, get_run, node, run_status, submit, workflow


def _worker_node_url(coordinator_url: str) -> str:
    """The URL of worker node 1 (cluster.sh: the coordinator's port plus one)."""
    port = int(re.search(r":(\d+)/", coordinator_url).group(1))  # type: ignore[union-attr]
    return coordinator_url.replace(f":{port}/", f":{port + 1}/")


@pytest.fixture
def worker_node_server(database_url: str) -> Any:
    server = RunningServer(_worker_node_url(database_url), replace(TEST_SETTINGS)).start()
    yield server
    server.stop()


def test_a_server_on_a_worker_node_serves_the_runs_of_every_shard(
    cyclone_server: Any, worker_node_server: Any
) -> None:
    """Runs submitted through either server are claimed and completed through the other,
    whichever node holds their shard."""
    here = [submit(worker_node_server, workflow("w", node("a"))) for _ in range(6)]
    there = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(6)]
    steps = claim(worker_node_server, n=20)
    assert sorted(s.run_id for s in steps) == sorted(here + there)
    for step in steps:
        complete(worker_node_server, step, step.run_id)
    for run_id in here + there:
        assert run_status(get_run(cyclone_server, run_id)) == "completed"
    [(shards,)] = cyclone_server.sql(
        "SELECT count(DISTINCT get_shard_id_for_distribution_column('cyclone.runs', run_id))"
        " FROM cyclone.runs"
    )
    assert shards > 1


@pytest.mark.parametrize("waits_on", ["worker node", "coordinator"])
def test_a_waiting_claim_is_woken_by_a_submit_through_a_server_on_another_node(
    cyclone_server: Any, worker_node_server: Any, waits_on: str
) -> None:
    """Servers listen and notify on the coordinator whichever node they use, so a claim
    waiting on one is woken by a step made ready through the other (the tests' servers
    never look again by themselves: --claim-recheck is an hour)."""
    waiting, submitting = (
        (worker_node_server, cyclone_server)
        if waits_on == "worker node"
        else (cyclone_server, worker_node_server)
    )
    # Both servers' LISTEN connections are up before the wait begins.
    for server in (waiting, submitting):
        deadline = time.monotonic() + 10
        while not server.server.dispatcher.connected.is_set():
            assert time.monotonic() < deadline, "LISTEN never connected"
            time.sleep(0.01)
    got: list[Any] = []
    claimer = threading.Thread(target=lambda: got.extend(claim(waiting, wait=20)))
    claimer.start()
    time.sleep(0.5)  # the claim is waiting
    run_id = submit(submitting, workflow("w", node("a")))
    started = time.monotonic()
    claimer.join(25)
    assert [s.run_id for s in got] == [run_id]
    assert time.monotonic() - started < 15, "woken, not timed out"


def test_migrate_on_a_worker_node_applies_nothing_and_checks_the_schema(
    database_url: str,
) -> None:
    """A worker node takes no DDL: its server applies nothing and starts only when the
    coordinator has applied every migration it ships."""
    worker_url = _worker_node_url(database_url)
    assert migrate(worker_url) == []
    last = available()[-1]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM cyclone.schema_migrations WHERE version = %s", (last.version,))
    try:
        with pytest.raises(RuntimeError, match=f"worker node.*first is {last.version:04d}"):
            migrate(worker_url)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO cyclone.schema_migrations (version, name) VALUES (%s, %s)",
                (last.version, last.name),
            )
    assert migrate(worker_url) == []
