"""Flow control: start times, priorities, concurrency keys and rate limits,
enforced by the claim (docs/flow-control.md). Limits are checked from the database,
not from what the workers say, while workers on two servers claim at once."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import timestamp_pb2

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from tests.helpers import PATIENCE, eventually, get_run, node, seconds, submit, value, workflow
from tests.test_steps import WATCHED, claim_in_thread


def _spec(action: str, rate: tuple[int, float] | None = None) -> worker_service_pb2.ActionSpec:
    spec = worker_service_pb2.ActionSpec(name=action)
    if rate is not None:
        spec.rate_limit.count = rate[0]
        spec.rate_limit.period.CopyFrom(seconds(rate[1]))
    return spec


def _claim(server: Any, action: str, n: int = 1, **spec: Any) -> list:
    request = worker_service_pb2.ClaimRequest(
        worker_id="t", actions=[_spec(action, **spec)], max_steps=n
    )
    return list(server.workers.Claim(request).steps)


def _complete(server: Any, step: Any) -> None:
    server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token, output=value(1)
        )
    )


def _submit(server: Any, wf: types_pb2.Workflow, *, input: Any = None, **flow: Any) -> str:
    request = workflow_service_pb2.SubmitRequest(workflow=wf, **flow)
    if input is not None:
        request.input.CopyFrom(value(input))
    return str(server.workflows.Submit(request).run_id)


def _db_now(server: Any) -> timestamp_pb2.Timestamp:
    [(now,)] = server.sql("SELECT cyclone.now()")
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(now)
    return ts


# -- priorities ---------------------------------------------------------------------


def test_claims_take_higher_priorities_first_and_each_priority_in_order(cyclone_server):
    runs = {}
    for label, priority in [("a0", 0), ("b5", 5), ("c0", 0), ("d5", 5), ("e-1", -1), ("f9", 9)]:
        runs[_submit(cyclone_server, workflow("w", node("n")), priority=priority)] = label
    # A node's own priority overrides its run's.
    override = node("n")
    override.priority = 7
    runs[_submit(cyclone_server, workflow("w", override), priority=-5)] = "g7"

    order = [runs[s.run_id] for _ in range(len(runs)) for s in _claim(cyclone_server, "work")]
    assert order == ["f9", "g7", "b5", "d5", "a0", "c0", "e-1"]
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.steps WHERE status = 'running'") == [
        (len(runs),)
    ]


def test_a_batch_across_actions_takes_the_highest_priorities(cyclone_server):
    for action, priority in [("x", 1), ("y", 3), ("x", 2), ("y", 0)]:
        _submit(cyclone_server, workflow("w", node("n", action)), priority=priority)
    request = worker_service_pb2.ClaimRequest(
        worker_id="t", actions=[_spec("x"), _spec("y")], max_steps=2
    )
    steps = cyclone_server.workers.Claim(request).steps
    priorities = cyclone_server.sql(
        "SELECT priority FROM cyclone.steps WHERE status = 'running' ORDER BY priority"
    )
    assert (len(steps), priorities) == (2, [(2,), (3,)])


def test_get_run_shows_priority_start_time_and_evaluated_key(cyclone_server):
    n = node("n", input={"region": "eu"})
    n.concurrency.key = "c:{run.customer}/{node.region}"
    n.concurrency.limit = 2
    start = _db_now(cyclone_server)
    start.seconds += 3600
    run_id = _submit(
        cyclone_server, workflow("w", n), input={"customer": 42}, priority=3, start_at=start
    )
    run = cyclone_server.workflows.GetRun(workflow_service_pb2.GetRunRequest(run_id=run_id)).run
    [step] = run.steps
    assert (run.priority, run.start_at.seconds, step.priority, step.concurrency_key) == (
        3,
        start.seconds,
        3,
        "c:42/eu",
    )
    assert step.available_at.seconds == start.seconds


# -- start times --------------------------------------------------------------------


@pytest.mark.parametrize("once", [False, True])
def test_a_run_submitted_to_start_later_is_claimed_only_then(cyclone_server, once):
    start = _db_now(cyclone_server)
    start.seconds += 60
    wf = workflow("later", node("a"), node("b", deps=["a"]))
    if once:
        reply = cyclone_server.workflows.SubmitOnce(
            workflow_service_pb2.SubmitOnceRequest(workflow=wf, key="k", start_at=start)
        )
        run_id = reply.run_id
    else:
        run_id = _submit(cyclone_server, wf, start_at=start)
    assert _claim(cyclone_server, "work", 10) == []
    # The engine's clock also moves with real time: ten seconds short of the start
    # leave room for a slow machine between the submit and this claim.
    cyclone_server.advance_clock(50)
    assert _claim(cyclone_server, "work", 10) == []
    cyclone_server.advance_clock(11)
    [a] = _claim(cyclone_server, "work", 10)
    assert (a.run_id, a.node) == (run_id, "a")


def test_a_waiting_claim_wakes_at_the_start_time(cyclone_server):
    """The waiting Claim sets its timer by step_next_due (TEST_SETTINGS' recheck is an
    hour), so it must learn the start time from the database."""
    start = _db_now(cyclone_server)
    start.nanos = 0
    start.seconds += 2  # real time: the claim's wait is on the wall clock
    run_id = _submit(cyclone_server, workflow("soon", node("a")), start_at=start)
    request = worker_service_pb2.ClaimRequest(
        worker_id="t", actions=[_spec("work")], max_steps=1, wait=seconds(PATIENCE)
    )
    began = time.monotonic()
    [step] = cyclone_server.workers.Claim(request).steps
    assert step.run_id == run_id
    assert time.monotonic() - began < PATIENCE - 1  # woken by its timer, not the end


@pytest.mark.parametrize("function", ["step_next_due", "step_next_due_sharded"])
def test_a_step_that_came_due_after_the_claim_is_due_now_not_held_back(cyclone_server, function):
    """A claim that took nothing asks step_next_due when to look again, passing the
    seconds since it claimed. A step that came due in between is due now (negative
    seconds): the claim looks again at once. One due before the claim was passed over
    by it (a full key, a rate, a lock), and sets no timer."""
    start = _db_now(cyclone_server)
    start.seconds += 10
    _submit(cyclone_server, workflow("soon", node("a")), start_at=start)
    cyclone_server.advance_clock(12)  # due 2 s ago

    def due(since: float) -> float | None:
        [(seconds,)] = cyclone_server.sql(
            f"SELECT cyclone.{function}(ARRAY['work'], %s::float8)", since
        )
        return seconds

    assert -2.5 < due(5) < -1.5  # came due after a claim 5 s ago
    assert due(1) is None  # was due already when a claim 1 s ago took nothing
    assert due(0) is None


# -- concurrency keys ---------------------------------------------------------------


def _keyed(name: str, key: str, limit: int, action: str = "work") -> types_pb2.Node:
    n = node(name, action)
    n.concurrency.key = key
    n.concurrency.limit = limit
    return n


def test_a_full_key_is_passed_over_and_frees_a_slot_when_a_step_ends(cyclone_server):
    for customer in ["a", "a", "a", "b"]:
        _submit(
            cyclone_server,
            workflow("w", _keyed("n", "customer:{run.customer}", 2)),
            input={"customer": customer},
        )
    steps = _claim(cyclone_server, "work", 10)
    keys = sorted(
        k
        for (k,) in cyclone_server.sql(
            "SELECT concurrency_key FROM cyclone.steps WHERE status = 'running'"
        )
    )
    assert (len(steps), keys) == (3, ["customer:a", "customer:a", "customer:b"])
    assert _claim(cyclone_server, "work", 10) == []
    _complete(cyclone_server, steps[0])
    [third] = _claim(cyclone_server, "work", 10)
    assert cyclone_server.sql(
        "SELECT concurrency_key FROM cyclone.steps WHERE run_id = %s", third.run_id
    ) == [("customer:a",)]


@pytest.mark.parametrize("freed_by", ["a completion", "a discarding failure"])
@pytest.mark.parametrize("through", ["the same server", "another server"])
def test_a_step_that_frees_its_keys_slot_wakes_a_claim_waiting_for_it(
    server_factory, freed_by, through
):
    """A key with limit 1 and two ready steps: the second waits for the first. The
    periodic re-check is out of reach, so only the wake-up sent when the first step
    leaves `running` (in this server, or by NOTIFY from the other) can end the waiting
    claim before its 30 s."""
    waiting = server_factory(claim_recheck_s=3600, **WATCHED)
    finishing = waiting if through == "the same server" else server_factory(claim_recheck_s=3600)
    runs = {_submit(waiting, workflow("w", _keyed("n", "serial", 1, "serial"))) for _ in "ab"}
    [held] = _claim(finishing, "serial", 10)
    assert _claim(finishing, "serial", 10) == []
    waiter, result = claim_in_thread(waiting, "serial")
    if freed_by == "a completion":
        _complete(finishing, held)
    else:
        finishing.workers.Complete(
            worker_service_pb2.CompleteRequest(
                run_id=held.run_id,
                node=held.node,
                lease_token=held.lease_token,
                failure=worker_service_pb2.Failure(type="E", message="no", non_retryable=True),
            )
        )
    waiter.join(20)
    assert not waiter.is_alive(), "the claim was not woken when the key's slot freed"
    assert [s.run_id for s in result] == list(runs - {held.run_id})


@pytest.mark.parametrize("limit", [1, 2])
def test_a_keyed_completion_wakes_claims_only_when_its_key_was_full(cyclone_server, limit):
    """One step of a key runs. Its completion in the worker's own transaction
    (cyclone.step_complete, which notifies inline) frees a slot: with limit 1 the key
    was full, so a claim may be waiting for the slot and the action is notified; with
    limit 2 the key had room, no claim was kept from it, and nothing is sent."""
    server = cyclone_server
    _submit(server, workflow("w", _keyed("n", "k", limit, "keyed")))
    [held] = _claim(server, "keyed")
    with psycopg.connect(server.database_url, autocommit=True) as listener:
        listener.execute("LISTEN cyclone_ready")
        with psycopg.connect(server.database_url, autocommit=True) as worker:
            worker.execute(
                "SELECT cyclone.step_complete(%s, %s, %s, 'null')",
                (held.run_id, held.node, held.lease_token),
            )
        # The notification of a committed transaction is in the listener's queue by now;
        # the timeout only bounds the wait for one that is there.
        sent = [n.payload for n in listener.notifies(timeout=1.0, stop_after=1)]
    assert sent == (["keyed"] if limit == 1 else [])


def test_a_key_with_limit_two_never_has_three_running_across_servers(server_factory):
    """Several workers on two servers claim batches of steps of one key (limit 2), of
    another key and of none; a sampler reads the running steps per key from the
    database throughout."""
    servers = [server_factory(), server_factory()]
    runs = []
    for i in range(36):
        customer = ["hot", "hot", "cold"][i % 3] if i % 4 else None
        n = _keyed("n", "customer:{run.customer}", 2) if customer else node("n")
        runs.append(_submit(servers[i % 2], workflow("w", n), input={"customer": customer}))

    done = threading.Event()
    errors: list[BaseException] = []

    def work(server: Any, seed: int) -> None:
        rnd = random.Random(seed)
        stub = server.workers
        try:
            while not done.is_set():
                request = worker_service_pb2.ClaimRequest(
                    worker_id=f"w{seed}", actions=[_spec("work")], max_steps=3, wait=seconds(0.2)
                )
                for step in stub.Claim(request).steps:
                    time.sleep(rnd.uniform(0.01, 0.04))
                    _complete(server, step)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    workers = [
        threading.Thread(target=work, args=(servers[i % 2], i), daemon=True) for i in range(6)
    ]
    for t in workers:
        t.start()
    peak: dict[str, int] = {}
    deadline = time.monotonic() + 4 * PATIENCE
    # One connection, so that samples follow each other closely.
    with psycopg.connect(servers[0].database_url, autocommit=True) as db:
        try:
            while time.monotonic() < deadline:
                rows = db.execute(
                    "SELECT concurrency_key, count(*) FROM cyclone.steps"
                    " WHERE status = 'running' AND concurrency_key IS NOT NULL GROUP BY 1"
                ).fetchall()
                for key, count in rows:
                    peak[key] = max(peak.get(key, 0), count)
                left = db.execute("SELECT count(*) FROM cyclone.runs WHERE status <> 'completed'")
                if left.fetchone() == (0,):
                    break
        finally:
            done.set()
            for t in workers:
                t.join(PATIENCE)
    assert errors == []
    assert servers[0].sql("SELECT count(*) FROM cyclone.runs WHERE status = 'completed'") == [
        (len(runs),)
    ]
    # The sampler saw the hot key's steps run (18 of them, two at a time, 10-40 ms each).
    assert 1 <= peak.get("customer:hot", 0) <= 2, peak
    assert max(peak.values()) <= 2, peak


# -- rate limits --------------------------------------------------------------------


def test_a_rate_limit_admits_count_claims_per_window(cyclone_server):
    for _ in range(6):
        submit(cyclone_server, workflow("w", node("n", "rated")))
    rate = (2, 10.0)
    assert len(_claim(cyclone_server, "rated", 10, rate=rate)) == 2
    assert _claim(cyclone_server, "rated", 10, rate=rate) == []
    # cyclone.now() is the real time plus the offset, so the margins leave room for a
    # slow machine (the real time between these claims).
    cyclone_server.advance_clock(9.0)
    assert _claim(cyclone_server, "rated", 10, rate=rate) == []
    cyclone_server.advance_clock(1.2)
    assert len(_claim(cyclone_server, "rated", 10, rate=rate)) == 2
    # A worker that declares no limit is not held back by the window.
    assert len(_claim(cyclone_server, "rated", 10)) == 2


def test_a_waiting_claim_wakes_when_the_rate_window_opens(cyclone_server):
    for _ in range(2):
        submit(cyclone_server, workflow("w", node("n", "rated")))
    assert len(_claim(cyclone_server, "rated", 10, rate=(1, 1.5))) == 1
    request = worker_service_pb2.ClaimRequest(
        worker_id="t",
        actions=[_spec("rated", (1, 1.5))],
        max_steps=10,
        wait=seconds(PATIENCE),
    )
    began = time.monotonic()
    assert len(cyclone_server.workers.Claim(request).steps) == 1
    assert time.monotonic() - began < PATIENCE - 1


def test_claims_of_a_rate_limited_action_stay_within_the_limit_across_servers(server_factory):
    """4 claims per 0.5 s for 20 steps, claimed in batches by workers on two servers;
    every window of 0.5 s of the steps' claim times, read from the database, holds at
    most 4."""
    servers = [server_factory(), server_factory()]
    count, period, total = 4, 0.5, 20
    for i in range(total):
        submit(servers[i % 2], workflow("w", node("n", "rated")))
    done = threading.Event()
    errors: list[BaseException] = []

    def work(server: Any, i: int) -> None:
        try:
            while not done.is_set():
                request = worker_service_pb2.ClaimRequest(
                    worker_id=f"w{i}",
                    actions=[_spec("rated", (count, period))],
                    max_steps=8,
                    wait=seconds(0.5),
                )
                for step in server.workers.Claim(request).steps:
                    _complete(server, step)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(servers[i % 2], i)) for i in range(4)]
    for t in workers:
        t.start()
    try:
        eventually(
            lambda: (
                servers[0].sql("SELECT count(*) FROM cyclone.steps WHERE status = 'completed'")
                == [(total,)]
            ),
            "every rated step to complete",
            timeout=4 * PATIENCE,
        )
    finally:
        done.set()
        for t in workers:
            t.join(PATIENCE)
    assert errors == []
    # Counted here rather than by a correlated subquery, which Citus cannot plan (the
    # Citus suite runs this test too).
    started = sorted(
        t for (t,) in servers[0].sql("SELECT started_at FROM cyclone.steps WHERE action = 'rated'")
    )
    window = timedelta(seconds=period)
    busiest = max(sum(1 for o in started if s <= o < s + window) for s in started)
    assert 1 <= busiest <= count, started


# -- hostile values -----------------------------------------------------------------


def _far(server: Any, days: int) -> timestamp_pb2.Timestamp:
    ts = _db_now(server)
    ts.seconds += days * 86400
    return ts


def _concurrency(key: str, limit: int) -> types_pb2.Node:
    return _keyed("n", key, limit)


def _priority(p: int) -> types_pb2.Node:
    n = node("n")
    n.priority = p
    return n


@pytest.mark.parametrize(
    ("wf", "flow", "input", "message"),
    [
        (workflow("w", node("n")), {"priority": 1_000_001}, None, "priority"),
        (workflow("w", node("n")), {"priority": -1_000_001}, None, "priority"),
        (workflow("w", _priority(2_000_000)), {}, None, "priority"),
        (workflow("w", _concurrency("k", 0)), {}, None, "concurrency limit"),
        (workflow("w", _concurrency("k", 10_001)), {}, None, "concurrency limit"),
        (workflow("w", _concurrency("", 1)), {}, None, "concurrency key is empty"),
        (workflow("w", _concurrency("k" * 257, 1)), {}, None, "256"),
        (workflow("w", _concurrency("{customer}", 1)), {}, {"customer": 1}, "not a field"),
        (workflow("w", _concurrency("c:{run.x", 1)), {}, {"x": 1}, "not a field"),
        (workflow("w", _concurrency("c:{run.x}", 1)), {}, {"y": 1}, "missing"),
        (workflow("w", _concurrency("c:{run.x}", 1)), {}, None, "missing"),
        (workflow("w", _concurrency("c:{run.x}", 1)), {}, {"x": {"a": 1}}, "must be a string"),
        (workflow("w", _concurrency("c:{run.x}", 1)), {}, {"x": "y" * 300}, "256"),
        (workflow("w", node("n")), {"start_at": "far"}, None, "start_at"),
        (workflow("w", node("n")), {"start_at": "out of range"}, None, "start_at"),
    ],
)
def test_hostile_flow_values_are_invalid_and_write_nothing(
    cyclone_server, wf, flow, input, message
):
    if flow.get("start_at") == "far":
        flow = {"start_at": _far(cyclone_server, 400)}
    elif flow.get("start_at") == "out of range":
        flow = {"start_at": timestamp_pb2.Timestamp(seconds=300_000_000_000)}
    for once in (False, True):
        with pytest.raises(grpc.RpcError) as caught:
            if once:
                request = workflow_service_pb2.SubmitOnceRequest(workflow=wf, key="k", **flow)
                if input is not None:
                    request.input.CopyFrom(value(input))
                cyclone_server.workflows.SubmitOnce(request)
            else:
                _submit(cyclone_server, wf, input=input, **flow)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in caught.value.details()
    assert cyclone_server.sql(
        "SELECT (SELECT count(*) FROM cyclone.runs) + (SELECT count(*) FROM cyclone.submit_keys)"
    ) == [(0,)]


@pytest.mark.parametrize(
    ("count", "period", "message"),
    [
        (0, 1.0, "count"),
        (1_000_001, 1.0, "count"),
        (-1, 1.0, "count"),
        (1, 0.0, "period"),
        (1, -1.0, "period"),
        (1, 2 * 86400.0, "period"),
    ],
)
def test_hostile_rate_limits_are_invalid(cyclone_server, count, period, message):
    submit(cyclone_server, workflow("w", node("n", "rated")))
    with pytest.raises(grpc.RpcError) as caught:
        _claim(cyclone_server, "rated", 1, rate=(count, period))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()
    assert cyclone_server.sql(
        "SELECT (SELECT count(*) FROM cyclone.action_rates),"
        "       (SELECT count(*) FROM cyclone.steps WHERE status = 'running')"
    ) == [(0, 0)]


def test_the_start_time_may_be_a_delay_from_now_in_the_sdk(cyclone_server):
    from pyclient import Client, Workflow

    wf = Workflow("sdk")
    wf.node("a", "work", priority=4, concurrency=("k:{run.id}", 3))
    with Client(cyclone_server.address) as client:
        run_id = client.submit(wf, {"id": 7}, start_at=timedelta(hours=1), priority=2)
        run = client.get_run(run_id)
    rows = cyclone_server.sql(
        "SELECT r.priority, s.priority, s.concurrency_key, s.concurrency_limit,"
        "       s.available_at > cyclone.now() + interval '59 minutes'"
        "  FROM cyclone.runs r JOIN cyclone.steps s USING (run_id) WHERE r.run_id = %s",
        run_id,
    )
    assert rows == [(2, 4, "k:7", 3, True)]
    assert run.run_id == run_id


def test_explain_counts_the_steps_ahead_in_claim_order(cyclone_server):
    low = [_submit(cyclone_server, workflow("w", node("n"))) for _ in range(2)]
    high = _submit(cyclone_server, workflow("w", node("n")), priority=5)

    def ahead(run_id: str) -> int:
        request = workflow_service_pb2.ExplainRequest(run_id=run_id, node="n")
        return int(cyclone_server.workflows.Explain(request).action.ready_ahead)

    assert [ahead(high), ahead(low[0]), ahead(low[1])] == [0, 1, 2]


def _explain(server: Any, run_id: str) -> Any:
    return server.workflows.Explain(workflow_service_pb2.ExplainRequest(run_id=run_id, node="n"))


def test_explain_says_a_ready_step_waits_for_its_full_concurrency_key(cyclone_server):
    runs = [
        _submit(cyclone_server, workflow("w", _keyed("n", "customer:{run.c}", 1)), input={"c": 7})
        for _ in range(2)
    ]
    [held] = _claim(cyclone_server, "work", 10)
    [waiting] = [r for r in runs if r != held.run_id]
    answer = _explain(cyclone_server, waiting)
    assert answer.reason == workflow_service_pb2.EXPLAIN_REASON_CONCURRENCY_LIMITED
    assert "'customer:7' has 1 of 1 step(s) running" in answer.message
    # Explain's step says it waits, for what, with no time known.
    assert answer.step.waiting == "concurrency" and "'customer:7'" in answer.step.waiting_reason
    assert not answer.step.HasField("waiting_until")
    # GetRun says the same of it, and nothing of the step holding the slot.
    [step] = get_run(cyclone_server, waiting).steps
    assert step.waiting == "concurrency" and "'customer:7'" in step.waiting_reason
    [running] = get_run(cyclone_server, held.run_id).steps
    assert running.waiting == ""
    _complete(cyclone_server, held)
    # The slot is free: it no longer waits.
    [step] = get_run(cyclone_server, waiting).steps
    assert step.waiting == ""
    # The key has room again: the next claim takes it.
    assert _explain(cyclone_server, waiting).reason == workflow_service_pb2.EXPLAIN_REASON_READY


def test_explain_says_a_ready_step_waits_for_its_actions_rate(cyclone_server):
    runs = [submit(cyclone_server, workflow("w", node("n", "rated"))) for _ in range(2)]
    [taken] = _claim(cyclone_server, "rated", 10, rate=(1, 60.0))
    [waiting] = [r for r in runs if r != taken.run_id]
    answer = _explain(cyclone_server, waiting)
    assert answer.reason == workflow_service_pb2.EXPLAIN_REASON_RATE_LIMITED
    assert "the rate limit of action rated is used up until" in answer.message
    assert answer.step.waiting == "rate_limit" and answer.step.HasField("waiting_until")
    # GetRun says it too, with the same time; the step taken does not wait.
    got = {s.node: s for s in get_run(cyclone_server, waiting).steps}["n"]
    assert (got.waiting, got.waiting_until) == ("rate_limit", answer.step.waiting_until)
    assert "rate limit of action rated" in got.waiting_reason
    assert get_run(cyclone_server, taken.run_id).steps[0].waiting == ""
    cyclone_server.advance_clock(61)  # the window opens (no worker asked meanwhile)
    assert _explain(cyclone_server, waiting).reason == workflow_service_pb2.EXPLAIN_REASON_QUEUED
