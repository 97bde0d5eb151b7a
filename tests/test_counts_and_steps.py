"""The console's reads, against a real server: CountRuns (exact up to a limit, then
"at least"), ListRuns' key filter, ListSteps (running, lease expired, backing off;
by worker and action; paged) and ListWorkers; and their refusals of bad input."""

from __future__ import annotations

import datetime as dt
from typing import Any

import grpc
import pytest

from cyclone.v1 import types_pb2, workflow_service_pb2
from tests.helpers import claim, complete, fail, node, rpc_error, submit, workflow

W = workflow_service_pb2
RUNNING = types_pb2.RUN_STATUS_RUNNING
COMPLETED = types_pb2.RUN_STATUS_COMPLETED
CANCELLED = types_pb2.RUN_STATUS_CANCELLED


def counts(server: Any, **fields: Any) -> dict[str, tuple[int, bool]]:
    answer = server.workflows.CountRuns(W.CountRunsRequest(**fields))
    return {
        types_pb2.RunStatus.Name(c.status).removeprefix("RUN_STATUS_").lower(): (
            c.count,
            c.at_least,
        )
        for c in answer.counts
    }


def submit_once(server: Any, name: str, key: str) -> str:
    request = W.SubmitOnceRequest(workflow=workflow(name, node("a")), key=key)
    return server.workflows.SubmitOnce(request).run_id


def cancel(server: Any, run_id: str) -> None:
    server.workflows.CancelRun(W.CancelRunRequest(run_id=run_id))


def test_counts_are_exact_up_to_the_limit_then_at_least(cyclone_server: Any) -> None:
    s = cyclone_server
    runs = [submit(s, workflow("orders", node("a"))) for _ in range(5)]
    submit(s, workflow("emails", node("a")))
    for run_id in runs[:2]:
        cancel(s, run_id)
    complete(s, claim(s, n=1)[0])  # the oldest running run completes

    assert counts(s) == {
        "running": (3, False),
        "completed": (1, False),
        "failed": (0, False),
        "blocked": (0, False),
        "cancelled": (2, False),
    }
    assert counts(s, limit=2) == {
        "running": (2, True),
        "completed": (1, False),
        "failed": (0, False),
        "blocked": (0, False),
        "cancelled": (2, False),
    }
    assert counts(s, workflow="orders", statuses=[RUNNING, CANCELLED]) == {
        "running": (2, False),
        "cancelled": (2, False),
    }
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    after = W.CountRunsRequest().created_after
    after.FromDatetime(future)
    assert counts(s, created_after=after)["running"] == (0, False)


def test_list_and_count_by_key_with_or_without_a_workflow(cyclone_server: Any) -> None:
    s = cyclone_server
    first = submit_once(s, "orders", "order-17")
    other = submit_once(s, "emails", "order-17")
    submit_once(s, "orders", "order-18")
    submit(s, workflow("orders", node("a")))

    def listed(**fields: Any) -> list[str]:
        return [r.run_id for r in s.workflows.ListRuns(W.ListRunsRequest(**fields)).runs]

    assert sorted(listed(key="order-17")) == sorted([first, other])
    assert listed(key="order-17", workflow="orders") == [first]
    assert listed(key="order-17", workflow="orders", statuses=[CANCELLED]) == []
    assert listed(key="no-such-key") == []
    assert counts(s, key="order-17")["running"] == (2, False)
    assert counts(s, key="order-17", workflow="emails")["running"] == (1, False)


def test_list_steps_running_by_worker_and_action_and_lease_expired(cyclone_server: Any) -> None:
    s = cyclone_server
    for i in range(3):
        submit(s, workflow("wf", node("a", "work"), node("b", "mail")), {"i": i})
    mine = claim(s, "work", n=3, worker="w1", lease=60)
    theirs = claim(s, "mail", n=1, worker="w2", lease=600)
    assert len(mine) == 3 and len(theirs) == 1

    def listed(**fields: Any) -> list[tuple[str, str, str]]:
        answer = s.workflows.ListSteps(W.ListStepsRequest(**fields))
        return [(r.run_id, r.step.node, r.step.worker_id) for r in answer.steps]

    running = types_pb2.STEP_STATUS_RUNNING
    everything = listed(status=running)
    assert len(everything) == 4
    assert everything[-1] == (theirs[0].run_id, "b", "w2")  # its lease ends last
    assert {r for r, _, _ in listed(status=running, worker_id="w1")} == {m.run_id for m in mine}
    assert listed(status=running, action="mail") == [(theirs[0].run_id, "b", "w2")]
    assert listed(status=running, lease_expired=True) == []
    s.advance_clock(120)  # past w1's leases, not w2's
    assert {r for r, _, _ in listed(status=running, lease_expired=True)} == {m.run_id for m in mine}

    # Paged: two pages of two, then none, the same four steps in the same order.
    first = s.workflows.ListSteps(W.ListStepsRequest(status=running, page_size=2))
    second = s.workflows.ListSteps(
        W.ListStepsRequest(status=running, page_size=2, page_token=first.next_page_token)
    )
    assert first.next_page_token and not second.next_page_token
    paged = [(r.run_id, r.step.node, r.step.worker_id) for r in [*first.steps, *second.steps]]
    assert paged == everything
    assert first.steps[0].workflow == "wf" and first.steps[0].step.action == "work"


def test_list_steps_backing_off_with_their_errors(cyclone_server: Any) -> None:
    s = cyclone_server
    run_id = submit(s, workflow("wf", node("a", backoff=600)))
    submit(s, workflow("wf", node("a")))
    step = claim(s, n=1, worker="w1")[0]
    assert step.run_id == run_id
    fail(s, step, "card declined")
    answer = s.workflows.ListSteps(W.ListStepsRequest(backing_off=True))
    assert [(r.run_id, r.step.node) for r in answer.steps] == [(run_id, "a")]
    listed = answer.steps[0].step
    assert listed.status == types_pb2.STEP_STATUS_AVAILABLE
    assert [e.message for e in listed.errors] == ["card declined"]
    assert listed.worker_id == "w1"
    assert s.workflows.ListSteps(W.ListStepsRequest(backing_off=True, action="other")).steps == []
    s.advance_clock(3600)  # due now: no longer backing off
    assert s.workflows.ListSteps(W.ListStepsRequest(backing_off=True)).steps == []


def test_list_workers_groups_running_steps_and_reports_actions(cyclone_server: Any) -> None:
    s = cyclone_server
    for _ in range(3):
        submit(s, workflow("wf", node("a", "work"), node("b", "mail")))
    claim(s, "work", n=2, worker="w1")
    claim(s, "mail", n=1, worker="w1")
    claim(s, "work", n=1, worker="w2")
    answer = s.workflows.ListWorkers(W.ListWorkersRequest())
    workers = {w.worker_id: (list(w.actions), w.running) for w in answer.workers}
    assert workers == {"w1": (["mail", "work"], 3), "w2": (["work"], 1)}
    assert all(w.HasField("last_heartbeat_at") for w in answer.workers)
    actions = {a.action: (a.running, a.ready_ahead) for a in answer.actions}
    assert actions["work"] == (3, 0)
    assert actions["mail"] == (1, 2)
    assert {a.last_polled_by for a in answer.actions} <= {"w1", "w2"}


def test_a_finished_step_leaves_the_running_list(cyclone_server: Any) -> None:
    s = cyclone_server
    submit(s, workflow("wf", node("a")))
    step = claim(s, n=1)[0]
    running = types_pb2.STEP_STATUS_RUNNING
    assert len(s.workflows.ListSteps(W.ListStepsRequest(status=running)).steps) == 1
    complete(s, step)
    assert len(s.workflows.ListSteps(W.ListStepsRequest(status=running)).steps) == 0


@pytest.mark.parametrize(
    ("call", "fields", "words"),
    [
        ("CountRuns", {"limit": 100_001}, "limit must be between 1 and 100,000"),
        ("CountRuns", {"limit": -1}, "limit must be between"),
        ("CountRuns", {"statuses": [42]}, "unknown run status 42"),
        ("CountRuns", {"key": "x" * 257}, "submit key is 257 characters"),
        ("ListRuns", {"key": "a\x00b"}, "NUL"),
        ("ListRuns", {"workflow": "no spaces allowed"}, "workflow"),
        ("ListSteps", {}, "status must be STEP_STATUS_RUNNING"),
        ("ListSteps", {"status": types_pb2.STEP_STATUS_PENDING}, "listed per run"),
        ("ListSteps", {"status": types_pb2.STEP_STATUS_RUNNING, "backing_off": True}, "cannot"),
        ("ListSteps", {"backing_off": True, "lease_expired": True}, "running steps only"),
        ("ListSteps", {"status": types_pb2.STEP_STATUS_RUNNING, "page_size": 1001}, "page_size"),
        ("ListSteps", {"status": types_pb2.STEP_STATUS_RUNNING, "page_token": "abc"}, "token"),
        ("ListSteps", {"status": types_pb2.STEP_STATUS_RUNNING, "worker_id": "w" * 201}, "201"),
    ],
)
def test_bad_input_is_invalid_argument_naming_it(
    cyclone_server: Any, call: str, fields: dict[str, Any], words: str
) -> None:
    request = getattr(W, f"{call}Request")(**fields)
    error = rpc_error(getattr(cyclone_server.workflows, call), request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert words in error.details()


def test_a_runs_page_token_is_not_a_steps_page_token(cyclone_server: Any) -> None:
    s = cyclone_server
    for _ in range(2):
        submit(s, workflow("wf", node("a")))
    token = s.workflows.ListRuns(W.ListRunsRequest(page_size=1)).next_page_token
    assert token
    request = W.ListStepsRequest(status=types_pb2.STEP_STATUS_RUNNING, page_token=token)
    error = rpc_error(s.workflows.ListSteps, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_sdk_reads_counts_steps_and_workers(cyclone_server: Any) -> None:
    from pyclient.client import Client

    s = cyclone_server
    with Client(s.address) as client:
        wf = client_workflow()
        first = client.submit_once(wf, "k-1").run_id
        client.submit(wf)
        claim(s, "work", n=1, worker="w9")
        found = client.count_runs(key="k-1")
        assert (found["running"].count, found["running"].at_least) == (1, False)
        assert str(client.count_runs(limit=1)["running"]) == "1+"
        assert [r.run_id for r in client.list_runs(key="k-1").runs] == [first]
        page = client.list_steps(status="running")
        assert [(p.workflow, p.step.worker_id) for p in page.steps] == [("sdk", "w9")]
        workers = client.list_workers()
        assert [(w.worker_id, w.running) for w in workers.workers] == [("w9", 1)]


def client_workflow() -> Any:
    from pyclient.workflow import Workflow

    wf = Workflow("sdk")
    wf.node("a", action="work")
    return wf


def test_list_workers_names_an_action_no_worker_asked_for(cyclone_server: Any) -> None:
    s = cyclone_server
    submit(s, workflow("wf", node("a", "orphan")))
    [orphan] = [a for a in s.workflows.ListWorkers(W.ListWorkersRequest()).actions]
    assert (orphan.action, orphan.ready_ahead, orphan.running) == ("orphan", 1, 0)
    assert not orphan.HasField("last_polled_at") and orphan.last_polled_by == ""
