"""Patch markers: patched() and deprecate_patch() let a durable function's step calls
change while runs recorded by the old code are in flight. In memory (pyclient.testing)
for the rules, then against a real server with real worker processes restarted on new
code: a run in flight keeps the old path, a new run takes the new one, both complete."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyclient import (
    Client,
    InvalidPatch,
    OutsideHandler,
    ReplayMismatch,
    StepCallStatus,
    current,
    patched,
    step,
    testing,
)
from tests.helpers import PATIENCE, eventually
from tests.sdk import patch_bodies
from tests.sdk.conftest import running
from tests.sdk.patch_bodies import VERSIONS

WORKER_SCRIPT = Path(__file__).with_name("patch_worker_process.py")


class Deploy:
    """The code a node in memory runs: ``version`` names a body of patch_bodies, and
    changing it is a deploy under the runs in flight."""

    def __init__(self, version: str):
        self.version = version

        def order(ctx: Any, order: str) -> Any:
            return VERSIONS[self.version](ctx, order)

        async def order_async(ctx: Any, order: str) -> Any:
            return await VERSIONS[self.version](ctx, order)

        self.order, self.order_async = order, order_async


def markers(journal: Any) -> list[tuple[int, str, str, Any]]:
    return [
        (e.seq, e.step_id, e.function, e.output) for e in journal if e.step_id.startswith("patch:")
    ]


def step_ids(journal: Any) -> list[str]:
    return [e.step_id for e in journal]


# -- the rules, in memory


def test_a_run_in_flight_keeps_the_old_path_and_a_new_run_records_the_patch() -> None:
    deploy = Deploy("v1")
    old = testing.DurableNode(deploy.order, input="o-1")
    assert old.run().status == "waiting"
    deploy.version = "v2"  # deployed while old waits for its event
    new = testing.DurableNode(deploy.order, input="o-2")
    assert new.run().status == "waiting"
    assert old.run().status == "waiting"  # replays on v2: still the old path
    old.send_event("go")
    new.send_event("go")
    # The patch before the wait: old went past it on v1. The one after: both reach it on v2.
    assert old.run().output == ["reserve:o-1", "notify:o-1", "charge:o-1"]
    assert new.run().output == ["reserve:o-2", "check_fraud:o-2", "notify:o-2", "charge:o-2"]
    assert step_ids(old.journal) == ["reserve", "event:go", "patch:notify", "notify", "charge"]
    assert markers(new.journal) == [
        (2, "patch:fraud", "cyclone.patch", True),
        (5, "patch:notify", "cyclone.patch", True),
    ]
    assert old.executions["check_fraud"] == 0 and new.executions["check_fraud"] == 1


def test_without_a_patch_the_same_change_fails_the_run_in_flight_naming_both_calls() -> None:
    deploy = Deploy("v1")
    old = testing.DurableNode(deploy.order, input="o-1")
    assert old.run().status == "waiting"
    deploy.version = "breaking"
    attempt = old.run()
    assert attempt.status == "failed" and isinstance(attempt.error, ReplayMismatch)
    message = str(attempt.error)
    assert "call #2 recorded step 'event:go' of cyclone.event" in message
    assert "this replay makes step 'check_fraud' of check_fraud there" in message
    assert "patched(ID)" in message and "deprecate_patch(ID)" in message
    assert "pin the runs in flight" in message
    assert "docs/durable-functions.md#changing-code-safely" in message


def test_a_marker_replays_as_the_new_path_on_every_attempt_and_after_a_crash() -> None:
    deploy = Deploy("v2")
    node = testing.DurableNode(deploy.order, input="o-1")
    assert node.run(crash="patch:fraud", when="before_record").status == "crashed"
    assert node.run().status == "waiting"  # the marker was not recorded: new territory
    assert node.run().status == "waiting"  # replayed from the marker now
    node.send_event("go")
    assert node.run().output == ["reserve:o-1", "check_fraud:o-1", "notify:o-1", "charge:o-1"]
    assert node.executions["check_fraud"] == 1


def test_the_deprecation_path_replays_runs_from_before_and_after_it() -> None:
    deploy = Deploy("v2")
    patched_run = testing.DurableNode(deploy.order, input="o-1")
    assert patched_run.run().status == "waiting"  # recorded the marker of fraud
    deploy.version = "v3"  # the old branch is gone; deprecate_patch("fraud") holds its place
    fresh = testing.DurableNode(deploy.order, input="o-2")
    assert fresh.run().status == "waiting"
    for node in (patched_run, fresh):
        node.send_event("go")
    assert patched_run.run().output == [
        "reserve:o-1",
        "check_fraud:o-1",
        "notify:o-1",
        "charge:o-1",
    ]
    assert fresh.run().output == ["reserve:o-2", "check_fraud:o-2", "notify:o-2", "charge:o-2"]
    assert "patch:fraud" in step_ids(patched_run.journal)
    assert "patch:fraud" not in step_ids(fresh.journal)  # deprecate_patch records nothing
    assert patched_run.executions["check_fraud"] == 1  # replayed, not run again


def test_a_patch_id_checked_twice_fails_the_node_for_good() -> None:
    node = testing.DurableNode(VERSIONS["twice"], input="o-1")
    attempt = node.run_to_end()
    assert attempt.status == "failed" and not attempt.retryable
    assert isinstance(attempt.error, InvalidPatch)
    assert "patch 'fraud' is checked twice" in str(attempt.error)
    assert len(node.attempts) == 1


@pytest.mark.parametrize("bad", ["", "x" * 191, "tab\there"])
def test_a_bad_patch_id_fails_the_node_for_good(bad: str) -> None:
    def body(ctx: Any) -> bool:
        return patched(bad)

    attempt = testing.DurableNode(body).run_to_end()
    assert attempt.status == "failed" and isinstance(attempt.error, InvalidPatch)
    assert not attempt.retryable


def test_patched_outside_a_durable_function_is_refused() -> None:
    with pytest.raises(OutsideHandler):
        patched("x")


def test_an_async_body_takes_the_patch_as_a_sync_one_does() -> None:
    deploy = Deploy("async-v1")
    old = testing.DurableNode(deploy.order_async, input="o-1")
    assert old.run().status == "waiting"
    deploy.version = "async-v2"
    new = testing.DurableNode(deploy.order_async, input="o-2")
    assert new.run().status == "waiting"
    for node in (old, new):
        node.send_event("go")
    assert old.run().output == ["reserve:o-1", "charge:o-1"]
    assert new.run().output == ["reserve:o-2", "check_fraud:o-2", "charge:o-2"]
    assert markers(new.journal) == [(2, "patch:fraud", "cyclone.patch", True)]


def test_a_run_whose_later_async_call_was_recorded_first_keeps_the_old_path() -> None:
    """Old code started two calls together; the second was recorded, the first not
    (the worker died). Code with a patch in front of them must take the old branch:
    the run went past this point on the old code, though its seq has no entry."""

    calls: list[str] = []

    @step(name="first")
    async def first() -> str:
        calls.append("first")
        return "a"

    @step(name="second")
    async def second() -> str:
        calls.append("second")
        return "b"

    @step(name="new_step")
    async def new_step() -> str:
        calls.append("new_step")
        return "n"

    async def body(ctx: Any) -> list[str]:
        done = []
        if patched("pre"):
            done.append(await new_step())
        done += await asyncio.gather(first(), second())
        return done

    journal = [
        {"step_id": "second", "seq": 2, "function": "second", "status": "succeeded", "output": "b"}
    ]
    report = testing.replay(body, {"nodes": [_exported(journal)]})
    # The old path: first is call #1 (unanswered: the replay stops there), second #2.
    assert report.ok and report.results[0].stopped_at == "call #1 'first' (first)"
    assert calls == []
    # A new run, with nothing recorded, takes the patch.
    node = testing.DurableNode(body)
    assert node.run().output == ["n", "a", "b"]
    assert step_ids(node.journal) == ["patch:pre", "new_step", "first", "second"]


def _exported(journal: list[dict[str, Any]], action: str = "node") -> dict[str, Any]:
    return {"run_id": "r-1", "node": action, "action": action, "journal": journal}


# -- a real server, real worker processes, a deploy between them


@pytest.fixture
def deploy(cyclone_server, tmp_path) -> Iterator[Callable[..., Any]]:
    """Start a worker process on ``version`` (stopping the one before: a deploy);
    returns the path of the log its steps write."""
    log = tmp_path / "steps.log"
    log.touch()
    current: list[subprocess.Popen[str]] = []

    def stop() -> None:
        for proc in current:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=PATIENCE)
            assert proc.returncode == 0, stderr
        current.clear()

    def start(version: str, async_version: str = "async-v1") -> Path:
        stop()
        args = [sys.executable, str(WORKER_SCRIPT), cyclone_server.address, str(log)]
        proc = subprocess.Popen(
            [*args, version, async_version],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        current.append(proc)
        return log

    try:
        yield start
    finally:
        for proc in current:
            proc.kill()
            proc.communicate()


def waiting(client: Client, run_id: str) -> bool:
    node = client.get_run(run_id).steps[0]
    return node.status == "available" and node.waiting_for == "event go"


def ran(log: Path, run_id: str) -> list[str]:
    return [line.split()[1] for line in log.read_text().splitlines() if line.startswith(run_id)]


@pytest.mark.slow
def test_a_worker_restarted_on_patched_code_finishes_old_and_new_runs(client, deploy) -> None:
    log = deploy("v1")
    old = client.start("order", "o-1")
    eventually(lambda: waiting(client, old), "the old run waiting for its event")
    deploy("v2")  # the new code, while the old run waits
    new = client.start("order", "o-2")
    eventually(lambda: waiting(client, new), "the new run waiting for its event")
    for run_id in (old, new):
        client.send_event(run_id, "go")
    old_run, new_run = (client.wait(r, timeout=PATIENCE) for r in (old, new))
    assert old_run.status == new_run.status == "completed", (old_run.error, new_run.error)
    assert old_run.steps[0].output == ["reserve:o-1", "notify:o-1", "charge:o-1"]
    assert new_run.steps[0].output == [
        "reserve:o-2",
        "check_fraud:o-2",
        "notify:o-2",
        "charge:o-2",
    ]
    assert ran(log, old) == ["reserve", "notify", "charge"]
    assert ran(log, new) == ["reserve", "check_fraud", "notify", "charge"]
    # The markers, as the server keeps them (what a worker in any language reads).
    assert markers(old_run.steps[0].journal) == [(3, "patch:notify", "cyclone.patch", True)]
    assert markers(new_run.steps[0].journal) == [
        (2, "patch:fraud", "cyclone.patch", True),
        (5, "patch:notify", "cyclone.patch", True),
    ]
    marker = new_run.steps[0].journal[1]
    assert marker.status == StepCallStatus.SUCCEEDED and not marker.unsafe_to_repeat


@pytest.mark.slow
def test_the_deprecation_path_against_a_server(client, deploy) -> None:
    log = deploy("v2")
    before = client.start("order", "o-1")
    eventually(lambda: waiting(client, before), "the run on v2 waiting")
    deploy("v3")  # fraud's old branch deleted, deprecate_patch("fraud") in its place
    after = client.start("order", "o-2")
    eventually(lambda: waiting(client, after), "the run on v3 waiting")
    for run_id in (before, after):
        client.send_event(run_id, "go")
    runs = [client.wait(r, timeout=PATIENCE) for r in (before, after)]
    assert [r.status for r in runs] == ["completed", "completed"], [r.error for r in runs]
    assert [e.step_id for e in runs[0].steps[0].journal][:3] == [
        "reserve",
        "patch:fraud",
        "check_fraud",
    ]
    assert "patch:fraud" not in [e.step_id for e in runs[1].steps[0].journal]
    assert ran(log, before) == ["reserve", "check_fraud", "notify", "charge"]
    assert ran(log, after) == ["reserve", "check_fraud", "notify", "charge"]


@pytest.mark.slow
def test_an_async_body_restarted_on_patched_code(client, deploy) -> None:
    log = deploy("v1", "async-v1")
    old = client.start("order_async", "o-1")
    eventually(lambda: waiting(client, old), "the old async run waiting")
    deploy("v1", "async-v2")
    new = client.start("order_async", "o-2")
    eventually(lambda: waiting(client, new), "the new async run waiting")
    for run_id in (old, new):
        client.send_event(run_id, "go")
    old_run, new_run = (client.wait(r, timeout=PATIENCE) for r in (old, new))
    assert old_run.status == new_run.status == "completed", (old_run.error, new_run.error)
    assert ran(log, old) == ["reserve", "charge"]
    assert ran(log, new) == ["reserve", "check_fraud", "charge"]
    assert markers(new_run.steps[0].journal) == [(2, "patch:fraud", "cyclone.patch", True)]


@pytest.mark.slow
def test_a_duplicate_patch_id_fails_the_node_for_good_on_a_server(client, deploy) -> None:
    deploy("twice")
    run = client.wait(client.start("order", "o-1"), timeout=PATIENCE)
    assert run.status == "failed"
    node = run.steps[0]
    assert node.attempt == 1  # not retried
    assert node.last_error is not None and node.last_error.type == "InvalidPatch"
    assert "patch 'fraud' is checked twice" in node.last_error.message


def test_patch_bodies_are_all_named() -> None:
    assert set(VERSIONS) >= {"v1", "v2", "v3", "breaking", "twice", "async-v1", "async-v2"}
    assert patch_bodies.v2 is VERSIONS["v2"]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_a_new_marker_is_recorded_before_the_next_call_runs(
    cyclone_server, client, make_worker, is_async
) -> None:
    """A call may record itself outside the order of the ends (its own transaction, a
    child's start): were it recorded and the marker before it lost in a crash, a replay
    would see a later entry and no marker, and take the old path. So the first call
    after a new marker runs once the marker is recorded: the step reads its own
    journal from the server and finds the marker there."""
    seen: list[list[str]] = []

    def journal_now() -> list[str]:
        with Client(cyclone_server.address) as reader:
            run = reader.get_run(current().run_id)
        return [e.step_id for e in run.steps[0].journal]

    @step(name="look")
    def look() -> None:
        seen.append(journal_now())

    @step(name="look_async")
    async def look_async() -> None:
        seen.append(await asyncio.to_thread(journal_now))

    worker = make_worker()

    @worker.workflow("look_sync")
    def sync_body(ctx: Any) -> str:
        if patched("x"):
            look()
        return "done"

    @worker.workflow("look_async")
    async def async_body(ctx: Any) -> str:
        if patched("x"):
            await look_async()
        return "done"

    with running(worker):
        run = client.wait(client.start("look_async" if is_async else "look_sync"), timeout=PATIENCE)
    assert run.status == "completed", run.error
    assert seen == [["patch:x"]]
