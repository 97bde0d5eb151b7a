"""Pause and resume of a run, a workflow and an action, through the public API: what a
claim takes while paused and after, what still goes on (completions, waits, retries),
Explain's answer, the audit, and bad input."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import grpc
import pytest

from cyclone.v1 import admin_service_pb2, types_pb2, workflow_service_pb2
from tests.helpers import (
    PATIENCE,
    claim,
    complete,
    fail,
    get_run,
    node,
    rpc_error,
    run_status,
    statuses,
    submit,
    workflow,
)
from tests.test_waits import send_event, wait_request

ACTOR = [("cyclone-actor", "ops@example")]


def pause_run(server: Any, run_id: str, reason: str = "") -> Any:
    return server.admin.PauseRun(
        admin_service_pb2.PauseRunRequest(run_id=run_id, reason=reason), metadata=ACTOR
    )


def resume_run(server: Any, run_id: str) -> Any:
    return server.admin.ResumeRun(admin_service_pb2.ResumeRunRequest(run_id=run_id), metadata=ACTOR)


def explain(server: Any, run_id: str, node_name: str) -> Any:
    return server.workflows.Explain(
        workflow_service_pb2.ExplainRequest(run_id=run_id, node=node_name)
    )


PAUSED = workflow_service_pb2.EXPLAIN_REASON_PAUSED


def test_a_paused_run_is_not_claimed_while_other_runs_are_until_resumed(
    cyclone_server: Any,
) -> None:
    paused = submit(cyclone_server, workflow("w", node("a"), node("b")))
    other = submit(cyclone_server, workflow("w", node("a"), node("b")))
    answer = pause_run(cyclone_server, paused, "looking into it")
    assert answer.changed
    assert answer.run.pause.actor == "ops@example"
    assert answer.run.pause.reason == "looking into it"
    assert answer.run.pause.HasField("at")
    assert run_status(answer.run) == "running"  # a pause is not a status
    # Pausing again changes nothing and keeps the first pause.
    again = pause_run(cyclone_server, paused, "another reason")
    assert not again.changed and again.run.pause.reason == "looking into it"

    taken = claim(cyclone_server, n=10)
    assert sorted((s.run_id, s.node) for s in taken) == [(other, "a"), (other, "b")]
    why = explain(cyclone_server, paused, "a")
    assert why.reason == PAUSED
    assert "paused by ops@example" in why.message and "looking into it" in why.message
    listed = cyclone_server.workflows.ListRuns(workflow_service_pb2.ListRunsRequest())
    by_id = {r.run_id: r for r in listed.runs}
    assert by_id[paused].pause.actor == "ops@example"
    assert not by_id[other].HasField("pause")

    resumed = resume_run(cyclone_server, paused)
    assert resumed.changed and not resumed.run.HasField("pause")
    assert not resume_run(cyclone_server, paused).changed
    taken = claim(cyclone_server, n=10)
    assert sorted((s.run_id, s.node) for s in taken) == [(paused, "a"), (paused, "b")]
    audit = [(a.action, a.actor, a.reason) for a in get_run(cyclone_server, paused).audit]
    assert audit == [
        ("pause", "ops@example", "looking into it"),
        ("resume", "ops@example", ""),
    ]


def test_a_running_step_completes_while_paused_and_its_dependents_wait_for_resume(
    cyclone_server: Any,
) -> None:
    run_id = submit(cyclone_server, workflow("w", node("a"), node("b", deps=["a"])))
    [a] = claim(cyclone_server)
    pause_run(cyclone_server, run_id)
    # The running step heartbeats and completes as usual.
    from cyclone.v1 import worker_service_pb2

    cyclone_server.workers.Heartbeat(
        worker_service_pb2.HeartbeatRequest(run_id=a.run_id, node=a.node, lease_token=a.lease_token)
    )
    complete(cyclone_server, a, 1)
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "completed", "b": "pending"}
    assert claim(cyclone_server) == []
    assert explain(cyclone_server, run_id, "b").reason == PAUSED
    # A claim waiting when the run is resumed is woken and takes the dependent.
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.extend(claim(cyclone_server, wait=PATIENCE)))
    waiter.start()
    resume_run(cyclone_server, run_id)
    waiter.join()
    assert [(s.run_id, s.node) for s in got] == [(run_id, "b")]


def test_a_retry_of_a_paused_run_is_held_until_resume(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("w", node("a", backoff=0.001)))
    [a] = claim(cyclone_server)
    pause_run(cyclone_server, run_id)
    fail(cyclone_server, a)
    cyclone_server.advance_clock(60)
    assert claim(cyclone_server) == []
    assert statuses(get_run(cyclone_server, run_id)) == {"a": "pending"}
    resume_run(cyclone_server, run_id)
    [again] = claim(cyclone_server)
    assert again.attempt == 2


def test_an_expired_lease_of_a_paused_run_is_swept_but_held(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("w", node("a")))
    claim(cyclone_server, lease=1)
    pause_run(cyclone_server, run_id)
    cyclone_server.advance_clock(120)
    assert cyclone_server.sweep() == 1
    assert claim(cyclone_server, worker="other") == []
    resume_run(cyclone_server, run_id)
    assert [s.node for s in claim(cyclone_server, worker="other")] == ["a"]


def test_an_event_for_a_paused_run_arrives_but_the_body_waits_for_resume(
    cyclone_server: Any,
) -> None:
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [a] = claim(cyclone_server)
    cyclone_server.workers.Wait(wait_request(a, "event:go", event="go"))
    pause_run(cyclone_server, run_id)
    send_event(cyclone_server, run_id, "go", {"ok": True})
    assert claim(cyclone_server) == []
    assert explain(cyclone_server, run_id, "a").reason == PAUSED
    resume_run(cyclone_server, run_id)
    [resumed] = claim(cyclone_server)
    answer = cyclone_server.workers.Wait(wait_request(resumed, "event:go", event="go"))
    assert answer.call.output.struct_value.fields["ok"].bool_value


def test_a_paused_run_can_be_cancelled(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("w", node("a"), node("b", deps=["a"])))
    pause_run(cyclone_server, run_id)
    cancelled = cyclone_server.workflows.CancelRun(
        workflow_service_pb2.CancelRunRequest(run_id=run_id)
    ).run
    assert run_status(cancelled) == "cancelled"
    assert set(statuses(cancelled).values()) == {"cancelled"}
    assert claim(cyclone_server) == []


def test_pausing_runs_refuses_bad_input_and_writes_nothing(cyclone_server: Any) -> None:
    missing = str(uuid.uuid4())
    assert rpc_error(pause_run, cyclone_server, missing).code() == grpc.StatusCode.NOT_FOUND
    assert rpc_error(resume_run, cyclone_server, missing).code() == grpc.StatusCode.NOT_FOUND
    bad = rpc_error(pause_run, cyclone_server, "not-a-uuid")
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    run_id = submit(cyclone_server, workflow("w", node("a")))
    bad = rpc_error(pause_run, cyclone_server, run_id, "nul\x00reason")
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    [a] = claim(cyclone_server)
    complete(cyclone_server, a)
    done = rpc_error(pause_run, cyclone_server, run_id)
    assert done.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "completed" in (done.details() or "")
    assert [e.action for e in get_run(cyclone_server, run_id).audit] == []


def pause_name(server: Any, kind: str, name: str, reason: str = "") -> Any:
    rpc = server.admin.PauseWorkflow if kind == "workflow" else server.admin.PauseAction
    request = (
        admin_service_pb2.PauseWorkflowRequest
        if kind == "workflow"
        else admin_service_pb2.PauseActionRequest
    )
    return rpc(request(name=name, reason=reason), metadata=ACTOR)


def resume_name(server: Any, kind: str, name: str) -> Any:
    rpc = server.admin.ResumeWorkflow if kind == "workflow" else server.admin.ResumeAction
    request = (
        admin_service_pb2.ResumeWorkflowRequest
        if kind == "workflow"
        else admin_service_pb2.ResumeActionRequest
    )
    return rpc(request(name=name), metadata=ACTOR)


def test_a_paused_workflow_is_not_claimed_on_any_server_until_resumed(
    server_factory: Any,
) -> None:
    one, two = server_factory(), server_factory()
    held = submit(one, workflow("billing", node("a")))
    free = submit(one, workflow("reports", node("a")))
    answer = pause_name(one, "workflow", "billing", "bad deploy")
    assert answer.changed and answer.pause.actor == "ops@example"
    assert not pause_name(two, "workflow", "billing").changed
    assert [s.run_id for s in claim(two)] == [free]
    assert claim(one) == []
    why = explain(two, held, "a")
    assert why.reason == PAUSED
    assert "workflow billing" in why.message and "bad deploy" in why.message
    listed = two.admin.ListPauses(admin_service_pb2.ListPausesRequest()).pauses
    assert [(p.kind, p.name, p.pause.reason) for p in listed] == [
        (types_pb2.PAUSE_KIND_WORKFLOW, "billing", "bad deploy")
    ]
    assert resume_name(two, "workflow", "billing").changed
    assert not resume_name(two, "workflow", "billing").changed
    assert [s.run_id for s in claim(one)] == [held]
    assert two.admin.ListPauses(admin_service_pb2.ListPausesRequest()).pauses == []
    log = one.sql("SELECT kind, name, action, actor FROM cyclone.pause_log ORDER BY at")
    assert log == [
        ("workflow", "billing", "pause", "ops@example"),
        ("workflow", "billing", "resume", "ops@example"),
    ]


def test_a_paused_action_is_not_claimed_until_resumed(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("w", node("a", "charge"), node("b", "email")))
    pause_name(cyclone_server, "action", "charge", "provider down")
    taken = claim(cyclone_server, "charge", "email")
    assert [s.node for s in taken] == ["b"]
    why = explain(cyclone_server, run_id, "a")
    assert why.reason == PAUSED and "action charge" in why.message
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.extend(claim(cyclone_server, "charge", wait=PATIENCE))
    )
    waiter.start()
    resume_name(cyclone_server, "action", "charge")
    waiter.join()
    assert [s.node for s in got] == ["a"]


@pytest.mark.parametrize("kind", ["workflow", "action"])
@pytest.mark.parametrize("name", ["", "x" * 300, "nul\x00name", "bad name", "9starts-with-digit"])
def test_bad_names_are_invalid_arguments(cyclone_server: Any, kind: str, name: str) -> None:
    error = rpc_error(pause_name, cyclone_server, kind, name)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = rpc_error(resume_name, cyclone_server, kind, name)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.pauses")[0][0] == 0


def test_the_engine_refuses_names_no_workflow_has(cyclone_server: Any) -> None:
    import psycopg

    with psycopg.connect(cyclone_server.database_url, autocommit=True) as conn:
        for kind, name in [("run", "x"), ("action", ""), ("action", "a\x01b")]:
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SELECT cyclone.pause_set(%s, %s, 'me', '')", (kind, name))
            assert info.value.sqlstate == "CY004"


@pytest.mark.slow
def test_no_step_of_a_paused_run_starts_under_claims_from_three_servers(
    server_factory: Any,
) -> None:
    servers = [server_factory() for _ in range(3)]
    # Chains, so that a pause meets each run half way: the run's claims go one by one.
    nodes = [node("n0")] + [node(f"n{i}", deps=[f"n{i - 1}"]) for i in range(1, 60)]
    runs = [submit(servers[0], workflow("w", *nodes)) for _ in range(16)]
    to_pause, to_run = runs[::2], runs[1::2]
    stop = threading.Event()
    failures: list[BaseException] = []

    def work(server: Any, worker: str) -> None:
        try:
            while not stop.is_set():
                for step in claim(server, n=3, worker=worker):
                    complete(server, step, step.node)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    claimers = [
        threading.Thread(target=work, args=(s, f"w{i}-{j}"))
        for i, s in enumerate(servers)
        for j in range(2)
    ]
    for t in claimers:
        t.start()
    started: dict[str, set[str]] = {}
    for i, run_id in enumerate(to_pause):
        try:
            assert pause_run(servers[i % 3], run_id).changed
        except grpc.RpcError as exc:
            # Finished before its turn came (fast claimers): there is nothing to pause.
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
            assert run_status(get_run(servers[0], run_id)) == "completed"
            to_pause = [r for r in to_pause if r != run_id]
            continue
        # Every claim of the run committed before the pause did (the pause waits for the
        # locks of the steps being claimed): from here on no attempt may start.
        started[run_id] = {
            r[0]
            for r in servers[0].sql(
                "SELECT node FROM cyclone.steps WHERE run_id = %s::uuid AND attempt > 0", run_id
            )
        }
    try:
        for run_id in to_run:
            while run_status(get_run(servers[0], run_id)) != "completed" and not failures:
                claim(servers[0], "idle", wait=0.2)  # let the claimers go on
    finally:
        stop.set()
        for t in claimers:
            t.join()
    assert not failures, failures
    assert any(len(started[r]) < len(nodes) for r in to_pause), "no run was paused half way"
    for run_id in to_pause:
        now_started = {
            r[0]
            for r in servers[0].sql(
                "SELECT node FROM cyclone.steps WHERE run_id = %s::uuid AND attempt > 0", run_id
            )
        }
        assert now_started == started[run_id], run_id
        if len(started[run_id]) < len(nodes):
            assert run_status(get_run(servers[0], run_id)) == "running"
    for run_id in to_pause:
        resume_run(servers[1], run_id)
    while steps := claim(servers[2], n=50):
        for step in steps:
            complete(servers[2], step, step.node)
    assert {run_status(get_run(servers[0], r)) for r in runs} == {"completed"}


def test_the_command_line_pauses_resumes_and_lists(cyclone_server: Any) -> None:
    import contextlib
    import io

    from pyclient import cli

    def run(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        full = ["--address", cyclone_server.address, "--actor", "carol", *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = cli.main(full)
            except SystemExit as exc:
                code = exc.code
        return int(code or 0), out.getvalue()

    run_id = submit(cyclone_server, workflow("billing", node("a", "charge")))
    code, out = run("pause", "run", run_id, "--reason", "checking")
    assert code == 0 and f"run {run_id} paused" in out
    assert "already paused" in run("pause", "run", run_id)[1]
    code, out = run("run", "show", run_id)
    assert "PAUSED by carol" in out and "checking" in out
    assert claim(cyclone_server, "charge") == []
    assert run("resume", "run", run_id)[0] == 0
    assert "workflow billing paused" in run("pause", "workflow", "billing", "--reason", "x")[1]
    assert "action charge paused" in run("pause", "action", "charge")[1]
    code, out = run("pauses")
    assert code == 0 and "workflow billing" in out and "action   charge" in out
    code, out = run("--json", "pauses")
    assert [(p["kind"], p["name"]) for p in __import__("json").loads(out)] == [
        ("workflow", "billing"),
        ("action", "charge"),
    ]
    assert claim(cyclone_server, "charge") == []
    assert run("resume", "workflow", "billing")[0] == 0
    assert run("resume", "action", "charge")[0] == 0
    assert "nothing is paused" in run("pauses")[1]
    assert [s.node for s in claim(cyclone_server, "charge")] == ["a"]
    code, _ = run("pause", "workflow", "bad name")
    assert code == 1
    code, _ = run("pause", "run", str(uuid.uuid4()))
    assert code == 1


def test_the_python_clients_pause_and_resume(cyclone_server: Any) -> None:
    import asyncio

    from pyclient import AsyncClient, Client

    run_id = submit(cyclone_server, workflow("w", node("a")))
    with Client(cyclone_server.address, actor="dana") as client:
        paused = client.pause_run(run_id, "why not")
        assert paused.changed and paused.run.pause is not None
        assert paused.run.pause.actor == "dana" and paused.run.pause.reason == "why not"
        assert client.get_run(run_id).pause is not None
        assert client.explain(run_id, "a").reason == "paused"
        assert not client.pause_run(run_id).changed
        assert client.resume_run(run_id).run.pause is None
        held = client.pause_action("work", "later")
        assert held.changed and held.pause is not None and held.pause.actor == "dana"
        assert [p.name for p in client.list_pauses()] == ["work"]

    async def async_side() -> None:
        async with AsyncClient(cyclone_server.address, actor="dana") as client:
            assert (await client.resume_action("work")).changed
            assert (await client.pause_workflow("w")).changed
            assert [p.kind for p in await client.list_pauses()] == ["workflow"]
            assert (await client.resume_workflow("w")).changed
            assert (await client.pause_run(run_id)).changed
            assert (await client.resume_run(run_id)).changed

    asyncio.run(async_side())
    assert [s.node for s in claim(cyclone_server)] == ["a"]
