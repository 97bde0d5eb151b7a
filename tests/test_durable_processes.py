"""Durable functions with real worker processes killed with SIGKILL.

The worker (tests/durable_worker_process.py) appends a line, synced to disk, for each
call of a step function: an effect that no Cyclone transaction can take back, so the
lines count how often each step really ran. A first worker is killed at a known point
of a body; its lease runs out on the fake clock (advance_clock + sweep, no sleeping); a
second worker process claims the node and replays the body from its journal.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cyclone.v1 import types_pb2
from pyclient import Client, RetryPolicy, Workflow
from tests.helpers import PATIENCE, eventually, get_run
from tests.process_lab import ProcessLab
from tests.roles import worker_login
from tests.test_metrics import scrape
from tests.test_metrics import value as metric

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("durable_worker_process.py")
STATUS = {
    types_pb2.STEP_CALL_STATUS_STARTED: "started",
    types_pb2.STEP_CALL_STATUS_SUCCEEDED: "succeeded",
    types_pb2.STEP_CALL_STATUS_FAILED: "failed",
    types_pb2.STEP_CALL_STATUS_WAITING: "waiting",
}


@dataclass
class Lab(ProcessLab):
    effects_file: Path

    def start_worker(self, *flags: str, gated: bool = False) -> subprocess.Popen:
        argv = [str(WORKER), self.server.address, str(self.effects_file), *flags]
        return self.spawn([*argv, *(["--gated"] if gated else [])], gated=gated)

    def lines(self) -> list[dict[str, Any]]:
        text = self.effects_file.read_text()
        return [json.loads(line) for line in text.splitlines(keepends=True) if line[-1] == "\n"]

    def effects(self, phase: str = "effect") -> Counter[str]:
        """How many times each step function did its effect (or reached ``phase``)."""
        return Counter(line["step"] for line in self.lines() if line["phase"] == phase)

    def paused(self) -> bool:
        return any(line["phase"] == "paused" for line in self.lines())

    def journal(self, run_id: str, node: str) -> list[tuple[str, int, str]]:
        """(step_id, seq, status) of the node's journal, as GetRun returns it."""
        [found] = [s for s in get_run(self.server, run_id).steps if s.node == node]
        return [(c.step_id, c.seq, STATUS[c.status]) for c in found.journal]

    def crash(
        self, run_id: str, hang: str, *next_flags: str, recorded: tuple[str, int] | None = None
    ) -> subprocess.Popen:
        """A worker runs ``run_id`` to the hang point ``hang`` and is SIGKILLed there (once
        the journal of node ``recorded[0]`` holds ``recorded[1]`` entries: the worker
        sends a safe call's end without waiting for it); its lease expires. Returns the
        next worker (gated, not claiming yet)."""
        proc = self.start_worker("--hang", hang)
        following = self.start_worker(*next_flags, gated=True)
        eventually(self.paused, f"the body to reach {hang}")
        if recorded is not None:
            node, count = recorded
            eventually(lambda: len(self.journal(run_id, node)) == count, f"{count} journal entries")
        self.kill(proc)
        self.expire_leases()
        return following


@pytest.fixture
def lab(server_factory, tmp_path) -> Iterator[Lab]:
    server = server_factory(metrics_listen="127.0.0.1:0")
    server.server.metrics.gauge_max_age_s = 0  # every scrape reads the database
    effects_file = tmp_path / "effects.jsonl"
    effects_file.touch()
    with Client(server.address, actor="sdk-operator") as client:
        lab = Lab(server, client, tmp_path, effects_file)
        try:
            yield lab
        finally:
            lab.kill_all()


def order_run(lab: Lab, *, reraise: bool = False) -> str:
    """An order whose body may re-raise; one retry, quickly, so a re-raise ends it."""
    wf = Workflow("order")
    wf.node("order", retry=RetryPolicy(max_attempts=2, initial_backoff=0.1, max_backoff=0.1))
    return lab.client.submit(wf, {"order_id": "o-1", "amount": 42, "reraise": reraise})


def blocked_order(lab: Lab, hang: str = "after-effect", *, reraise: bool = False) -> str:
    """An order whose charge_card was killed mid-call, blocked at the next worker's
    replay (that worker keeps running)."""
    run_id = order_run(lab, reraise=reraise)
    following = lab.crash(run_id, hang)
    lab.release(following)
    run = lab.wait(run_id)
    assert run.status == "blocked", run
    return run_id


def test_a_body_killed_after_its_second_step_call_replays_without_repeating_them(lab):
    run_id = lab.client.start("three_steps", {"n": 1})
    following = lab.crash(run_id, "before-third", recorded=("three_steps", 2))
    # Killed with two step calls recorded and the third not begun.
    assert lab.journal(run_id, "three_steps") == [
        ("first", 1, "succeeded"),
        ("second", 2, "succeeded"),
    ]
    assert lab.effects() == {"first": 1, "second": 1}

    lab.release(following)
    run = lab.wait(run_id)

    assert run.status == "completed"
    assert run.step("three_steps").output == {"a": 2, "b": 20, "c": 23}
    assert run.step("three_steps").attempt == 2
    # The replay took the first two values from the journal: each step ran once.
    assert lab.effects() == {"first": 1, "second": 1, "third": 1}
    [third] = [line for line in lab.lines() if line["step"] == "third"]
    assert (third["attempt"], third["detail"]) == (2, 20)
    assert lab.journal(run_id, "three_steps") == [
        ("first", 1, "succeeded"),
        ("second", 2, "succeeded"),
        ("third", 3, "succeeded"),
    ]


def test_a_body_killed_just_after_its_sleep_replays_without_repeating_anything(lab):
    run_id = lab.client.start("napper", {"n": 1, "sleep": 0.5})
    # The first attempt sleeps (the node gives up its lease); the resume is killed
    # just after the sleep returned.
    following = lab.crash(run_id, "after-wait", recorded=("napper", 2))
    assert lab.journal(run_id, "napper") == [("first", 1, "succeeded"), ("sleep", 2, "succeeded")]
    lab.release(following)
    run = lab.wait(run_id)
    assert run.status == "completed" and run.step("napper").output == {"a": 2, "got": None, "c": 5}
    assert lab.effects() == {"first": 1, "third": 1}
    assert run.step("napper").resumes == 1


def test_a_body_killed_at_an_event_wait_gets_the_event_sent_meanwhile(lab):
    run_id = lab.client.start("napper", {"n": 1, "event": True})
    following = lab.crash(run_id, "before-wait", recorded=("napper", 1))
    # No worker runs the node now: the event is kept for the wait.
    lab.client.send_event(run_id, "go", {"ok": True})
    lab.release(following)
    run = lab.wait(run_id)
    assert run.status == "completed"
    assert run.step("napper").output == {"a": 2, "got": {"ok": True}, "c": 5}
    assert lab.effects() == {"first": 1, "third": 1}


def test_an_update_applied_before_a_kill_is_replayed_from_the_journal_not_applied_again(lab):
    run_id = lab.client.start("counter", {"n": 1})
    proc = lab.start_worker("--hang", "after-wait")
    following = lab.start_worker(gated=True)
    eventually(
        lambda: lab.journal(run_id, "counter")[-1:] == [("event:go", 2, "waiting")],
        "the body to wait for go",
    )
    held = "SELECT resumes, lease_token IS NULL FROM cyclone.steps WHERE run_id = %s"
    [(resumes, _)] = lab.server.sql(held, run_id)
    # The update wakes the waiting node; its body applies it at the wait and records it.
    added = lab.client.update(run_id, "counter", "add", 5, update_id="add-5")
    assert (added.result, added.seq, added.created) == (5, 3, True)
    # The body waits for go again (its node given back) before go is sent: the event
    # then resumes it in an attempt of its own, which replays the update.
    eventually(
        lambda: lab.server.sql(held, run_id) == [(resumes + 1, True)],
        "the body to wait for go again",
    )
    lab.client.send_event(run_id, "go", "now")
    eventually(lab.paused, "the body to pass its wait")  # the update replayed, then killed
    lab.kill(proc)
    lab.expire_leases()
    # No worker runs the body: the total it published.
    answer = eventually(
        lambda: (a := lab.client.query(run_id, "counter", "total")).result == 5 and a,
        "the published total",
    )
    assert answer.published
    lab.release(following)
    run = lab.wait(run_id)
    assert run.status == "completed"
    assert run.step("counter").output == {"a": 2, "got": "now", "total": 5, "c": 5}
    assert [e for e in lab.journal(run_id, "counter") if e[0].startswith("update:")] == [
        ("update:add-5", 3, "succeeded")
    ]
    # Applied once, then replayed from the journal by each later attempt (the killed one
    # and the next worker's): never taken from the queue a second time.
    applied = [line for line in lab.lines() if line["phase"] == "applied"]
    assert [line["detail"] for line in applied] == [5, 5, 5]
    assert len({line["pid"] for line in applied}) == 2
    # The same update id again: nothing sent, the recorded outcome answered.
    again = lab.client.update(run_id, "counter", "add", 5, update_id="add-5")
    assert (again.result, again.created) == (5, False)


def test_a_body_killed_after_its_event_wait_replays_the_payload_without_consuming_again(lab):
    run_id = lab.client.start("napper", {"n": 1, "event": True})
    lab.client.send_event(run_id, "go", "first")
    following = lab.crash(run_id, "after-wait", recorded=("napper", 2))
    lab.client.send_event(run_id, "go", "second")
    lab.release(following)
    run = lab.wait(run_id)
    assert run.status == "completed" and run.step("napper").output["got"] == "first"
    assert lab.effects() == {"first": 1, "third": 1}
    # The second event is still there, for a later wait.
    assert lab.server.sql(
        "SELECT payload, consumed_step_id FROM cyclone.events WHERE run_id = %s ORDER BY event_id",
        run_id,
    ) == [("first", "event:go"), ("second", None)]


def test_a_parent_killed_right_after_start_child_does_not_start_a_second(lab):
    run_id = lab.client.start("parent", {"n": 20})
    following = lab.crash(run_id, "after-start", recorded=("parent", 2))
    children = "SELECT run_id::text FROM cyclone.runs WHERE parent_run_id = %s::uuid"
    [(child_id,)] = lab.server.sql(children, run_id)
    lab.release(following)
    run = lab.wait(run_id)
    assert run.status == "completed", run
    assert run.step("parent").output == {"child": child_id, "result": {"double": 42}}
    # The replay started nothing: one child, the one the killed attempt started.
    assert lab.server.sql(children, run_id) == [(child_id,)]
    assert lab.effects() == {"first": 1}
    assert lab.client.get_run(child_id).parent_run_id == run_id


def test_an_unsafe_step_killed_mid_call_blocks_the_run_naming_node_and_step_id(lab):
    run_id = blocked_order(lab)
    raw = get_run(lab.server, run_id)

    assert raw.error.kind == "EffectUncertain"
    assert (raw.error.node, raw.error.step_id) == ("order", "charge_card")
    assert "order" in raw.error.message and "charge_card" in raw.error.message
    run = lab.client.get_run(run_id)
    assert run.step("order").status == "uncertain"
    assert lab.journal(run_id, "order") == [
        ("reserve", 1, "succeeded"),
        ("charge_card", 2, "started"),
    ]
    # The second worker replayed reserve from the journal and never called charge_card.
    assert lab.effects() == {"reserve": 1, "charge_card": 1}
    assert lab.effects("entered") == {"charge_card": 1}
    samples = scrape(lab.server.server.metrics_port)
    assert metric(samples, "cyclone_runs", status="blocked") == 1
    assert metric(samples, "cyclone_runs_blocked_total", action="order") == 1

    # Nothing moves it: not the sweep, however late, nor the worker still claiming.
    lab.server.advance_clock(3600)
    assert lab.server.sweep() == 0
    assert lab.client.get_run(run_id).status == "blocked"


def test_resolve_result_records_the_value_and_the_body_goes_on_without_calling_again(lab):
    run_id = blocked_order(lab)
    value = {"charge_id": "ch-from-the-psp", "amount": 42}
    done = lab.cli("resolve", run_id, "charge_card", "--result", json.dumps(value))
    assert done.returncode == 0, done.stderr
    run = lab.wait(run_id)

    assert run.status == "completed"
    assert run.step("order").output == {"charged": True, "charge": value}
    assert lab.effects() == {"reserve": 1, "charge_card": 1, "receipt": 1}
    [receipt] = [line for line in lab.lines() if line["step"] == "receipt"]
    assert receipt["detail"] == value
    assert lab.journal(run_id, "order") == [
        ("reserve", 1, "succeeded"),
        ("charge_card", 2, "succeeded"),
        ("receipt", 3, "succeeded"),
    ]
    [entry] = run.audit
    assert (entry.action, entry.node, entry.actor) == ("resolve_result", "order", "carol")
    assert entry.details["step_id"] == "charge_card"


def test_resolve_error_runs_the_except_block_cleanup_and_a_handled_failure_completes(lab):
    run_id = blocked_order(lab)
    lab.client.resolve(run_id, step_id="charge_card", error="card declined")
    run = lab.wait(run_id)

    assert run.status == "completed"
    output = run.step("order").output
    assert output["charged"] is False
    assert output["error"]["type"] == "EffectFailed"
    assert "card declined" in output["error"]["message"]
    # The except block's cleanup ran, once; the charge was never called again.
    assert lab.effects() == {"reserve": 1, "charge_card": 1, "release": 1}
    assert lab.journal(run_id, "order") == [
        ("reserve", 1, "succeeded"),
        ("charge_card", 2, "failed"),
        ("release", 3, "succeeded"),
    ]
    assert [a.action for a in run.audit] == ["resolve_error"]


def test_resolve_error_with_a_body_that_re_raises_fails_the_node_after_its_cleanup(lab):
    run_id = blocked_order(lab, reraise=True)
    lab.client.resolve(run_id, step_id="charge_card", error="card declined")
    run = lab.wait(run_id)

    assert run.status == "failed"
    order = run.step("order")
    assert order.status == "discarded"
    assert "card declined" in order.last_error.message
    # The failure of an unsafe call stays recorded, so a retry could only replay it:
    # the node fails for good at the attempt after the resolve, its cleanup done once.
    assert order.attempt == 3
    assert lab.effects() == {"reserve": 1, "charge_card": 1, "release": 1}
    assert lab.journal(run_id, "order") == [
        ("reserve", 1, "succeeded"),
        ("charge_card", 2, "failed"),
        ("release", 3, "succeeded"),
    ]


def test_resolve_discard_of_a_false_alarm_runs_the_call_once(lab):
    # Killed inside charge_card before its effect: blocked all the same.
    run_id = blocked_order(lab, "before-effect")
    assert lab.effects() == {"reserve": 1}
    done = lab.cli("resolve", run_id, "charge_card", "--discard")
    assert done.returncode == 0, done.stderr
    run = lab.wait(run_id)

    assert run.status == "completed"
    assert run.step("order").output["charged"] is True
    assert lab.effects() == {"reserve": 1, "charge_card": 1, "receipt": 1}
    assert lab.effects("entered") == {"charge_card": 2}
    assert [a.action for a in run.audit] == ["resolve_discard"]


def test_removing_the_unsafe_mark_re_executes_the_call(lab):
    run_id = order_run(lab)
    # The next worker registers charge_card without the mark.
    following = lab.crash(run_id, "after-effect", "--safe")
    lab.release(following)
    run = lab.wait(run_id)

    assert run.status == "completed"
    assert run.step("order").output["charged"] is True
    assert lab.effects() == {"reserve": 1, "charge_card": 2, "receipt": 1}  # at least once
    assert run.audit == ()
    assert lab.journal(run_id, "order") == [
        ("reserve", 1, "succeeded"),
        ("charge_card", 2, "succeeded"),
        ("receipt", 3, "succeeded"),
    ]


@pytest.fixture
def ledger_login(lab, postgres_url) -> Iterator[str]:
    lab.server.sql(
        "CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY, run_id uuid NOT NULL,"
        " node text NOT NULL, step_id text NOT NULL, pid integer NOT NULL)"
    )
    with worker_login(lab.server.database_url, postgres_url, writes=("ledger",)) as dsn:
        yield dsn


def test_a_step_effect_recorded_in_its_own_transaction_happens_once_under_kills(lab, ledger_login):
    # Every kill costs the node it held an attempt: leave room for them all.
    retry = RetryPolicy(max_attempts=10)
    runs = [lab.client.start("ledger", {"count": 4}, retry=retry) for _ in range(2)]
    # Each worker kills itself at one point of one call: a rolled-back effect, then a
    # committed effect whose call the SDK never heard back from, for each of two calls.
    kills = ["book#2:before-commit", "book#2:after-commit", "book#3:after-commit"]
    kills += ["book#4:before-commit", "book#4:after-commit"]
    for die_at in kills:
        proc = lab.start_worker("--database-url", ledger_login, "--die-at", die_at)
        assert proc.wait(PATIENCE) == -signal.SIGKILL, die_at
        lab.expire_leases()
    lab.start_worker("--database-url", ledger_login)
    for run_id in runs:
        run = lab.wait(run_id)
        assert run.status == "completed"
        assert run.step("ledger").output == [0, 1, 2, 3]

    rows = lab.server.sql(
        "SELECT run_id::text, step_id, count(*) FROM ledger GROUP BY 1, 2 ORDER BY 1, 2"
    )
    assert rows == [(r, s, 1) for r in sorted(runs) for s in ("book", "book#2", "book#3", "book#4")]
    # The kills landed where they were meant to: some calls ran more than once.
    entered = lab.effects("entered")
    assert sum(entered.values()) > 8


FEATURES = Path(__file__).with_name("durable_features.py")


def test_a_body_run_as_a_script_replays_when_a_worker_imports_it_and_sees_the_same_failure(
    lab,
):
    def seen() -> list[dict[str, Any]]:
        return [line for line in lab.lines() if line["phase"] == "caught"]

    run_id = lab.client.start("features", {"key": "a", "amount": 7})
    script = lab.spawn([str(FEATURES), lab.server.address, str(lab.effects_file), "--hang"])
    importer = "from tests import durable_features; durable_features.main()"
    following = lab.spawn(
        ["-c", importer, lab.server.address, str(lab.effects_file), "--gated"], gated=True
    )
    eventually(lambda: any(line["phase"] == "paused" for line in lab.lines()), "the pause")
    # A safe call's record is sent after the call returns: wait for both to land.
    recorded = [("lookup", 1, "succeeded"), ("pay", 2, "failed")]
    eventually(lambda: lab.journal(run_id, "features") == recorded, "both calls recorded")
    lab.kill(script)
    lab.expire_leases()
    lab.release(following)
    run = lab.wait(run_id)

    assert run.status == "completed", run
    assert run.step("features").output == {"key": "A", "end": "done A"}
    phases = Counter(line["phase"] for line in lab.lines())
    assert (phases["lookup"], phases["pay"], phases["finish"]) == (1, 1, 1)
    first, replay = (line["detail"] for line in seen())
    # The same failure on both runs, though its class was __main__'s the first time.
    assert (first.pop("module"), replay.pop("module")) == ("__main__", "tests.durable_features")
    assert (
        first
        == replay
        == {
            "type": "__main__.Declined",
            "type_name": "Declined",
            "message": "declined: insufficient_funds",
            "attributes": {"code": "insufficient_funds", "amount": 7},
            "args": ["declined: insufficient_funds"],
            "class": "Declined",
            "is_declined": True,
            "code": "insufficient_funds",
        }
    )
    [step_row] = [s for s in get_run(lab.server, run_id).steps if s.node == "features"]
    assert [c.function for c in step_row.journal] == ["lookup", "pay", "finish"]


def test_a_body_killed_mid_stream_replays_without_a_chunk_twice_or_one_lost(lab):
    run_id = lab.client.start("streamer", {"before": ["a", "b"], "after": ["c", "d"]})
    read: list[Any] = []

    def follow() -> None:  # a live reader, from before the crash to the run's end
        with Client(lab.server.address) as client:
            read.extend((c.offset, c.data) for c in client.read_stream(run_id, "tokens"))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    following = lab.crash(run_id, "mid-stream", recorded=("streamer", 1))
    stored = [
        (c.offset, c.data, c.attempt) for c in lab.client.read_stream(run_id, "tokens", wait=False)
    ]
    # Killed with four chunks stored, the step call's among them.
    assert stored == [(0, "a", 1), (1, "b", 1), (2, "LOUD", 1), (3, {"after": "LOUD"}, 1)]

    lab.release(following)
    assert lab.wait(run_id).status == "completed"
    reader.join(PATIENCE)
    assert not reader.is_alive(), "the reader ends with the run"
    # The replay emitted a, b and {"after"} again (shout was replayed from the journal):
    # none stored twice, and the new chunks follow, written by attempt 2.
    whole = [
        (c.offset, c.data, c.step_id, c.attempt) for c in lab.client.read_stream(run_id, "tokens")
    ]
    assert whole == [
        (0, "a", "", 1),
        (1, "b", "", 1),
        (2, "LOUD", "shout", 1),
        (3, {"after": "LOUD"}, "", 1),
        (4, "c", "", 2),
        (5, "d", "", 2),
    ]
    assert read == [(offset, data) for offset, data, _, _ in whole]
    assert lab.effects() == {"shout": 1}
