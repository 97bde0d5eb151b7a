"""Unsafe-to-repeat steps through the raw API: a lost lease blocks the run at the next
claim by a worker that marks the action unsafe, until an operator resolves it."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import grpc

from cyclone.v1 import admin_service_pb2, types_pb2, worker_service_pb2
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


def blocked_run(server):
    """A run whose 'charge' step lost its lease and met an unsafe worker."""
    run_id = submit(
        server,
        workflow(
            "order",
            node("charge", action="charge"),
            node("receipt", deps=["charge"]),
            node("refund", action="refund", deps=["charge"], rule="one_failed"),
            node("side", action="side"),
        ),
    )
    [step] = claim(server, "charge", unsafe=("charge",), lease=5)
    server.advance_clock(6)
    assert server.sweep() == 1
    assert claim(server, "charge", unsafe=("charge",)) == []  # not handed out
    return run_id, step


def resolve(server, run_id, node_name="charge", **kw):
    return server.admin.Resolve(
        admin_service_pb2.ResolveRequest(
            run_id=run_id, node=node_name, reason=kw.pop("reason", "checked the PSP"), **kw
        ),
        metadata=[("cyclone-actor", "carol")],
    )


def test_unsafe_step_that_lost_its_lease_blocks_the_run(cyclone_server):
    run_id, step = blocked_run(cyclone_server)
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "blocked"
    assert statuses(run)["charge"] == "uncertain"
    assert run.error.kind == "EffectUncertain"
    assert (run.error.node, run.error.attempt) == ("charge", 1)
    claimed_at = step.lease_expires_at.ToDatetime() - timedelta(seconds=5)
    assert run.error.started_at.ToDatetime() == claimed_at
    # Nothing in a blocked run is handed out, not even unrelated ready steps.
    assert claim(cyclone_server, "side") == []
    cyclone_server.advance_clock(3600)
    assert cyclone_server.sweep() == 0
    assert run_status(get_run(cyclone_server, run_id)) == "blocked"


def test_resolve_result_records_the_output_and_releases_downstream(cyclone_server):
    run_id, _ = blocked_run(cyclone_server)
    reply = resolve(cyclone_server, run_id, result=value({"charge_id": "ch_9"}))
    assert run_status(reply.run) == "running"
    assert statuses(reply.run)["charge"] == "completed"
    [receipt] = claim(cyclone_server)
    assert receipt.upstream_outputs["charge"].struct_value["charge_id"] == "ch_9"
    assert [s.node for s in claim(cyclone_server, "side")] == ["side"]  # released
    [entry] = reply.run.audit
    assert (entry.action, entry.actor, entry.reason) == (
        "resolve_result",
        "carol",
        "checked the PSP",
    )


def test_resolve_error_fails_the_step_so_compensation_runs(cyclone_server):
    run_id, _ = blocked_run(cyclone_server)
    reply = resolve(cyclone_server, run_id, error="card declined")
    assert statuses(reply.run)["charge"] == "discarded"
    assert statuses(reply.run)["receipt"] == "skipped"
    [refund] = claim(cyclone_server, "refund")
    assert refund.run_id == run_id
    complete(cyclone_server, refund)
    [side] = claim(cyclone_server, "side")
    complete(cyclone_server, side)
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "failed"
    assert run.steps[0].errors[-1].message == "card declined"


def test_resolve_discard_runs_the_step_again_on_the_next_claim(cyclone_server):
    run_id, first = blocked_run(cyclone_server)
    resolve(cyclone_server, run_id, discard=True)
    [again] = claim(cyclone_server, "charge", unsafe=("charge",))
    assert (again.run_id, again.node, again.attempt) == (run_id, "charge", first.attempt + 1)
    assert not again.effect_uncertain


def test_removing_the_unsafe_mark_re_executes_the_step(cyclone_server):
    submit(cyclone_server, workflow("order", node("charge", action="charge")))
    [first] = claim(cyclone_server, "charge", unsafe=("charge",), lease=5)
    cyclone_server.advance_clock(6)
    cyclone_server.sweep()
    [again] = claim(cyclone_server, "charge")  # this worker's code no longer marks it
    assert (again.run_id, again.node) == (first.run_id, first.node)
    assert again.attempt == 2 and again.effect_uncertain


def test_only_the_uncertain_step_of_a_blocked_run_can_be_resolved(cyclone_server):
    run_id, _ = blocked_run(cyclone_server)
    error = rpc_error(resolve, cyclone_server, run_id, "receipt", discard=True)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not uncertain" in error.details() and "(here: charge)" in error.details()
    assert run_status(get_run(cyclone_server, run_id)) == "blocked"


def test_two_operators_resolving_at_once_one_wins_and_the_other_is_refused(cyclone_server):
    run_id, _ = blocked_run(cyclone_server)

    def attempt(kind):
        try:
            if kind == "result":
                resolve(cyclone_server, run_id, result=value(1))
            else:
                resolve(cyclone_server, run_id, discard=True)
            return "ok"
        except grpc.RpcError as exc:
            return exc.code()

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(attempt, ["result", "discard"]))
    assert sorted(map(str, outcomes)) == sorted(["ok", str(grpc.StatusCode.FAILED_PRECONDITION)])
    assert len(get_run(cyclone_server, run_id).audit) == 1


def test_retry_all_refuses_a_blocked_run(cyclone_server):
    run_id, _ = blocked_run(cyclone_server)
    error = rpc_error(
        cyclone_server.admin.RetryAll, admin_service_pb2.RetryAllRequest(run_id=run_id)
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is blocked" in error.details()


def test_a_step_that_fails_while_its_run_is_blocked_is_held_not_retried(cyclone_server, caplog):
    run_id = submit(
        cyclone_server,
        workflow("order", node("charge", action="charge"), node("side", action="side")),
    )
    claim(cyclone_server, "charge", unsafe=("charge",), lease=5)
    cyclone_server.advance_clock(6)
    assert cyclone_server.sweep() == 1
    [side] = claim(cyclone_server, "side")  # still running when the run blocks
    assert claim(cyclone_server, "charge", unsafe=("charge",)) == []
    assert run_status(get_run(cyclone_server, run_id)) == "blocked"

    # Its retryable failure is recorded, but no worker gets the step while blocked.
    with caplog.at_level(logging.INFO, logger="cyclone"):
        reply = fail(cyclone_server, side, retry_after=0)
    assert reply.status == types_pb2.STEP_STATUS_PENDING
    assert not reply.HasField("retry_at")
    assert any("held until its blocked run is resolved" in m for m in caplog.messages)
    assert claim(cyclone_server, "side") == []
    run = get_run(cyclone_server, run_id)
    assert (run_status(run), statuses(run)["side"]) == ("blocked", "pending")
    assert [e.kind for e in run.steps[1].errors] == ["handler"]

    resolve(cyclone_server, run_id, discard=True)
    [again] = claim(cyclone_server, "side")
    assert (again.run_id, again.attempt) == (run_id, 2)


def _abandon(server, step, message="ran past its time limit"):
    """What a worker reports when an unsafe handler stopped without an outcome."""
    request = worker_service_pb2.CompleteRequest(
        run_id=step.run_id, node=step.node, lease_token=step.lease_token
    )
    request.failure.type = "HandlerTimeout"
    request.failure.message = message
    request.failure.effect_uncertain = True
    return request


def test_an_unsafe_handler_that_stopped_without_an_outcome_blocks_the_run_at_once(
    cyclone_server,
):
    run_id = submit(
        cyclone_server,
        workflow("order", node("charge", action="charge"), node("side", action="side")),
    )
    [step] = claim(cyclone_server, "charge", unsafe=("charge",))
    reply = cyclone_server.workers.Complete(_abandon(cyclone_server, step))
    assert reply.status == types_pb2.STEP_STATUS_UNCERTAIN
    assert reply.run_status == types_pb2.RUN_STATUS_BLOCKED
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "blocked"
    assert statuses(run) == {"charge": "uncertain", "side": "pending"}  # held
    assert run.error.kind == "EffectUncertain" and run.error.node == "charge"
    assert "HandlerTimeout" in run.error.message
    assert claim(cyclone_server, "charge", "side") == []
    resolve(cyclone_server, run_id, discard=True)
    assert {s.node for s in claim(cyclone_server, "charge", "side")} == {"charge", "side"}


def test_an_uncertain_outcome_in_complete_many_blocks_the_run_and_is_counted(server_factory):
    server = server_factory(metrics_listen="127.0.0.1:0")
    run_id = submit(server, workflow("order", node("charge", action="charge")))
    [step] = claim(server, "charge", unsafe=("charge",))
    reply = server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(completions=[_abandon(server, step)])
    )
    assert reply.results[0].response.status == types_pb2.STEP_STATUS_UNCERTAIN
    assert run_status(get_run(server, run_id)) == "blocked"
    samples = scrape(server.server.metrics_port)
    assert metric(samples, "cyclone_steps_failed_total", outcome="uncertain") == 1
    assert metric(samples, "cyclone_runs_blocked_total", action="charge") == 1
