"""The completion function as any language's worker calls it, its grants, and fencing.

A worker logs in as its own role, a member of cyclone_worker, and completes a step by
calling cyclone.step_complete at the end of its own transaction, after its business
writes. A superseded attempt is refused on both paths (that call, and Complete over
gRPC) and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest
from psycopg import errors as pg_errors

from tests.helpers import (
    claim,
    complete,
    fail,
    get_run,
    node,
    rpc_error,
    run_status,
    statuses,
    submit,
    workflow,
)
from tests.roles import worker_login

LEDGER = """
CREATE TABLE ledger (
    run_id  uuid    NOT NULL,
    node    text    NOT NULL,
    amount  integer NOT NULL,
    attempt integer NOT NULL
)
"""
COMPLETE = "SELECT * FROM cyclone.step_complete(%s::uuid, %s, %s::uuid, %s::jsonb)"
INSERT = "INSERT INTO ledger (run_id, node, amount, attempt) VALUES (%s, %s, %s, %s)"


@pytest.fixture
def worker_db(cyclone_server, postgres_url) -> Iterator[Any]:
    """connect() opens a connection as a fresh login role that is a member of
    cyclone_worker and may write the business table `ledger`, and nothing else."""
    cyclone_server.sql(LEDGER)
    with worker_login(cyclone_server.database_url, postgres_url, writes=("ledger",)) as login:
        yield lambda: psycopg.connect(login)


def step_row(server, run_id: str, node_name: str) -> tuple:
    [row] = server.sql(
        "SELECT status, attempt, lease_token::text, output, finished_at, effect_uncertain"
        " FROM cyclone.steps WHERE run_id = %s AND node = %s",
        run_id,
        node_name,
    )
    return row


def snapshot(server, run_id: str) -> dict[str, list[tuple]]:
    """Everything Cyclone stores about a run, to show that a refusal changed nothing."""
    return {
        "runs": server.sql("SELECT * FROM cyclone.runs WHERE run_id = %s", run_id),
        "steps": server.sql("SELECT * FROM cyclone.steps WHERE run_id = %s ORDER BY node", run_id),
        "errors": server.sql(
            "SELECT * FROM cyclone.step_errors WHERE run_id = %s ORDER BY at, node", run_id
        ),
    }


def superseded(server, run_id: str) -> tuple[Any, Any]:
    """Attempt 1 of node "a" loses its lease and attempt 2 takes the node."""
    [first] = claim(server, lease=5)
    server.advance_clock(6)
    assert server.sweep() == 1
    [second] = claim(server, lease=5)
    assert (first.run_id, second.run_id, first.attempt, second.attempt) == (run_id, run_id, 1, 2)
    return first, second


# The function's contract --------------------------------------------------------------


def test_a_worker_role_completes_a_step_and_its_business_write_in_one_transaction(
    cyclone_server, worker_db
):
    run_id = submit(cyclone_server, workflow("w", node("a"), node("b", "next", deps=["a"])))
    [a] = claim(cyclone_server)
    with worker_db() as conn, psycopg.connect(cyclone_server.database_url) as listener:
        listener.execute("LISTEN cyclone_ready")
        listener.commit()
        conn.execute(INSERT, (run_id, "a", 42, a.attempt))
        reply = conn.execute(COMPLETE, (run_id, "a", a.lease_token, '{"charged": 42}')).fetchone()
        assert reply == ("completed", "running", False, None)
        # Nothing shows before the commit: not the step, not the business write.
        assert step_row(cyclone_server, run_id, "a")[0] == "running"
        assert cyclone_server.sql("SELECT count(*) FROM ledger") == [(0,)]
        conn.commit()
        # The dependent was released, and the claims waiting for it were woken.
        woken = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert woken == ["next"]
    status, attempt, _, output, finished_at, _ = step_row(cyclone_server, run_id, "a")
    assert (status, attempt, output) == ("completed", 1, {"charged": 42})
    assert finished_at is not None
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "completed", "b": "available"}
    assert cyclone_server.sql("SELECT run_id::text, node, amount FROM ledger") == [
        (run_id, "a", 42)
    ]

    # The last step completes the run, in the worker's transaction too.
    [b] = claim(cyclone_server, "next")
    assert b.upstream_outputs["a"].struct_value["charged"] == 42
    with worker_db() as conn:
        conn.execute(INSERT, (run_id, "b", 1, b.attempt))
        reply = conn.execute(COMPLETE, (run_id, "b", b.lease_token, "null")).fetchone()
    assert reply == ("completed", "completed", False, None)
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "completed" and run.HasField("finished_at")


def test_a_repeated_completion_in_a_workers_transaction_raises_and_commits_no_second_effect(
    cyclone_server, worker_db
):
    # A careless caller: writes its effect, calls the function, commits without reading
    # the answer. The repeat must abort its transaction, so the effect exists once.
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [a] = claim(cyclone_server)

    def careless(output: str) -> None:
        with worker_db() as conn:
            conn.execute(INSERT, (run_id, "a", 100, a.attempt))
            conn.execute(COMPLETE, (run_id, "a", a.lease_token, output))
            conn.commit()

    careless('"first"')
    with pytest.raises(psycopg.Error) as repeat:
        careless('"second"')
    assert repeat.value.sqlstate == "CY005"
    assert "already completed" in str(repeat.value)
    assert cyclone_server.sql("SELECT count(*) FROM ledger")[0][0] == 1
    assert step_row(cyclone_server, run_id, "a")[3] == "first"


def test_complete_over_grpc_after_a_completion_in_sql_answers_the_recorded_duplicate(
    cyclone_server, worker_db
):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [a] = claim(cyclone_server)
    with worker_db() as conn:
        conn.execute(COMPLETE, (run_id, "a", a.lease_token, '"first"'))
    again = complete(cyclone_server, a, {"x": 1})
    assert again.duplicate
    assert step_row(cyclone_server, run_id, "a")[3] == "first"


def test_the_worker_role_cannot_touch_cyclone_tables_or_other_transitions(
    cyclone_server, worker_db
):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [a] = claim(cyclone_server)
    forbidden = [
        ("UPDATE cyclone.steps SET status = 'completed' WHERE run_id = %s", (run_id,)),
        ("DELETE FROM cyclone.steps WHERE run_id = %s", (run_id,)),
        ("UPDATE cyclone.runs SET status = 'completed' WHERE run_id = %s", (run_id,)),
        ("SELECT lease_token FROM cyclone.steps WHERE run_id = %s", (run_id,)),
        ("UPDATE cyclone.clock SET offset_by = '1 day'", ()),
        ("SELECT cyclone.sweep(10)", ()),
        (
            "SELECT cyclone.step_fail(%s::uuid, 'a', %s::uuid, 'E', 'm', '', false, NULL)",
            (run_id, a.lease_token),
        ),
        ("SELECT cyclone.run_cancel(%s::uuid, 'worker', 'no')", (run_id,)),
        ("SELECT cyclone._settle(%s::uuid, ARRAY['a'], '{}', 1)", (run_id,)),
    ]
    with worker_db() as conn:
        conn.autocommit = True
        for query, params in forbidden:
            with pytest.raises(pg_errors.InsufficientPrivilege):
                conn.execute(query, params)
    assert step_row(cyclone_server, run_id, "a")[:2] == ("running", 1)
    complete(cyclone_server, a)  # the server, as the schema owner, is unaffected


def test_a_lease_that_ran_out_while_the_transaction_was_open_is_refused(cyclone_server, worker_db):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [a] = claim(cyclone_server, lease=5)
    cyclone_server.advance_clock(4)  # one second of the lease is left
    with worker_db() as conn:
        conn.execute(INSERT, (run_id, "a", 1, 1))  # the transaction begins here
        # The handler is slow: the lease runs out before it completes. The lease is
        # checked at the call, not at the start of the transaction (now()), so real
        # time must pass inside the open transaction: this sleep is the scenario.
        time.sleep(1.2)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(COMPLETE, (run_id, "a", a.lease_token, "1"))
    assert refused.value.sqlstate == "CY001"
    assert step_row(cyclone_server, run_id, "a")[:2] == ("running", 1)
    assert cyclone_server.sql("SELECT count(*) FROM ledger") == [(0,)]


# Fencing: a superseded attempt changes nothing --------------------------------------------


def test_the_function_refuses_a_superseded_attempt_and_its_business_write_rolls_back(
    cyclone_server, worker_db
):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    first, second = superseded(cyclone_server, run_id)
    before = snapshot(cyclone_server, run_id)
    with worker_db() as conn:
        conn.execute(INSERT, (run_id, "a", 10, first.attempt))
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(COMPLETE, (run_id, "a", first.lease_token, '"late"'))
        conn.rollback()
    assert refused.value.sqlstate == "CY001"
    assert refused.value.diag.message_detail == "current_attempt=2"
    assert "now at attempt 2" in refused.value.diag.message_primary
    assert snapshot(cyclone_server, run_id) == before
    assert cyclone_server.sql("SELECT count(*) FROM ledger") == [(0,)]

    # The holder completes; the stale attempt is still refused afterwards, not taken
    # for a duplicate of the completion.
    with worker_db() as conn:
        conn.execute(INSERT, (run_id, "a", 10, second.attempt))
        conn.execute(COMPLETE, (run_id, "a", second.lease_token, '"on time"'))
    after = snapshot(cyclone_server, run_id)
    with worker_db() as conn, pytest.raises(psycopg.Error) as refused:
        conn.execute(COMPLETE, (run_id, "a", first.lease_token, '"late"'))
    assert refused.value.sqlstate == "CY001"
    assert refused.value.diag.message_detail == "current_attempt=2"
    assert snapshot(cyclone_server, run_id) == after
    assert step_row(cyclone_server, run_id, "a")[:4] == (
        "completed",
        2,
        second.lease_token,
        "on time",
    )
    assert cyclone_server.sql("SELECT attempt FROM ledger") == [(2,)]


def test_complete_from_a_superseded_attempt_is_aborted_naming_the_current_attempt(
    cyclone_server,
):
    run_id = submit(cyclone_server, workflow("w", node("a"), node("b", deps=["a"])))
    first, second = superseded(cyclone_server, run_id)
    before = snapshot(cyclone_server, run_id)
    for late in (
        lambda: complete(cyclone_server, first, {"late": True}),
        lambda: fail(cyclone_server, first, "late failure"),
        lambda: fail(cyclone_server, first, "late failure", non_retryable=True),
    ):
        error = rpc_error(late)
        assert error.code() == grpc.StatusCode.ABORTED
        assert dict(error.trailing_metadata())["cyclone-current-attempt"] == "2"
        assert "now at attempt 2" in error.details()
    assert snapshot(cyclone_server, run_id) == before

    complete(cyclone_server, second, {"on_time": True})
    after = snapshot(cyclone_server, run_id)
    error = rpc_error(complete, cyclone_server, first, {"late": True})
    assert error.code() == grpc.StatusCode.ABORTED
    assert dict(error.trailing_metadata())["cyclone-current-attempt"] == "2"
    assert snapshot(cyclone_server, run_id) == after
    assert complete(cyclone_server, second, {"on_time": True}).duplicate
    assert step_row(cyclone_server, run_id, "a")[:4] == (
        "completed",
        2,
        second.lease_token,
        {"on_time": True},
    )
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "completed", "b": "available"}
