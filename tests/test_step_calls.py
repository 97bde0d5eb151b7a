"""The journal of durable functions, through the raw API: BeginStepCall, EndStepCall,
the journal in claims and GetRun, Resolve with a step_id, and cyclone.step_call_record
in a worker's own transaction."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import psycopg
import pytest

from cyclone.v1 import (
    admin_service_pb2,
    types_pb2,
    worker_service_pb2,
    workflow_service_pb2,
)
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
    value,
    workflow,
)
from tests.test_metrics import scrape
from tests.test_metrics import value as metric

RUN = worker_service_pb2.STEP_CALL_DECISION_RUN
RECORDED = worker_service_pb2.STEP_CALL_DECISION_RECORDED
UNCERTAIN = worker_service_pb2.STEP_CALL_DECISION_UNCERTAIN
STARTED = types_pb2.STEP_CALL_STATUS_STARTED
SUCCEEDED = types_pb2.STEP_CALL_STATUS_SUCCEEDED
FAILED = types_pb2.STEP_CALL_STATUS_FAILED

JOURNAL = (
    "SELECT step_id, seq, status, unsafe, output, error, attempt FROM cyclone.step_calls"
    " WHERE run_id = %s::uuid ORDER BY node, seq"
)


def begin(
    server: Any, step: Any, step_id: str, seq: int, *, unsafe: bool = False, fn: str = "f"
) -> worker_service_pb2.BeginStepCallResponse:
    return server.workers.BeginStepCall(
        worker_service_pb2.BeginStepCallRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id=step_id,
            seq=seq,
            function=fn,
            unsafe_to_repeat=unsafe,
        )
    )


def end_request(
    step: Any,
    step_id: str,
    seq: int,
    output: Any = None,
    *,
    error: tuple[str, str] | None = None,
    unsafe: bool = False,
    fn: str = "f",
) -> worker_service_pb2.EndStepCallRequest:
    request = worker_service_pb2.EndStepCallRequest(
        run_id=step.run_id,
        node=step.node,
        lease_token=step.lease_token,
        step_id=step_id,
        seq=seq,
        function=fn,
        unsafe_to_repeat=unsafe,
    )
    if error is not None:
        request.error.CopyFrom(types_pb2.StepCallError(type=error[0], message=error[1]))
    else:
        request.output.CopyFrom(value(output))
    return request


def end(server: Any, step: Any, *args: Any, **kwargs: Any) -> Any:
    return server.workers.EndStepCall(end_request(step, *args, **kwargs))


def journal(server: Any, run_id: str) -> list[tuple]:
    return server.sql(JOURNAL, run_id)


def resolve(server: Any, run_id: str, step_id: str = "", **choice: Any) -> types_pb2.Run:
    if "result" in choice:
        choice["result"] = value(choice["result"])
    return server.admin.Resolve(
        admin_service_pb2.ResolveRequest(run_id=run_id, step_id=step_id, reason="checked", **choice)
    ).run


def one_node(server: Any, **kwargs: Any) -> tuple[str, Any]:
    """A run of one node "body" (action "work"), claimed: (run_id, step)."""
    run_id = submit(server, workflow("durable", node("body", **kwargs)))
    [step] = claim(server)
    return run_id, step


def blocked_on_charge(server: Any, *extra: types_pb2.Node) -> tuple[str, Any]:
    """A run whose node "body" began the unsafe call "charge" at attempt 1 and failed
    without its outcome; attempt 2 (returned) is claimed and has not begun it yet."""
    run_id = submit(server, workflow("durable", node("body"), *extra))
    steps = {s.node: s for s in claim(server)}
    first = steps["body"]
    end(server, first, "lookup", 1, {"id": 7})
    assert begin(server, first, "charge", 2, unsafe=True).decision == RUN
    fail(server, first, "worker died", retry_after=0)
    [second] = [s for s in claim(server) if s.node == "body"]
    assert second.attempt == 2
    return run_id, second


# Begin and End ------------------------------------------------------------------------


def test_a_safe_call_begins_without_a_write_and_ends_with_its_output(cyclone_server):
    run_id, step = one_node(cyclone_server)
    reply = begin(cyclone_server, step, "lookup", 1)
    assert reply.decision == RUN and not reply.HasField("call")
    assert reply.run_status == types_pb2.RUN_STATUS_RUNNING
    assert journal(cyclone_server, run_id) == []  # a safe Begin writes nothing
    ended = end(cyclone_server, step, "lookup", 1, {"id": 7})
    assert not ended.duplicate
    assert ended.call.status == SUCCEEDED and ended.call.output.struct_value["id"] == 7
    assert ended.call.attempt == 1 and ended.call.HasField("finished_at")
    assert journal(cyclone_server, run_id) == [
        ("lookup", 1, "succeeded", False, {"id": 7}, None, 1)
    ]
    again = begin(cyclone_server, step, "lookup", 1)
    assert again.decision == RECORDED and again.call.output.struct_value["id"] == 7


def test_an_unsafe_call_is_recorded_started_before_it_runs(cyclone_server):
    run_id, step = one_node(cyclone_server)
    reply = begin(cyclone_server, step, "charge", 1, unsafe=True, fn="billing.charge")
    assert reply.decision == RUN
    assert reply.call.status == STARTED and reply.call.unsafe_to_repeat
    assert reply.call.function == "billing.charge" and not reply.call.HasField("finished_at")
    assert journal(cyclone_server, run_id) == [("charge", 1, "started", True, None, None, 1)]
    # The same attempt asking again (its answer was lost): run it.
    assert begin(cyclone_server, step, "charge", 1, unsafe=True).decision == RUN
    ended = end(cyclone_server, step, "charge", 1, "ch_1", unsafe=True)
    assert ended.call.status == SUCCEEDED and ended.call.unsafe_to_repeat
    assert ended.call.started_at.ToDatetime() <= ended.call.finished_at.ToDatetime()
    assert journal(cyclone_server, run_id) == [("charge", 1, "succeeded", True, "ch_1", None, 1)]
    assert begin(cyclone_server, step, "charge", 1, unsafe=True).decision == RECORDED


def test_a_failure_is_recorded_and_answered_as_recorded(cyclone_server):
    _, step = one_node(cyclone_server)
    ended = end(cyclone_server, step, "charge", 1, error=("CardDeclined", "no funds"))
    assert ended.call.status == FAILED
    assert (ended.call.error.type, ended.call.error.message) == ("CardDeclined", "no funds")
    assert not ended.call.HasField("output")
    reply = begin(cyclone_server, step, "charge", 1)
    assert reply.decision == RECORDED and reply.call.error.type == "CardDeclined"


def test_a_repeated_end_changes_nothing_and_says_duplicate(cyclone_server):
    run_id, step = one_node(cyclone_server)
    end(cyclone_server, step, "lookup", 1, {"id": 7})
    again = end(cyclone_server, step, "lookup", 1, {"id": 8})
    assert again.duplicate and again.call.output.struct_value["id"] == 7
    again = end(cyclone_server, step, "lookup", 1, error=("E", "late"))
    assert again.duplicate and again.call.status == SUCCEEDED
    assert journal(cyclone_server, run_id) == [
        ("lookup", 1, "succeeded", False, {"id": 7}, None, 1)
    ]


def test_a_null_output_is_an_output(cyclone_server):
    _, step = one_node(cyclone_server)
    ended = end(cyclone_server, step, "notify", 1, None)
    assert ended.call.status == SUCCEEDED
    assert ended.call.output.WhichOneof("kind") == "null_value"
    assert begin(cyclone_server, step, "notify", 1).decision == RECORDED


def test_an_unsafe_call_started_by_an_earlier_attempt_blocks_the_run(server_factory):
    server = server_factory(metrics_listen="127.0.0.1:0")
    server.server.metrics.gauge_max_age_s = 0
    run_id, second = blocked_on_charge(server, node("side", action="side"))
    # A ready step of the run, to be held while it is blocked.
    reply = begin(server, second, "charge", 2, unsafe=True, fn="billing.charge")
    assert reply.decision == UNCERTAIN
    assert reply.run_status == types_pb2.RUN_STATUS_BLOCKED
    assert reply.call.status == STARTED and reply.call.attempt == 1
    run = get_run(server, run_id)
    assert run_status(run) == "blocked"
    assert statuses(run) == {"body": "uncertain", "side": "pending"}
    assert run.error.kind == "EffectUncertain"
    assert (run.error.node, run.error.step_id, run.error.attempt) == ("body", "charge", 1)
    assert "body" in run.error.message and "charge" in run.error.message
    assert f"cyclone resolve {run_id} charge --result" in run.error.message
    body = next(s for s in run.steps if s.node == "body")
    assert body.errors[-1].type == "EffectUncertain" and body.errors[-1].attempt == 2
    samples = scrape(server.server.metrics_port)
    assert metric(samples, "cyclone_runs", status="blocked") == 1
    assert metric(samples, "cyclone_runs_blocked_total", action="work") == 1
    # The node's lease is over: its late Complete and further calls are refused.
    err = rpc_error(server.workers.Complete, _complete_request(second))
    assert err.code() == grpc.StatusCode.ABORTED
    err = rpc_error(server.workers.EndStepCall, end_request(second, "charge", 2, "x"))
    assert err.code() == grpc.StatusCode.ABORTED
    assert claim(server, "work", "side") == []
    assert journal(server, run_id)[1] == ("charge", 2, "started", True, None, None, 1)


def _complete_request(step: Any) -> worker_service_pb2.CompleteRequest:
    return worker_service_pb2.CompleteRequest(
        run_id=step.run_id, node=step.node, lease_token=step.lease_token, output=value(1)
    )


def test_a_safe_begin_runs_a_call_left_started_by_code_that_marked_it_unsafe(
    cyclone_server,
):
    run_id, second = blocked_on_charge(cyclone_server)
    reply = begin(cyclone_server, second, "charge", 2, unsafe=False)
    assert reply.decision == RUN
    assert run_status(get_run(cyclone_server, run_id)) == "running"
    ended = end(cyclone_server, second, "charge", 2, "ch_2")
    assert not ended.duplicate and ended.call.status == SUCCEEDED and ended.call.attempt == 2


def test_a_started_entry_discarded_by_an_operator_runs_at_the_next_attempt(cyclone_server):
    # The entry was discarded by an operator: the call simply runs.
    run_id, second = blocked_on_charge(cyclone_server)
    assert begin(cyclone_server, second, "charge", 2, unsafe=True).decision == UNCERTAIN
    resolve(cyclone_server, run_id, "charge", discard=True)
    [third] = claim(cyclone_server)
    reply = begin(cyclone_server, third, "charge", 2, unsafe=True)
    assert reply.decision == RUN and reply.call.attempt == 3


def test_in_a_run_already_blocked_the_node_is_held(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow("durable", node("body"), node("pay", action="pay")),
    )
    steps = {s.node: s for s in claim(cyclone_server, "work", "pay")}
    first = steps["body"]
    assert begin(cyclone_server, first, "charge", 1, unsafe=True).decision == RUN
    fail(cyclone_server, first, "worker died", retry_after=0)
    [second] = claim(cyclone_server)
    assert second.node == "body"
    # Another node blocks the run first.
    abandon = worker_service_pb2.CompleteRequest(
        run_id=steps["pay"].run_id,
        node="pay",
        lease_token=steps["pay"].lease_token,
        failure=worker_service_pb2.Failure(type="Timeout", effect_uncertain=True),
    )
    cyclone_server.workers.Complete(abandon)
    # "pay" had not been claimed as unsafe by the worker; abandon blocks the run anyway.
    assert run_status(get_run(cyclone_server, run_id)) == "blocked"
    reply = begin(cyclone_server, second, "charge", 1, unsafe=True)
    assert reply.decision == UNCERTAIN
    assert reply.run_status == types_pb2.RUN_STATUS_BLOCKED
    run = get_run(cyclone_server, run_id)
    assert statuses(run) == {"body": "pending", "pay": "uncertain"}
    assert run.error.node == "pay" and not run.error.step_id
    body = next(s for s in run.steps if s.node == "body")
    assert body.effect_uncertain
    # Resolving "pay" releases "body"; its replay blocks the run on the step call.
    resolve(cyclone_server, run_id, node="pay", result=1)
    [third] = claim(cyclone_server)
    assert third.node == "body" and [c.step_id for c in third.journal] == ["charge"]
    assert begin(cyclone_server, third, "charge", 1, unsafe=True).decision == UNCERTAIN
    run = get_run(cyclone_server, run_id)
    assert (run.error.node, run.error.step_id) == ("body", "charge")


# Lease fencing ----------------------------------------------------------------------


def test_a_stale_token_is_aborted_and_writes_nothing(cyclone_server):
    run_id, first = one_node(cyclone_server)
    fail(cyclone_server, first, "boom", retry_after=0)
    [second] = claim(cyclone_server)
    for call in (
        lambda: begin(cyclone_server, first, "charge", 1, unsafe=True),
        lambda: begin(cyclone_server, first, "lookup", 1),
        lambda: end(cyclone_server, first, "lookup", 1, 1),
        lambda: end(cyclone_server, first, "charge", 1, error=("E", "x"), unsafe=True),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.ABORTED
    assert journal(cyclone_server, run_id) == []
    assert begin(cyclone_server, second, "lookup", 1).decision == RUN


def test_an_expired_lease_is_aborted(cyclone_server):
    run_id, step = one_node(cyclone_server)
    cyclone_server.advance_clock(3600)
    err = rpc_error(cyclone_server.workers.EndStepCall, end_request(step, "lookup", 1, 1))
    assert err.code() == grpc.StatusCode.ABORTED
    assert journal(cyclone_server, run_id) == []


# The journal in claims and GetRun ---------------------------------------------------------


def test_the_claim_carries_the_journal_in_seq_order_and_retry_keeps_it(cyclone_server):
    run_id, first = one_node(cyclone_server, max_attempts=1)
    end(cyclone_server, first, "c", 3, "third")
    end(cyclone_server, first, "a", 1, "first")
    end(cyclone_server, first, "b", 2, error=("KeyError", "handled"))
    end(cyclone_server, first, "d", 4, "fourth")
    fail(cyclone_server, first, "later", non_retryable=True)
    run = get_run(cyclone_server, run_id)
    assert statuses(run) == {"body": "discarded"}
    body = run.steps[0]
    assert [(c.step_id, c.seq, c.status) for c in body.journal] == [
        ("a", 1, SUCCEEDED),
        ("b", 2, FAILED),
        ("c", 3, SUCCEEDED),
        ("d", 4, SUCCEEDED),
    ]
    assert body.journal[1].error.message == "handled"
    cyclone_server.admin.Retry(
        admin_service_pb2.RetryRequest(run_id=run_id, node="body", reason="again")
    )
    [again] = claim(cyclone_server)
    assert [c.step_id for c in again.journal] == ["a", "b", "c", "d"]
    assert again.journal[0].output.string_value == "first"
    assert begin(cyclone_server, again, "a", 1).decision == RECORDED


def test_a_node_without_a_journal_is_claimed_with_none(cyclone_server):
    submit(cyclone_server, workflow("plain", node("a")))
    [step] = claim(cyclone_server)
    assert list(step.journal) == []


def test_a_trailing_safe_failure_is_not_kept_but_a_handled_one_is(cyclone_server):
    run_id, first = one_node(cyclone_server)
    end(cyclone_server, first, "a", 1, error=("KeyError", "handled"))
    end(cyclone_server, first, "b", 2, "ok")
    end(cyclone_server, first, "c", 3, error=("Timeout", "ended the body"))
    fail(cyclone_server, first, "Timeout: ended the body", retry_after=0)
    assert [r[0] for r in journal(cyclone_server, run_id)] == ["a", "b"]
    [second] = claim(cyclone_server)
    assert [c.step_id for c in second.journal] == ["a", "b"]
    assert begin(cyclone_server, second, "c", 3).decision == RUN


def test_an_unsafe_failure_is_never_trimmed(cyclone_server):
    run_id, first = one_node(cyclone_server)
    assert begin(cyclone_server, first, "charge", 1, unsafe=True).decision == RUN
    end(cyclone_server, first, "charge", 1, error=("CardDeclined", "no"), unsafe=True)
    fail(cyclone_server, first, "CardDeclined", retry_after=0)
    assert journal(cyclone_server, run_id) == [
        (
            "charge",
            1,
            "failed",
            True,
            None,
            {"type": "CardDeclined", "message": "no", "details": ""},
            1,
        )
    ]


def test_a_failure_through_complete_many_trims_too(cyclone_server):
    run_id, first = one_node(cyclone_server)
    end(cyclone_server, first, "a", 1, "ok")
    end(cyclone_server, first, "b", 2, error=("E", "x"))
    request = worker_service_pb2.CompleteManyRequest(
        completions=[
            worker_service_pb2.CompleteRequest(
                run_id=first.run_id,
                node=first.node,
                lease_token=first.lease_token,
                failure=worker_service_pb2.Failure(type="E", message="x"),
            )
        ]
    )
    cyclone_server.workers.CompleteMany(request)
    assert [r[0] for r in journal(cyclone_server, run_id)] == ["a"]


def test_a_lost_lease_keeps_the_trailing_failure(cyclone_server):
    run_id, first = one_node(cyclone_server)
    end(cyclone_server, first, "a", 1, error=("E", "x"))
    cyclone_server.advance_clock(3600)
    assert cyclone_server.sweep() == 1
    assert [r[0] for r in journal(cyclone_server, run_id)] == ["a"]


def test_cancel_keeps_the_journal_and_retention_purges_it(cyclone_server):
    run_id, step = one_node(cyclone_server)
    end(cyclone_server, step, "a", 1, "ok")
    cyclone_server.workflows.CancelRun(workflow_service_pb2.CancelRunRequest(run_id=run_id))
    assert len(journal(cyclone_server, run_id)) == 1
    cyclone_server.advance_clock(10 * 86400)
    assert cyclone_server.sql("SELECT cyclone.runs_purge('1 day', false, 100)")[0][0] == 1
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.step_calls")[0][0] == 0


def test_a_completed_node_keeps_its_journal_in_get_run(cyclone_server):
    run_id, step = one_node(cyclone_server)
    end(cyclone_server, step, "a", 1, {"x": 1}, fn="mod.a")
    complete(cyclone_server, step, "done")
    [body] = get_run(cyclone_server, run_id).steps
    assert body.status == types_pb2.STEP_STATUS_COMPLETED
    [call] = body.journal
    assert (call.step_id, call.function, call.seq, call.attempt) == ("a", "mod.a", 1, 1)
    assert call.output.struct_value["x"] == 1


# Resolve with a step_id -----------------------------------------------------------------


def _blocked(server: Any) -> tuple[str, Any]:
    run_id, second = blocked_on_charge(server, node("after", deps=["body"], action="after"))
    assert begin(server, second, "charge", 2, unsafe=True).decision == UNCERTAIN
    return run_id, second


def test_resolve_result_records_the_call_and_the_node_replays(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    run = resolve(cyclone_server, run_id, "charge", result={"charge": "ch_1"})
    assert run_status(run) == "running" and not run.HasField("error")
    assert statuses(run) == {"body": "available", "after": "pending"}
    assert run.audit[-1].action == "resolve_result"
    assert run.audit[-1].details.struct_value["step_id"] == "charge"
    [third] = claim(cyclone_server)
    assert third.attempt == 3
    charge = next(c for c in third.journal if c.step_id == "charge")
    assert charge.status == SUCCEEDED and charge.output.struct_value["charge"] == "ch_1"
    assert begin(cyclone_server, third, "charge", 2, unsafe=True).decision == RECORDED
    complete(cyclone_server, third, "done")
    assert [s.node for s in claim(cyclone_server, "after")] == ["after"]


def test_resolve_error_records_the_failure_for_the_body_to_handle(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    run = resolve(cyclone_server, run_id, "charge", error="the card was declined")
    assert statuses(run)["body"] == "available"
    assert run.audit[-1].action == "resolve_error"
    [third] = claim(cyclone_server)
    reply = begin(cyclone_server, third, "charge", 2, unsafe=True)
    assert reply.decision == RECORDED and reply.call.status == FAILED
    assert reply.call.error.type == "EffectFailed"
    assert reply.call.error.message == "the card was declined"


def test_resolve_discard_deletes_the_entry_so_the_call_runs_again(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    run = resolve(cyclone_server, run_id, "charge", discard=True)
    assert run.audit[-1].action == "resolve_discard"
    assert [r[0] for r in journal(cyclone_server, run_id)] == ["lookup"]
    [third] = claim(cyclone_server)
    assert begin(cyclone_server, third, "charge", 2, unsafe=True).decision == RUN


def test_resolve_names_the_node_when_the_step_id_is_given(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    run = resolve(cyclone_server, run_id, "charge", node="body", discard=True)
    assert run_status(run) == "running"


def test_resolve_needs_no_reason_and_records_the_actor(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    cyclone_server.admin.Resolve(
        admin_service_pb2.ResolveRequest(run_id=run_id, step_id="charge", discard=True),
        metadata=[("cyclone-actor", "alice")],
    )
    assert cyclone_server.sql(
        "SELECT actor, reason FROM cyclone.audit WHERE run_id = %s::uuid", run_id
    ) == [("alice", "")]


def test_resolve_with_a_wrong_or_missing_step_id_is_refused(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    err = rpc_error(
        cyclone_server.admin.Resolve,
        admin_service_pb2.ResolveRequest(run_id=run_id, node="body", discard=True),
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "step_id charge" in err.details()
    err = rpc_error(
        cyclone_server.admin.Resolve,
        admin_service_pb2.ResolveRequest(run_id=run_id, step_id="refund", discard=True),
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "charge" in err.details() and "refund" in err.details()
    err = rpc_error(
        cyclone_server.admin.Resolve,
        admin_service_pb2.ResolveRequest(
            run_id=run_id, node="after", step_id="charge", discard=True
        ),
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert run_status(get_run(cyclone_server, run_id)) == "blocked"


def test_resolve_with_a_step_id_on_a_node_level_block_is_refused(cyclone_server):
    run_id = submit(cyclone_server, workflow("order", node("pay", action="pay")))
    [step] = claim(cyclone_server, "pay", unsafe=("pay",))
    cyclone_server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=run_id,
            node="pay",
            lease_token=step.lease_token,
            failure=worker_service_pb2.Failure(type="Timeout", effect_uncertain=True),
        )
    )
    err = rpc_error(
        cyclone_server.admin.Resolve,
        admin_service_pb2.ResolveRequest(run_id=run_id, step_id="charge", discard=True),
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "without step_id" in err.details()


def test_resolve_of_a_running_run_is_refused(cyclone_server):
    run_id, _ = one_node(cyclone_server)
    err = rpc_error(
        cyclone_server.admin.Resolve,
        admin_service_pb2.ResolveRequest(run_id=run_id, step_id="charge", discard=True),
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_two_operators_resolving_a_step_call_at_once_one_wins(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    barrier = threading.Barrier(2)
    outcomes: list[Any] = []

    def operator(**choice: Any) -> None:
        barrier.wait(10)
        try:
            resolve(cyclone_server, run_id, "charge", **choice)
            outcomes.append("ok")
        except grpc.RpcError as exc:
            outcomes.append(exc.code())

    threads = [
        threading.Thread(target=operator, kwargs={"result": 1}),
        threading.Thread(target=operator, kwargs={"discard": True}),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(map(str, outcomes)) == sorted(["ok", str(grpc.StatusCode.FAILED_PRECONDITION)])
    audit = cyclone_server.sql(
        "SELECT action FROM cyclone.audit WHERE run_id = %s::uuid AND action LIKE 'resolve%%'",
        run_id,
    )
    assert len(audit) == 1


# Explain ------------------------------------------------------------------------------


def test_explain_says_which_step_call_blocks_the_node_and_how_to_resolve_it(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    reply = cyclone_server.workflows.Explain(
        workflow_service_pb2.ExplainRequest(run_id=run_id, node="body")
    )
    for word in ("node body", "step call charge", "function f", "attempt 1"):
        assert word in reply.message
    assert f"cyclone resolve {run_id} charge" in reply.message
    assert "--discard" in reply.message
    assert reply.run_error.step_id == "charge"
    assert [c.step_id for c in reply.step.journal] == ["lookup", "charge"]


# step_call_record in a worker's own transaction ------------------------------------------


@pytest.fixture
def worker_db(cyclone_server):
    """A worker's own connection: a login role in cyclone_worker, and a business table."""
    role = "worker_login"
    cyclone_server.sql(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'worker_login') "
        "THEN CREATE ROLE worker_login LOGIN PASSWORD 'pw' IN ROLE cyclone_worker; "
        "END IF; END $$"
    )
    cyclone_server.sql("CREATE TABLE charges (step_key text PRIMARY KEY, amount int)")
    cyclone_server.sql("GRANT ALL ON charges TO worker_login")
    url = cyclone_server.database_url
    prefix, rest = url.split("://", 1)
    rest = rest.split("@", 1)[1] if "@" in rest else rest
    return f"{prefix}://{role}:pw@{rest}"


RECORD = "SELECT cyclone.step_call_record(%s::uuid, %s, %s::uuid, %s, %s, %s, %s::jsonb)"


def _charge_once(url: str, step: Any, step_id: str, amount: int) -> Any:
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO charges VALUES (%s, %s) ON CONFLICT (step_key) DO UPDATE "
            "SET amount = charges.amount + excluded.amount",
            (f"{step.run_id}:{step.node}:{step_id}", amount),
        )
        row = conn.execute(
            RECORD,
            (step.run_id, step.node, step.lease_token, step_id, 1, "pay", '{"paid": true}'),
        ).fetchone()
        conn.commit()
        return row[0] if row else None


def test_step_call_record_commits_the_effect_once(cyclone_server, worker_db):
    _, step = one_node(cyclone_server)
    recorded = _charge_once(worker_db, step, "charge", 10)
    assert recorded["status"] == "succeeded" and recorded["output"] == {"paid": True}
    with pytest.raises(psycopg.Error) as caught:
        _charge_once(worker_db, step, "charge", 10)
    assert caught.value.sqlstate == "CY005"
    assert cyclone_server.sql("SELECT amount FROM charges") == [(10,)]
    assert begin(cyclone_server, step, "charge", 1).decision == RECORDED


def test_step_call_record_updates_an_unsafe_started_entry(cyclone_server, worker_db):
    run_id, step = one_node(cyclone_server)
    assert begin(cyclone_server, step, "charge", 1, unsafe=True).decision == RUN
    _charge_once(worker_db, step, "charge", 10)
    assert journal(cyclone_server, run_id) == [
        ("charge", 1, "succeeded", True, {"paid": True}, None, 1)
    ]


def test_step_call_record_under_a_stale_token_rolls_back(cyclone_server, worker_db):
    run_id, first = one_node(cyclone_server)
    fail(cyclone_server, first, "boom", retry_after=0)
    claim(cyclone_server)
    with pytest.raises(psycopg.Error) as caught:
        _charge_once(worker_db, first, "charge", 10)
    assert caught.value.sqlstate == "CY001"
    assert cyclone_server.sql("SELECT count(*) FROM charges") == [(0,)]
    assert journal(cyclone_server, run_id) == []


# Hostile values ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "bad", "says"),
    [
        ("step_id", "", "step_id is required"),
        ("step_id", "x" * 201, "step_id is 201 characters"),
        ("step_id", "x" * 100_000, "the limit is 200"),
        ("step_id", "a\nb", "unprintable"),
        ("step_id", "a\x00b", "unprintable"),
        ("function", "", "function is required"),
        ("function", "f\x1b[31m", "unprintable"),
        ("seq", 0, "seq must be between 1 and 100000"),
        ("seq", -1, "seq must be between"),
        ("seq", 100_001, "seq must be between"),
        ("seq", 2**31 - 1, "seq must be between"),
        ("run_id", "not-a-uuid", "run_id"),
        ("lease_token", "x", "lease_token"),
        ("node", "", "node"),
    ],
)
def test_hostile_values_are_invalid_and_write_nothing(cyclone_server, field, bad, says):
    run_id, step = one_node(cyclone_server)
    requests = [
        worker_service_pb2.BeginStepCallRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id="s",
            seq=1,
            function="f",
            unsafe_to_repeat=True,
        ),
        end_request(step, "s", 1, "x"),
    ]
    for request in requests:
        setattr(request, field, bad)
        method = (
            cyclone_server.workers.BeginStepCall
            if isinstance(request, worker_service_pb2.BeginStepCallRequest)
            else cyclone_server.workers.EndStepCall
        )
        err = rpc_error(method, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, err.details())
        assert says in err.details()
    assert journal(cyclone_server, run_id) == []


def test_end_needs_exactly_one_outcome_and_bounded_error_text(cyclone_server):
    run_id, step = one_node(cyclone_server)
    request = end_request(step, "s", 1, "x")
    request.ClearField("output")
    err = rpc_error(cyclone_server.workers.EndStepCall, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "outcome" in err.details()
    request = end_request(step, "s", 1, error=("T" * 201, "m"))
    err = rpc_error(cyclone_server.workers.EndStepCall, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "error.type" in err.details()
    request = end_request(step, "s", 1, error=("T", "m\x00"))
    err = rpc_error(cyclone_server.workers.EndStepCall, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    request = end_request(step, "s", 1, error=("T", "m" * (64 * 1024 + 1)))
    err = rpc_error(cyclone_server.workers.EndStepCall, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "error.message" in err.details()
    request = end_request(step, "s", 1, {"bad": float("nan")})
    err = rpc_error(cyclone_server.workers.EndStepCall, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    # An output past the payload limit, as for a node's output.
    request = end_request(step, "s", 1, "x" * (1 << 20))
    err = rpc_error(cyclone_server.workers.EndStepCall, request)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "output" in err.details()
    assert journal(cyclone_server, run_id) == []


def test_unknown_run_or_node_is_not_found(cyclone_server):
    run_id, step = one_node(cyclone_server)
    request = end_request(step, "s", 1, "x")
    request.node = "nobody"
    assert rpc_error(cyclone_server.workers.EndStepCall, request).code() == (
        grpc.StatusCode.NOT_FOUND
    )
    request = end_request(step, "s", 1, "x")
    request.run_id = "00000000-0000-7000-8000-000000000000"
    assert rpc_error(cyclone_server.workers.EndStepCall, request).code() == (
        grpc.StatusCode.NOT_FOUND
    )
    assert journal(cyclone_server, run_id) == []


def test_resolve_refuses_a_hostile_step_id(cyclone_server):
    run_id, _ = _blocked(cyclone_server)
    for bad in ("x" * 201, "a\tb"):
        err = rpc_error(
            cyclone_server.admin.Resolve,
            admin_service_pb2.ResolveRequest(run_id=run_id, step_id=bad, discard=True),
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert run_status(get_run(cyclone_server, run_id)) == "blocked"


def test_the_journal_holds_at_most_ten_thousand_entries(cyclone_server):
    run_id, step = one_node(cyclone_server)
    cyclone_server.sql(
        "INSERT INTO cyclone.step_calls (run_id, node, step_id, seq, function, status, unsafe,"
        " output, attempt, started_at, finished_at)"
        " SELECT %s::uuid, 'body', 's' || i, i, 'f', 'succeeded', false, 'null', 1, now(), now()"
        " FROM generate_series(1, 10000) i",
        run_id,
    )
    err = rpc_error(cyclone_server.workers.EndStepCall, end_request(step, "one-more", 1, "x"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "10000" in err.details()
    assert end(cyclone_server, step, "s5", 5, "x").duplicate


# The SDK's read side ------------------------------------------------------------------


def test_the_client_reads_the_journal_and_resolves_a_step_call(cyclone_server):
    from pyclient import Client
    from pyclient.models import StepCallStatus

    run_id, _ = _blocked(cyclone_server)
    with Client(cyclone_server.address) as client:
        run = client.get_run(run_id)
        assert run.error is not None and run.error.step_id == "charge"
        calls = run.step("body").journal
        assert [(c.step_id, c.status) for c in calls] == [
            ("lookup", StepCallStatus.SUCCEEDED),
            ("charge", StepCallStatus.STARTED),
        ]
        assert calls[0].output == {"id": 7} and calls[1].unsafe_to_repeat
        assert run.to_dict()["steps"][0]["journal"][1]["status"] == "started"
        run = client.resolve(run_id, step_id="charge", error="declined")
        assert run.status == "running"
        [third] = claim(cyclone_server)
        reply = begin(cyclone_server, third, "charge", 2, unsafe=True)
        assert reply.call.error.message == "declined"


def test_the_client_resolves_with_the_clis_words_a_step_id_or_a_node(cyclone_server):
    """Client.resolve(run, TARGET) as `cyclone resolve RUN TARGET`: the step id of the
    blocking call, or the node of a run blocked on a node."""
    from pyclient import Client

    run_id, _ = _blocked(cyclone_server)
    blocked = submit(cyclone_server, workflow("order", node("pay", action="pay")))
    claim(cyclone_server, "pay", unsafe=("pay",), lease=5)
    cyclone_server.advance_clock(6)
    cyclone_server.sweep()
    assert claim(cyclone_server, "pay", unsafe=("pay",)) == []
    with Client(cyclone_server.address) as client:
        assert client.get_run(blocked).status == "blocked"
        run = client.resolve(run_id, "charge", error="declined")  # a step id
        assert run.status == "running"
        assert run.audit[-1].details["step_id"] == "charge"
        run = client.resolve(blocked, "pay", discard=True)  # a node
        assert run.status == "running" and run.audit[-1].node == "pay"
