"""The Worker's session on a Work stream (pyclient.worker._session), against real
servers: runs drained on one stream with no Claim nor CompleteMany call, never more
steps held than the worker's slots, slots freed without a report granted again, a
server without Work claimed from as before, a stream broken or cut off mid-drain
losing no outcome, and a stop reporting what finished."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from typing import Any

import grpc
import psycopg
import pytest

from pyclient import RetryPolicy, Workflow, sleep
from pyclient.worker import _session
from service.api.worker import WorkerServicer
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running


def one_node(action: str = "work", **kwargs: Any) -> Workflow:
    wf = Workflow("job")
    wf.node("only", action=action, **kwargs)
    return wf


def rpcs(server: Any, method: str) -> float:
    """Unary calls of ``method`` the server answered, whatever their status."""
    samples = server.server.metrics.registry.collect()
    return sum(
        s.value
        for family in samples
        if family.name == "cyclone_rpcs"
        for s in family.samples
        if s.name == "cyclone_rpcs_total" and s.labels["method"] == f"WorkerService/{method}"
    )


def work_streams(server: Any) -> float:
    return server.server.metrics.registry.get_sample_value("cyclone_work_streams") or 0.0


def statuses(server: Any) -> collections.Counter[str]:
    return collections.Counter(s for (s,) in server.sql("SELECT status FROM cyclone.steps"))


def test_a_worker_drains_its_runs_on_one_work_stream(cyclone_server, client, make_worker):
    worker = make_worker(concurrency=4)
    worker.register("work", lambda ctx: ctx.run_id)
    runs = [client.submit(one_node()) for _ in range(30)]
    with running(worker):
        done = [client.wait(run_id, timeout=PATIENCE) for run_id in runs]
        assert work_streams(cyclone_server) == 1
    assert [r.status for r in done] == ["completed"] * 30
    assert [r.step("only").output for r in done] == runs
    # Claims and reports went on the stream: not one Claim, CompleteMany nor Complete.
    assert rpcs(cyclone_server, "Claim") == 0
    assert rpcs(cyclone_server, "CompleteMany") == 0
    assert rpcs(cyclone_server, "Complete") == 0
    eventually(lambda: work_streams(cyclone_server) == 0, "the stream to end with the worker")


def test_the_worker_never_holds_more_steps_than_its_slots(cyclone_server, client, make_worker):
    """A backlog of short steps, some failing and retried at once: handlers never run
    more than ``concurrency`` at once, nor does the database ever hold more steps
    leased to the worker (credit granted with each report, as its slots come free)."""
    worker = make_worker(concurrency=3)
    lock = threading.Lock()
    now, peak, leased = [0], [0], [0]
    conn = psycopg.connect(cyclone_server.database_url, autocommit=True)

    @worker.action("work")
    def work(ctx: Any) -> None:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
            (held,) = conn.execute(
                "SELECT count(*) FROM cyclone.steps WHERE status = 'running' AND worker_id = %s",
                (worker.worker_id,),
            ).fetchone()
            leased[0] = max(leased[0], held)
        try:
            time.sleep(0.005 * (hash(ctx.run_id) % 4))
            if ctx.attempt == 1 and hash(ctx.run_id) % 3 == 0:
                raise ConnectionError("flaky")
        finally:
            with lock:
                now[0] -= 1

    retry = RetryPolicy(initial_backoff=0, max_backoff=0)
    runs = [client.submit(one_node(retry=retry)) for _ in range(40)]
    try:
        with running(worker):
            done = [client.wait(run_id, timeout=PATIENCE) for run_id in runs]
    finally:
        conn.close()
    assert [r.status for r in done] == ["completed"] * 40
    assert peak[0] == 3
    assert leased[0] <= 3


def test_a_slot_freed_without_a_report_is_granted_again(client, make_worker):
    """A body that sleeps gives its slot up with no outcome to report: the slot is
    granted on the stream again at once, so the one-slot worker runs the next step."""
    worker = make_worker(concurrency=1)
    worker.register("work", lambda ctx: "ran")

    @worker.workflow("nap")
    def nap(ctx: Any) -> str:
        sleep(3600)
        return "woke"

    sleeper = client.start("nap")
    with running(worker):
        eventually(lambda: bool(client.get_run(sleeper).steps[0].waiting_for), "the body to sleep")
        run = client.wait(client.submit(one_node()), timeout=PATIENCE)
    assert (run.status, run.step("only").output) == ("completed", "ran")


def test_a_server_without_work_streams_is_claimed_from(
    server_factory, client, make_worker, monkeypatch, caplog
):
    """An older server answers Work with UNIMPLEMENTED: the worker says so once and
    claims with Claim and reports with CompleteMany for the rest of its run."""
    opened: list[int] = []

    async def unimplemented(self: Any, requests: Any, context: Any) -> Any:
        opened.append(1)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield b""  # pragma: no cover (an async generator, as the real one)

    monkeypatch.setattr(WorkerServicer, "Work", unimplemented)
    old = server_factory()
    worker = make_worker(concurrency=2, claim_wait=0.5)
    worker.address = old.address
    worker.register("work", lambda ctx: "ok")
    runs = [client.submit(one_node()) for _ in range(6)]
    with caplog.at_level(logging.INFO, logger="pyclient.worker"), running(worker):
        done = [client.wait(run_id, timeout=PATIENCE) for run_id in runs]
        tried = len(opened)
        time.sleep(1.5)  # a few idle claims: it does not try the stream again
        assert len(opened) == tried
    assert [r.status for r in done] == ["completed"] * 6
    # Once, or a few times: the opening's write can race the server's answer, and gRPC
    # then ends the call INTERNAL ("Internal error from Core"), which the worker takes
    # as a failed stream and opens another after its backoff, until one is answered
    # UNIMPLEMENTED (above: then it stops trying).
    assert tried >= 1
    assert rpcs(old, "Claim") >= 2 and rpcs(old, "CompleteMany") >= 1
    said = [r for r in caplog.records if "offers no Work stream" in r.getMessage()]
    assert len(said) == 1


@pytest.mark.parametrize("grace", [0, 5], ids=["cut-off", "stopping"])
def test_a_stream_broken_mid_drain_loses_no_outcome(
    cyclone_server, server_factory, client, make_worker, grace
):
    """The worker's server goes away mid-drain (cut off, or stopping: it answers what
    it read and ends its streams) and another starts on its address: every handler
    that returned has its outcome recorded (it never runs again), the reports not
    answered going by CompleteMany or the next stream."""
    first = server_factory()
    address = first.address
    worker = make_worker(concurrency=4, lease=10.0)
    worker.address = address
    returned: collections.Counter[str] = collections.Counter()
    started: set[str] = set()

    @worker.action("work")
    async def work(ctx: Any) -> str:
        started.add(ctx.run_id)
        await asyncio.sleep(0.02)
        returned[ctx.run_id] += 1
        return "ok"

    runs = [client.submit(one_node()) for _ in range(60)]
    with running(worker):
        eventually(lambda: sum(returned.values()) >= 12, "a part of the drain")
        first.stop(grace)
        server_factory(listen=address)

        def settled() -> bool:
            # Done, or handed out by the server that went away and never delivered.
            return (
                all(
                    run.status == "completed" or run.steps[0].status == "running"
                    for run in map(client.get_run, runs)
                    if run.run_id in started or run.status == "completed"
                )
                and len(started) + stranded() >= 60
            )

        def stranded() -> int:
            return sum(
                1
                for run in map(client.get_run, runs)
                if run.run_id not in started and run.steps[0].status == "running"
            )

        eventually(settled, "the drain to settle")
        time.sleep(0.5)
        if stranded():  # leased by a claim whose answer was lost: its lease lapses
            cyclone_server.advance_clock(60)
            cyclone_server.sweep()
        done = [client.wait(run_id, timeout=PATIENCE) for run_id in runs]
    assert [r.status for r in done] == ["completed"] * 60
    assert set(returned) == set(runs)
    assert [run for run, n in returned.items() if n > 1] == []


def test_a_report_not_answered_in_time_goes_by_complete_many(
    cyclone_server, client, make_worker, monkeypatch
):
    """A report the server sits on past its time: the worker cuts the stream off,
    sends the report with CompleteMany, and opens another stream."""
    monkeypatch.setattr(_session, "RPC_TIMEOUT", 0.5)
    monkeypatch.setattr(_session, "WATCH_INTERVAL", 0.1)
    real = WorkerServicer._report
    delayed: list[int] = []

    async def slow_first(self: Any, request: Any) -> bytes:
        if not delayed:
            delayed.append(1)
            await asyncio.sleep(5)
        return await real(self, request)

    monkeypatch.setattr(WorkerServicer, "_report", slow_first)
    worker = make_worker(concurrency=2)
    worker.register("work", lambda ctx: "ok")
    with running(worker):
        first = client.wait(client.submit(one_node()), timeout=PATIENCE)
        second = client.wait(client.submit(one_node()), timeout=PATIENCE)
    assert (first.status, second.status) == ("completed", "completed")
    assert first.step("only").attempt == 1
    assert rpcs(cyclone_server, "CompleteMany") == 1  # the report cut off, only
    assert delayed == [1]


def test_an_idle_stream_is_opened_again_and_still_hands_out(
    server_factory, client, make_worker, monkeypatch
):
    monkeypatch.setattr(_session, "IDLE_S", 0.2)
    monkeypatch.setattr(_session, "WATCH_INTERVAL", 0.05)
    opened: list[int] = []
    real = WorkerServicer.Work

    def counting(self: Any, requests: Any, context: Any) -> Any:
        opened.append(1)
        return real(self, requests, context)

    monkeypatch.setattr(WorkerServicer, "Work", counting)
    server = server_factory()  # registers its servicer's Work now: the counting one
    worker = make_worker()
    worker.address = server.address
    worker.register("work", lambda ctx: "ok")
    with running(worker):
        eventually(lambda: len(opened) >= 3, "the idle stream to be opened again")
        run = client.wait(client.submit(one_node()), timeout=PATIENCE)
    assert run.status == "completed"


def test_a_stop_mid_drain_reports_what_finished(cyclone_server, client, make_worker):
    """Stopped mid-drain, the worker grants no more, half-closes its stream, runs what
    the server handed out before it saw the end, and reports every outcome: no step is
    left leased, and those never handed out wait for the next worker."""
    worker = make_worker(concurrency=4)
    lock = threading.Lock()
    started: list[str] = []
    ended: list[str] = []

    @worker.action("work")
    def work(ctx: Any) -> str:
        with lock:
            started.append(ctx.run_id)
        time.sleep(0.2)
        with lock:
            ended.append(ctx.run_id)
        return "ok"

    runs = [client.submit(one_node()) for _ in range(40)]
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        eventually(lambda: len(ended) >= 6, "a part of the drain")
        worker.stop()  # once: the handlers in flight are waited for
        thread.join(PATIENCE)
        assert not thread.is_alive(), "the worker did not stop"
    finally:
        worker.stop()
        worker.stop()
        thread.join(PATIENCE)
    assert sorted(started) == sorted(ended)  # every handler in flight finished
    assert len(set(started)) == len(started)
    for run_id in runs:
        step = client.get_run(run_id).steps[0]
        if run_id in started:
            assert (step.status, step.attempt) == ("completed", 1), run_id
        else:
            assert (step.status, step.attempt) == ("available", 0), run_id
    assert statuses(cyclone_server)["running"] == 0
    assert len(started) < 40
