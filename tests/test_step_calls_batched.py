"""Step calls ended and begun in batches: CompleteMany's step_call_ends and
step_call_begins, applied before its completions in one transaction, each refusal
standing alone."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from cyclone.v1 import types_pb2, worker_service_pb2
from tests.helpers import (
    claim,
    fail,
    get_run,
    node,
    rpc_error,
    run_status,
    submit,
    value,
    workflow,
)
from tests.test_step_calls import end_request, journal

RUN = worker_service_pb2.STEP_CALL_DECISION_RUN
RECORDED = worker_service_pb2.STEP_CALL_DECISION_RECORDED
UNCERTAIN = worker_service_pb2.STEP_CALL_DECISION_UNCERTAIN
BLOCKED = types_pb2.RUN_STATUS_BLOCKED


def report(
    server: Any, calls: list[Any], completions: list[Any] = (), begins: list[Any] = ()
) -> Any:
    return server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(
            step_call_ends=calls, completions=list(completions), step_call_begins=list(begins)
        )
    )


def begin_request(step: Any, step_id: str, seq: int) -> worker_service_pb2.BeginStepCallRequest:
    return worker_service_pb2.BeginStepCallRequest(
        run_id=step.run_id,
        node=step.node,
        lease_token=step.lease_token,
        step_id=step_id,
        seq=seq,
        function="f",
        unsafe_to_repeat=True,
    )


def completion(step: Any, output: Any) -> worker_service_pb2.CompleteRequest:
    return worker_service_pb2.CompleteRequest(
        run_id=step.run_id, node=step.node, lease_token=step.lease_token, output=value(output)
    )


def test_a_batch_of_step_calls_and_the_completion_after_them_commit_together(cyclone_server):
    run_id = submit(cyclone_server, workflow("durable", node("body")))
    [step] = claim(cyclone_server)
    calls = [end_request(step, f"f#{n}" if n > 1 else "f", n, {"n": n}) for n in range(1, 4)]
    answer = report(cyclone_server, calls, [completion(step, "done")])
    assert [r.response.duplicate for r in answer.step_call_end_results] == [False] * 3
    assert [r.response.call.step_id for r in answer.step_call_end_results] == ["f", "f#2", "f#3"]
    assert answer.results[0].response.run_status == 2  # RUN_STATUS_COMPLETED
    assert [(r[0], r[2], r[4]) for r in journal(cyclone_server, run_id)] == [
        ("f", "succeeded", {"n": 1}),
        ("f#2", "succeeded", {"n": 2}),
        ("f#3", "succeeded", {"n": 3}),
    ]
    assert run_status(get_run(cyclone_server, run_id)) == "completed"


def test_step_calls_alone_are_recorded_and_the_node_stays_held(cyclone_server):
    run_id = submit(cyclone_server, workflow("durable", node("body")))
    [step] = claim(cyclone_server)
    answer = report(cyclone_server, [end_request(step, "a", 1, 1), end_request(step, "b", 2, 2)])
    assert len(answer.step_call_end_results) == 2 and not answer.results
    assert [r[0] for r in journal(cyclone_server, run_id)] == ["a", "b"]
    [(status,)] = cyclone_server.sql(
        "SELECT status FROM cyclone.steps WHERE run_id = %s::uuid", run_id
    )
    assert status == "running"


def test_each_refused_step_call_stands_alone(cyclone_server):
    run_a = submit(cyclone_server, workflow("durable", node("body")))
    run_b = submit(cyclone_server, workflow("durable", node("body")))
    steps = {s.run_id: s for s in claim(cyclone_server)}
    held, stale = steps[run_a], steps[run_b]
    stale_request = end_request(stale, "x", 1, 1)
    stale_request.lease_token = "00000000-0000-0000-0000-000000000000"
    # Recorded once already: the second end is a duplicate, the recorded value stands.
    report(cyclone_server, [end_request(held, "dup", 1, "first")])
    answer = report(
        cyclone_server,
        [
            end_request(held, "dup", 1, "second"),
            stale_request,
            end_request(held, "new", 2, "fresh"),
            end_request(held, "failed", 3, error=("ValueError", "bad")),
        ],
    )
    kinds = [r.WhichOneof("result") for r in answer.step_call_end_results]
    assert kinds == ["response", "error", "response", "response"]
    assert answer.step_call_end_results[0].response.duplicate
    assert answer.step_call_end_results[0].response.call.output.string_value == "first"
    assert answer.step_call_end_results[1].error.code == grpc.StatusCode.ABORTED.value[0]
    assert [(r[0], r[2]) for r in journal(cyclone_server, run_a)] == [
        ("dup", "succeeded"),
        ("new", "succeeded"),
        ("failed", "failed"),
    ]
    assert journal(cyclone_server, run_b) == []


def test_a_started_unsafe_call_is_ended_in_place_by_a_batch(cyclone_server):
    run_id = submit(cyclone_server, workflow("durable", node("body")))
    [step] = claim(cyclone_server)
    cyclone_server.workers.BeginStepCall(begin_request(step, "charge", 1))
    answer = report(cyclone_server, [end_request(step, "charge", 1, {"id": 1}, unsafe=True)])
    assert not answer.step_call_end_results[0].response.duplicate
    assert [(r[0], r[2], r[3]) for r in journal(cyclone_server, run_id)] == [
        ("charge", "succeeded", True)
    ]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: setattr(r, "seq", 0), "step_call_ends[0]: seq"),
        (lambda r: setattr(r, "step_id", "a\x00b"), "step_call_ends[0]: step_id"),
        (lambda r: r.ClearField("output"), "step_call_ends[0]: outcome is required"),
    ],
)
def test_a_malformed_step_call_refuses_the_whole_batch(cyclone_server, mutate, message):
    run_id = submit(cyclone_server, workflow("durable", node("body")))
    [step] = claim(cyclone_server)
    bad = end_request(step, "bad", 1, 1)
    mutate(bad)
    error = rpc_error(lambda: report(cyclone_server, [bad], [completion(step, "done")]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()
    assert journal(cyclone_server, run_id) == []
    assert run_status(get_run(cyclone_server, run_id)) == "running"


def test_an_empty_batch_is_refused(cyclone_server):
    error = rpc_error(lambda: report(cyclone_server, []))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at least one" in error.details()


def test_unsafe_calls_begun_in_a_batch_get_each_their_decision(cyclone_server):
    """Begins share a transaction: RUN (recorded started), RECORDED, and UNCERTAIN
    for a call an earlier attempt started, which blocks that run alone."""
    run_a = submit(cyclone_server, workflow("durable", node("body", backoff=0)))
    run_b = submit(cyclone_server, workflow("durable", node("body")))
    steps = {s.run_id: s for s in claim(cyclone_server)}
    a, b = steps[run_a], steps[run_b]
    report(cyclone_server, [end_request(b, "done", 1, "ok")])
    answer = report(cyclone_server, [], begins=[begin_request(a, "charge", 1)])
    assert answer.step_call_begin_results[0].response.decision == RUN
    # a's attempt fails without an outcome for charge; attempt 2 begins it again.
    fail(cyclone_server, a)
    [a2] = claim(cyclone_server)
    answer = report(
        cyclone_server,
        [],
        begins=[begin_request(a2, "charge", 1), begin_request(b, "done", 1)],
    )
    first, second = (r.response for r in answer.step_call_begin_results)
    assert (first.decision, first.run_status) == (UNCERTAIN, BLOCKED)
    assert first.call.step_id == "charge"
    assert second.decision == RECORDED and second.call.output.string_value == "ok"
    assert run_status(get_run(cyclone_server, run_a)) == "blocked"
    assert run_status(get_run(cyclone_server, run_b)) == "running"
    assert get_run(cyclone_server, run_a).error.step_id == "charge"


def test_a_refused_begin_stands_alone(cyclone_server):
    run_id = submit(cyclone_server, workflow("durable", node("body")))
    [step] = claim(cyclone_server)
    stale = begin_request(step, "x", 1)
    stale.lease_token = "00000000-0000-0000-0000-000000000000"
    answer = report(
        cyclone_server, [], [completion(step, "done")], begins=[stale, begin_request(step, "y", 2)]
    )
    kinds = [r.WhichOneof("result") for r in answer.step_call_begin_results]
    assert kinds == ["error", "response"]
    assert answer.step_call_begin_results[0].error.code == grpc.StatusCode.ABORTED.value[0]
    assert [(r[0], r[2]) for r in journal(cyclone_server, run_id)] == [("y", "started")]
    assert run_status(get_run(cyclone_server, run_id)) == "completed"


def test_a_brief_batch_answers_without_the_entries_it_was_not_asked_for(cyclone_server):
    run_id = submit(cyclone_server, workflow("durable", node("body")))
    [step] = claim(cyclone_server)
    report(cyclone_server, [], begins=[begin_request(step, "paid", 1)])
    ended = end_request(step, "paid", 1, {"ok": True})
    ended.unsafe_to_repeat = True
    answer = cyclone_server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(
            step_call_ends=[ended, end_request(step, "sent", 2, "x")],
            step_call_begins=[begin_request(step, "paid", 1), begin_request(step, "next", 3)],
            brief=True,
        )
    )
    # Ends: recorded, no entry; begins: RECORDED keeps its entry, RUN has none.
    assert [
        (r.HasField("response"), r.response.HasField("call"), r.response.duplicate)
        for r in answer.step_call_end_results
    ] == [(True, False, False)] * 2
    begun = [r.response for r in answer.step_call_begin_results]
    assert [b.decision for b in begun] == [RECORDED, RUN]
    assert begun[0].call.output == value({"ok": True}) and not begun[1].HasField("call")
    assert [(r[0], r[2]) for r in journal(cyclone_server, run_id)] == [
        ("paid", "succeeded"),
        ("sent", "succeeded"),
        ("next", "started"),
    ]
