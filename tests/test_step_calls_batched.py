"""Step calls ended in batches: CompleteMany's step_calls, applied before its
completions in one transaction, each refusal standing alone."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from cyclone.v1 import worker_service_pb2
from tests.helpers import claim, get_run, node, rpc_error, run_status, submit, value, workflow
from tests.test_step_calls import end_request, journal


def report(server: Any, calls: list[Any], completions: list[Any] = ()) -> Any:
    return server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(step_calls=calls, completions=list(completions))
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
    assert [r.response.duplicate for r in answer.step_call_results] == [False] * 3
    assert [r.response.call.step_id for r in answer.step_call_results] == ["f", "f#2", "f#3"]
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
    assert len(answer.step_call_results) == 2 and not answer.results
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
    kinds = [r.WhichOneof("result") for r in answer.step_call_results]
    assert kinds == ["response", "error", "response", "response"]
    assert answer.step_call_results[0].response.duplicate
    assert answer.step_call_results[0].response.call.output.string_value == "first"
    assert answer.step_call_results[1].error.code == grpc.StatusCode.ABORTED.value[0]
    assert [(r[0], r[2]) for r in journal(cyclone_server, run_a)] == [
        ("dup", "succeeded"),
        ("new", "succeeded"),
        ("failed", "failed"),
    ]
    assert journal(cyclone_server, run_b) == []


def test_a_started_unsafe_call_is_ended_in_place_by_a_batch(cyclone_server):
    run_id = submit(cyclone_server, workflow("durable", node("body")))
    [step] = claim(cyclone_server)
    cyclone_server.workers.BeginStepCall(
        worker_service_pb2.BeginStepCallRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id="charge",
            seq=1,
            function="f",
            unsafe_to_repeat=True,
        )
    )
    answer = report(cyclone_server, [end_request(step, "charge", 1, {"id": 1}, unsafe=True)])
    assert not answer.step_call_results[0].response.duplicate
    assert [(r[0], r[2], r[3]) for r in journal(cyclone_server, run_id)] == [
        ("charge", "succeeded", True)
    ]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: setattr(r, "seq", 0), "step_calls[0]: seq"),
        (lambda r: setattr(r, "step_id", "a\x00b"), "step_calls[0]: step_id"),
        (lambda r: r.ClearField("output"), "step_calls[0]: outcome is required"),
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
