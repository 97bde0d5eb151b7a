"""Child runs from durable functions against a real server and a real Worker:
start_child (sync and async bodies, a registered function, its name or a Workflow),
its journal entry, the parent link, the CLI's view, and cancelling the parent."""

from __future__ import annotations

import asyncio
import contextlib
import io
from typing import Any

import pytest

from pyclient import (
    ChildFailed,
    ChildRun,
    Client,
    NonRetryableError,
    RetryPolicy,
    Workflow,
    cli,
    start_child,
    testing,
)
from tests.helpers import eventually
from tests.sdk.conftest import running

pytestmark = pytest.mark.usefixtures("cyclone_server")


def run_cli(server: Any, *argv: str) -> tuple[int, str]:
    """The command line's exit status and output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--address", server.address, *argv])
    return int(code or 0), out.getvalue()


def doubling_kid(worker: Any) -> tuple[Any, Workflow]:
    """Registers the durable function "kid" (doubles its input's n) on ``worker``;
    returns it and the DAG "pair" of two kid nodes (n = 1, then n = 2)."""

    @worker.workflow("kid")
    def kid(ctx: Any, data: dict) -> dict:
        return {"double": data["n"] * 2}

    dag = Workflow("pair")
    dag.node("a", action="kid", input={"n": 1})
    dag.node("b", action="kid", input={"n": 2}, depends_on=["a"])
    return kid, dag


def test_a_body_starts_children_of_each_kind_once(client: Client, make_worker: Any) -> None:
    worker = make_worker()
    kid, dag = doubling_kid(worker)

    @worker.workflow("parent")
    def parent(ctx: Any, n: int) -> list[str]:
        children = [start_child(kid, {"n": n}), start_child("kid", {"n": n + 1})]
        children.append(start_child(dag, step_id="the-dag"))
        assert all(isinstance(c, ChildRun) for c in children)
        return [c.run_id for c in children]

    with running(worker):
        run = client.wait(client.start("parent", 5), timeout=20)
        assert run.status == "completed", run
        ids = run.step("parent").output
        assert len(set(ids)) == 3
        for run_id in ids:
            child = client.wait(run_id, timeout=20)
            assert child.status == "completed", child
            assert (child.parent_run_id, child.parent_node) == (run.run_id, "parent")
    assert [client.get_run(i).parent_step_id for i in ids] == ["child", "child#2", "the-dag"]
    assert [client.get_run(i).workflow for i in ids] == ["kid", "kid", "pair"]
    assert client.get_run(ids[0]).step("kid").output == {"double": 10}
    journal = client.get_run(run.run_id).step("parent").journal
    assert [(c.step_id, c.function) for c in journal] == [
        ("child", "cyclone.start_child"),
        ("child#2", "cyclone.start_child"),
        ("the-dag", "cyclone.start_child"),
    ]
    assert [c for _, _, c in client.get_run(run.run_id).children] == ids


def test_an_async_body_awaits_its_start(client: Client, make_worker: Any) -> None:
    worker = make_worker()

    @worker.workflow("kid")
    async def kid(ctx: Any, data: dict) -> int:
        return int(data["n"])

    @worker.workflow("parent")
    async def parent(ctx: Any, n: int) -> str:
        child = await start_child("kid", {"n": n})
        again = await child  # awaiting twice is harmless
        return again.run_id

    with running(worker):
        run = client.wait(client.start("parent", 7), timeout=20)
        assert run.status == "completed", run
        child_id = run.step("parent").output
        assert client.wait(child_id, timeout=20).step("kid").output == 7


def test_a_failed_attempt_replays_its_start(client: Client, make_worker: Any) -> None:
    worker = make_worker()
    attempts: list[str] = []

    @worker.workflow("kid")
    def kid(ctx: Any) -> None:
        return None

    @worker.workflow("parent")
    def parent(ctx: Any) -> str:
        child = start_child("kid")
        attempts.append(child.run_id)
        if ctx.attempt == 1:
            raise ConnectionError("try again")
        return child.run_id

    wf = Workflow("parent")
    wf.node("parent", retry=RetryPolicy(max_attempts=2, initial_backoff=0, max_backoff=0))
    with running(worker):
        run = client.wait(client.submit(wf), timeout=20)
    assert run.status == "completed", run
    assert len(attempts) == 2 and attempts[0] == attempts[1]
    assert run.step("parent").output == attempts[0]
    assert len(client.list_runs(workflow="kid").runs) == 1


def test_start_child_outside_a_durable_function_is_refused() -> None:
    with pytest.raises(RuntimeError, match="durable function"):
        start_child("kid")


def test_a_bad_child_is_refused_before_anything_is_sent(client: Client, make_worker: Any) -> None:
    worker = make_worker()
    seen: list[str] = []

    @worker.workflow("parent")
    def parent(ctx: Any) -> str:
        for bad in (42, "bad name!"):
            try:
                start_child(bad)
            except Exception as exc:
                seen.append(type(exc).__name__)
        try:
            start_child("kid", object())
        except Exception as exc:
            seen.append(type(exc).__name__)
        return "ok"

    with running(worker):
        run = client.wait(client.start("parent"), timeout=20)
    assert run.status == "completed", run
    assert seen == ["InvalidArgument", "InvalidArgument", "InvalidArgument"]
    assert client.get_run(run.run_id).step("parent").journal == ()


def test_cancelling_the_parent_cancels_the_child_unless_kept(
    client: Client, make_worker: Any
) -> None:
    """Parents that stay running after their body started a child: their second node
    waits for a worker that never comes, and so do the children."""
    worker = make_worker()

    @worker.workflow("starter")
    def starter(ctx: Any) -> str:
        return start_child("nobody_serves_this").run_id

    wf = Workflow("parent")
    wf.node("start", action="starter")
    wf.node("then", action="nobody_serves_this", depends_on=["start"])
    with running(worker):
        first, second = (client.submit(wf) for _ in range(2))
        children = []
        for run_id in (first, second):
            [child] = _eventually_children(client, run_id)
            children.append(child)
    client.cancel(first, "changed my mind")
    client.cancel(second, "keep the child", keep_children=True)
    assert client.get_run(children[0]).status == "cancelled"
    assert client.get_run(children[1]).status == "running"
    [audit] = client.get_run(children[0]).audit
    assert audit.action == "cancel" and first in audit.reason


def _eventually_children(client: Client, run_id: str) -> list[str]:
    def started() -> list[str]:
        return [c for _, _, c in client.get_run(run_id).children]

    return eventually(started, f"run {run_id} to start its child")


def test_the_cli_shows_parent_and_children(
    cyclone_server: Any, client: Client, make_worker: Any
) -> None:
    worker = make_worker()

    @worker.workflow("parent")
    def parent(ctx: Any) -> str:
        return start_child("nobody_serves_this").run_id

    with running(worker):
        run = client.wait(client.start("parent"), timeout=20)
    child_id = run.step("parent").output
    code, out = run_cli(cyclone_server, "run", "show", run.run_id)
    assert code == 0
    assert f"child run {child_id}  (node parent, step call child)" in out
    code, out = run_cli(cyclone_server, "run", "show", child_id)
    assert code == 0
    assert f"child of run {run.run_id}, node parent, step call child" in out


def test_durable_node_records_children_in_memory() -> None:
    def parent(ctx: Any, n: int) -> str:
        return start_child("kid", {"n": n}).run_id

    node = testing.DurableNode(parent, input=3)
    first = node.run(crash=testing.END)
    assert first.status == "crashed" and list(first.ran) == ["child"]
    again = node.run()
    assert again.status == "completed" and list(again.replayed) == ["child"]
    [entry] = node.journal
    assert again.output == entry.output["run_id"]


def test_a_body_awaits_its_children_with_one_worker_slot(client: Client, make_worker: Any) -> None:
    """One slot: the parent gives it up while it waits, so its children run in it."""
    worker = make_worker(concurrency=1)
    kid, dag = doubling_kid(worker)

    @worker.workflow("parent")
    def parent(ctx: Any, n: int) -> dict:
        one = start_child(kid, {"n": n})
        pair = start_child(dag, {"n": 0})
        return {"one": one.result(), "pair": pair.result(), "again": one.result()}

    with running(worker):
        run = client.wait(client.start("parent", 5), timeout=20)
    assert run.status == "completed", run
    assert run.step("parent").output == {
        "one": {"double": 10},
        "pair": {"a": {"double": 2}, "b": {"double": 4}},
        "again": {"double": 10},
    }
    step = run.step("parent")
    assert [c.step_id for c in step.journal] == [
        "child",
        "child#2",
        "child.result",
        "child#2.result",
    ]
    assert step.resumes >= 1  # it gave its slot up at least once


def test_an_async_body_awaits_a_failed_child(client: Client, make_worker: Any) -> None:
    worker = make_worker()

    @worker.workflow("kid")
    async def kid(ctx: Any) -> None:
        raise NonRetryableError("no rooms left")

    @worker.workflow("parent")
    async def parent(ctx: Any) -> dict:
        child = await start_child("kid")
        try:
            await child.result()
        except ChildFailed as failed:
            return {
                "type": failed.type_name,
                "message": failed.message,
                "run": failed.run_id,
                "node": failed.child_node,
                "kind": failed.child_error.get("kind"),
            }
        return {"type": None}

    with running(worker):
        run = client.wait(client.start("parent"), timeout=20)
    assert run.status == "completed", run
    out = run.step("parent").output
    assert out["type"] == "ChildFailed" and "discarded" in out["message"]
    assert (out["node"], out["kind"]) == ("kid", "StepDiscarded")
    assert client.get_run(out["run"]).status == "failed"


def test_a_cancelled_child_raises_child_cancelled(client: Client, make_worker: Any) -> None:
    worker = make_worker()

    @worker.workflow("parent")
    def parent(ctx: Any) -> str:
        child = start_child("nobody_serves_this")
        try:
            child.result()
        except ChildFailed as failed:
            return f"{failed.type_name}: {failed.message}"
        return "finished"

    with running(worker):
        parent_id = client.start("parent")
        [child_id] = _eventually_children(client, parent_id)
        eventually(
            lambda: client.get_run(parent_id).step("parent").waiting_for == f"child {child_id}",
            "the parent to wait for its child",
        )
        client.cancel(child_id, "not needed")
        run = client.wait(parent_id, timeout=20)
    assert run.status == "completed", run
    assert run.step("parent").output.startswith("ChildCancelled: ")
    assert "not needed" in run.step("parent").output


def test_durable_node_runs_a_childs_wait_in_memory() -> None:
    def parent(ctx: Any, n: int) -> Any:
        child = start_child("kid", {"n": n})
        try:
            return child.result()
        except ChildFailed as failed:
            return f"{failed.type_name} {failed.child_node}".strip()

    node = testing.DurableNode(parent, input=3)
    assert node.run().status == "waiting"
    assert list(node.children.values()) == [("kid", {"n": 3})]
    node.finish_child(output={"double": 6})
    done = node.run()
    assert done.status == "completed" and done.output == {"double": 6}

    for finish, expected in (
        ({"error": "boom"}, "ChildFailed kid"),
        ({"cancelled": True}, "ChildCancelled"),
    ):
        other = testing.DurableNode(parent, input=1)
        other.run()
        other.finish_child(**finish)
        assert other.run().output == expected


def test_an_async_body_gathers_the_results_of_two_children(
    client: Client, make_worker: Any
) -> None:
    worker = make_worker()

    @worker.workflow("kid")
    async def kid(ctx: Any, data: dict) -> int:
        return int(data["n"]) * 10

    @worker.workflow("parent")
    async def parent(ctx: Any) -> list[int]:
        a = await start_child(kid, {"n": 1})
        b = await start_child(kid, {"n": 2})
        return list(await asyncio.gather(a.result(), b.result()))

    with running(worker):
        run = client.wait(client.start("parent"), timeout=20)
    assert run.status == "completed", run
    assert run.step("parent").output == [10, 20]
    journal = [(c.seq, c.step_id) for c in run.step("parent").journal]
    assert journal == [(1, "child"), (2, "child#2"), (3, "child.result"), (4, "child#2.result")]
