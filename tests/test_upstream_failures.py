"""Cleanup nodes see what failed: a node whose trigger rule lets it
run after a failure receives, with its claim, each direct upstream node that did not
succeed and that node's last error, the way an except block sees its exception."""

from __future__ import annotations

from cyclone.v1 import types_pb2
from tests.helpers import claim, complete, fail, node, submit, workflow


def test_cleanup_nodes_receive_the_failed_upstream_with_its_last_error(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow(
            "order",
            node("charge", action="charge", max_attempts=2),
            node("ship", deps=["charge"]),
            node("refund", action="cleanup", deps=["charge"], rule="one_failed"),
            node("audit", action="cleanup", deps=["charge", "ship"], rule="all_done"),
        ),
    )
    [first] = claim(cyclone_server, "charge")
    assert list(first.upstream_failures) == []
    fail(cyclone_server, first, "network timeout", retry_after=0)
    [second] = claim(cyclone_server, "charge")
    fail(cyclone_server, second, "card declined", non_retryable=True)

    steps = {s.node: s for s in claim(cyclone_server, "cleanup")}
    assert set(steps) == {"refund", "audit"}
    assert {s.run_id for s in steps.values()} == {run_id}

    [charge] = steps["refund"].upstream_failures
    assert charge.node == "charge"
    assert charge.status == types_pb2.STEP_STATUS_DISCARDED
    # The last error, not the first: attempt 2's.
    assert (charge.error.attempt, charge.error.kind) == (2, "handler")
    assert (charge.error.type, charge.error.message) == ("RuntimeError", "card declined")
    assert charge.error.retryable is False
    assert charge.error.HasField("at")

    # all_done: the discarded node with its error, and the node it made skip, without.
    charge_again, ship = steps["audit"].upstream_failures
    assert charge_again == charge
    assert ship.node == "ship"
    assert ship.status == types_pb2.STEP_STATUS_SKIPPED
    assert not ship.HasField("error")
    for step in steps.values():
        complete(cyclone_server, step)


def test_a_lease_expiry_that_discards_is_what_the_cleanup_sees(cyclone_server):
    submit(
        cyclone_server,
        workflow(
            "w",
            # The lease runs to the deadline: a timeout, which uses up the attempt.
            node("a", max_attempts=1, timeout=5),
            node("undo", action="undo", deps=["a"], rule="one_failed"),
        ),
    )
    claim(cyclone_server, lease=5)
    cyclone_server.advance_clock(6)
    assert cyclone_server.sweep() == 1
    [undo] = claim(cyclone_server, "undo")
    [a] = undo.upstream_failures
    assert (a.node, a.error.kind, a.error.type, a.error.attempt) == (
        "a",
        "lease_expired",
        "LeaseExpired",
        1,
    )


def test_an_all_done_node_after_success_receives_no_failures(cyclone_server):
    submit(
        cyclone_server,
        workflow("w", node("a"), node("audit", action="audit", deps=["a"], rule="all_done")),
    )
    [a] = claim(cyclone_server)
    complete(cyclone_server, a, {"ok": True})
    [audit] = claim(cyclone_server, "audit")
    assert list(audit.upstream_failures) == []
    assert "a" in audit.upstream_outputs
