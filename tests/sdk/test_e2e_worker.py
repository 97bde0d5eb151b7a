"""Workers against a real server: DAGs, concurrency, outcomes, timeouts, leases, cancel."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading

import pytest

from pyclient import (
    AsyncClient,
    NonRetryableError,
    RetryAfter,
    RetryPolicy,
    StepStatus,
    Workflow,
    current,
)
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running

pytestmark = pytest.mark.usefixtures("cyclone_server")


@dataclasses.dataclass
class Order:
    order_id: str
    amount: int


def order_workflow() -> Workflow:
    wf = Workflow("order")
    charge = wf.node("charge")
    receipt = wf.node("send_receipt", depends_on=charge)
    wf.node("audit", depends_on=receipt, trigger_rule="all_done")
    return wf


def test_worker_runs_a_dag_in_order_passing_inputs_and_upstream_outputs(client, make_worker):
    worker = make_worker()
    order: list[str] = []

    @worker.action("charge")
    def charge(ctx, o: Order):
        order.append(ctx.node)
        return {"charge_id": f"ch-{o.order_id}", "amount": o.amount}

    @worker.action("send_receipt")
    async def send_receipt(ctx, data: dict):
        order.append(ctx.node)
        assert current() is ctx
        return {"to": data["email"], "charge": ctx.upstream["charge"]["charge_id"]}

    @worker.action()
    def audit(ctx):
        order.append(ctx.node)
        return sorted(ctx.upstream)

    with running(worker):
        run_id = client.submit(order_workflow(), {"order_id": "o-1", "amount": 42, "email": "a@b"})
        run = client.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed"
    assert order == ["charge", "send_receipt", "audit"]
    assert run.step("charge").output == {"charge_id": "ch-o-1", "amount": 42}
    assert run.step("send_receipt").output == {"to": "a@b", "charge": "ch-o-1"}
    assert run.step("audit").output == ["send_receipt"]
    assert {s.attempt for s in run.steps} == {1}


def test_claims_fill_every_slot_and_never_more(client, make_worker):
    worker = make_worker(concurrency=3)
    lock = threading.Lock()
    running_now, peak = [0], [0]
    together = threading.Barrier(3, timeout=PATIENCE)

    @worker.action("work")
    def work(ctx):
        with lock:
            running_now[0] += 1
            peak[0] = max(peak[0], running_now[0])
        try:
            if ctx.node in ("n0", "n1", "n2"):
                together.wait()  # passes only if three handlers run at once
        finally:
            with lock:
                running_now[0] -= 1

    wf = Workflow("fan")
    for i in range(6):
        wf.node(f"n{i}", action="work")
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    assert run.status == "completed"
    assert peak[0] == 3


def test_a_slot_freed_while_a_long_handler_runs_is_claimed_for_again(client, make_worker):
    worker = make_worker(concurrency=2)
    chain_done = threading.Event()

    @worker.action("long")
    def long(ctx):
        assert chain_done.wait(PATIENCE)  # holds its slot until the chain is through

    @worker.action("short")
    def short(ctx):
        if ctx.node == "s3":
            chain_done.set()

    wf = Workflow("w")
    wf.node("long")
    wf.node("s1", action="short")
    wf.node("s2", action="short", depends_on="s1")
    wf.node("s3", action="short", depends_on="s2")
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    assert run.status == "completed"


def test_handler_exceptions_are_retried_with_type_message_and_traceback(client, make_worker):
    worker = make_worker()

    @worker.action("flaky")
    def flaky(ctx):
        if ctx.attempt == 1:
            raise ConnectionError("smtp down")
        return "sent"

    wf = Workflow("w")
    wf.node("flaky", retry=RetryPolicy(initial_backoff=0, max_backoff=0))
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    step = run.step("flaky")
    assert (run.status, step.attempt, step.output) == ("completed", 2, "sent")
    (error,) = step.errors
    assert (error.attempt, error.type, error.message, error.retryable) == (
        1,
        "ConnectionError",
        "smtp down",
        True,
    )
    assert "Traceback" in error.details and 'raise ConnectionError("smtp down")' in error.details


def test_non_retryable_error_discards_at_once_and_failure_rules_run(client, make_worker):
    worker = make_worker()
    calls: list[str] = []

    @worker.action("charge")
    def charge(ctx):
        calls.append(ctx.node)
        raise NonRetryableError("card declined")

    @worker.action("refund")
    def refund(ctx):
        calls.append(ctx.node)

    wf = Workflow("w")
    c = wf.node("charge", retry=RetryPolicy(max_attempts=5))
    wf.node("refund", depends_on=c, trigger_rule="one_failed")
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    assert run.status == "failed"
    assert run.step("charge").status == "discarded"
    assert run.step("charge").errors[0].retryable is False
    assert run.step("refund").status == "completed"
    assert calls == ["charge", "refund"]


def test_retry_after_sets_when_the_next_attempt_may_start(client, make_worker):
    worker = make_worker()
    seen = threading.Event()

    @worker.action("rate_limited")
    def rate_limited(ctx):
        seen.set()
        raise RetryAfter(3600, "429 from the API")

    wf = Workflow("w")
    wf.node("rate_limited")
    with running(worker):
        run_id = client.submit(wf)
        assert seen.wait(PATIENCE)
        step = eventually(
            lambda: (s := client.get_run(run_id).step("rate_limited")).status == "available" and s,
            "the step to wait for its retry",
        )
    assert step.errors[0].message == "429 from the API"
    assert step.available_at is not None
    assert (step.available_at - step.errors[0].at).total_seconds() == pytest.approx(3600, abs=5)


def test_async_handler_is_cancelled_at_its_timeout_and_retried(client, make_worker):
    worker = make_worker()
    cancelled = threading.Event()

    @worker.action("slow", timeout=0.3)
    async def slow(ctx):
        if ctx.attempt > 1:
            return "fast enough"
        try:
            await asyncio.sleep(PATIENCE)  # never ends on its own: only cancellation stops it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    wf = Workflow("w")
    wf.node("slow", retry=RetryPolicy(initial_backoff=0, max_backoff=0))
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    step = run.step("slow")
    assert cancelled.is_set()
    assert (run.status, step.attempt, step.output) == ("completed", 2, "fast enough")
    assert step.errors[0].type == "HandlerTimeout"
    assert "timeout of 0.3s" in step.errors[0].message


def test_sync_handler_past_its_deadline_loses_the_lease_and_a_second_attempt_runs(
    cyclone_server, client, make_worker
):
    worker = make_worker(lease=1.0)
    release = threading.Event()
    first_told_to_stop = threading.Event()

    @worker.action("stuck")
    def stuck(ctx):
        if ctx.attempt == 1:
            if ctx.should_stop.wait(PATIENCE):
                first_told_to_stop.set()
            release.wait(PATIENCE)  # a non-cooperative handler keeps running
            return "late"
        return "second"

    wf = Workflow("w")
    wf.node("stuck", timeout=1)
    with running(worker):
        run_id = client.submit(wf)

        def second_attempt_done():
            cyclone_server.sweep()
            return client.get_run(run_id).status == "completed"

        eventually(second_attempt_done, "the second attempt to complete")
        release.set()
    run = client.get_run(run_id)
    step = run.step("stuck")
    assert first_told_to_stop.is_set()
    assert (step.attempt, step.output) == (2, "second")
    assert [e.kind for e in step.errors] == ["lease_expired"]


def test_heartbeats_keep_a_long_handler_alive_past_its_first_lease(
    cyclone_server, client, make_worker
):
    worker = make_worker(lease=1.5)
    calls: list[int] = []

    @worker.action("long")
    def long(ctx):
        calls.append(ctx.attempt)
        leases = [ctx.lease_expires_at]
        while len(leases) < 5:  # 4 heartbeats, 0.5s apart: past the first 1.5s lease
            if ctx.should_stop.wait(0.02):
                return "stopped"
            if ctx.lease_expires_at != leases[-1]:
                leases.append(ctx.lease_expires_at)
                cyclone_server.sweep()  # would reclaim an expired lease
        return "done"

    wf = Workflow("w")
    wf.node("long", timeout=60)
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    step = run.step("long")
    assert (run.status, step.output, step.attempt, calls) == ("completed", "done", 1, [1])
    assert step.errors == ()


def test_lost_lease_reaches_the_handler_and_its_outcome_is_dropped(
    cyclone_server, client, make_worker, caplog
):
    caplog.set_level(logging.WARNING, logger="pyclient")
    worker = make_worker(lease=2.0)
    started, lost = threading.Event(), threading.Event()

    @worker.action("work")
    def work(ctx):
        if ctx.attempt == 1:
            started.set()
            if ctx.lease_lost.wait(PATIENCE):
                lost.set()
            return "first"
        return "second"

    wf = Workflow("w")
    wf.node("work", timeout=60)
    with running(worker):
        run_id = client.submit(wf)
        assert started.wait(PATIENCE)
        cyclone_server.advance_clock(5)  # past the lease: as if heartbeats had stopped
        cyclone_server.sweep()
        run = client.wait(run_id, timeout=PATIENCE)
    assert lost.is_set()
    step = run.step("work")
    assert (step.attempt, step.output) == (2, "second")
    assert [e.kind for e in step.errors] == ["lease_expired"]
    said = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert said and not any("lease lost: lease lost" in m for m in said), said


@pytest.mark.parametrize("suspended", [False, True], ids=["at-once", "after-an-await"])
def test_an_async_handler_that_cancels_itself_fails_its_attempt(client, make_worker, suspended):
    # asyncio.CancelledError out of a handler the worker did not cancel is a failure
    # of the attempt (retried as any other), never a success with no output.
    worker = make_worker()

    @worker.action("work")
    async def work(ctx):
        if ctx.attempt == 1:
            if suspended:
                await asyncio.sleep(0.01)
            raise asyncio.CancelledError()
        return "second"

    wf = Workflow("w")
    wf.node("work", retry=RetryPolicy(initial_backoff=0, max_backoff=0))
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    step = run.step("work")
    assert (run.status, step.attempt, step.output) == ("completed", 2, "second")
    assert [(e.kind, e.type) for e in step.errors] == [("handler", "CancelledError")]


def test_cancelling_a_run_reaches_sync_and_async_handlers(client, make_worker):
    worker = make_worker(lease=1.0)
    started = threading.Barrier(3, timeout=PATIENCE)
    saw_cancel: list[str] = []

    @worker.action("sync_wait")
    def sync_wait(ctx):
        started.wait()
        if ctx.cancelled.wait(PATIENCE):
            saw_cancel.append("sync")

    @worker.action("async_wait")
    async def async_wait(ctx):
        await asyncio.to_thread(started.wait)
        try:
            await asyncio.sleep(PATIENCE)  # never ends on its own: only cancellation stops it
        except asyncio.CancelledError:
            saw_cancel.append("async")
            raise

    wf = Workflow("w")
    wf.node("a", action="sync_wait")
    wf.node("b", action="async_wait")
    with running(worker):
        run_id = client.submit(wf)
        started.wait()
        run = client.cancel(run_id, reason="changed my mind")
        eventually(lambda: len(saw_cancel) == 2, "both handlers to see the cancellation")
    assert sorted(saw_cancel) == ["async", "sync"]
    assert run.status == "cancelled"
    assert {s.status for s in client.get_run(run_id).steps} == {"cancelled"}


def test_async_client_submits_and_waits(cyclone_server, make_worker):
    worker = make_worker()
    worker.register("charge", lambda ctx: ctx.idempotency_key)

    async def scenario():
        async with AsyncClient(cyclone_server.address) as ac:
            wf = Workflow("w")
            wf.node("charge")
            first = await ac.submit_once(wf, "order-1", {"n": 1})
            again = await ac.submit_once(wf, "order-1", {"n": 2})
            run = await ac.wait(first.run_id, timeout=PATIENCE)
            listed = [r.run_id async for r in ac.iter_runs(workflow="w")]
            return first, again, run, listed

    with running(worker):
        first, again, run, listed = asyncio.run(scenario())
    assert first.created and not again.created and again.run_id == first.run_id
    assert run.status == "completed"
    assert run.step("charge").output == f"{run.run_id}:charge"
    assert listed == [run.run_id]


def test_unsafe_action_blocks_its_run_after_a_lost_lease_until_resolved(
    cyclone_server, client, make_worker
):
    worker = make_worker(lease=2.0)
    started = threading.Event()
    calls: list[int] = []

    @worker.action("charge", unsafe_to_repeat=True)
    def charge(ctx):
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            started.set()
            ctx.should_stop.wait(PATIENCE)  # dies, as far as the server can tell
            return "lost"
        return "charged"

    wf = Workflow("order")
    wf.node("charge", timeout=60)
    with running(worker):
        run_id = client.submit(wf)
        assert started.wait(PATIENCE)
        cyclone_server.advance_clock(5)
        cyclone_server.sweep()
        blocked = client.wait(run_id, timeout=PATIENCE)
        assert blocked.status == "blocked"
        assert (blocked.error.kind, blocked.error.node, blocked.error.attempt) == (
            "EffectUncertain",
            "charge",
            1,
        )
        assert blocked.step("charge").status == "uncertain"
        client.resolve(run_id, "charge", discard=True, reason="no charge at the PSP")
        run = client.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed"
    assert run.step("charge").output == "charged"
    assert calls == [1, 2]
    assert [(a.action, a.actor, a.reason) for a in run.audit] == [
        ("resolve_discard", "sdk-tests", "no charge at the PSP")
    ]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_unsafe_handler_cut_off_at_its_time_limit_blocks_the_run(client, make_worker, kind):
    # Whatever stopped it, a handler of an unsafe action that did not finish may have had
    # its effect: the run blocks instead of a second attempt repeating it.
    worker = make_worker()
    calls: list[int] = []
    release = threading.Event()

    if kind == "async":

        @worker.action("charge", timeout=0.3, unsafe_to_repeat=True)
        async def charge(ctx):
            calls.append(ctx.attempt)
            await asyncio.sleep(PATIENCE)  # never ends on its own: only cancellation stops it

    else:

        @worker.action("charge", timeout=0.3, unsafe_to_repeat=True)
        def charge(ctx):
            calls.append(ctx.attempt)
            release.wait(PATIENCE)  # does not watch ctx.should_stop
            return "late"

    wf = Workflow("order")
    wf.node("charge", retry=RetryPolicy(initial_backoff=0, max_backoff=0))
    with running(worker):
        run_id = client.submit(wf)
        blocked = eventually(
            lambda: (r := client.get_run(run_id)).status == "blocked" and r,
            "the run to block",
        )
        release.set()
    assert (blocked.error.kind, blocked.error.node, blocked.error.attempt) == (
        "EffectUncertain",
        "charge",
        1,
    )
    assert "time limit" in blocked.error.message or "timeout" in blocked.error.message
    assert blocked.step("charge").status == "uncertain"
    assert calls == [1]


def test_an_unsafe_handler_that_cancels_itself_blocks_the_run(client, make_worker):
    # Cancelled partway, it may have had its effect: as when cut off at its time limit.
    worker = make_worker()
    calls: list[int] = []

    @worker.action("charge", unsafe_to_repeat=True)
    async def charge(ctx):
        calls.append(ctx.attempt)
        await asyncio.sleep(0.01)
        raise asyncio.CancelledError()

    wf = Workflow("order")
    wf.node("charge", retry=RetryPolicy(initial_backoff=0, max_backoff=0))
    with running(worker):
        run_id = client.submit(wf)
        blocked = eventually(
            lambda: (r := client.get_run(run_id)).status == "blocked" and r,
            "the run to block",
        )
    assert (blocked.error.kind, blocked.error.node) == ("EffectUncertain", "charge")
    assert blocked.step("charge").status == "uncertain"
    assert calls == [1]


def test_sdk_handlers_read_the_failures_from_their_context(client, make_worker):
    worker = make_worker()
    seen: dict[str, tuple] = {}
    done = threading.Event()

    @worker.action("charge")
    def charge(ctx):
        raise NonRetryableError("card declined")

    @worker.action("cleanup")
    def cleanup(ctx):
        seen[ctx.node] = ctx.upstream_failures
        if len(seen) == 2:
            done.set()

    wf = Workflow("order")
    c = wf.node("charge", retry=RetryPolicy(max_attempts=3))
    s = wf.node("ship", depends_on=c)
    wf.node("refund", action="cleanup", depends_on=c, trigger_rule="one_failed")
    wf.node("audit", action="cleanup", depends_on=[c, s], trigger_rule="all_done")
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    assert done.is_set()
    assert run.status == "failed"

    [failure] = seen["refund"]
    assert failure.node == "charge"
    assert failure.status == StepStatus.DISCARDED
    assert failure.error is not None
    assert failure.error.attempt == 1
    assert failure.error.kind == "handler"
    assert failure.error.type == "NonRetryableError"
    assert failure.error.message == "card declined"
    assert [(f.node, f.status, f.error) for f in seen["audit"]] == [
        ("charge", StepStatus.DISCARDED, failure.error),
        ("ship", StepStatus.SKIPPED, None),
    ]


def test_a_worker_stopped_as_its_handlers_end_still_reports_their_outcomes(client, make_worker):
    # A step's task ends once its outcome is queued for the next CompleteMany; the
    # slot, and the worker's shutdown, wait for that CompleteMany's answer.
    worker = make_worker(concurrency=4)
    # The last handler to arrive stops the worker (once: a second stop would cut the
    # shutdown short); then they all return.
    started = threading.Barrier(4, action=worker.stop, timeout=PATIENCE)
    stopped: list[str] = []

    @worker.action("last")
    def last(ctx):
        started.wait()
        stopped.append(ctx.node)
        return {"node": ctx.node}

    wf = Workflow("stopping")
    for i in range(4):
        wf.node(f"n{i}", action="last")
    run_id = client.submit(wf)
    with running(worker):
        eventually(lambda: len(stopped) == 4 and worker._runtime is None, "the stop")
    run = client.get_run(run_id)
    assert run.status == "completed"
    assert {s.node: s.output for s in run.steps} == {f"n{i}": {"node": f"n{i}"} for i in range(4)}
