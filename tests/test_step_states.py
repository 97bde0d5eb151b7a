"""What GetRun and Explain say of a node that waits with no worker holding it: a durable
sleep, an event, its run's start time, a retry's backoff (Step.waiting, waiting_reason,
waiting_until; Explain's WAITING and NOT_BEFORE), and whether its action is unsafe."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cyclone.v1 import types_pb2, workflow_service_pb2
from tests.helpers import claim, fail, get_run, node, submit, workflow
from tests.test_waits import wait_request


def _step(server: Any, run_id: str, name: str = "a") -> Any:
    return next(s for s in get_run(server, run_id).steps if s.node == name)


def _explain(server: Any, run_id: str, name: str = "a") -> Any:
    return server.workflows.Explain(workflow_service_pb2.ExplainRequest(run_id=run_id, node=name))


def _db_now(server: Any) -> dt.datetime:
    [(now,)] = server.sql("SELECT cyclone.now()")
    return now


def test_a_node_waiting_for_an_event_says_so_with_its_deadline(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("x", node("a")))
    [step] = claim(cyclone_server)
    cyclone_server.workers.Wait(wait_request(step, "e", event="approved", timeout=600))
    got = _step(cyclone_server, run_id)
    assert got.waiting == "event" and got.waiting_for == "event approved"
    assert "event approved" in got.waiting_reason and "SendEvent" in got.waiting_reason
    until = got.waiting_until.ToDatetime(tzinfo=dt.UTC)
    assert dt.timedelta(seconds=590) < until - _db_now(cyclone_server) <= dt.timedelta(seconds=600)
    # It waits: no resume yet (resumes counts this wait's suspension).
    why = _explain(cyclone_server, run_id)
    assert why.reason == workflow_service_pb2.EXPLAIN_REASON_WAITING
    assert "resumed 0 time(s)" in why.message


def test_a_durable_sleep_says_until_when_and_the_wait_ends_with_the_resume(
    cyclone_server: Any,
) -> None:
    run_id = submit(cyclone_server, workflow("x", node("a")))
    [step] = claim(cyclone_server)
    wake = _db_now(cyclone_server) + dt.timedelta(seconds=30)
    cyclone_server.workers.Wait(wait_request(step, wake_at=wake))
    got = _step(cyclone_server, run_id)
    assert (got.waiting, got.waiting_reason) == ("sleep", "a durable sleep")
    assert got.waiting_until.ToDatetime(tzinfo=dt.UTC) == wake
    cyclone_server.advance_clock(31)
    assert _step(cyclone_server, run_id).waiting == ""  # its time came: ready
    [resumed] = claim(cyclone_server)
    got = _step(cyclone_server, run_id)
    assert (got.waiting, got.waiting_reason, got.HasField("waiting_until")) == ("", "", False)
    assert resumed.attempt == 2 and got.resumes == 1


def test_a_run_that_starts_later_waits_for_its_start_time(cyclone_server: Any) -> None:
    start = _db_now(cyclone_server) + dt.timedelta(hours=1)
    request = workflow_service_pb2.SubmitRequest(workflow=workflow("later", node("a")))
    request.start_at.FromDatetime(start)
    run_id = cyclone_server.workflows.Submit(request).run_id
    got = _step(cyclone_server, run_id)
    assert (got.waiting, got.waiting_reason) == ("start", "its run's start time")
    assert got.waiting_until.ToDatetime(tzinfo=dt.UTC) == start
    why = _explain(cyclone_server, run_id)
    assert why.reason == workflow_service_pb2.EXPLAIN_REASON_NOT_BEFORE
    assert why.message.startswith("its run starts at")


def test_a_retry_backoff_is_a_wait_with_its_end(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("x", node("a")))
    [step] = claim(cyclone_server)
    fail(cyclone_server, step, retry_after=120)
    got = _step(cyclone_server, run_id)
    assert got.waiting == "backoff"
    assert got.waiting_reason == "the retry backoff after attempt 1 failed"
    assert got.waiting_until == got.available_at
    assert _explain(cyclone_server, run_id).reason == (
        workflow_service_pb2.EXPLAIN_REASON_BACKING_OFF
    )


def test_a_ready_or_running_node_does_not_wait_and_unsafe_is_shown(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("x", node("a"), node("b", action="pay")))
    assert _step(cyclone_server, run_id).waiting == ""
    claim(cyclone_server, "work", "pay", unsafe=("pay",))
    assert _step(cyclone_server, run_id).waiting == ""
    assert [(s.node, s.unsafe) for s in get_run(cyclone_server, run_id).steps] == [
        ("a", False),
        ("b", True),
    ]


def test_a_cancelled_runs_wait_reads_cancelled_in_get_run(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("gate", node("a"), node("b")))
    steps = {s.node: s for s in claim(cyclone_server)}
    cyclone_server.workers.Wait(wait_request(steps["a"], "event:go", event="go"))
    cyclone_server.workers.Wait(wait_request(steps["b"], "sleep", wake_at=_db_now(cyclone_server)))
    running = {s.node: s.journal[0].status for s in get_run(cyclone_server, run_id).steps}
    assert running == {
        "a": types_pb2.STEP_CALL_STATUS_WAITING,
        "b": types_pb2.STEP_CALL_STATUS_SUCCEEDED,  # a sleep already over
    }
    cyclone_server.workflows.CancelRun(workflow_service_pb2.CancelRunRequest(run_id=run_id))
    cancelled = {s.node: s.journal[0].status for s in get_run(cyclone_server, run_id).steps}
    assert cancelled == {
        "a": types_pb2.STEP_CALL_STATUS_CANCELLED,
        "b": types_pb2.STEP_CALL_STATUS_SUCCEEDED,
    }
