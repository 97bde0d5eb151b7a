"""Durable functions against a real server and a real Worker: replays, handled
failures, unsafe calls that block, resolutions by step id, bodies inside DAGs."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from typing import Any

import pytest

from pyclient import (
    AsyncClient,
    Client,
    RetryPolicy,
    StepCallStatus,
    StepFailed,
    Workflow,
    context,
    step,
)
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running

pytestmark = pytest.mark.usefixtures("cyclone_server")

#: Retries at once, so a failed attempt is replayed without waiting.
AT_ONCE = RetryPolicy(max_attempts=3, initial_backoff=0, max_backoff=0)


class Shop:
    """The steps of a checkout, counting their effects; ``fail_once`` makes a step
    raise on its first call, ``hold`` makes charge wait for ``release``."""

    def __init__(self, fail_once: tuple[str, ...] = ()) -> None:
        self.effects: collections.Counter[str] = collections.Counter()
        self.fail_once = set(fail_once)
        self.hold = False
        self.charging = threading.Event()
        self.release = threading.Event()
        self.keys: list[str] = []

        @step
        def reserve(item: str) -> dict:
            self._effect("reserve")
            return {"reserved": item}

        @step(unsafe_to_repeat=True)
        def charge(amount: int) -> dict:
            self._effect("charge")
            self.keys.append(context.current().step_key)
            if self.hold:
                self.charging.set()
                self.release.wait(PATIENCE)
            return {"charge_id": f"ch_{amount}"}

        @step
        def release_stock(item: str) -> str:
            self._effect("release_stock")
            return f"released {item}"

        @step
        def notify(what: str) -> str:
            self._effect("notify")
            return what

        self.reserve, self.charge, self.release_stock, self.notify = (
            reserve,
            charge,
            release_stock,
            notify,
        )

    def _effect(self, name: str) -> None:
        self.effects[name] += 1
        if name in self.fail_once and self.effects[name] == 1:
            raise ConnectionError(f"{name}: connection reset")

    def checkout(self, ctx: Any, order: dict) -> dict:
        """reserve, charge (unsafe), then notify; a failed charge releases the stock."""
        reserved = self.reserve(order["item"])
        try:
            charged = self.charge(order["amount"])
        except StepFailed as e:
            self.release_stock(order["item"])
            return {"failed": e.type_name, "why": e.message}
        self.notify(f"charged {charged['charge_id']}")
        return {**reserved, **charged}


ORDER = {"item": "book", "amount": 42}


def count_and_fail_first(counter: collections.Counter[str], name: str, error: Exception) -> None:
    """Count a call of ``name``; the first one raises ``error``."""
    counter[name] += 1
    if counter[name] == 1:
        raise error


def test_a_body_of_steps_completes_and_its_journal_is_in_get_run(client, make_worker):
    shop = Shop()
    worker = make_worker()
    worker.workflow("checkout")(shop.checkout)
    with running(worker):
        run_id = client.start("checkout", ORDER)
        run = client.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed" and run.workflow == "checkout"
    step = run.step("checkout")
    assert step.output == {"reserved": "book", "charge_id": "ch_42"}
    assert [(c.seq, c.step_id, c.status, c.unsafe_to_repeat) for c in step.journal] == [
        (1, "reserve", StepCallStatus.SUCCEEDED, False),
        (2, "charge", StepCallStatus.SUCCEEDED, True),
        (3, "notify", StepCallStatus.SUCCEEDED, False),
    ]
    assert step.journal[1].output == {"charge_id": "ch_42"}
    assert shop.effects == {"reserve": 1, "charge": 1, "notify": 1}
    assert shop.keys == [f"{run_id}:checkout:charge"]


def test_a_retried_attempt_replays_recorded_calls_without_running_them(client, make_worker):
    shop = Shop(fail_once=("notify",))
    worker = make_worker()
    worker.workflow("checkout")(shop.checkout)
    with running(worker):
        run = client.wait(client.start("checkout", ORDER, retry=AT_ONCE), timeout=PATIENCE)
    step = run.step("checkout")
    assert (run.status, step.attempt) == ("completed", 2)
    assert shop.effects == {"reserve": 1, "charge": 1, "notify": 2}
    (error,) = step.errors
    assert (error.type, error.message) == ("ConnectionError", "notify: connection reset")
    assert "raised by step call 'notify'" in error.details


def test_an_async_body_replays_its_gathered_calls_in_call_order(client, make_worker):
    effects: collections.Counter[str] = collections.Counter()

    @step
    async def fetch(key: str) -> str:
        effects[key] += 1
        await asyncio.sleep(0.05 if key == "a" else 0)  # b ends first
        return key.upper()

    @step
    async def flaky() -> str:
        count_and_fail_first(effects, "flaky", TimeoutError("slow"))
        return "ok"

    worker = make_worker()

    @worker.workflow()
    async def gather(ctx):
        pair = await asyncio.gather(fetch("a"), fetch("b"))
        return [*pair, await flaky()]

    with running(worker):
        run_id = client.start(gather, retry=AT_ONCE)  # the function names the workflow
        run = client.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed" and run.step("gather").output == ["A", "B", "ok"]
    assert effects == {"a": 1, "b": 1, "flaky": 2}
    assert [(c.seq, c.step_id) for c in run.step("gather").journal] == [
        (1, "fetch"),
        (2, "fetch#2"),
        (3, "flaky"),
    ]


def test_a_handled_failure_runs_the_cleanup_step_and_the_run_completes(client, make_worker):
    shop = Shop(fail_once=("charge",))
    worker = make_worker()
    worker.workflow("checkout")(shop.checkout)
    with running(worker):
        run = client.wait(client.start("checkout", ORDER), timeout=PATIENCE)
    step = run.step("checkout")
    assert run.status == "completed" and step.attempt == 1
    assert step.output == {"failed": "ConnectionError", "why": "charge: connection reset"}
    assert [(c.step_id, c.status) for c in step.journal] == [
        ("reserve", StepCallStatus.SUCCEEDED),
        ("charge", StepCallStatus.FAILED),
        ("release_stock", StepCallStatus.SUCCEEDED),
    ]
    assert step.journal[1].error is not None
    assert step.journal[1].error.type == "ConnectionError"


def test_the_cleanup_of_an_except_block_runs_once_across_replays(client, make_worker):
    effects: collections.Counter[str] = collections.Counter()

    @step
    def pay() -> None:
        effects["pay"] += 1
        raise ValueError("declined")

    @step
    def refund() -> str:
        effects["refund"] += 1
        return "refunded"

    @step
    def report() -> str:
        count_and_fail_first(effects, "report", ConnectionError("mail server down"))
        return "reported"

    worker = make_worker()

    @worker.workflow("order")
    def order(ctx):
        try:
            pay()
        except StepFailed:
            refund()
        return report()

    with running(worker):
        run = client.wait(client.start("order", retry=AT_ONCE), timeout=PATIENCE)
    assert (run.status, run.step("order").attempt) == ("completed", 2)
    assert effects == {"pay": 1, "refund": 1, "report": 2}


def block_on_charge(client, make_worker, server, shop: Shop) -> tuple[str, Any]:
    """A checkout whose first attempt dies inside its unsafe charge (the worker is
    cut off while charge runs, its lease lapses); the second attempt, on a new
    worker, blocks the run. Returns the run id and the running second worker's
    context manager (exit it to stop the worker)."""
    shop.hold = True
    first = make_worker(shutdown_grace=0.1)
    first.workflow("checkout")(shop.checkout)
    with running(first):
        run_id = client.start("checkout", ORDER)
        assert shop.charging.wait(PATIENCE)
    # The first worker gave up on the handler; its lease lapses.
    server.advance_clock(60)
    assert server.sweep() == 1
    second = make_worker()
    second.workflow("checkout")(shop.checkout)
    serving = running(second)
    serving.__enter__()
    try:
        run = client.wait(run_id, timeout=PATIENCE)
        assert run.status == "blocked", run
    except BaseException:
        serving.__exit__(None, None, None)
        raise
    finally:
        shop.hold = False
        shop.release.set()  # the first handler ends: its outcome is refused
    return run_id, serving


def test_an_unsafe_call_started_by_an_earlier_attempt_blocks_the_run(
    client, make_worker, cyclone_server, caplog
):
    shop = Shop()
    caplog.set_level(logging.WARNING, logger="pyclient.worker")
    run_id, serving = block_on_charge(client, make_worker, cyclone_server, shop)
    try:
        run = client.get_run(run_id)
        assert run.error is not None and run.error.kind == "EffectUncertain"
        assert (run.error.node, run.error.step_id) == ("checkout", "charge")
        step = run.step("checkout")
        assert step.status == "uncertain" and step.attempt == 2
        assert [(c.step_id, c.status) for c in step.journal] == [
            ("reserve", StepCallStatus.SUCCEEDED),
            ("charge", StepCallStatus.STARTED),
        ]
        assert shop.effects == {"reserve": 1, "charge": 1}  # not charged again
        warning = eventually(
            lambda: [r for r in caplog.records if "run blocked on step call" in r.message],
            "the worker's warning",
        )[0].getMessage()
        assert f"cyclone resolve {run_id} charge --result JSON" in warning
    finally:
        serving.__exit__(None, None, None)


@pytest.mark.parametrize(
    ("resolution", "output", "effects"),
    [
        (
            {"result": {"charge_id": "ch_found"}},
            {"reserved": "book", "charge_id": "ch_found"},
            {"reserve": 1, "charge": 1, "notify": 1},
        ),
        (
            {"error": "card declined"},
            {"failed": "EffectFailed", "why": "card declined"},
            {"reserve": 1, "charge": 1, "release_stock": 1},
        ),
        (
            {"discard": True},
            {"reserved": "book", "charge_id": "ch_42"},
            {"reserve": 1, "charge": 2, "notify": 1},
        ),
    ],
    ids=["result", "error", "discard"],
)
def test_resolving_the_blocked_call_by_step_id_resumes_the_body(
    client, make_worker, cyclone_server, resolution, output, effects
):
    shop = Shop()
    run_id, serving = block_on_charge(client, make_worker, cyclone_server, shop)
    try:
        client.resolve(run_id, step_id="charge", reason="checked the PSP", **resolution)
        run = client.wait(run_id, timeout=PATIENCE)
    finally:
        serving.__exit__(None, None, None)
    assert run.status == "completed"
    assert run.step("checkout").output == output
    assert shop.effects == effects
    assert run.audit[-1].action == f"resolve_{next(iter(resolution))}"


def test_a_replay_out_of_order_fails_the_node_for_good_naming_both_step_ids(client, make_worker):
    order = ["first", "second"]
    attempts: list[int] = []

    @step
    def first() -> int:
        return 1

    @step
    def second() -> int:
        return 2

    worker = make_worker()

    @worker.workflow("drift")
    def drift(ctx):
        attempts.append(ctx.attempt)
        for name in order:
            first() if name == "first" else second()
        if ctx.attempt == 1:
            order.reverse()  # the code "changes" before the retry
            raise ConnectionError("crash after the first calls")
        return "done"

    with running(worker):
        run = client.wait(client.start("drift", retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "failed" and attempts == [1, 2]
    error = run.step("drift").last_error
    assert error is not None and error.type == "ReplayMismatch" and not error.retryable
    assert "call #1 recorded step 'first' of " in error.message
    assert "this replay makes step 'second' of " in error.message


def test_a_durable_function_is_a_node_of_a_dag(client, make_worker):
    shop = Shop()
    worker = make_worker()
    worker.workflow("checkout")(shop.checkout)

    @worker.action("quote")
    def quote(ctx, order: dict) -> dict:
        return {"amount": order["qty"] * 7}

    @worker.action("ship")
    def ship(ctx) -> str:
        return f"shipped after {ctx.upstream['checkout']['charge_id']}"

    wf = Workflow("order")
    q = wf.node("quote")
    c = wf.node("checkout", depends_on=q, input={"item": "pen", "amount": 0})
    wf.node("ship", depends_on=c)

    with running(worker):
        run = client.wait(client.submit(wf, {"qty": 3}), timeout=PATIENCE)
    assert run.status == "completed"
    assert run.step("checkout").output == {"reserved": "pen", "charge_id": "ch_0"}
    assert run.step("ship").output == "shipped after ch_0"
    assert [c.step_id for c in run.step("checkout").journal] == ["reserve", "charge", "notify"]
    assert run.step("quote").journal == ()


def test_start_with_a_key_starts_one_run(client):
    first = client.start("checkout", ORDER, key="order-1")
    again = client.start("checkout", {"other": True}, key="order-1")
    other = client.start("checkout", ORDER)
    assert first == again != other
    run = client.get_run(first)
    assert (run.workflow, run.input, run.submit_key) == ("checkout", ORDER, "order-1")
    assert [(s.node, s.action) for s in run.steps] == [("checkout", "checkout")]


PAYMENTS = """
CREATE TABLE payments (
    step_key text    PRIMARY KEY,
    amount   integer NOT NULL
)
"""
#: A plain INSERT: a second run of one step call would violate the primary key.
PAY = "INSERT INTO payments (step_key, amount) VALUES (%s, %s)"


def test_a_step_writes_in_its_own_transaction_once_across_replays(
    cyclone_server, client, make_worker
):
    cyclone_server.sql(PAYMENTS)
    calls: collections.Counter[str] = collections.Counter()

    @step
    def pay(amount: int) -> int:
        calls["pay"] += 1
        ctx = context.current()
        ctx.completion_tx().execute(PAY, (ctx.step_key, amount))
        return amount

    @step
    def refuse(amount: int) -> None:
        calls["refuse"] += 1
        context.current().completion_tx().execute(PAY, ("refused", amount))
        raise ValueError("over the limit")

    @step
    def confirm() -> str:
        count_and_fail_first(calls, "confirm", ConnectionError("crash after the payment"))
        return "confirmed"

    worker = make_worker(database_url=cyclone_server.database_url)

    @worker.workflow("pay")
    def body(ctx, amount: int):
        paid = pay(amount)
        try:
            refuse(amount)
        except StepFailed as e:
            assert e.type_name == "ValueError"
        return [paid, confirm()]

    with running(worker):
        run = client.wait(client.start("pay", 5, retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "completed" and run.step("pay").output == [5, "confirmed"]
    assert calls == {"pay": 1, "refuse": 1, "confirm": 2}
    # The payment committed once, with its record; the refused call's write rolled back.
    assert cyclone_server.sql("SELECT step_key, amount FROM payments") == [
        (f"{run.run_id}:pay:pay", 5)
    ]
    journal = {c.step_id: c.status for c in run.step("pay").journal}
    assert journal == {
        "pay": StepCallStatus.SUCCEEDED,
        "refuse": StepCallStatus.FAILED,
        "confirm": StepCallStatus.SUCCEEDED,
    }


def test_a_step_records_its_call_in_its_own_transaction_on_its_own_connection(
    cyclone_server, client, make_worker
):
    import psycopg

    cyclone_server.sql(PAYMENTS)
    calls: collections.Counter[str] = collections.Counter()

    @step
    def pay(amount: int) -> int:
        calls["pay"] += 1
        ctx = context.current()
        with psycopg.connect(cyclone_server.database_url) as conn:  # commits on exit
            conn.execute(PAY, (ctx.step_key, amount))
            ctx.record_step_call(conn, amount)
        return amount

    @step
    def confirm() -> str:
        count_and_fail_first(calls, "confirm", ConnectionError("crash after the payment"))
        return "confirmed"

    worker = make_worker()

    @worker.workflow("pay")
    def body(ctx, amount: int):
        return [pay(amount), confirm()]

    with running(worker):
        run = client.wait(client.start("pay", 7, retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "completed" and run.step("pay").output == [7, "confirmed"]
    assert calls == {"pay": 1, "confirm": 2}
    assert cyclone_server.sql("SELECT amount FROM payments") == [(7,)]
    assert run.step("pay").journal[0].output == 7


def test_a_body_that_lost_its_lease_makes_no_further_step_call(client, make_worker, cyclone_server):
    calls: list[tuple[str, int]] = []
    first_ctx: list[Any] = []
    release = threading.Event()

    @step
    def one() -> int:
        calls.append(("one", context.current().attempt))
        return 1

    @step
    def two() -> int:
        calls.append(("two", context.current().attempt))
        return 2

    worker = make_worker()

    @worker.workflow("slow")
    def slow(ctx):
        one()
        if ctx.attempt == 1:
            first_ctx.append(ctx)
            assert release.wait(PATIENCE)
        return two()

    with running(worker):
        run_id = client.start("slow")
        eventually(lambda: first_ctx, "the first attempt to wait")
        # one's end travels after it returned: recorded before the lease is taken away,
        # so that attempt 2 replays it instead of calling it again.
        eventually(
            lambda: [c.step_id for c in client.get_run(run_id).step("slow").journal] == ["one"],
            "one to be recorded",
        )
        cyclone_server.advance_clock(60)  # its lease expires; attempt 2 takes the node
        assert cyclone_server.sweep() == 1
        eventually(lambda: first_ctx[0].lease_lost.is_set(), "the lost lease to be seen")
        run = client.wait(run_id, timeout=PATIENCE)
        release.set()  # attempt 1 goes on; the worker's stop waits for it
    assert run.status == "completed" and run.step("slow").attempt == 2
    assert calls == [("one", 1), ("two", 2)]  # attempt 1 stopped before calling two


def test_the_async_client_starts_a_durable_function_too(cyclone_server):
    async def start_twice() -> tuple[str, str]:
        async with AsyncClient(cyclone_server.address) as client:
            first = await client.start("checkout", ORDER, key="order-2")
            return first, await client.start("checkout", ORDER, key="order-2")

    first, again = asyncio.run(start_twice())
    assert first == again
    with Client(cyclone_server.address) as client:
        run = client.get_run(first)
    assert (run.workflow, run.submit_key, run.steps[0].action) == (
        "checkout",
        "order-2",
        "checkout",
    )


def test_the_ends_of_safe_calls_travel_in_batches_and_all_are_recorded(
    client, make_worker, cyclone_server
):
    """A safe call's end is not a round trip of its own: it goes with the next
    CompleteMany, before the node's completion, and the journal holds every call."""

    @step
    def inc(n: int) -> int:
        return n + 1

    def count(ctx: Any, start: int) -> int:
        n = start
        for _ in range(20):
            n = inc(n)
        return n

    registry = cyclone_server.server.metrics.registry

    def calls(method: str) -> float:
        labels = {"method": f"WorkerService/{method}", "code": "OK"}
        return registry.get_sample_value("cyclone_rpcs_total", labels) or 0.0

    worker = make_worker()
    worker.workflow("count")(count)
    with running(worker):
        run = client.wait(client.start("count", 0), timeout=PATIENCE)
    assert (run.status, run.step("count").output) == ("completed", 20)
    journal = run.step("count").journal
    assert [c.step_id for c in journal] == ["inc"] + [f"inc#{i}" for i in range(2, 21)]
    assert [c.output for c in journal] == list(range(1, 21))
    # They went with the reports on the worker's Work stream (with its CompleteMany
    # calls, on a server without one), never in calls of their own.
    assert calls("EndStepCall") == 0 and calls("CompleteMany") == 0


def test_a_body_ending_more_calls_than_one_batch_holds_completes_after_all_of_them(
    client, make_worker
):
    """An async body whose 1,200 no-op calls end in one turn queues more ends than two
    CompleteMany calls carry (500 each): its completion waits for the batch after the
    last of them, so none is refused as coming after the node completed."""

    @step
    async def inc(n: int) -> int:
        return n + 1

    async def count(ctx: Any, start: int) -> int:
        n = start
        for _ in range(1200):
            n = await inc(n)
        return n

    worker = make_worker()
    worker.workflow("count_far")(count)
    with running(worker):
        # Many batches of records: more time than one call's patience on a busy machine.
        run = client.wait(client.start("count_far", 0), timeout=PATIENCE * 6)
    assert (run.status, run.step("count_far").output) == ("completed", 1200)
    assert [c.output for c in run.step("count_far").journal] == list(range(1, 1201))
