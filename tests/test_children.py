"""Child runs through the raw API: StartChild (idempotent by its step call, fenced by
the lease, validated), the parent link in GetRun and ListRuns, and CancelRun's
cascade down the tree (keep_children to stop it)."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from tests.helpers import (
    PATIENCE,
    claim,
    complete,
    eventually,
    fail,
    get_run,
    node,
    rpc_error,
    run_status,
    statuses,
    submit,
    table_counts,
    value,
    workflow,
)

SUCCEEDED = types_pb2.STEP_CALL_STATUS_SUCCEEDED


def start_child(
    server: Any,
    step: Any,
    step_id: str = "child",
    seq: int = 1,
    *,
    wf: types_pb2.Workflow | None = None,
    input: Any = None,
    **overrides: Any,
) -> worker_service_pb2.StartChildResponse:
    request = worker_service_pb2.StartChildRequest(
        run_id=step.run_id,
        node=step.node,
        lease_token=step.lease_token,
        step_id=step_id,
        seq=seq,
        workflow=wf if wf is not None else workflow("kid", node("k", "kid_work")),
    )
    if input is not None:
        request.input.CopyFrom(value(input))
    for field, v in overrides.items():
        setattr(request, field, v)
    return server.workers.StartChild(request)


def parent_and_step(server: Any, action: str = "work") -> tuple[str, Any]:
    """A run of one node "body", claimed: (run_id, step)."""
    run_id = submit(server, workflow("parent", node("body", action)))
    [step] = claim(server, action)
    return run_id, step


def cancel(server: Any, run_id: str, **kwargs: Any) -> types_pb2.Run:
    return server.workflows.CancelRun(
        workflow_service_pb2.CancelRunRequest(run_id=run_id, reason="stop", **kwargs)
    ).run


def runs_count(server: Any) -> int:
    return int(server.sql("SELECT count(*) FROM cyclone.runs")[0][0])


# Starting a child -----------------------------------------------------------------------


def test_start_child_submits_a_linked_run_and_journals_the_call(cyclone_server: Any) -> None:
    parent_id, step = parent_and_step(cyclone_server)
    started = start_child(cyclone_server, step, input={"n": 3})
    assert started.created
    assert started.call.status == SUCCEEDED
    assert started.call.function == "cyclone.start_child"
    assert started.call.output.struct_value["run_id"] == started.child_run_id

    child = get_run(cyclone_server, started.child_run_id)
    assert (child.parent_run_id, child.parent_node, child.parent_step_id) == (
        parent_id,
        "body",
        "child",
    )
    assert child.workflow == "kid" and run_status(child) == "running"
    assert child.input.struct_value["n"] == 3
    assert statuses(child) == {"k": "available"}
    # The parent itself has no parent; its journal holds the call.
    parent = get_run(cyclone_server, parent_id)
    assert parent.parent_run_id == ""
    [entry] = parent.steps[0].journal
    assert (entry.step_id, entry.function) == ("child", "cyclone.start_child")

    # The child is an ordinary run: its node is claimed by its own action.
    [kid] = claim(cyclone_server, "kid_work")
    assert kid.run_id == started.child_run_id
    complete(cyclone_server, kid, {"done": True})
    assert run_status(get_run(cyclone_server, started.child_run_id)) == "completed"

    listed = cyclone_server.workflows.ListRuns(
        workflow_service_pb2.ListRunsRequest(workflow="kid")
    ).runs
    assert [(r.run_id, r.parent_run_id) for r in listed] == [(started.child_run_id, parent_id)]


def test_a_repeated_start_returns_the_same_child_and_submits_nothing(cyclone_server: Any) -> None:
    _, step = parent_and_step(cyclone_server)
    first = start_child(cyclone_server, step)
    before = runs_count(cyclone_server)
    again = start_child(cyclone_server, step)
    assert not again.created
    assert again.child_run_id == first.child_run_id
    assert runs_count(cyclone_server) == before

    # A second call site of the body is a second child.
    other = start_child(cyclone_server, step, "child#2", 2)
    assert other.created and other.child_run_id != first.child_run_id


def test_a_replay_in_a_later_attempt_finds_the_child_of_the_first(cyclone_server: Any) -> None:
    parent_id, step = parent_and_step(cyclone_server)
    first = start_child(cyclone_server, step)
    # The worker dies: its lease runs out and the sweep makes the node claimable again.
    cyclone_server.advance_clock(3600)
    cyclone_server.sweep()
    [second] = [s for s in claim(cyclone_server) if s.run_id == parent_id]
    assert second.attempt == 2
    assert [j.step_id for j in second.journal] == ["child"]
    replayed = start_child(cyclone_server, second)
    assert not replayed.created and replayed.child_run_id == first.child_run_id
    assert (
        cyclone_server.sql(
            "SELECT count(*) FROM cyclone.runs WHERE parent_run_id = %s::uuid", parent_id
        )[0][0]
        == 1
    )


def test_a_stale_lease_is_aborted_and_writes_nothing(cyclone_server: Any) -> None:
    _, step = parent_and_step(cyclone_server)
    cyclone_server.advance_clock(3600)
    cyclone_server.sweep()
    [second] = claim(cyclone_server)
    before = table_counts(cyclone_server)
    err = rpc_error(start_child, cyclone_server, step)
    assert err.code() == grpc.StatusCode.ABORTED
    assert table_counts(cyclone_server) == before
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.step_calls")[0][0] == 0
    # The holder of the new lease may start it.
    assert start_child(cyclone_server, second).created


def test_a_step_id_recorded_for_another_function_is_refused(cyclone_server: Any) -> None:
    _, step = parent_and_step(cyclone_server)
    cyclone_server.workers.EndStepCall(
        worker_service_pb2.EndStepCallRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id="lookup",
            seq=1,
            function="shop.lookup",
            output=value(1),
        )
    )
    before = runs_count(cyclone_server)
    err = rpc_error(start_child, cyclone_server, step, "lookup")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "shop.lookup" in (err.details() or "")
    assert runs_count(cyclone_server) == before


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"step_id": ""}, "step_id"),
        ({"step_id": "x" * 201}, "step_id"),
        ({"step_id": "a\nb"}, "step_id"),
        ({"seq": 0}, "seq"),
        ({"seq": 100_001}, "seq"),
        ({"run_id": "not-a-uuid"}, "run_id"),
        ({"lease_token": "nope"}, "lease_token"),
        ({"node": "bad name!"}, "node"),
    ],
)
def test_hostile_identities_are_invalid_and_write_nothing(
    cyclone_server: Any, overrides: dict[str, Any], says: str
) -> None:
    _, step = parent_and_step(cyclone_server)
    before = table_counts(cyclone_server)
    args = {"step_id": overrides.pop("step_id", "child"), "seq": overrides.pop("seq", 1)}
    err = rpc_error(start_child, cyclone_server, step, **args, **overrides)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in (err.details() or "")
    assert table_counts(cyclone_server) == before


@pytest.mark.parametrize(
    ("wf", "says"),
    [
        (workflow("kid"), "node"),
        (workflow("kid", node("a", deps=["b"]), node("b", deps=["a"])), "cycle"),
        (workflow("bad name", node("a")), "workflow"),
        (workflow("kid", node("a", deps=["nowhere"])), "nowhere"),
    ],
)
def test_a_hostile_child_workflow_is_invalid_and_writes_nothing(
    cyclone_server: Any, wf: types_pb2.Workflow, says: str
) -> None:
    _, step = parent_and_step(cyclone_server)
    before = table_counts(cyclone_server)
    err = rpc_error(start_child, cyclone_server, step, wf=wf)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in (err.details() or "")
    assert table_counts(cyclone_server) == before


def test_a_missing_workflow_and_a_deep_input_are_invalid(cyclone_server: Any) -> None:
    _, step = parent_and_step(cyclone_server)
    request = worker_service_pb2.StartChildRequest(
        run_id=step.run_id, node=step.node, lease_token=step.lease_token, step_id="c", seq=1
    )
    err = rpc_error(cyclone_server.workers.StartChild, request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "workflow" in (err.details() or "")
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    err = rpc_error(start_child, cyclone_server, step, input=deep)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert runs_count(cyclone_server) == 1


# Cancelling a parent --------------------------------------------------------------------


def _tree(server: Any) -> tuple[str, str, str, Any]:
    """A parent whose node started a child, whose node started a grandchild:
    (parent, child, grandchild run ids, the parent's step)."""
    parent_id, step = parent_and_step(server)
    child_id = start_child(
        server, step, wf=workflow("kid", node("k", "kid_work"), node("k2", "kid_work", ["k"]))
    ).child_run_id
    [kid] = claim(server, "kid_work")
    grandchild_id = start_child(
        server, kid, wf=workflow("grandkid", node("g", "grand_work"))
    ).child_run_id
    return parent_id, child_id, grandchild_id, step


def test_cancelling_a_parent_cancels_its_descendants(cyclone_server: Any) -> None:
    parent_id, child_id, grandchild_id, _ = _tree(cyclone_server)
    parent = cancel(cyclone_server, parent_id)
    assert run_status(parent) == "cancelled"
    for run_id in (child_id, grandchild_id):
        run = get_run(cyclone_server, run_id)
        assert run_status(run) == "cancelled"
        assert set(statuses(run).values()) == {"cancelled"}
        [audit] = run.audit
        assert audit.action == "cancel"
        assert parent_id in audit.reason and "stop" in audit.reason
    # Nothing of the tree can be claimed any more.
    assert claim(cyclone_server, "kid_work", "grand_work") == []


def test_keep_children_leaves_them_running(cyclone_server: Any) -> None:
    parent_id, child_id, grandchild_id, _ = _tree(cyclone_server)
    cancel(cyclone_server, parent_id, keep_children=True)
    assert run_status(get_run(cyclone_server, child_id)) == "running"
    assert run_status(get_run(cyclone_server, grandchild_id)) == "running"
    [g] = claim(cyclone_server, "grand_work")
    complete(cyclone_server, g, 1)
    assert run_status(get_run(cyclone_server, grandchild_id)) == "completed"


def test_cancelling_a_child_leaves_its_parent_alone(cyclone_server: Any) -> None:
    parent_id, child_id, grandchild_id, step = _tree(cyclone_server)
    cancel(cyclone_server, child_id)
    assert run_status(get_run(cyclone_server, grandchild_id)) == "cancelled"
    assert run_status(get_run(cyclone_server, parent_id)) == "running"
    complete(cyclone_server, step, "done")
    assert run_status(get_run(cyclone_server, parent_id)) == "completed"


def test_completed_and_failed_children_are_not_cancelled(cyclone_server: Any) -> None:
    parent_id, step = parent_and_step(cyclone_server)
    done_id = start_child(cyclone_server, step, "a", 1).child_run_id
    [kid] = claim(cyclone_server, "kid_work")
    complete(cyclone_server, kid, 1)
    running_id = start_child(cyclone_server, step, "b", 2).child_run_id
    cancel(cyclone_server, parent_id)
    assert run_status(get_run(cyclone_server, done_id)) == "completed"
    assert run_status(get_run(cyclone_server, running_id)) == "cancelled"


def test_a_cancelled_parent_cannot_start_a_child(cyclone_server: Any) -> None:
    parent_id, step = parent_and_step(cyclone_server)
    cancel(cyclone_server, parent_id)
    before = runs_count(cyclone_server)
    err = rpc_error(start_child, cyclone_server, step)
    assert err.code() == grpc.StatusCode.ABORTED
    assert runs_count(cyclone_server) == before


def test_a_cancel_racing_child_starts_leaves_no_child_running(cyclone_server: Any) -> None:
    """StartChild takes the parent's run lock, as CancelRun does: every child a start
    made before the cancel is cancelled with the parent, every start after it is
    refused, whatever the interleaving."""
    for _ in range(5):
        parent_id, step = parent_and_step(cyclone_server)
        refused = threading.Event()

        def start_until_refused(step: Any = step, refused: threading.Event = refused) -> None:
            for seq in range(1, 200):
                try:
                    start_child(cyclone_server, step, f"child#{seq}", seq)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.ABORTED
                    refused.set()
                    return

        starter = threading.Thread(target=start_until_refused)
        starter.start()
        eventually(
            lambda parent_id=parent_id: (
                cyclone_server.sql(
                    "SELECT count(*) FROM cyclone.runs WHERE parent_run_id = %s::uuid", parent_id
                )[0][0]
                >= 2
            ),
            "two children started",
        )
        cancel(cyclone_server, parent_id)
        starter.join(PATIENCE)
        assert refused.is_set()
        statuses_of_children = cyclone_server.sql(
            "SELECT DISTINCT status FROM cyclone.runs WHERE parent_run_id = %s::uuid", parent_id
        )
        assert statuses_of_children == [("cancelled",)]


# Waiting for a child (Wait with child_run_id) ---------------------------------------

READY = worker_service_pb2.WAIT_DECISION_READY
SUSPENDED = worker_service_pb2.WAIT_DECISION_SUSPENDED
FAILED = types_pb2.STEP_CALL_STATUS_FAILED


def wait_for(server: Any, step: Any, child_id: str, step_id: str = "child.result", seq: int = 2):
    return server.workers.Wait(
        worker_service_pb2.WaitRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id=step_id,
            seq=seq,
            child_run_id=child_id,
        )
    )


def waiting_parent(server: Any, kid_nodes: int = 1) -> tuple[str, str]:
    """A parent whose node started a child and waits for it (suspended): (parent, child)."""
    parent_id, step = parent_and_step(server)
    nodes = [node(f"k{i}", "kid_work") for i in range(kid_nodes)]
    child_id = start_child(server, step, wf=workflow("kid", *nodes)).child_run_id
    assert wait_for(server, step, child_id).decision == SUSPENDED
    return parent_id, child_id


def resumed(server: Any, parent_id: str) -> Any:
    """The parent's node, claimed again (it must be claimable now)."""
    [step] = [s for s in claim(server) if s.run_id == parent_id]
    return step


def test_a_finished_child_wakes_its_waiting_parent(cyclone_server: Any) -> None:
    parent_id, child_id = waiting_parent(cyclone_server, kid_nodes=2)
    waiting = get_run(cyclone_server, parent_id).steps[0]
    assert waiting.waiting_for == f"child {child_id}"
    assert claim(cyclone_server) == []  # it waits: nothing to claim
    for kid in claim(cyclone_server, "kid_work"):
        complete(cyclone_server, kid, {"node": kid.node})
    step = resumed(cyclone_server, parent_id)
    assert [j.step_id for j in step.journal] == ["child", "child.result"]
    answer = wait_for(cyclone_server, step, child_id)
    assert answer.decision == READY and answer.call.status == SUCCEEDED
    assert json_format.MessageToDict(answer.call.output) == {
        "run_id": child_id,
        "status": "completed",
        "outputs": {"k0": {"node": "k0"}, "k1": {"node": "k1"}},
    }
    complete(cyclone_server, step, "done")
    assert run_status(get_run(cyclone_server, parent_id)) == "completed"


def test_a_failed_child_is_a_failed_wait(cyclone_server: Any) -> None:
    parent_id, child_id = waiting_parent(cyclone_server)
    [kid] = claim(cyclone_server, "kid_work")
    fail(cyclone_server, kid, "no rooms left", non_retryable=True)
    answer = wait_for(cyclone_server, resumed(cyclone_server, parent_id), child_id)
    assert answer.decision == READY and answer.call.status == FAILED
    assert answer.call.error.type == "ChildFailed"
    assert child_id in answer.call.error.message
    assert "k0 was discarded" in answer.call.error.message


def test_a_cancelled_child_is_a_failed_wait(cyclone_server: Any) -> None:
    parent_id, child_id = waiting_parent(cyclone_server)
    cancel(cyclone_server, child_id)
    answer = wait_for(cyclone_server, resumed(cyclone_server, parent_id), child_id)
    assert answer.call.error.type == "ChildCancelled"
    assert "stop" in answer.call.error.message


def test_a_cancelled_child_wakes_a_claim_waiting_for_its_parent(cyclone_server: Any) -> None:
    """The cancel that wakes the parent's node wakes the claims waiting for its action
    (the tests' servers never look again without a wake-up: claim_recheck_s)."""
    parent_id, child_id = waiting_parent(cyclone_server)
    registry = cyclone_server.server.metrics.registry
    claimed: list[Any] = []
    waiting = threading.Thread(target=lambda: claimed.extend(claim(cyclone_server, wait=20)))
    waiting.start()
    eventually(
        lambda: registry.get_sample_value("cyclone_claims_waiting") == 1,
        "the claim to wait",
    )
    cancel(cyclone_server, child_id)
    waiting.join(10)
    assert not waiting.is_alive(), "the claim was not woken"
    assert [s.run_id for s in claimed] == [parent_id]


def test_a_child_finished_before_the_wait_answers_at_once(cyclone_server: Any) -> None:
    _, step = parent_and_step(cyclone_server)
    child_id = start_child(cyclone_server, step).child_run_id
    [kid] = claim(cyclone_server, "kid_work")
    complete(cyclone_server, kid, 7)
    answer = wait_for(cyclone_server, step, child_id)
    assert answer.decision == READY
    assert json_format.MessageToDict(answer.call.output)["outputs"] == {"k": 7}


def test_only_a_child_of_the_node_can_be_awaited(cyclone_server: Any) -> None:
    _, step = parent_and_step(cyclone_server)
    stranger = submit(cyclone_server, workflow("other", node("x", "kid_work")))
    before = table_counts(cyclone_server)
    err = rpc_error(wait_for, cyclone_server, step, stranger)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = rpc_error(wait_for, cyclone_server, step, "0190a0a0-0000-7000-8000-000000000000")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a child run" in (err.details() or "")
    err = rpc_error(wait_for, cyclone_server, step, "not-a-uuid")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert table_counts(cyclone_server) == before
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.step_calls")[0][0] == 0


def test_waits_and_finishes_racing_never_strand_a_parent(cyclone_server: Any) -> None:
    """A child finishing while its parent sends Wait: either the Wait sees it finished
    (READY), or the finish wakes the node the Wait suspended. Never a deadlock, never
    a parent asleep for good."""
    for _ in range(8):
        parent_id, step = parent_and_step(cyclone_server)
        child_id = start_child(cyclone_server, step).child_run_id
        [kid] = claim(cyclone_server, "kid_work")
        finisher = threading.Thread(target=complete, args=(cyclone_server, kid, 1))
        finisher.start()
        answer = wait_for(cyclone_server, step, child_id)
        finisher.join(PATIENCE)
        if answer.decision == SUSPENDED:
            step = resumed(cyclone_server, parent_id)
            answer = wait_for(cyclone_server, step, child_id)
        assert answer.decision == READY and answer.call.status == SUCCEEDED


def test_a_parent_cancel_racing_its_childs_finish(cyclone_server: Any) -> None:
    for _ in range(8):
        parent_id, child_id = waiting_parent(cyclone_server)
        [kid] = claim(cyclone_server, "kid_work")
        finisher = threading.Thread(target=_complete_unless_cancelled, args=(cyclone_server, kid))
        finisher.start()
        try:
            cancel(cyclone_server, parent_id)
        finally:
            finisher.join(PATIENCE)
        assert run_status(get_run(cyclone_server, parent_id)) == "cancelled"
        assert run_status(get_run(cyclone_server, child_id)) in ("completed", "cancelled")


def _complete_unless_cancelled(server: Any, step: Any) -> None:
    try:
        complete(server, step, 1)
    except grpc.RpcError as err:  # the cancel came first: the child's lease is gone
        assert err.code() == grpc.StatusCode.ABORTED
