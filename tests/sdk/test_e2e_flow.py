"""Flow control through the SDK's Worker and Client (docs/flow-control.md)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from pyclient import Concurrency, InvalidArgument, RateLimit, Workflow
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running


def test_a_workers_rate_limit_holds_its_claims_to_the_window(cyclone_server, client, make_worker):
    wf = Workflow("rated")
    wf.node("call", "call_api")
    for _ in range(5):
        client.submit(wf)
    worker = make_worker(concurrency=4)
    done = threading.Semaphore(0)

    @worker.action("call_api", rate_limit=RateLimit(2, 3600))
    def call_api(ctx):
        done.release()

    with running(worker):
        for _ in range(2):
            assert done.acquire(timeout=PATIENCE)
        # The next claims find the window full: nothing more runs within the hour.
        eventually(
            lambda: cyclone_server.sql("SELECT counts FROM cyclone.action_rates") == [([2],)],
            "the two claims recorded in the action's window",
        )
        assert not done.acquire(timeout=1.0)
    assert cyclone_server.sql(
        "SELECT status, count(*) FROM cyclone.steps GROUP BY 1 ORDER BY 1"
    ) == [("available", 3), ("completed", 2)]


def test_priorities_order_what_the_worker_runs(cyclone_server, client, make_worker):
    ran: list[int] = []
    for p in (1, 3, 2):
        wf = Workflow("prio")
        wf.node("n", "record", input={"p": p})
        client.submit(wf, priority=p)
    worker = make_worker(concurrency=1)

    @worker.action("record")
    def record(ctx, data):
        ran.append(data["p"])

    with running(worker):
        eventually(lambda: len(ran) == 3, "the three steps to run")
    assert ran == [3, 2, 1]


def test_get_run_shows_the_flow_settings(client):
    wf = Workflow("shown")
    wf.node("n", concurrency=("c:{run.id}", 2), priority=9)
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(days=30)
    run = client.get_run(client.submit(wf, {"id": "x"}, start_at=when, priority=4))
    step = run.step("n")
    assert (run.priority, run.start_at, step.priority, step.concurrency_key) == (
        4,
        when,
        9,
        "c:x",
    )


def test_sdk_values_are_checked_before_the_call(client):
    wf = Workflow("bad")
    wf.node("n", concurrency=Concurrency("{nope}", 2))
    with pytest.raises(InvalidArgument, match="not a field"):
        client.submit(wf)
    plain = Workflow("plain")
    plain.node("n")
    with pytest.raises(InvalidArgument, match="priority"):
        client.submit(plain, priority=10**7)
    with pytest.raises(InvalidArgument, match="time zone"):
        client.submit(plain, start_at=datetime(2030, 1, 1))
    with pytest.raises(InvalidArgument, match="rate limit count"):
        RateLimit(0, 1)
