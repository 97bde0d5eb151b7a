"""Step logs through the raw API: lines sent with Heartbeat and Complete are stored per
attempt, within the cap, shown by GetRun only when asked; a lost lease stores nothing.
And a claim that blocks a run says so in ClaimResponse.blocked, with a readable reason."""

from __future__ import annotations

import re

import grpc
import pytest

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from tests.helpers import (
    claim,
    fail,
    get_run,
    node,
    rpc_error,
    statuses,
    submit,
    value,
    workflow,
)
from tests.snapshot import database_snapshot


def lines(*messages: str, level: str = "INFO") -> list[types_pb2.LogLine]:
    return [types_pb2.LogLine(level=level, message=m, logger="handler") for m in messages]


def heartbeat(server, step, *messages: str) -> worker_service_pb2.HeartbeatResponse:
    return server.workers.Heartbeat(
        worker_service_pb2.HeartbeatRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token, logs=lines(*messages)
        )
    )


def complete(server, step, *messages: str, output=None):
    return server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            output=value(output),
            logs=lines(*messages),
        )
    )


def logged(server, run_id: str, logs: bool = True) -> dict[str, list[types_pb2.LogLine]]:
    run = server.workflows.GetRun(workflow_service_pb2.GetRunRequest(run_id=run_id, logs=logs)).run
    return {s.node: list(s.logs) for s in run.steps}


def test_lines_are_kept_per_attempt_and_shown_only_when_asked(cyclone_server):
    run_id = submit(cyclone_server, workflow("logs", node("a")))
    [first] = claim(cyclone_server)
    heartbeat(cyclone_server, first, "starting", "halfway")
    fail(cyclone_server, first, "boom")
    cyclone_server.advance_clock(3600)
    [second] = claim(cyclone_server)
    complete(cyclone_server, second, "done at last", output="ok")

    assert logged(cyclone_server, run_id, logs=False) == {"a": []}
    got = logged(cyclone_server, run_id)["a"]
    assert [(line.attempt, line.message) for line in got] == [
        (1, "starting"),
        (1, "halfway"),
        (2, "done at last"),
    ]
    assert {line.level for line in got} == {"INFO"} and got[0].logger == "handler"
    assert all(line.HasField("at") for line in got)


def test_a_lost_lease_stores_none_of_its_lines(cyclone_server):
    run_id = submit(cyclone_server, workflow("logs", node("a")))
    [step] = claim(cyclone_server, lease=5)
    cyclone_server.advance_clock(6)
    assert rpc_error(heartbeat, cyclone_server, step, "too late").code() == grpc.StatusCode.ABORTED
    assert logged(cyclone_server, run_id) == {"a": []}


def test_the_cap_keeps_1000_lines_per_attempt_then_one_marker(cyclone_server):
    run_id = submit(cyclone_server, workflow("logs", node("a")))
    [step] = claim(cyclone_server)
    heartbeat(cyclone_server, step, *(f"line {i}" for i in range(600)))
    heartbeat(cyclone_server, step, *(f"more {i}" for i in range(600)))
    complete(cyclone_server, step, "never stored")
    got = logged(cyclone_server, run_id)["a"]
    assert len(got) == 1001
    assert got[999].message == "more 399"
    assert got[-1].level == "WARNING" and "log cap reached" in got[-1].message
    # Bytes count too: 256 KiB in 4 KiB lines is 64 lines.
    run_id = submit(cyclone_server, workflow("logs", node("a")))
    [step] = claim(cyclone_server)
    heartbeat(cyclone_server, step, *("x" * 5000 for _ in range(100)))
    got = logged(cyclone_server, run_id)["a"]
    assert len(got) == 65 and {len(line.message) for line in got[:64]} == {4096}


def test_a_claim_that_blocks_a_run_says_which_and_why(cyclone_server):
    run_id = submit(cyclone_server, workflow("order", node("charge", action="charge")))
    claim(cyclone_server, "charge", unsafe=("charge",), lease=5)
    cyclone_server.advance_clock(6)
    assert cyclone_server.sweep() == 1
    request = worker_service_pb2.ClaimRequest(
        worker_id="w",
        actions=[worker_service_pb2.ActionSpec(name="charge", unsafe_to_repeat=True)],
    )
    answer = cyclone_server.workers.Claim(request)
    assert list(answer.steps) == []
    [blocked] = answer.blocked
    assert (blocked.run_id, blocked.node, blocked.attempt, blocked.action) == (
        run_id,
        "charge",
        1,
        "charge",
    )
    assert blocked.step_id == ""
    # A readable time (to the second, with its zone), and the advice once.
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", blocked.reason)
    assert blocked.reason.count("cyclone resolve") == 1
    assert f"cyclone resolve {run_id} charge" in blocked.reason


def test_completions_in_a_batch_carry_their_own_lines(cyclone_server):
    run_id = submit(cyclone_server, workflow("batch", node("a"), node("b"), node("c")))
    steps = sorted(claim(cyclone_server), key=lambda s: s.node)
    assert [s.node for s in steps] == ["a", "b", "c"]
    completions = [
        worker_service_pb2.CompleteRequest(
            run_id=s.run_id,
            node=s.node,
            lease_token=s.lease_token,
            output=value(s.node),
            logs=lines(f"{s.node} done") if s.node != "c" else [],
        )
        for s in steps
    ]
    # b's token is stale: its completion is refused, and its lines are not stored.
    completions[1].lease_token = "00000000-0000-4000-8000-000000000000"
    answer = cyclone_server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(completions=completions)
    )
    assert [r.HasField("error") for r in answer.results] == [False, True, False]
    got = logged(cyclone_server, run_id)
    assert {n: [line.message for line in ls] for n, ls in got.items()} == {
        "a": ["a done"],
        "b": [],
        "c": [],
    }


def bad_line(fault: str) -> types_pb2.LogLine:
    line = types_pb2.LogLine(level="INFO", message="fine", logger="handler")
    if fault == "message":
        line.message = "half\x00way"
    elif fault == "logger":
        line.logger = "app\x00"
    else:  # a time past the Timestamp range, which Python cannot hold
        line.at.seconds = 2**62
    return line


#: What each fault of bad_line is refused with; the bad line is the second of two.
FAULTS = {
    "message": "logs[1].message contains a NUL character",
    "logger": "logs[1].logger contains a NUL character",
    "at": "logs[1].at must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z",
}


def completion(step, logs, output="done") -> worker_service_pb2.CompleteRequest:
    return worker_service_pb2.CompleteRequest(
        run_id=step.run_id,
        node=step.node,
        lease_token=step.lease_token,
        output=value(output),
        logs=logs,
    )


def send_heartbeat(server, good, bad, logs):
    server.workers.Heartbeat(
        worker_service_pb2.HeartbeatRequest(
            run_id=bad.run_id,
            node=bad.node,
            lease_token=bad.lease_token,
            progress=value({"halfway": True}),
            logs=logs,
        )
    )


def send_complete(server, good, bad, logs):
    server.workers.Complete(completion(bad, logs))


def send_complete_many(server, good, bad, logs):
    server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(
            completions=[completion(good, lines("fine")), completion(bad, logs)]
        )
    )


def send_work_report(server, good, bad, logs):
    from tests.test_work import Stream, opening

    stream = Stream(server, opening(0, "work"))
    report = worker_service_pb2.CompleteManyRequest(
        completions=[completion(good, lines("fine")), completion(bad, logs)]
    )
    stream.send(worker_service_pb2.WorkRequest(report=report))
    while (response := stream.next()) is not None:  # raises the stream's status
        assert not response.HasField("report")


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize(
    "send", [send_heartbeat, send_complete, send_complete_many, send_work_report]
)
def test_a_line_with_a_nul_or_a_time_out_of_range_refuses_the_request_and_writes_nothing(
    cyclone_server, send, fault
):
    """Whichever call carries it, the whole request is refused with INVALID_ARGUMENT
    naming the line and the field (in a batch, the item too), never INTERNAL; no line,
    outcome or progress is stored, and the steps stay held."""
    run_id = submit(cyclone_server, workflow("logs", node("a"), node("b")))
    good, bad = sorted(claim(cyclone_server), key=lambda s: s.node)
    before = database_snapshot(cyclone_server)
    error = rpc_error(send, cyclone_server, good, bad, [*lines("first"), bad_line(fault)])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    batch = send in (send_complete_many, send_work_report)
    assert error.details() == ("completions[1]: " if batch else "") + FAULTS[fault] + (
        f" (seconds {2**62}, nanos 0)" if fault == "at" else ""
    )
    assert database_snapshot(cyclone_server) == before
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.step_logs") == [(0,)]
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "running", "b": "running"}
    # The same steps, with their lines sent right, still go through.
    complete(cyclone_server, good, "first")
    complete(cyclone_server, bad, "first")
    assert {
        n: [line.message for line in ls] for n, ls in logged(cyclone_server, run_id).items()
    } == {
        "a": ["first"],
        "b": ["first"],
    }


def test_get_run_fills_one_nodes_logs_when_asked_and_refuses_a_bad_node_name(cyclone_server):
    run_id = submit(cyclone_server, workflow("logs", node("a"), node("b")))
    steps = {s.node: s for s in claim(cyclone_server)}
    heartbeat(cyclone_server, steps["a"], "from a")
    heartbeat(cyclone_server, steps["b"], "from b")
    request = workflow_service_pb2.GetRunRequest(run_id=run_id, logs=True, logs_node="b")
    run = cyclone_server.workflows.GetRun(request).run
    assert {s.node: [line.message for line in s.logs] for s in run.steps} == {
        "a": [],
        "b": ["from b"],
    }
    bad = workflow_service_pb2.GetRunRequest(run_id=run_id, logs=True, logs_node="a\x00")
    refused = rpc_error(cyclone_server.workflows.GetRun, bad)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
