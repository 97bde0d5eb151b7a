"""A claim made for a worker while a sweep reclaims that worker's lease: the sweep frees
the step and marks the worker unhealthy in one commit, so a claim for the lost worker
sees both or neither, and never takes back the step just taken from it.

The race is made certain with a table lock: a transaction locks cyclone.steps and sweeps;
the claim for the lost worker checks the mark (not yet committed), then waits to pick
ready steps; the sweep commits, and the pick runs after it."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from tests.helpers import claim, node, submit, workflow

CLAIM = (
    "SELECT run_id::text, node, attempt FROM cyclone.step_claim("
    "'lost-worker', ARRAY['held'], '{}', 10, interval '2 s')"
)


def _waiting_on_steps(server: Any) -> bool:
    """Whether a backend waits for a lock on cyclone.steps."""
    return bool(
        server.sql(
            "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
            " WHERE NOT l.granted AND c.relname = 'steps'"
        )
    )


def test_a_claim_racing_the_sweep_of_its_worker_takes_nothing_it_freed(cyclone_server: Any) -> None:
    server = cyclone_server
    run_id = submit(server, workflow("held", node("held", action="held")))
    [step] = claim(server, "held", worker="lost-worker", lease=2)
    server.advance_clock(10)  # past the lease: the worker is lost

    claimed: list[list[tuple]] = []
    with psycopg.connect(server.database_url) as sweeper:
        sweeper.execute("LOCK TABLE cyclone.steps IN EXCLUSIVE MODE")
        # The sweep's statement starts first: the step is available from before the
        # claim's time, as it is when a sweep commits just before a claim's pick.
        assert sweeper.execute("SELECT cyclone.sweep(100)").fetchone() == (1,)

        def claim_for_lost_worker() -> None:
            with psycopg.connect(server.database_url, autocommit=True) as conn:
                claimed.append(conn.execute(CLAIM).fetchall())

        thread = threading.Thread(target=claim_for_lost_worker)
        thread.start()
        deadline = time.monotonic() + 30
        while not _waiting_on_steps(server):
            assert time.monotonic() < deadline, "the claim never reached the pick"
            time.sleep(0.01)
        # The claim has read the mark (not yet committed) and waits to pick: commit.
        sweeper.commit()
        thread.join(30)

    assert claimed == [[]]
    assert server.sql(
        "SELECT status, attempt, worker_id FROM cyclone.steps WHERE run_id = %s", run_id
    ) == [("available", 1, "lost-worker")]
    assert server.sql("SELECT worker_id FROM cyclone.worker_health") == [("lost-worker",)]
    # Another worker takes the step freed by the sweep.
    [again] = claim(server, "held", worker="healthy")
    assert (again.run_id, again.attempt) == (step.run_id, 2)


def test_the_claims_of_a_sharded_database_hand_a_marked_worker_nothing(cyclone_server: Any) -> None:
    """On Citus a claim reads candidates first (no locks), then takes each shard's with
    step_claim_shard (or step_claim_run, for a worker with unsafe actions, and under
    flow control): both read the worker's mark themselves, in the snapshot of their
    pick, so that a sweep committed after the server's own check is still seen."""
    server = cyclone_server
    run_id = submit(server, workflow("held", node("held", action="held")))
    [step] = claim(server, "held", worker="lost-worker", lease=2)
    server.advance_clock(10)  # past the lease: the worker is lost
    # The sweep frees the step and marks its worker, after the server's check.
    assert server.sql("SELECT cyclone.sweep(100)") == [(1,)]

    shard = server.sql(
        "SELECT node FROM cyclone.step_claim_shard(%s, ARRAY[%s]::uuid[], ARRAY['held'],"
        " 'lost-worker', '{}', interval '2 s')",
        run_id,
        run_id,
    )
    by_run = server.sql(
        "SELECT node FROM cyclone.step_claim_run(%s, ARRAY['held'], 'lost-worker',"
        " ARRAY['held'], interval '2 s')",
        run_id,
    )
    assert (shard, by_run) == ([], [])
    assert server.sql("SELECT status, attempt FROM cyclone.steps WHERE run_id = %s", run_id) == [
        ("available", 1)
    ]
    [again] = claim(server, "held", worker="healthy")
    assert (again.run_id, again.attempt) == (step.run_id, 2)
