"""Per-step policies with a real server and a real Worker: a flaky step's tries and
durable backoffs in GetRun's journal, timeouts, an unsafe step's timeout blocking the
run on that call."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest

from pyclient import RetryPolicy, StepCallStatus, StepTimeout, step
from tests.helpers import PATIENCE
from tests.sdk.conftest import running

pytestmark = pytest.mark.usefixtures("cyclone_server")

AT_ONCE = RetryPolicy(max_attempts=3, initial_backoff=0, max_backoff=0)


def test_a_flaky_step_succeeds_on_its_third_try_in_one_attempt(client, make_worker):
    tries: collections.Counter[str] = collections.Counter()

    @step(retries=3, backoff=0.1)
    def flaky(order_id: str) -> str:
        tries["flaky"] += 1
        if tries["flaky"] < 3:
            raise ConnectionError(f"try {tries['flaky']}: connection reset")
        return f"charged {order_id}"

    worker = make_worker()

    @worker.workflow("flaky")
    def body(ctx, order_id: str) -> str:
        return flaky(order_id)

    with running(worker):
        run = client.wait(client.start("flaky", "o-1"), timeout=PATIENCE)
    node = run.step("flaky")
    assert (run.status, node.output) == ("completed", "charged o-1")
    assert node.errors == ()  # no attempt of the node failed
    assert [(c.step_id, c.status) for c in node.journal] == [
        ("flaky", StepCallStatus.FAILED),
        ("flaky~2:backoff", StepCallStatus.SUCCEEDED),
        ("flaky~2", StepCallStatus.FAILED),
        ("flaky~3:backoff", StepCallStatus.SUCCEEDED),
        ("flaky~3", StepCallStatus.SUCCEEDED),
    ]
    assert node.journal[2].error is not None
    assert node.journal[2].error.message == "try 2: connection reset"
    assert tries["flaky"] == 3


def test_timeouts_of_a_sync_and_an_async_step_are_step_timeouts_the_body_handles(
    client, make_worker
):
    release = threading.Event()

    @step(timeout=0.3)
    def stuck() -> str:
        release.wait(PATIENCE)
        return "late"

    @step(timeout=0.3)
    async def slow() -> str:
        await asyncio.sleep(PATIENCE)
        return "late"

    worker = make_worker()

    @worker.workflow("sync_timeout")
    def sync_body(ctx) -> list:
        try:
            return [stuck()]
        except StepTimeout as e:
            return [e.type_name, e.message]

    @worker.workflow("async_timeout")
    async def async_body(ctx) -> list:
        try:
            return [await slow()]
        except StepTimeout as e:
            return [e.type_name, e.message]

    try:
        with running(worker):
            sync_run = client.wait(client.start("sync_timeout"), timeout=PATIENCE)
            async_run = client.wait(client.start("async_timeout"), timeout=PATIENCE)
    finally:
        release.set()
    assert sync_run.step("sync_timeout").output == [
        "StepTimeout",
        "step 'stuck' did not finish within 0.3s",
    ]
    assert async_run.step("async_timeout").output == [
        "StepTimeout",
        "step 'slow' did not finish within 0.3s",
    ]
    [entry] = sync_run.step("sync_timeout").journal
    assert entry.status == StepCallStatus.FAILED and entry.error is not None
    assert entry.error.type == "StepTimeout"


def test_a_timeout_of_an_unsafe_step_blocks_the_run_on_that_call(client, make_worker):
    release = threading.Event()
    charges: list[int] = []

    @step(unsafe_to_repeat=True, timeout=0.3, retries=2)
    def charge(amount: int) -> str:
        charges.append(amount)
        release.wait(PATIENCE)
        return "charged"

    worker = make_worker()

    @worker.workflow("unsafe_timeout")
    def body(ctx, amount: int) -> str:
        try:
            return charge(amount)
        except StepTimeout:  # never: the effect is uncertain, not failed
            return "handled"

    try:
        with running(worker):
            run = client.wait(client.start("unsafe_timeout", 5, retry=AT_ONCE), timeout=PATIENCE)
    finally:
        release.set()
    assert run.status == "blocked"
    assert run.error is not None and run.error.kind == "EffectUncertain"
    assert run.error.step_id == "charge"
    node = run.step("unsafe_timeout")
    assert node.status == "uncertain"
    assert [(c.step_id, c.status) for c in node.journal] == [("charge", StepCallStatus.STARTED)]
    assert [e.type for e in node.errors] == ["EffectTimedOut", "EffectUncertain"]
    assert "did not finish in time" in node.errors[0].message
    assert charges == [5]  # neither retried nor run again
