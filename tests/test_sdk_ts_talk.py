"""The TypeScript SDK talking to running work, against a real server: its client reads
a run's output streams (live, until the run ends) and lists them, queries and updates
durable functions, and lists and decides approvals; its bodies wait for approvals,
journaled as the Python SDK journals them, and answer queries and apply updates with
handlers they register, recorded as the Python SDK records them. They need Node.js
(marker `polyglot`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pyclient import Workflow
from pyclient.errors import FailedPrecondition, NotFound
from tests import test_polyglot as polyglot
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running
from tests.test_approvals import post
from tests.test_polyglot import ROOT, Process, _tool
from tests.test_queries_updates import _waiting
from tests.test_queries_updates import _worker as python_worker

pytestmark = [pytest.mark.slow, pytest.mark.polyglot, pytest.mark.timeout(600)]

# The fixtures of the polyglot tests, shared.
start_process = polyglot.start_process
ts_sdk = polyglot.ts_sdk
operator = polyglot.operator

CLIENT = ROOT / "tests" / "ts_talk_client.mjs"
WORKER = ROOT / "tests" / "ts_talk_worker.mjs"


@pytest.fixture
def cyclone_server(server_factory: Any) -> Any:
    """A server with an HTTP listener: approvals' URLs are on it."""
    return server_factory(http_listen="127.0.0.1:0")


@pytest.fixture
def ts_client(cyclone_server, ts_sdk) -> Callable[..., Any]:
    """Runs one command of tests/ts_talk_client.mjs; its JSON lines (one value for one line)."""

    def call(*args: str) -> Any:
        out = subprocess.run(
            [_tool("node"), str(CLIENT), cyclone_server.address, *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert out.returncode in (0, 3), out.stdout + out.stderr
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        return lines[0] if len(lines) == 1 else lines

    return call


@pytest.fixture
def ts_worker(cyclone_server, start_process, ts_sdk) -> Process:
    return start_process("ts-talk-worker", _tool("node"), WORKER, cyclone_server.address)


def _lines(process: Process) -> list[Any]:
    return [json.loads(line) for line in process.log.splitlines() if line.startswith("{")]


# -- output streams ----------------------------------------------------------------------


def test_a_ts_client_reads_a_stream_live_until_the_run_ends(
    cyclone_server, ts_worker, ts_client, start_process, operator
):
    wf = Workflow("emitting")
    wf.node("body", action="ts.emitter")
    run_id = operator.submit(wf, None)
    reader = start_process(
        "ts-reader", _tool("node"), CLIENT, cyclone_server.address, "stream", run_id, "tokens"
    )
    eventually(
        lambda: len(_lines(reader)) >= 2,
        "the reader to get the chunks stored before the wait",
        PATIENCE,
        detail=lambda: reader.log + ts_worker.log,
    )
    [listed] = ts_client("streams", run_id)
    assert (listed["name"], listed["chunks"]) == ("tokens", 2)
    assert listed["bytes"] > 0
    assert reader.popen.poll() is None  # the run is not finished: the read goes on

    operator.send_event(run_id, "go")
    assert operator.wait(run_id, timeout=PATIENCE).status == "completed", ts_worker.log
    assert reader.popen.wait(PATIENCE) == 0, reader.log
    chunks = _lines(reader)
    assert chunks[-1] == {"end": True}
    assert [(c["offset"], c["kind"], c["value"], c["stepId"]) for c in chunks[:-1]] == [
        (0, "text", "hello", ""),
        (1, "json", {"n": 1}, "mark"),
        (2, "text", "bye", ""),
    ]
    assert {c["node"] for c in chunks[:-1]} == {"body"}

    # From an offset, without waiting; a stream nobody wrote is empty.
    later = ts_client("stream", run_id, "tokens", "1", "--no-wait")
    assert [c["value"] for c in later[:-1]] == [{"n": 1}, "bye"]
    assert ts_client("stream", run_id, "nothing", "0", "--no-wait") == {"end": True}
    ts_worker.stop()


def test_a_ts_client_names_an_unknown_run_with_its_status(ts_client):
    unknown = "00000000-0000-0000-0000-000000000000"
    assert ts_client("streams", unknown)["error"] == "NotFound"
    assert ts_client("stream", unknown, "tokens")["error"] == "NotFound"


# -- queries and updates -----------------------------------------------------------------


def test_a_ts_client_queries_and_updates_a_durable_function(cyclone_server, ts_client, operator):
    with running(python_worker(cyclone_server.address)):
        run_id = operator.start("cart", "ann")
        eventually(lambda: _waiting(operator, run_id, "cart"), "the body waits for checkout")

        first = ts_client("update", run_id, "cart", "add_item", '["apple"]', "u-1")
        assert (first["result"], first["updateId"], first["created"]) == (1, "u-1", True)
        second = ts_client("update", run_id, "cart", "add_item", '["pear"]')
        assert second["result"] == 2 and second["created"] and second["updateId"] != "u-1"
        again = ts_client("update", run_id, "cart", "add_item", '["apple"]', "u-1")
        assert (again["result"], again["created"], again["seq"]) == (1, False, first["seq"])

        def both() -> Any:
            answer = ts_client("query", run_id, "cart", "items")
            return answer if answer.get("result") == ["apple", "pear"] else None

        answer = eventually(both, "the items after the updates")
        assert set(answer) == {"result", "published", "publishedAt"}

        # Refusals carry their status.
        unknown = ts_client("query", run_id, "cart", "nope")
        assert unknown["error"] == "FailedPrecondition"
        assert "published no value for query 'nope'" in unknown["message"]
        nowhere = ts_client("query", run_id, "nowhere", "items")
        assert nowhere["error"] == "NotFound" and "has no node nowhere" in nowhere["message"]
        missing = ts_client("update", run_id, "cart", "remove_item", '["apple"]')
        assert missing["error"] == "NotFound"
        assert "no update handler 'remove_item'" in missing["message"]
        refused = ts_client("update", run_id, "cart", "add_item", '[""]')
        assert refused["error"] == "FailedPrecondition"
        assert "an item needs a name" in refused["message"]

        operator.send_event(run_id, "checkout")
        run = operator.wait(run_id, timeout=PATIENCE)
        assert run.step("cart").output == {"user": "ann", "items": ["apple", "pear"]}


# -- approvals ---------------------------------------------------------------------------


def _sent(worker: Process, run_id: str) -> list[dict[str, Any]]:
    return [line for line in _lines(worker) if line.get("run") == run_id and "sent" in line]


def test_a_ts_body_waits_for_approvals_sent_once_and_decided_by_a_ts_client_and_a_url(
    cyclone_server, ts_worker, ts_client, operator
):
    wf = Workflow("approving")
    wf.node("body", action="ts.approve")
    run_id = operator.submit(wf, {"amount": 20})
    eventually(lambda: _sent(ts_worker, run_id), "the body to send its first URL", PATIENCE)

    [pending] = eventually(
        lambda: ts_client("approvals", run_id) or None, "the pending approval", PATIENCE
    )
    assert (pending["stepId"], pending["title"], pending["node"]) == (
        "approval",
        "refund 20",
        "body",
    )
    assert "decidedAt" not in pending and pending["decision"] is None
    decided = ts_client("decide", pending["approvalId"], "yes", "fine")
    assert decided["decidedBy"] == "ts-client"
    assert decided["decision"] == {"approved": True, "comment": "fine", "decided_by": "ts-client"}
    again = ts_client("decide", pending["approvalId"], "no")
    assert again["error"] == "FailedPrecondition"

    # The second approval, by its URL.
    eventually(
        lambda: len(_sent(ts_worker, run_id)) == 2, "the body to send its second URL", PATIENCE
    )
    second = _sent(ts_worker, run_id)[1]
    assert second["step"] == "boss"
    status, answer = post(second["sent"], {"approved": False})
    assert status == 200 and answer["status"] == "decided", answer

    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", ts_worker.log
    assert run.step("body").output == {
        "first": {"approved": True, "comment": "fine", "decided_by": "ts-client"},
        "second": {"approved": False},
    }
    # Each URL was sent once: the replays after each wait sent nothing.
    assert [s["step"] for s in _sent(ts_worker, run_id)] == ["approval", "boss"]
    journal = run.step("body").journal
    assert [(c.step_id, c.function) for c in journal] == [
        ("approval", "cyclone.approval"),
        ("approval.wait", "cyclone.event"),
        ("boss", "cyclone.approval"),
        ("boss.wait", "cyclone.event"),
    ]
    # What the approval call records is what the Python SDK records (never the token).
    asked = journal[0].output
    assert set(asked) == {"approval_id", "event", "expires_at"}
    assert asked["approval_id"] == pending["approvalId"]
    assert asked["event"] == f"approval:{pending['approvalId']}"
    expires = dt.datetime.fromisoformat(asked["expires_at"])
    assert dt.timedelta(minutes=50) < expires - dt.datetime.now(dt.UTC) <= dt.timedelta(hours=1)
    listed = ts_client("approvals", run_id, "--all")
    assert sorted(a["decidedBy"] for a in listed) == ["callback", "ts-client"]
    ts_worker.stop()


# -- query and update handlers of a TypeScript body ---------------------------------------


def test_a_ts_body_applies_updates_at_its_wait_records_them_and_publishes_its_queries(
    cyclone_server, ts_worker, ts_client, operator
):
    wf = Workflow("ts-cart")
    wf.node("body", action="ts.cart")
    run_id = operator.submit(wf, "ann")
    eventually(
        lambda: _waiting(operator, run_id, "body"),
        "the body waits for checkout",
        PATIENCE,
        detail=lambda: ts_worker.log,
    )

    first = operator.update(run_id, "body", "add_item", "apple", update_id="u-1")
    assert (first.result, first.update_id, first.created) == (1, "u-1", True)
    second = ts_client("update", run_id, "body", "add_item", '["pear"]')
    assert second["result"] == 2 and second["created"] and second["updateId"] != "u-1"
    again = operator.update(run_id, "body", "add_item", "apple", update_id="u-1")
    assert (again.result, again.created, again.seq) == (1, False, first.seq)

    # Once the node waits again (no worker runs it): the value its body last published.
    eventually(lambda: _waiting(operator, run_id, "body"), "the body waits again", PATIENCE)

    def published_both() -> Any:
        answer = operator.query(run_id, "body", "items")
        return answer if answer.result == ["apple", "pear"] else None

    answer = eventually(published_both, "the published items", PATIENCE)
    assert answer.published and answer.published_at is not None

    # The journal records each application once, as the Python SDK records it.
    journal = operator.get_run(run_id).step("body").journal
    updates = [e for e in journal if e.function == "cyclone.update"]
    assert [e.step_id for e in updates] == ["update:u-1", f"update:{second['updateId']}"]
    assert updates[0].output == {"update": "add_item", "args": ["apple"], "result": 1}
    assert [e.seq for e in updates] == [first.seq, second["seq"]]

    with pytest.raises(NotFound, match="no update handler"):
        operator.update(run_id, "body", "remove_item", "apple")
    with pytest.raises(FailedPrecondition, match="an item needs a name"):
        operator.update(run_id, "body", "add_item", "")
    eventually(lambda: _waiting(operator, run_id, "body"), "the body waits again", PATIENCE)
    with pytest.raises(FailedPrecondition, match="a query with arguments needs one"):
        operator.query(run_id, "body", "has", "kiwi")

    operator.send_event(run_id, "checkout")
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", ts_worker.log
    # The replay after the event applied the updates again from the journal.
    assert run.step("body").output == {"user": "ann", "items": ["apple", "pear"]}
    assert operator.query(run_id, "body", "items").result == ["apple", "pear"]
    ts_worker.stop()


def test_a_running_ts_body_answers_queries_and_applies_an_update_when_its_step_returns(
    cyclone_server, ts_worker, operator
):
    wf = Workflow("ts-live")
    wf.node("body", action="ts.live")
    run_id = operator.submit(wf, None)

    def answered_live() -> Any:
        try:
            answer = operator.query(run_id, "body", "seen")
        except FailedPrecondition:  # nothing runs the body yet, nothing published
            return None
        return answer if answer.result == [1] and not answer.published else None

    eventually(answered_live, "the worker to answer", PATIENCE, detail=lambda: ts_worker.log)
    with pytest.raises(NotFound, match='no query handler "other"'):
        operator.query(run_id, "body", "other")
    assert operator.query(run_id, "body", "page", 1).result == 1  # with arguments, live
    with pytest.raises(FailedPrecondition, match=r"RangeError.*no page 7"):
        operator.query(run_id, "body", "page", 7)

    # Delivered while the step "gate" runs (which returns once it is), applied when it returns.
    pushed = operator.update(run_id, "body", "push", 5, update_id="u-5")
    assert (pushed.result, pushed.seq) == (2, 3)
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", ts_worker.log
    assert run.step("body").output == [1, 5]
    assert [(c.step_id, c.function) for c in run.step("body").journal] == [
        ("first", "first"),
        ("gate", "gate"),
        ("update:u-5", "cyclone.update"),
    ]
    ts_worker.stop()


@contextlib.contextmanager
def _serving_cart(language: str, server: Any, start_process: Any) -> Iterator[Process | None]:
    """A worker of `language` serving the action "cart" for the block."""
    if language == "python":
        with running(python_worker(server.address)):
            yield None
        return
    worker = start_process("ts-talk-worker", _tool("node"), WORKER, server.address)
    yield worker
    worker.stop()


@pytest.mark.parametrize(("first", "then"), [("python", "ts"), ("ts", "python")])
def test_a_body_resumes_the_other_sdks_journal_of_updates_and_applies_more(
    cyclone_server, start_process, ts_sdk, operator, first, then
):
    # One SDK's "cart" applies two updates and waits; then only the other SDK's worker
    # serves the action "cart", and its body replays that journal.
    with _serving_cart(first, cyclone_server, start_process):
        run_id = operator.start("cart", "ann")
        eventually(lambda: _waiting(operator, run_id, "cart"), "the body waits", PATIENCE)
        assert operator.update(run_id, "cart", "add_item", "apple", update_id="u-1").result == 1
        assert operator.update(run_id, "cart", "add_item", "pear", update_id="u-2").result == 2
        eventually(lambda: _waiting(operator, run_id, "cart"), "the body waits again", PATIENCE)

    with _serving_cart(then, cyclone_server, start_process) as worker:
        # The other body rebuilds the items from the journal, then applies a third.
        third = operator.update(run_id, "cart", "add_item", "kiwi", update_id="u-3")
        assert third.result == 3, worker.log if worker else ""
        eventually(lambda: _waiting(operator, run_id, "cart"), "the body waits again", PATIENCE)
        operator.send_event(run_id, "checkout")
        run = operator.wait(run_id, timeout=PATIENCE)
        assert run.status == "completed", worker.log if worker else ""
    assert run.step("cart").output == {"user": "ann", "items": ["apple", "pear", "kiwi"]}
    journal = run.step("cart").journal
    assert [e.step_id for e in journal] == [
        "tick",
        "event:checkout",
        "update:u-1",
        "update:u-2",
        "update:u-3",
    ]
    assert journal[-1].output == {"update": "add_item", "args": ["kiwi"], "result": 3}
