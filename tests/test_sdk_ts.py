"""The TypeScript SDK (sdk/ts) against a real server, through examples/ts's worker:
a durable function whose journaled step calls are not repeated after its worker is
SIGKILLed, an unsafe call killed mid-call that blocks the run until the `cyclone`
command resolves it, and a charge booked in the completion transaction exactly once,
even when its lease is lost before the commit. Also the SDK's own checks: its node
tests, tsc --strict and eslint. They need Node.js: `make test` leaves them out
(marker `polyglot`), `make test-all` runs them, and there a missing node or npm fails
them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from pyclient import RetryPolicy, Workflow
from tests import test_polyglot as polyglot
from tests.helpers import eventually
from tests.test_polyglot import (
    ORDER,
    PATIENCE,
    PRICE_WORKER,
    RESOLUTIONS,
    ROOT,
    TS_SDK,
    Process,
    _calls,
    _cyclone,
    _journal,
    _order_workflow,
    _tool,
)

pytestmark = [pytest.mark.slow, pytest.mark.polyglot, pytest.mark.timeout(600)]

# The fixtures of the Go and TypeScript examples' tests, shared.
start_process = polyglot.start_process
ts_sdk = polyglot.ts_sdk
ts_example = polyglot.ts_example
operator = polyglot.operator


@pytest.fixture
def ts_worker(cyclone_server, start_process, ts_example) -> Callable[..., Process]:
    """Start examples/ts's worker (checkout.charge, order.fulfil), with extra flags."""

    def start(*flags: str) -> Process:
        return start_process(
            "ts-worker",
            _tool("node"),
            ts_example / "worker.js",
            "--address",
            cyclone_server.address,
            "--database-url",
            cyclone_server.database_url,
            *flags,
        )

    return start


def _kill_in_the_charge(server, operator, ts_worker, run_id: str) -> Process:
    """Waits for the first worker to be in the unsafe charge of run_id, SIGKILLs it, lets
    its lease run out and starts a second worker, which replays the body."""
    first = ts_worker("--gateway-delay-ms", "600000")
    eventually(
        lambda: _calls(server, run_id) == ["price_order", "reserve_stock", "charge_card"],
        "the TypeScript body to reach the charge",
        PATIENCE,
    )
    assert _journal(operator.get_run(run_id)) == [
        ("price_order", "succeeded", 1, False),
        ("reserve_stock", "succeeded", 1, False),
        ("charge_card", "started", 1, True),
    ]
    first.popen.kill()
    first.popen.wait()
    server.advance_clock(120)
    assert server.sweep() == 1
    return ts_worker()


def test_a_ts_durable_function_replays_its_journal_after_a_kill(
    cyclone_server,
    ts_worker,
    operator,
):
    run_id = operator.submit(_order_workflow(), ORDER)
    second = _kill_in_the_charge(cyclone_server, operator, ts_worker, run_id)

    # The replay answers price_order and reserve_stock from the journal, and the
    # STARTED charge blocks the run instead of charging again.
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "blocked", second.log
    assert run.error is not None
    assert (run.error.kind, run.error.node, run.error.step_id) == (
        "EffectUncertain",
        "fulfil",
        "charge_card",
    )
    assert run.step("fulfil").status == "uncertain"
    assert _calls(cyclone_server, run_id) == ["price_order", "reserve_stock", "charge_card"]
    eventually(lambda: "effect uncertain" in second.log, "the worker to drop the node", PATIENCE)

    resolved = _cyclone(
        cyclone_server, "resolve", run_id, "charge_card", "--result", '{"charge_id": "ch_found"}'
    )
    assert resolved.returncode == 0, resolved.stderr
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", second.log
    assert run.step("fulfil").output == {
        "status": "fulfilled",
        "reservation": "r-o-7",
        "charge_id": "ch_found",
        "charged": 2290,
    }
    # Each step function ran once: the replays took the journal's outcomes.
    assert _calls(cyclone_server, run_id) == [
        "price_order",
        "reserve_stock",
        "charge_card",
        "send_receipt",
    ]
    assert [s for (_, s, _, _) in _journal(run)] == ["succeeded"] * 4
    assert cyclone_server.sql("SELECT order_id, released FROM reservations") == [("o-7", False)]
    second.stop()


@RESOLUTIONS
def test_a_blocked_ts_durable_function_resumes_as_resolved(
    cyclone_server, ts_worker, operator, resolution, calls, output
):
    run_id = operator.submit(_order_workflow(), ORDER)
    second = _kill_in_the_charge(cyclone_server, operator, ts_worker, run_id)
    assert operator.wait(run_id, timeout=PATIENCE).status == "blocked", second.log

    resolved = _cyclone(cyclone_server, "resolve", run_id, "charge_card", *resolution)
    assert resolved.returncode == 0, resolved.stderr
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", second.log
    assert run.step("fulfil").output == output
    assert _calls(cyclone_server, run_id) == calls
    second.stop()


# -- the completion transaction ----------------------------------------------------------


def _checkout() -> Workflow:
    wf = Workflow("checkout")
    wf.node("price", action="checkout.price")
    wf.node(
        "charge", action="checkout.charge", depends_on=["price"], retry=RetryPolicy(max_attempts=3)
    )
    return wf


CART = {"customer": "ada", "items": [{"sku": "tea", "qty": 2, "unit_price": 450}]}


@pytest.fixture
def price_worker(cyclone_server, start_process) -> Process:
    return start_process(
        "price-worker", sys.executable, PRICE_WORKER, "--address", cyclone_server.address
    )


def _ledger(server) -> list[tuple[str, str, int]]:
    return [(str(r), n, a) for r, n, a in server.sql("SELECT run_id, node, amount FROM ledger")]


def test_a_ts_charge_is_booked_in_its_completion_transaction(
    cyclone_server, ts_worker, price_worker, operator
):
    worker = ts_worker()
    run_id = operator.submit(_checkout(), CART)
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", worker.log + price_worker.log
    assert run.step("charge").output == {"charged": 900, "currency": "EUR", "booked": True}
    assert run.step("charge").attempt == 1
    assert _ledger(cyclone_server) == [(run_id, "charge", 900)]
    assert "step completed in its transaction" in worker.log
    # What the handler logged was sent before the completion committed.
    logs = operator.get_run(run_id, logs=True).step("charge").logs
    assert [(line.level, line.message, line.attempt) for line in logs] == [
        ("INFO", "booking 900 cents", 1)
    ]
    worker.stop()
    price_worker.stop()


def test_a_ts_charge_that_loses_its_lease_before_commit_rolls_back_and_is_booked_once(
    cyclone_server, ts_worker, price_worker, operator
):
    worker = ts_worker("--gateway-delay-ms", "1500")
    run_id = operator.submit(_checkout(), CART)
    # While the gateway answers, the ledger row is written, not committed: the lease
    # ends under the handler and the sweep reclaims the step; step_complete raises CY001.
    eventually(
        lambda: cyclone_server.sql(
            "SELECT 1 FROM cyclone.steps WHERE run_id = %s AND node = 'charge'"
            " AND status = 'running'",
            run_id,
        ),
        "the TypeScript worker to claim the charge",
        timeout=PATIENCE,
    )
    cyclone_server.advance_clock(120)
    assert cyclone_server.sweep() == 1
    eventually(lambda: "lease lost" in worker.log, "the worker to lose its lease", PATIENCE)
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", worker.log
    charge = run.step("charge")
    assert charge.attempt == 2
    assert charge.output["booked"] is True  # the first attempt's row was rolled back
    assert _ledger(cyclone_server) == [(run_id, "charge", 900)]
    worker.stop()
    price_worker.stop()


def test_a_declined_ts_charge_fails_for_good_with_its_type(
    cyclone_server, ts_worker, price_worker, operator
):
    worker = ts_worker("--limit", "500")
    run_id = operator.submit(_checkout(), CART)
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "failed", worker.log
    [error] = run.step("charge").errors
    assert (error.type, error.message) == (
        "CardDeclined",
        "900 cents is over the card's limit of 500",
    )
    assert _ledger(cyclone_server) == []
    worker.stop()
    price_worker.stop()


# -- the SDK's own checks ----------------------------------------------------------------


def _npm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_tool("npm"), *args], cwd=TS_SDK, capture_output=True, text=True, timeout=300
    )


def test_the_typescript_sdk_unit_tests_pass(ts_sdk):
    out = _npm("test")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# fail 0" in out.stdout


def test_the_typescript_sdk_is_strict_and_lint_clean(ts_sdk):
    typecheck = _npm("run", "typecheck")
    assert typecheck.returncode == 0, typecheck.stdout + typecheck.stderr
    lint = _npm("run", "lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr


# -- durable waits, Claim, and outputs that JSON cannot carry -------------------------

TS_WORKER = ROOT / "tests" / "ts_worker_process.mjs"


@pytest.fixture(params=["work", "claim"])
def js_worker(request, cyclone_server, start_process, ts_sdk) -> Process:
    """tests/ts_worker_process.mjs on the Work stream, or on Claim and Complete."""
    flags = ["--claim"] if request.param == "claim" else []
    return start_process(
        f"ts-{request.param}-worker", _tool("node"), TS_WORKER, cyclone_server.address, *flags
    )


def test_a_ts_body_sleeps_waits_for_an_event_and_for_a_child_run(
    cyclone_server, js_worker, operator
):
    wf = Workflow("waits")
    wf.node("body", action="ts.waits")
    run_id = operator.submit(wf, None)
    eventually(
        lambda: any(
            c.function == "cyclone.event" for c in operator.get_run(run_id).step("body").journal
        ),
        "the body to wait for its event",
        PATIENCE,
        detail=lambda: f"{operator.get_run(run_id).step('body')}\n{js_worker.log}",
    )
    operator.send_event(run_id, "approved", {"by": "ada"})
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", js_worker.log
    output = run.step("body").output
    assert output["approval"] == {"by": "ada"}
    assert (output["first"], output["last"]) == (1, 2)
    assert output["child"]["status"] == "completed"
    assert output["child"]["outputs"] == {"double": {"doubled": 42}}
    assert [c.step_id for c in run.step("body").journal] == [
        "first",
        "sleep",
        "event:approved",
        "child",
        "child.result",
        "last",
    ]
    js_worker.stop()


@pytest.mark.parametrize(
    ("action", "cause"),
    [("ts.bigint", "a BigInt (10n)"), ("ts.cycle", "a cycle (an object that contains itself)")],
)
def test_a_ts_output_that_json_cannot_carry_fails_its_node_naming_the_cause(
    cyclone_server, js_worker, operator, action, cause
):
    wf = Workflow("bad-output")
    wf.node("bad", action=action, retry=RetryPolicy(max_attempts=3))
    run_id = operator.submit(wf, None)
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "failed", js_worker.log
    [error] = run.step("bad").errors  # not retried: the same code returns the same value
    assert error.type == "OutputNotJson"
    assert cause in error.message
    js_worker.stop()
