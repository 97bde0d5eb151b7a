"""Explain: why a node is not running now, for each thing that can hold a node back,
through the raw API and through `cyclone explain`."""

from __future__ import annotations

import json

import grpc

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from pyclient import cli
from tests.helpers import (
    claim,
    complete,
    fail,
    node,
    rpc_error,
    seconds,
    submit,
    workflow,
)

REASON = workflow_service_pb2.ExplainReason


def explain(server, run_id, node_name):
    return server.workflows.Explain(
        workflow_service_pb2.ExplainRequest(run_id=run_id, node=node_name)
    )


def reason(reply) -> str:
    return REASON.Name(reply.reason).removeprefix("EXPLAIN_REASON_").lower()


def chain(server, *nodes):
    return submit(server, workflow("w", *nodes))


def test_a_node_after_an_unfinished_one_waits_on_it(cyclone_server):
    run_id = chain(cyclone_server, node("a"), node("b"), node("c", deps=["a", "b"]))
    [first, _] = claim(cyclone_server, n=2)
    complete(cyclone_server, first)
    reply = explain(cyclone_server, run_id, "c")
    assert reason(reply) == "waiting_on_upstream"
    waiting = {u.node: u.status for u in reply.upstream}
    done = first.node
    still = ({"a", "b"} - {done}).pop()
    assert waiting == {still: types_pb2.STEP_STATUS_RUNNING}
    assert f"upstream node {still} (running, attempt 1)" in reply.message
    assert reply.step.status == types_pb2.STEP_STATUS_PENDING


def test_a_ready_node_nobody_asks_for_is_said_to_have_no_worker(cyclone_server):
    never = chain(cyclone_server, node("x", action="ship"))
    reply = explain(cyclone_server, never, "x")
    assert reason(reply) == "no_worker"
    assert "no worker has asked for action ship in the last 30s (none ever has)" in reply.message
    assert reply.action.action == "ship"
    assert not reply.action.HasField("last_polled_at")

    assert claim(cyclone_server, "charge", worker="w-old") == []  # nothing to take yet
    run_id = chain(cyclone_server, node("a", action="charge"))
    assert reason(explain(cyclone_server, run_id, "a")) == "ready"
    # Two minutes later, on the database's clock, with only a worker of another action:
    cyclone_server.advance_clock(120)
    claim(cyclone_server, "refund", worker="w-refund")
    reply = explain(cyclone_server, run_id, "a")
    assert reason(reply) == "no_worker"
    assert "the last one was 2m ago, by w-old" in reply.message
    assert reply.action.last_polled_by == "w-old"
    assert not reply.action.HasField("last_claimed_at")


def test_ready_and_queued_say_which_worker_asks_and_what_is_ahead(cyclone_server):
    runs = [chain(cyclone_server, node("a")) for _ in range(3)]
    [taken] = claim(cyclone_server, n=1, worker="w-7")
    assert taken.run_id == runs[0]
    reply = explain(cyclone_server, runs[1], "a")
    assert reason(reply) == "ready", reply.message
    assert "worker w-7 asked for action work" in reply.message
    assert reply.action.last_polled_by == "w-7"
    assert reply.action.last_claimed_by == "w-7"
    assert reply.action.running == 1
    assert reply.action.ready_ahead == 0
    later = explain(cyclone_server, runs[2], "a")
    assert reason(later) == "queued"
    assert later.action.ready_ahead == 1
    assert "1 ready step(s) of action work are ahead of it" in later.message

    # Past the threshold without a Claim naming the action: nobody serves it.
    cyclone_server.advance_clock(120)
    stale = explain(cyclone_server, runs[1], "a")
    assert reason(stale) == "queued"  # its one worker is busy with a running step
    assert "busy" in stale.message


def test_a_leased_node_names_its_worker_and_last_heartbeat(cyclone_server):
    run_id = chain(cyclone_server, node("a"))
    [step] = claim(cyclone_server, worker="host-1:42", lease=30)
    reply = explain(cyclone_server, run_id, "a")
    assert reason(reply) == "running"
    assert "running on worker host-1:42" in reply.message
    assert "no heartbeat since its claim" in reply.message
    assert reply.step.worker_id == "host-1:42"
    assert reply.step.last_heartbeat_at == reply.step.started_at

    cyclone_server.advance_clock(10)
    beat = worker_service_pb2.HeartbeatRequest(
        run_id=run_id, node="a", lease_token=step.lease_token, lease=seconds(30)
    )
    beat.progress.string_value = "page 3"
    cyclone_server.workers.Heartbeat(beat)
    cyclone_server.advance_clock(4)
    reply = explain(cyclone_server, run_id, "a")
    assert reason(reply) == "running"
    assert "last heartbeat 4s ago" in reply.message
    gap = reply.step.last_heartbeat_at.ToDatetime() - reply.step.started_at.ToDatetime()
    assert gap.total_seconds() >= 10
    assert reply.step.progress.string_value == "page 3"

    cyclone_server.advance_clock(60)
    expired = explain(cyclone_server, run_id, "a")
    assert reason(expired) == "lease_expired"
    assert "the recovery sweep will reclaim it and it will run again" in expired.message


def test_a_failed_attempt_backs_off_until_its_retry_time(cyclone_server):
    run_id = chain(cyclone_server, node("a", max_attempts=3))
    [step] = claim(cyclone_server)
    reply = fail(cyclone_server, step, "card network timeout", retry_after=90)
    explained = explain(cyclone_server, run_id, "a")
    assert reason(explained) == "backing_off"
    assert explained.step.available_at == reply.retry_at
    assert "RuntimeError: card network timeout" in explained.message
    assert "2 attempt(s) left" in explained.message
    cyclone_server.advance_clock(91)  # past the backoff, and long after the last claim
    assert reason(explain(cyclone_server, run_id, "a")) == "no_worker"


def test_a_blocked_run_explains_its_uncertain_node_and_holds_the_others(cyclone_server):
    run_id = chain(
        cyclone_server,
        node("charge", action="charge"),
        node("receipt", deps=["charge"]),
        node("side", action="side"),
    )
    claim(cyclone_server, "charge", unsafe=("charge",), lease=5)
    cyclone_server.advance_clock(6)
    assert cyclone_server.sweep() == 1
    assert claim(cyclone_server, "charge", unsafe=("charge",)) == []
    uncertain = explain(cyclone_server, run_id, "charge")
    assert reason(uncertain) == "blocked"
    assert uncertain.run_status == types_pb2.RUN_STATUS_BLOCKED
    assert uncertain.run_error.kind == "EffectUncertain"
    assert "cyclone resolve" in uncertain.message
    held = explain(cyclone_server, run_id, "side")
    assert reason(held) == "blocked"
    assert "held: its run is blocked by node charge" in held.message
    downstream = explain(cyclone_server, run_id, "receipt")
    assert reason(downstream) == "blocked"
    assert [u.node for u in downstream.upstream] == ["charge"]


def test_a_skipped_node_names_the_failure_that_made_it_skip(cyclone_server):
    run_id = chain(
        cyclone_server,
        node("a", action="charge"),
        node("b", deps=["a"]),
        node("c", deps=["b"]),
        node("undo", action="refund", deps=["a"], rule="one_failed"),
        node("cleanup", action="refund", deps=["b"], rule="one_failed"),
    )
    [a] = claim(cyclone_server, "charge")
    fail(cyclone_server, a, "card declined", non_retryable=True)
    discarded = explain(cyclone_server, run_id, "a")
    assert reason(discarded) == "discarded"
    assert "RuntimeError: card declined" in discarded.message

    skipped = explain(cyclone_server, run_id, "c")  # through b, itself skipped
    assert reason(skipped) == "skipped"
    assert [(u.node, u.status) for u in skipped.upstream] == [
        ("a", types_pb2.STEP_STATUS_DISCARDED)
    ]
    assert skipped.upstream[0].last_error.message == "card declined"
    assert "a was discarded at attempt 1 (RuntimeError: card declined)" in skipped.message

    [undo, cleanup] = sorted(claim(cyclone_server, "refund"), key=lambda s: s.node)
    complete(cyclone_server, undo)
    complete(cyclone_server, cleanup)
    assert reason(explain(cyclone_server, run_id, "undo")) == "completed"


def test_a_compensation_node_skipped_because_nothing_failed_says_so(cyclone_server):
    run_id = chain(
        cyclone_server, node("a"), node("undo", action="refund", deps=["a"], rule="one_failed")
    )
    [a] = claim(cyclone_server)
    complete(cyclone_server, a)
    reply = explain(cyclone_server, run_id, "undo")
    assert reason(reply) == "skipped"
    assert "one_failed and every upstream node succeeded" in reply.message
    assert list(reply.upstream) == []


def test_a_cancelled_run_says_who_cancelled_it_and_why(cyclone_server):
    run_id = chain(cyclone_server, node("a"))
    cyclone_server.workflows.CancelRun(
        workflow_service_pb2.CancelRunRequest(run_id=run_id, reason="customer asked"),
        metadata=[("cyclone-actor", "dora")],
    )
    reply = explain(cyclone_server, run_id, "a")
    assert reason(reply) == "cancelled"
    assert "cancelled by dora" in reply.message and "customer asked" in reply.message


def test_explain_refuses_unknown_runs_and_nodes(cyclone_server):
    run_id = chain(cyclone_server, node("a"))
    error = rpc_error(explain, cyclone_server, run_id, "nope")
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "no node 'nope'" in error.details()
    missing = "0190a4c5-0000-7000-8000-000000000000"
    assert rpc_error(explain, cyclone_server, missing, "a").code() == grpc.StatusCode.NOT_FOUND
    bad = rpc_error(explain, cyclone_server, "not-a-uuid", "a")
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_cyclone_explain_prints_the_reason_and_its_facts(cyclone_server, capsys):
    run_id = chain(cyclone_server, node("a"), node("b", deps=["a"]))
    claim(cyclone_server, worker="host-9")
    address = ["--address", cyclone_server.address]
    assert cli.main(["explain", run_id, "b", *address]) == 0
    out = capsys.readouterr().out
    assert out.startswith("WAITING_ON_UPSTREAM: waiting on upstream node a (running, attempt 1)")
    assert "upstream  a  running  attempt 1" in out

    assert cli.main(["explain", run_id, "a", "--json", *address]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["reason"] == "running"
    assert data["step"]["worker_id"] == "host-9"
    assert data["run_status"] == "running"

    assert cli.main(["explain", run_id, "zz", *address]) == 1
    assert "no node 'zz'" in capsys.readouterr().err
