"""Run deadlines through the raw API: Submit's deadline validated and stored, a
workflow's default deadline (AdminService), and the cancel at the deadline: once, with
the reason in the audit, the running step told through its heartbeat, the run's
children cancelled with it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from cyclone.v1 import admin_service_pb2, types_pb2, worker_service_pb2, workflow_service_pb2
from tests.helpers import (
    claim,
    complete,
    eventually,
    get_run,
    node,
    rpc_error,
    run_status,
    seconds,
    table_counts,
    workflow,
)
from tests.test_children import start_child

CANCELLED = types_pb2.RUN_STATUS_CANCELLED


def _ts(when: dt.datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(when)
    return ts


def _submit(server: Any, name: str = "x", **fields: Any) -> str:
    request = workflow_service_pb2.SubmitRequest(workflow=workflow(name, node("a")), **fields)
    return server.workflows.Submit(request).run_id


def _in(secs: float) -> timestamp_pb2.Timestamp:
    return _ts(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=secs))


def _fire(server: Any) -> int:
    return int(server.call(server.server.fire_deadlines))


def _heartbeat(server: Any, step: Any) -> worker_service_pb2.HeartbeatResponse:
    return server.workers.Heartbeat(
        worker_service_pb2.HeartbeatRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token
        )
    )


def _cancels(server: Any, run_id: str) -> list[tuple[str, str]]:
    return [(a.actor, a.reason) for a in get_run(server, run_id).audit if a.action == "cancel"]


def _set_default(server: Any, name: str, secs: float, reason: str = "") -> Any:
    return server.admin.SetWorkflowDeadline(
        admin_service_pb2.SetWorkflowDeadlineRequest(
            workflow=name, deadline=seconds(secs), reason=reason
        )
    ).deadline


# The cancel at the deadline ---------------------------------------------------------


def test_a_run_is_cancelled_at_its_deadline_its_step_told_and_its_children_cancelled(
    server_factory: Any,
) -> None:
    server = server_factory(deadline_interval_s=0.2)
    run_id = _submit(server, deadline=_in(2))
    [step] = claim(server)
    child_id = start_child(server, step).child_run_id
    assert not _heartbeat(server, step).cancelled  # before the deadline: going on
    eventually(lambda: run_status(get_run(server, run_id)) == "cancelled", "the deadline's cancel")
    # The running step learns it from its next heartbeat, and its outcome is refused.
    assert _heartbeat(server, step).cancelled
    assert rpc_error(complete, server, step).code() == grpc.StatusCode.ABORTED
    run = get_run(server, run_id)
    [(actor, reason)] = _cancels(server, run_id)
    deadline = run.deadline.ToDatetime(tzinfo=dt.UTC)
    assert actor == "cyclone"
    assert reason == f"deadline exceeded at {deadline:%Y-%m-%d %H:%M:%S} UTC"
    assert run.steps[0].status == types_pb2.STEP_STATUS_CANCELLED
    child = get_run(server, child_id)
    assert child.status == CANCELLED
    [(_, child_reason)] = _cancels(server, child_id)
    assert child_reason == f"run {run_id} was cancelled: {reason}"


def test_a_due_run_is_cancelled_by_one_pass_and_the_next_finds_nothing(
    cyclone_server: Any,
) -> None:
    run_id = _submit(cyclone_server, deadline=_in(60))
    assert _fire(cyclone_server) == 0  # not due yet
    assert run_status(get_run(cyclone_server, run_id)) == "running"
    cyclone_server.advance_clock(61)
    assert _fire(cyclone_server) == 1
    assert _fire(cyclone_server) == 0
    assert run_status(get_run(cyclone_server, run_id)) == "cancelled"
    assert len(_cancels(cyclone_server, run_id)) == 1


def test_a_run_finished_before_its_deadline_is_left_alone(cyclone_server: Any) -> None:
    run_id = _submit(cyclone_server, deadline=_in(60))
    [step] = claim(cyclone_server)
    complete(cyclone_server, step, "done")
    cyclone_server.advance_clock(120)
    assert _fire(cyclone_server) == 0
    run = get_run(cyclone_server, run_id)
    assert run.status == types_pb2.RUN_STATUS_COMPLETED and list(run.audit) == []
    assert run.steps[0].output.string_value == "done"


def test_get_run_and_list_runs_show_the_deadline(cyclone_server: Any) -> None:
    deadline = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    run_id = _submit(cyclone_server, deadline=_ts(deadline))
    plain = _submit(cyclone_server)
    assert get_run(cyclone_server, run_id).deadline.ToDatetime(tzinfo=dt.UTC) == deadline
    assert not get_run(cyclone_server, plain).HasField("deadline")
    listed = cyclone_server.workflows.ListRuns(workflow_service_pb2.ListRunsRequest()).runs
    by_id = {r.run_id: r for r in listed}
    assert by_id[run_id].deadline.ToDatetime(tzinfo=dt.UTC) == deadline
    assert not by_id[plain].HasField("deadline")


# A workflow's default deadline ------------------------------------------------------------


def test_a_workflow_default_applies_without_a_deadline_and_an_explicit_one_overrides_it(
    cyclone_server: Any,
) -> None:
    got = _set_default(cyclone_server, "x", 3600, reason="an hour is plenty")
    assert (got.workflow, got.deadline.seconds, got.reason) == ("x", 3600, "an hour is plenty")
    defaulted = get_run(cyclone_server, _submit(cyclone_server))
    assert defaulted.deadline.ToDatetime() - defaulted.created_at.ToDatetime() == dt.timedelta(
        hours=1
    )
    explicit = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(minutes=5)
    overridden = get_run(cyclone_server, _submit(cyclone_server, deadline=_ts(explicit)))
    assert overridden.deadline.ToDatetime(tzinfo=dt.UTC) == explicit
    other = get_run(cyclone_server, _submit(cyclone_server, "y"))
    assert not other.HasField("deadline")  # another workflow's runs have none


def test_default_deadlines_are_set_replaced_listed_and_cleared(cyclone_server: Any) -> None:
    admin = cyclone_server.admin
    _set_default(cyclone_server, "b", 60)
    _set_default(cyclone_server, "a", 600)
    _set_default(cyclone_server, "b", 120, reason="slower now")
    listed = admin.ListWorkflowDeadlines(admin_service_pb2.ListWorkflowDeadlinesRequest())
    rows = [(d.workflow, d.deadline.seconds, d.reason) for d in listed.deadlines]
    assert rows == [("a", 600, ""), ("b", 120, "slower now")]
    assert all(d.set_by and d.HasField("set_at") for d in listed.deadlines)
    cleared = admin.ClearWorkflowDeadline(
        admin_service_pb2.ClearWorkflowDeadlineRequest(workflow="b")
    ).deadline
    assert (cleared.workflow, cleared.deadline.seconds) == ("b", 120)
    again = rpc_error(
        admin.ClearWorkflowDeadline, admin_service_pb2.ClearWorkflowDeadlineRequest(workflow="b")
    )
    assert again.code() == grpc.StatusCode.NOT_FOUND and "no default deadline" in again.details()
    assert not get_run(cyclone_server, _submit(cyclone_server, "b")).HasField("deadline")


@pytest.mark.parametrize(
    ("name", "secs", "message"),
    [
        ("x", 0, "above zero"),
        ("x", -5, "above zero"),
        ("x", 367 * 86400, "the limit is 366 days"),
        ("", 60, "workflow is required"),
        ("bad name!", 60, "workflow"),
    ],
)
def test_a_bad_default_deadline_is_refused_and_nothing_is_stored(
    cyclone_server: Any, name: str, secs: float, message: str
) -> None:
    err = rpc_error(
        cyclone_server.admin.SetWorkflowDeadline,
        admin_service_pb2.SetWorkflowDeadlineRequest(workflow=name, deadline=seconds(secs)),
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and message in err.details()
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.workflow_deadlines") == [(0,)]


def test_a_default_deadline_is_required_to_set_one(cyclone_server: Any) -> None:
    err = rpc_error(
        cyclone_server.admin.SetWorkflowDeadline,
        admin_service_pb2.SetWorkflowDeadlineRequest(workflow="x"),
    )
    assert (
        err.code() == grpc.StatusCode.INVALID_ARGUMENT and "ClearWorkflowDeadline" in err.details()
    )


# Hostile deadlines ------------------------------------------------------------------------


def _hostile() -> list[tuple[str, dict[str, Any], str]]:
    now = dt.datetime.now(dt.UTC)
    return [
        ("past", {"deadline": _ts(now - dt.timedelta(seconds=1))}, "not in the future"),
        ("now-ish", {"deadline": _ts(now)}, "not in the future"),
        ("beyond 366 days", {"deadline": _in(367 * 86400)}, "the limit is 366 days"),
        (
            "before start_at",
            {"start_at": _in(3600), "deadline": _in(1800)},
            "is not after start_at",
        ),
        (
            "seconds beyond 9999",
            {"deadline": timestamp_pb2.Timestamp(seconds=253402300800 + 10)},
            "must lie between",
        ),
        (
            "negative nanos",
            {"deadline": timestamp_pb2.Timestamp(seconds=int(now.timestamp()) + 60, nanos=-1)},
            "must lie between",
        ),
    ]


@pytest.mark.parametrize("case", range(len(_hostile())), ids=[c[0] for c in _hostile()])
@pytest.mark.parametrize("once", [False, True], ids=["Submit", "SubmitOnce"])
def test_a_hostile_deadline_is_refused_and_nothing_is_written(
    cyclone_server: Any, case: int, once: bool
) -> None:
    _, fields, message = _hostile()[case]
    before = table_counts(cyclone_server)
    wf = workflow("x", node("a"))
    if once:
        call = cyclone_server.workflows.SubmitOnce
        request: Any = workflow_service_pb2.SubmitOnceRequest(workflow=wf, key="k", **fields)
    else:
        call = cyclone_server.workflows.Submit
        request = workflow_service_pb2.SubmitRequest(workflow=wf, **fields)
    err = rpc_error(call, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "deadline" in err.details() and message in err.details()
    assert table_counts(cyclone_server) == before


def test_submit_once_stores_its_deadline(cyclone_server: Any) -> None:
    deadline = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(minutes=10)
    run_id = cyclone_server.workflows.SubmitOnce(
        workflow_service_pb2.SubmitOnceRequest(
            workflow=workflow("x", node("a")), key="k", deadline=_ts(deadline)
        )
    ).run_id
    assert get_run(cyclone_server, run_id).deadline.ToDatetime(tzinfo=dt.UTC) == deadline


# Several servers ------------------------------------------------------------------------


@pytest.mark.slow
def test_three_servers_cancel_each_run_at_its_deadline_once(server_factory: Any) -> None:
    servers = [server_factory(deadline_interval_s=0.05) for _ in range(3)]
    runs = [_submit(servers[i % 3], deadline=_in(2)) for i in range(30)]

    def all_cancelled() -> bool:
        return all(run_status(get_run(servers[0], r)) == "cancelled" for r in runs)

    eventually(all_cancelled, "every run's deadline cancel")
    for run_id in runs:
        [(actor, reason)] = _cancels(servers[0], run_id)
        assert actor == "cyclone" and reason.startswith("deadline exceeded at ")
