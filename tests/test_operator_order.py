"""Operator actions keep the DAG's order: after Retry, RetryAll or Resolve, no node is
claimable while a node above it is open, and every open node's counters equal their
recount from the graph (docs/state-machine.md, "What operator actions do below")."""

from __future__ import annotations

import grpc

from cyclone.v1 import admin_service_pb2, types_pb2
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

# Every open step whose stored counters differ from their recount over its upstream.
COUNTERS_OFF = """
SELECT t.node, t.status, t.deps_open, t.deps_failed, c.open, c.failed
  FROM cyclone.steps t
  CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE u.status IN ('pending', 'available', 'running',
                                                   'uncertain')) AS open,
               count(*) FILTER (WHERE u.status IN ('discarded', 'skipped')) AS failed
          FROM cyclone.steps u
         WHERE u.run_id = t.run_id AND u.node = ANY (t.depends_on)) c
 WHERE t.run_id = %s AND t.status IN ('pending', 'available', 'running', 'uncertain')
   AND (t.deps_open, t.deps_failed) <> (c.open, c.failed)
"""


def assert_counters_hold(server, run_id: str) -> None:
    assert server.sql(COUNTERS_OFF, run_id) == []


def retry(server, run_id, node_name=None):
    if node_name is None:
        return server.admin.RetryAll(admin_service_pb2.RetryAllRequest(run_id=run_id))
    return server.admin.Retry(admin_service_pb2.RetryRequest(run_id=run_id, node=node_name))


def resolve(server, run_id, node_name, **kw):
    return server.admin.Resolve(
        admin_service_pb2.ResolveRequest(run_id=run_id, node=node_name, reason="checked", **kw)
    )


def discard(server, step):
    fail(server, step, "broken", non_retryable=True)


def cleanup_after_a(server):
    """a -> c, c on all_done; both end discarded."""
    run_id = submit(server, workflow("w", node("a"), node("c", deps=["a"], rule="all_done")))
    [a] = claim(server)
    discard(server, a)
    [c] = claim(server)
    assert c.node == "c"
    discard(server, c)
    assert run_status(get_run(server, run_id)) == "failed"
    return run_id


def test_retry_all_makes_a_cleanup_node_wait_for_its_reopened_upstream(cyclone_server):
    run_id = cleanup_after_a(cyclone_server)
    retry(cyclone_server, run_id)
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "available", "c": "pending"}
    assert_counters_hold(cyclone_server, run_id)
    [a] = claim(cyclone_server)
    assert a.node == "a"  # c is not handed out beside it
    complete(cyclone_server, a)
    [c] = claim(cyclone_server)
    assert c.node == "c"
    complete(cyclone_server, c)
    assert run_status(get_run(cyclone_server, run_id)) == "completed"


def test_retrying_the_upstream_then_the_cleanup_node_keeps_the_order(cyclone_server):
    run_id = cleanup_after_a(cyclone_server)
    retry(cyclone_server, run_id, "a")
    # c had not completed: it waits again for a, whatever it was.
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "available", "c": "pending"}
    err = rpc_error(retry, cyclone_server, run_id, "c")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert_counters_hold(cyclone_server, run_id)
    assert [s.node for s in claim(cyclone_server)] == ["a"]


def test_a_running_node_below_a_retried_one_loses_its_lease_and_waits(cyclone_server):
    run_id = submit(
        cyclone_server, workflow("w", node("a"), node("c", deps=["a"], rule="all_done"))
    )
    [a] = claim(cyclone_server)
    discard(cyclone_server, a)
    [c] = claim(cyclone_server)  # the cleanup runs because a failed
    retry(cyclone_server, run_id, "a")
    step = {s.node: s for s in get_run(cyclone_server, run_id).steps}["c"]
    assert step.status == types_pb2.STEP_STATUS_PENDING
    assert step.effect_uncertain  # its effect may have happened
    assert [e.kind for e in step.errors] == ["reset"]
    assert rpc_error(complete, cyclone_server, c).code() == grpc.StatusCode.ABORTED
    assert_counters_hold(cyclone_server, run_id)


def test_a_completed_node_below_a_retried_one_stays_completed(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow("w", node("a"), node("c", deps=["a"], rule="all_done"), node("d", deps=["c"])),
    )
    [a] = claim(cyclone_server)
    discard(cyclone_server, a)
    [c] = claim(cyclone_server)
    complete(cyclone_server, c, "cleaned")
    [d] = claim(cyclone_server)
    complete(cyclone_server, d)
    retry(cyclone_server, run_id, "a")
    run = get_run(cyclone_server, run_id)
    assert statuses(run) == {"a": "available", "c": "completed", "d": "completed"}
    [a] = claim(cyclone_server)
    complete(cyclone_server, a)
    assert run_status(get_run(cyclone_server, run_id)) == "completed"


def blocked_with_compensation(server):
    """u -> c, u unsafe and blocked, c on one_failed."""
    run_id = submit(
        server,
        workflow("w", node("u", action="pay"), node("c", deps=["u"], rule="one_failed")),
    )
    block(server)
    return run_id


def block(server):
    assert len(claim(server, "pay", unsafe=("pay",), lease=5)) == 1
    server.advance_clock(6)
    assert server.sweep() == 1
    assert claim(server, "pay", unsafe=("pay",)) == []


def test_resolve_error_retry_and_block_again_keeps_the_compensation_waiting(cyclone_server):
    run_id = blocked_with_compensation(cyclone_server)
    resolve(cyclone_server, run_id, "u", error="declined")
    assert statuses(get_run(cyclone_server, run_id)) == {"u": "discarded", "c": "available"}
    retry(cyclone_server, run_id, "u")
    assert statuses(get_run(cyclone_server, run_id))["c"] == "pending"
    block(cyclone_server)
    assert statuses(get_run(cyclone_server, run_id)) == {"u": "uncertain", "c": "pending"}
    assert_counters_hold(cyclone_server, run_id)
    # Was INTERNAL: a dependency counter went to -1.
    resolve(cyclone_server, run_id, "u", result=value({"ok": True}))
    run = get_run(cyclone_server, run_id)
    assert statuses(run) == {"u": "completed", "c": "skipped"}
    assert run_status(run) == "completed"


def test_resolve_discard_after_a_retry_does_not_release_the_compensation(cyclone_server):
    run_id = blocked_with_compensation(cyclone_server)
    resolve(cyclone_server, run_id, "u", error="declined")
    retry(cyclone_server, run_id, "u")
    block(cyclone_server)
    resolve(cyclone_server, run_id, "u", discard=True)
    assert statuses(get_run(cyclone_server, run_id)) == {"u": "available", "c": "pending"}
    assert_counters_hold(cyclone_server, run_id)
    assert [s.node for s in claim(cyclone_server, "pay", "work")] == ["u"]


def test_a_late_complete_with_the_lost_lease_after_resolve_result_is_refused(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("u", action="pay")))
    [lost] = claim(cyclone_server, "pay", unsafe=("pay",), lease=5)
    cyclone_server.advance_clock(6)
    cyclone_server.sweep()
    claim(cyclone_server, "pay", unsafe=("pay",))
    resolve(cyclone_server, run_id, "u", result=value("charged"))
    err = rpc_error(complete, cyclone_server, lost, "mine")
    assert err.code() == grpc.StatusCode.ABORTED
    step = get_run(cyclone_server, run_id).steps[0]
    assert step.output.string_value == "charged"


def test_retry_grants_the_node_a_fresh_attempt_budget(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a", max_attempts=2, backoff=0)))
    for _ in range(2):
        [a] = claim(cyclone_server)
        fail(cyclone_server, a, "flaky")
    step = get_run(cyclone_server, run_id).steps[0]
    assert (step.status, step.attempt, step.max_attempts) == (
        types_pb2.STEP_STATUS_DISCARDED,
        2,
        2,
    )
    retry(cyclone_server, run_id, "a")
    step = get_run(cyclone_server, run_id).steps[0]
    assert (step.attempt, step.max_attempts) == (2, 4)
    [a] = claim(cyclone_server)
    assert a.attempt == 3 and a.max_attempts == 4
    fail(cyclone_server, a, "flaky again")  # attempt 3 of 4: retried, not discarded
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "available"}
