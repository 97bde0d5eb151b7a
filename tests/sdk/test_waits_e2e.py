"""Durable sleep and events against a real server and a real Worker: a body that sleeps
gives up its slot and resumes without using up attempts; events sent before and after
the wait; timeouts; each event consumed once; sync and async bodies."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import threading
from typing import Any

import pytest

from pyclient import (
    Client,
    EventTimeout,
    RetryPolicy,
    StepCallStatus,
    Workflow,
    cli,
    sleep,
    sleep_until,
    step,
    wait_for_event,
)
from pyclient.errors import OutsideHandler
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running

pytestmark = pytest.mark.usefixtures("cyclone_server")


class Effects:
    """Steps that count their calls; ``flaky`` fails its first call."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

        @step
        def before(x: Any) -> Any:
            self.calls["before"] += 1
            return x

        @step
        def after(x: Any) -> Any:
            self.calls["after"] += 1
            return x

        @step
        def flaky() -> str:
            self.calls["flaky"] += 1
            if self.calls["flaky"] == 1:
                raise ConnectionError("reset")
            return "ok"

        @step
        def cleanup(why: str) -> str:
            self.calls["cleanup"] += 1
            return why

        self.before, self.after, self.flaky, self.cleanup = before, after, flaky, cleanup


def waiting_for(client: Client, run_id: str, what: str) -> bool:
    step = client.get_run(run_id).steps[0]
    return step.waiting_for == what and step.status == "available"


def test_a_sync_body_sleeps_gives_up_its_slot_and_resumes_without_using_up_attempts(
    client, make_worker
):
    fx = Effects()
    worker = make_worker(concurrency=1)

    @worker.workflow("nap")
    def nap(ctx: Any, x: int) -> dict:
        fx.before(x)
        sleep(0.5)
        fx.flaky()  # fails once: the body lets it through, the node is retried
        return {"x": fx.after(x), "attempt": ctx.attempt}

    @worker.action("quick")
    def quick(ctx: Any) -> str:
        return "done"

    with running(worker):
        # Two attempts allowed; the resume is a claim but not an attempt used up.
        run_id = client.start("nap", 7, retry=RetryPolicy(max_attempts=2, initial_backoff=0))
        eventually(lambda: waiting_for(client, run_id, "sleep"), "the sleep")
        # The only slot is free while the body sleeps.
        quick_flow = Workflow("quick")
        quick_flow.node("quick")
        other = client.submit(quick_flow)
        assert client.wait(other, timeout=PATIENCE).status == "completed"
        run = client.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", run.error
    node = run.steps[0]
    # Claims: the first (sleeps), the resume (flaky fails), the retry.
    assert node.attempt == 3 and node.resumes == 1 and node.output == {"x": 7, "attempt": 3}
    assert fx.calls == {"before": 1, "flaky": 2, "after": 1}
    assert [(c.step_id, c.status) for c in node.journal] == [
        ("before", StepCallStatus.SUCCEEDED),
        ("sleep", StepCallStatus.SUCCEEDED),
        ("flaky", StepCallStatus.SUCCEEDED),
        ("after", StepCallStatus.SUCCEEDED),
    ]
    assert node.journal[1].function == "cyclone.sleep"
    assert node.journal[1].wake_at is not None


def test_an_async_body_sleeps_until_a_time_and_waits_for_events(client, make_worker):
    fx = Effects()
    worker = make_worker()

    @worker.workflow("async_flow")
    async def flow(ctx: Any, x: int) -> dict:
        fx.before(x)
        await sleep_until(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.3))
        first = await wait_for_event("go")
        second = await wait_for_event("go")
        return {"first": first, "second": second, "after": fx.after(x)}

    with running(worker):
        run_id = client.start("async_flow", 1)
        # Sent before any wait: kept.
        client.send_event(run_id, "go", {"n": 1})
        eventually(lambda: waiting_for(client, run_id, "event go"), "the second wait")
        client.send_event(run_id, "go", {"n": 2})
        run = client.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", run.error
    assert run.steps[0].output == {"first": {"n": 1}, "second": {"n": 2}, "after": 1}
    assert fx.calls == {"before": 1, "after": 1}
    assert [c.step_id for c in run.steps[0].journal] == [
        "before",
        "sleep",
        "event:go",
        "event:go#2",
        "after",
    ]


def test_an_event_timeout_raises_and_the_except_block_step_runs_once(client, make_worker):
    fx = Effects()
    worker = make_worker()

    @worker.workflow("approval")
    def approval(ctx: Any, order: str) -> str:
        fx.before(order)
        try:
            return str(wait_for_event("approved", timeout=0.3))
        except EventTimeout as timeout:
            assert timeout.type_name == "EventTimeout"
            fx.cleanup("timed out")
            sleep(0.2)  # a replay after this must raise the same timeout again
            return "cancelled"

    with running(worker):
        run = client.wait(client.start("approval", "o-1"), timeout=PATIENCE)
    assert run.status == "completed" and run.steps[0].output == "cancelled"
    assert fx.calls == {"before": 1, "cleanup": 1}
    entries = {c.step_id: c for c in run.steps[0].journal}
    assert entries["event:approved"].status == StepCallStatus.FAILED
    assert entries["event:approved"].error.type == "EventTimeout"
    assert run.steps[0].resumes == 2


def test_two_waiting_runs_each_consume_their_own_event_once(client, make_worker):
    worker = make_worker(concurrency=1)
    got: list[Any] = []
    lock = threading.Lock()

    @worker.workflow("consumer")
    def consumer(ctx: Any, _: Any) -> list[Any]:
        one = wait_for_event("item")
        two = wait_for_event("item")
        with lock:
            got.append((one, two))
        return [one, two]

    with running(worker):
        runs = [client.start("consumer", i) for i in range(2)]
        for run_id in runs:
            eventually(lambda r=run_id: waiting_for(client, r, "event item"), "a wait")
        for n, run_id in enumerate(runs):
            client.send_event(run_id, "item", f"{n}-a")
            client.send_event(run_id, "item", f"{n}-b")
        outputs = [client.wait(r, timeout=PATIENCE).steps[0].output for r in runs]
    assert outputs == [["0-a", "0-b"], ["1-a", "1-b"]]


def test_send_event_with_a_key_sends_once(client, make_worker):
    worker = make_worker()

    @worker.workflow("once")
    def once(ctx: Any, _: Any) -> Any:
        first = wait_for_event("e")
        try:
            second = wait_for_event("e", timeout=0.3)
        except EventTimeout:
            second = "none"
        return [first, second]

    run_id = client.start("once", None)
    first = client.send_event(run_id, "e", 1, key="k-1")
    again = client.send_event(run_id, "e", 2, key="k-1")
    assert first.created and not again.created and again.event_id == first.event_id
    with running(worker):
        run = client.wait(run_id, timeout=PATIENCE)
    # The repeat sent nothing: the second wait times out.
    assert run.status == "completed" and run.steps[0].output == [1, "none"]


def test_outside_a_durable_function_sleep_just_sleeps() -> None:
    assert sleep(0) is None

    async def main() -> None:
        await sleep(0)

    asyncio.run(main())
    with pytest.raises(OutsideHandler):
        wait_for_event("x")


def test_cyclone_event_send_and_run_show_of_a_waiting_node(client, make_worker, capsys):
    worker = make_worker()

    @worker.workflow("gate")
    def gate(ctx: Any, _: Any) -> Any:
        return wait_for_event("open", timeout=3600)

    with running(worker):
        run_id = client.start("gate", None)
        eventually(lambda: waiting_for(client, run_id, "event open"), "the wait")
        assert cli.main(["run", "show", run_id], client=client) == 0
        shown = capsys.readouterr().out
        [row] = [line for line in shown.splitlines() if line.startswith("gate ")]
        # Waiting, not resumed yet: one try under way of the policy's three.
        assert row.split()[1:5] == ["waiting", "attempt", "1", "(2"]
        assert "resume" not in shown
        assert "waiting for event open (send it with SendEvent" in row and " until " in row
        argv = ["event", "send", run_id, "open", "--payload", '{"door": 1}', "--key", "k"]
        assert cli.main(argv, client=client) == 0
        assert "sent to run" in capsys.readouterr().out
        assert cli.main(argv, client=client) == 0
        assert "already sent with key k" in capsys.readouterr().out
        run = client.wait(run_id, timeout=PATIENCE)
        assert cli.main(["run", "show", run_id], client=client) == 0
        # Finished: two claims, one try of the retry policy and one resume.
        assert "attempt 2 (try 1 of 3, 1 resumed)" in capsys.readouterr().out
    assert run.steps[0].output == {"door": 1}
    assert [(a.action, a.actor) for a in run.audit] == [("send_event", "sdk-tests")]


def test_a_dag_node_waits_for_an_event_with_no_worker(client, make_worker):
    worker = make_worker()

    @worker.action("ship")
    def ship(ctx: Any) -> Any:
        return {"shipped_after": ctx.upstream["approval"]}

    wf = Workflow.from_dict(
        {
            "name": "approve",
            "nodes": [
                {"name": "approval", "event": "approved", "event_timeout": 3600},
                {"name": "ship", "depends_on": ["approval"]},
            ],
        }
    )
    with running(worker):
        run_id = client.submit(wf)
        client.send_event(run_id, "approved", {"by": "ann"})
        run = client.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed"
    assert run.step("approval").output == {"by": "ann"}
    assert run.step("approval").action == "cyclone.event"
    assert run.step("ship").output == {"shipped_after": {"by": "ann"}}


def test_a_sync_step_of_an_async_body_that_sleeps_blocks_in_place(client, make_worker):
    worker = make_worker()

    @step
    def pause() -> str:
        assert sleep(0.01) is None  # a plain sleep: blocks, returns nothing
        return "paused"

    @worker.workflow("mixed")
    async def mixed(ctx: Any, _: Any) -> str:
        return str(pause())

    with running(worker):
        run = client.wait(client.start("mixed", None), timeout=PATIENCE)
    assert run.status == "completed" and run.steps[0].output == "paused"
