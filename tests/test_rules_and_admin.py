"""Trigger rules, Retry / RetryAll in place, Resolve's refusals, reads and cancel."""

from __future__ import annotations

import grpc
import pytest

from cyclone.v1 import admin_service_pb2, types_pb2, workflow_service_pb2
from tests.helpers import (
    claim,
    complete,
    drain,
    fail,
    get_run,
    node,
    rpc_error,
    run_status,
    submit,
    table_counts,
    value,
    workflow,
)


def discard(server, action="work"):
    [step] = [s for s in claim(server, action) if s.action == action]
    fail(server, step, "broken", non_retryable=True)
    return step


def test_all_done_cleanup_runs_whatever_the_outcome(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow(
            "w", node("body"), node("cleanup", action="cleanup", deps=["body"], rule="all_done")
        ),
    )
    discard(cyclone_server)
    [cleanup] = claim(cyclone_server, "cleanup")
    complete(cyclone_server, cleanup)
    run = get_run(cyclone_server, run_id)
    assert {s.node: s.status for s in run.steps} == {
        "body": types_pb2.STEP_STATUS_DISCARDED,
        "cleanup": types_pb2.STEP_STATUS_COMPLETED,
    }
    assert run_status(run) == "failed"  # cleanup ran, but the body's failure stands


def test_one_failed_compensation_runs_only_on_failure(cyclone_server):
    ok = submit(
        cyclone_server,
        workflow(
            "w", node("charge"), node("refund", action="refund", deps=["charge"], rule="one_failed")
        ),
    )
    drain(cyclone_server)
    run = get_run(cyclone_server, ok)
    assert [s.status for s in run.steps] == [
        types_pb2.STEP_STATUS_COMPLETED,
        types_pb2.STEP_STATUS_SKIPPED,
    ]
    assert run_status(run) == "completed"

    bad = submit(
        cyclone_server,
        workflow(
            "w", node("charge"), node("refund", action="refund", deps=["charge"], rule="one_failed")
        ),
    )
    discard(cyclone_server)
    [refund] = claim(cyclone_server, "refund")
    assert refund.run_id == bad
    complete(cyclone_server, refund)
    assert run_status(get_run(cyclone_server, bad)) == "failed"


def test_one_failed_sees_a_failure_further_upstream_through_skips(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow(
            "w",
            node("a"),
            node("b", deps=["a"]),
            node("alert", action="alert", deps=["b"], rule="one_failed"),
        ),
    )
    discard(cyclone_server)
    [alert] = claim(cyclone_server, "alert")
    assert alert.run_id == run_id


def test_retry_reopens_the_node_in_place_and_the_run_goes_on(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow("w", node("a", max_attempts=1), node("b", deps=["a"]), node("c", deps=["b"])),
    )
    first = discard(cyclone_server)
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "failed"
    reply = cyclone_server.admin.Retry(
        admin_service_pb2.RetryRequest(run_id=run_id, node="a", reason="fixed the card"),
        metadata=[("cyclone-actor", "alice")],
    )
    assert run_status(reply.run) == "running"
    assert [s.status for s in reply.run.steps] == [
        types_pb2.STEP_STATUS_AVAILABLE,
        types_pb2.STEP_STATUS_PENDING,
        types_pb2.STEP_STATUS_PENDING,
    ]
    [again] = claim(cyclone_server)
    # Same run, same node: the (run_id, node) key holds; only the attempt moves on.
    assert (again.run_id, again.node, again.attempt) == (first.run_id, first.node, 2)
    complete(cyclone_server, again)
    assert drain(cyclone_server) == ["b", "c"]
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "completed"
    assert (
        cyclone_server.sql("SELECT count(*) FROM cyclone.steps WHERE run_id = %s", run_id)[0][0]
        == 3
    )
    [audit] = run.audit
    assert (audit.action, audit.node, audit.actor, audit.reason) == (
        "retry",
        "a",
        "alice",
        "fixed the card",
    )


def test_retry_all_reopens_every_discarded_node(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow(
            "w", node("a", max_attempts=1), node("b", max_attempts=1), node("j", deps=["a", "b"])
        ),
    )
    for step in claim(cyclone_server):
        fail(cyclone_server, step, non_retryable=True)
    reply = cyclone_server.admin.RetryAll(admin_service_pb2.RetryAllRequest(run_id=run_id))
    assert sorted(reply.nodes) == ["a", "b"]
    assert drain(cyclone_server)[-1] == "j"
    assert run_status(get_run(cyclone_server, run_id)) == "completed"


def test_retry_refuses_a_node_that_is_not_discarded(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a"), node("b", deps=["a"])))
    before = table_counts(cyclone_server)
    error = rpc_error(
        cyclone_server.admin.Retry, admin_service_pb2.RetryRequest(run_id=run_id, node="b")
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "node b is pending, not discarded" in error.details()
    error = rpc_error(
        cyclone_server.admin.Retry, admin_service_pb2.RetryRequest(run_id=run_id, node="ghost")
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(
        cyclone_server.admin.RetryAll, admin_service_pb2.RetryAllRequest(run_id=run_id)
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no discarded node" in error.details()
    assert table_counts(cyclone_server) == before


def test_retry_of_an_unknown_run_is_not_found(cyclone_server):
    error = rpc_error(
        cyclone_server.admin.Retry,
        admin_service_pb2.RetryRequest(run_id="01900000-0000-7000-8000-000000000000", node="a"),
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_resolve_refuses_a_run_that_is_not_blocked(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    before = table_counts(cyclone_server)
    error = rpc_error(
        cyclone_server.admin.Resolve,
        admin_service_pb2.ResolveRequest(run_id=run_id, node="a", discard=True, reason="checked"),
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is running, not blocked" in error.details()
    assert table_counts(cyclone_server) == before


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"step_id": "a\tb", "discard": True}, "step_id 'a\\tb' holds a control"),
        ({"node": "a", "reason": "x"}, "resolution is required"),
        ({"node": "a", "reason": "x", "discard": False}, "discard must be true"),
        ({"node": "a", "reason": "x", "error": ""}, "error must say what failed"),
        ({"node": "bad name", "reason": "x", "discard": True}, "node name 'bad name'"),
    ],
)
def test_resolve_validates_its_input(cyclone_server, request_fields, message):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    request = admin_service_pb2.ResolveRequest(run_id=run_id, **request_fields)
    if "error" in request_fields:
        request.error = request_fields["error"]
    error = rpc_error(cyclone_server.admin.Resolve, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()


def test_get_run_of_an_unknown_id_is_not_found_and_of_a_malformed_one_invalid(cyclone_server):
    error = rpc_error(
        cyclone_server.workflows.GetRun,
        workflow_service_pb2.GetRunRequest(run_id="01900000-0000-7000-8000-000000000000"),
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(
        cyclone_server.workflows.GetRun, workflow_service_pb2.GetRunRequest(run_id="x'; --")
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_list_runs_filters_by_workflow_and_status_and_pages(cyclone_server):
    ids = [submit(cyclone_server, workflow("alpha", node("a"))) for _ in range(5)]
    other = submit(cyclone_server, workflow("beta", node("a", action="other")))
    [step] = claim(cyclone_server, "other")
    fail(cyclone_server, step, non_retryable=True)

    def list_runs(**kw):
        return cyclone_server.workflows.ListRuns(workflow_service_pb2.ListRunsRequest(**kw))

    page1 = list_runs(workflow="alpha", page_size=3)
    page2 = list_runs(workflow="alpha", page_size=3, page_token=page1.next_page_token)
    assert [r.run_id for r in page1.runs] + [r.run_id for r in page2.runs] == ids[::-1]
    assert page2.next_page_token == ""
    failed = list_runs(statuses=[types_pb2.RUN_STATUS_FAILED])
    assert [r.run_id for r in failed.runs] == [other]
    assert dict(failed.runs[0].step_counts) == {"discarded": 1}
    error = rpc_error(list_runs, page_token="garbage")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_cancel_refuses_a_finished_run(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    drain(cyclone_server)
    error = rpc_error(
        cyclone_server.workflows.CancelRun, workflow_service_pb2.CancelRunRequest(run_id=run_id)
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already completed" in error.details()


def test_cancel_is_recorded_in_the_audit_trail(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a")))
    reply = cyclone_server.workflows.CancelRun(
        workflow_service_pb2.CancelRunRequest(run_id=run_id, reason="duplicate order"),
        metadata=[("cyclone-actor", "bob")],
    )
    assert run_status(reply.run) == "cancelled"
    [entry] = reply.run.audit
    assert (entry.action, entry.actor, entry.reason) == ("cancel", "bob", "duplicate order")


def test_get_run_shows_error_history(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a", backoff=0)))
    for message in ("first", "second"):
        [step] = claim(cyclone_server)
        fail(cyclone_server, step, message)
    run = get_run(cyclone_server, run_id)
    assert [(e.attempt, e.message) for e in run.steps[0].errors] == [(1, "first"), (2, "second")]
    assert run.steps[0].attempt == 2


def test_null_and_scalar_outputs_round_trip(cyclone_server):
    submit(cyclone_server, workflow("w", node("a"), node("b"), node("j", deps=["a", "b"])))
    steps = {s.node: s for s in claim(cyclone_server)}
    cyclone_server.workers.Complete(
        __import__("cyclone.v1.worker_service_pb2", fromlist=["x"]).CompleteRequest(
            run_id=steps["a"].run_id,
            node="a",
            lease_token=steps["a"].lease_token,
            output=value(None),
        )
    )
    complete(cyclone_server, steps["b"], "plain text")
    [j] = claim(cyclone_server)
    assert j.upstream_outputs["a"].WhichOneof("kind") == "null_value"
    assert j.upstream_outputs["b"].string_value == "plain text"
