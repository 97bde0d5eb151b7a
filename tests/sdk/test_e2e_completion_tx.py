"""ctx.completion_tx(): a handler's Postgres writes commit with its completion, once."""

from __future__ import annotations

import threading

import pytest

from pyclient import RetryPolicy, Workflow
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running

LEDGER = """
CREATE TABLE ledger (
    run_id  uuid    NOT NULL,
    node    text    NOT NULL,
    amount  integer NOT NULL,
    attempt integer NOT NULL,
    PRIMARY KEY (run_id, node)
)
"""
INSERT = """
INSERT INTO ledger (run_id, node, amount, attempt) VALUES (%s, %s, %s, %s)
ON CONFLICT (run_id, node) DO NOTHING
"""


@pytest.fixture
def ledger(cyclone_server):
    cyclone_server.sql(LEDGER)

    def rows() -> list[tuple]:
        return cyclone_server.sql("SELECT run_id::text, node, amount, attempt FROM ledger")

    return rows


def _charge_workflow() -> Workflow:
    wf = Workflow("order")
    wf.node("charge", retry=RetryPolicy(initial_backoff=0, max_backoff=0), timeout=60)
    return wf


def test_ledger_row_and_completion_commit_together(cyclone_server, client, make_worker, ledger):
    worker = make_worker(database_url=cyclone_server.database_url)

    @worker.action("charge")
    def charge(ctx, order: dict):
        tx = ctx.completion_tx()
        assert tx is ctx.completion_tx()
        tx.execute(INSERT, (ctx.run_id, ctx.node, order["amount"], ctx.attempt))
        return {"charged": order["amount"]}

    with running(worker):
        run = client.wait(client.submit(_charge_workflow(), {"amount": 42}), timeout=PATIENCE)
    assert run.status == "completed"
    assert run.step("charge").output == {"charged": 42}
    assert ledger() == [(run.run_id, "charge", 42, 1)]


def test_a_raising_handler_rolls_its_writes_back_and_the_retry_writes_once(
    cyclone_server, client, make_worker, ledger
):
    worker = make_worker(database_url=cyclone_server.database_url)

    @worker.action("charge")
    def charge(ctx):
        ctx.completion_tx().execute(INSERT, (ctx.run_id, ctx.node, 10, ctx.attempt))
        if ctx.attempt == 1:
            raise TimeoutError("gateway timed out after the write")
        return "ok"

    with running(worker):
        run = client.wait(client.submit(_charge_workflow()), timeout=PATIENCE)
    assert (run.status, run.step("charge").attempt) == ("completed", 2)
    assert run.step("charge").errors[0].type == "TimeoutError"
    assert ledger() == [(run.run_id, "charge", 10, 2)]


def test_a_completion_after_the_lease_was_lost_rolls_back_the_business_write(
    cyclone_server, client, make_worker, ledger, caplog
):
    # A long lease: no heartbeat happens during the test, so the first attempt only
    # learns of its loss from cyclone.step_complete (SQLSTATE CY001) at commit time.
    worker = make_worker(database_url=cyclone_server.database_url, lease=60.0)
    wrote, finish = threading.Event(), threading.Event()

    @worker.action("charge")
    def charge(ctx):
        ctx.completion_tx().execute(INSERT, (ctx.run_id, ctx.node, 7, ctx.attempt))
        if ctx.attempt == 1:
            wrote.set()
            finish.wait(PATIENCE)  # slow: its lease expires meanwhile
        return {"attempt": ctx.attempt}

    with running(worker):
        run_id = client.submit(_charge_workflow())
        assert wrote.wait(PATIENCE)
        cyclone_server.advance_clock(120)
        assert cyclone_server.sweep() == 1
        finish.set()  # the first attempt now tries to commit with a stale token
        run = client.wait(run_id, timeout=PATIENCE)
    step = run.step("charge")
    assert (run.status, step.attempt, step.output) == ("completed", 2, {"attempt": 2})
    assert ledger() == [(run_id, "charge", 7, 2)]
    refused = [r.getMessage() for r in caplog.records if "effects rolled back" in r.getMessage()]
    assert len(refused) == 1 and "attempt=1" in refused[0]


def test_without_database_url_completion_tx_fails_the_step_with_a_clear_message(
    client, make_worker
):
    worker = make_worker()
    worker.register("charge", lambda ctx: ctx.completion_tx())
    wf = Workflow("order")
    wf.node("charge", retry=RetryPolicy(max_attempts=1))
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    assert run.status == "failed"
    assert "database_url" in run.step("charge").errors[0].message


def test_a_pooled_connection_the_database_dropped_is_replaced_before_a_handler_gets_it(
    cyclone_server, client, make_worker, ledger
):
    # A Postgres restart leaves the worker's idle pooled connections dead; here the
    # backend of the one idle connection is terminated, which looks the same to it.
    url = f"{cyclone_server.database_url}&application_name=completion-pool"
    worker = make_worker(database_url=url, concurrency=1)

    @worker.action("charge")
    def charge(ctx):
        ctx.completion_tx().execute(INSERT, (ctx.run_id, ctx.node, 5, ctx.attempt))
        return "ok"

    pooled = "SELECT pid FROM pg_stat_activity WHERE application_name = 'completion-pool'"
    with running(worker):
        before = client.wait(client.submit(_charge_workflow()), timeout=PATIENCE)
        [(pid,)] = cyclone_server.sql(pooled)
        cyclone_server.sql("SELECT pg_terminate_backend(%s)", pid)
        eventually(lambda: cyclone_server.sql(pooled) == [], "the backend to exit")
        after = client.wait(client.submit(_charge_workflow()), timeout=PATIENCE)
    assert (before.status, after.status) == ("completed", "completed")
    assert after.step("charge").attempt == 1  # not a failed attempt on a dead connection
    assert after.step("charge").errors == ()
    assert sorted(ledger()) == sorted(
        [(before.run_id, "charge", 5, 1), (after.run_id, "charge", 5, 1)]
    )
