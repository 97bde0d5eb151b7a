"""Per-step policies (@step(retries=, backoff=, timeout=, retry_on=)) on the in-memory
durable runner: tries journaled under their own step ids, durable backoffs between
them, timeouts of sync and async steps, an unsafe step's timeout blocking the run."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest

from pyclient import (
    InvalidArgument,
    NonRetryableError,
    StepCallStatus,
    StepFailed,
    StepTimeout,
    step,
    testing,
)
from pyclient.durable._policy import StepPolicy

tries: collections.Counter[str] = collections.Counter()


@pytest.fixture(autouse=True)
def _fresh() -> None:
    tries.clear()


@step(retries=3, backoff=2.0)
def flaky(order_id: str) -> str:
    """Fails on its first two tries, succeeds on the third."""
    tries["flaky"] += 1
    if tries["flaky"] < 3:
        raise ConnectionError(f"try {tries['flaky']}: connection reset")
    return f"charged {order_id}"


def flaky_body(ctx, order_id: str) -> str:
    return flaky(order_id)


def journal(node: testing.DurableNode) -> list[tuple[str, StepCallStatus]]:
    return [(e.step_id, e.status) for e in node.journal]


def test_a_flaky_step_succeeds_on_its_third_try_without_failing_the_node():
    node = testing.DurableNode(flaky_body, input="o-1")
    attempt = node.run()
    assert (attempt.status, attempt.output) == ("completed", "charged o-1")
    # Each try is its own entry; the backoffs are durable sleeps between them.
    assert journal(node) == [
        ("flaky", StepCallStatus.FAILED),
        ("flaky~2:backoff", StepCallStatus.SUCCEEDED),
        ("flaky~2", StepCallStatus.FAILED),
        ("flaky~3:backoff", StepCallStatus.SUCCEEDED),
        ("flaky~3", StepCallStatus.SUCCEEDED),
    ]
    assert [e.function for e in node.journal] == ["flaky", *["cyclone.sleep", "flaky"] * 2]
    assert node.journal[0].error is not None
    assert node.journal[0].error.message == "try 1: connection reset"
    assert tries["flaky"] == 3


def test_a_replay_after_a_crash_goes_on_counting_tries_from_the_journal():
    node = testing.DurableNode(flaky_body, input="o-1")
    assert node.run(crash="flaky~2", when="after_record").status == "crashed"
    assert tries["flaky"] == 2
    attempt = node.run()
    assert attempt.status == "completed"
    assert attempt.replayed == ("flaky", "flaky~2:backoff", "flaky~2", "flaky~3:backoff")
    assert attempt.ran == ("flaky~3",)
    assert tries["flaky"] == 3  # no try beyond the policy's


def test_the_backoff_doubles_from_the_first_delay_and_a_function_can_set_it():
    assert [StepPolicy(retries=4, backoff=2.0).delay(k) for k in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert StepPolicy(retries=4, backoff=lambda k: 10 * k).delay(3) == 30.0
    assert StepPolicy(retries=1, backoff=0).delay(1) == 0.0


def test_no_backoff_records_no_sleep_between_the_tries():
    @step(retries=2, backoff=0)
    def once_broken() -> str:
        tries["b"] += 1
        if tries["b"] == 1:
            raise TimeoutError("slow")
        return "ok"

    node = testing.DurableNode(lambda ctx: once_broken())
    assert node.run().status == "completed"
    assert [e.step_id for e in node.journal] == ["once_broken", "once_broken~2"]


def test_when_the_tries_run_out_the_body_sees_the_last_failure():
    @step(retries=1, backoff=0)
    def broken() -> None:
        tries["broken"] += 1
        raise ConnectionError(f"down {tries['broken']}")

    def body(ctx):
        try:
            broken()
        except StepFailed as e:
            return [e.step_id, e.message]

    node = testing.DurableNode(body)
    assert node.run().output == ["broken~2", "down 2"]
    assert tries["broken"] == 2


def test_only_the_exceptions_of_retry_on_are_retried():
    @step(retries=3, backoff=0, retry_on=(ConnectionError,))
    def picky(kind: str) -> None:
        tries[kind] += 1
        raise ConnectionError("reset") if kind == "conn" else ValueError("bad input")

    def body(ctx, kind: str):
        try:
            picky(kind)
        except StepFailed as e:
            return e.step_id

    assert testing.DurableNode(body, input="value").run().output == "picky"
    assert testing.DurableNode(body, input="conn").run().output == "picky~4"
    assert tries == {"value": 1, "conn": 4}


def test_a_non_retryable_error_is_not_retried():
    @step(retries=3, backoff=0)
    def refuses() -> None:
        tries["refuses"] += 1
        raise NonRetryableError("card declined")

    node = testing.DurableNode(lambda ctx: refuses())
    attempt = node.run()
    assert attempt.status == "failed" and not attempt.retryable
    assert tries["refuses"] == 1


def test_a_sync_step_that_takes_too_long_fails_with_step_timeout():
    release = threading.Event()
    finished = threading.Event()

    @step(timeout=0.2)
    def stuck() -> str:
        release.wait(60)
        finished.set()
        return "late"

    seen = []

    def body(ctx):
        try:
            return stuck()
        except StepTimeout as e:
            seen.append([e.step_id, e.type_name, e.message])
            return "timed out"

    node = testing.DurableNode(body)
    try:
        first = node.run(crash=testing.END)  # dies after the body returned
    finally:
        release.set()  # the abandoned helper thread may finish now
    assert first.status == "crashed" and first.ran == ("stuck",)
    assert seen == [["stuck", "StepTimeout", "step 'stuck' did not finish within 0.2s"]]
    assert node.journal[0].status == StepCallStatus.FAILED
    assert node.journal[0].error is not None and node.journal[0].error.type == "StepTimeout"
    # A replay raises the recorded timeout again, without running the function.
    finished.wait(60)
    replay = node.run()
    assert replay.output == "timed out" and replay.replayed == ("stuck",) and replay.ran == ()
    assert seen[1] == seen[0]


def test_an_async_step_that_takes_too_long_is_cancelled():
    cancelled = []

    @step(timeout=0.2)
    async def slow() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "late"

    async def body(ctx):
        try:
            return await slow()
        except StepFailed as e:  # a StepTimeout is a StepFailed
            return [type(e).__name__, e.type_name]

    attempt = testing.DurableNode(body).run()
    assert attempt.output == ["StepTimeout", "StepTimeout"]
    assert cancelled == [True]


def test_async_tries_are_journaled_like_sync_ones():
    @step(retries=2, backoff=1.0)
    async def wobbly() -> str:
        tries["wobbly"] += 1
        if tries["wobbly"] == 1:
            raise ConnectionError("reset")
        return "ok"

    async def body(ctx):
        return await wobbly()

    node = testing.DurableNode(body)
    assert node.run().output == "ok"
    assert [e.step_id for e in node.journal] == ["wobbly", "wobbly~2:backoff", "wobbly~2"]


def test_a_timeout_of_an_unsafe_step_blocks_the_run_instead_of_failing_the_call():
    release = threading.Event()

    @step(unsafe_to_repeat=True, timeout=0.2, retries=2)
    def charge(amount: int) -> str:
        tries["charge"] += 1
        release.wait(60)
        return "charged"

    def body(ctx):
        try:
            return charge(5)
        except StepFailed:  # not reached: the effect is uncertain, not failed
            return "handled"

    node = testing.DurableNode(body)
    try:
        first = node.run()
    finally:
        release.set()
    # Nothing recorded but the call started: the attempt fails, to be retried at once.
    assert first.status == "failed" and first.retryable
    assert "charge" in str(first.error) and "uncertain" in str(first.error)
    assert journal(node) == [("charge", StepCallStatus.STARTED)]
    # The next attempt finds it started with no outcome: the run blocks on it.
    second = node.run()
    assert (second.status, second.blocked_on) == ("blocked", "charge")
    assert tries["charge"] == 1
    node.resolve("charge", result="charged")
    assert node.run().output == "charged"


def test_an_unsafe_step_is_retried_after_it_raised():
    @step(unsafe_to_repeat=True, retries=1, backoff=0)
    def charge() -> str:
        tries["charge"] += 1
        if tries["charge"] == 1:
            raise ConnectionError("refused before charging")
        return "charged"

    node = testing.DurableNode(lambda ctx: charge())
    assert node.run().output == "charged"
    assert [(e.step_id, e.unsafe_to_repeat) for e in node.journal] == [
        ("charge", True),
        ("charge~2", True),
    ]


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"retries": -1}, InvalidArgument, "retries must be 0 to 100"),
        ({"retries": 101}, InvalidArgument, "retries must be 0 to 100"),
        ({"retries": "3"}, TypeError, "retries must be an int"),
        ({"retries": 1, "backoff": -1}, InvalidArgument, "backoff must be 0 to"),
        ({"timeout": 0}, InvalidArgument, "timeout must be more than 0"),
        ({"timeout": float("nan")}, InvalidArgument, "timeout must be"),
        ({"retry_on": 42}, TypeError, "retry_on must be an exception class"),
        ({"retries": 1, "name": "n" * 190}, InvalidArgument, "too long for 1 retries"),
    ],
)
def test_a_bad_policy_is_refused_when_the_step_is_declared(options, error, words):
    with pytest.raises(error, match=words):

        @step(**options)
        def anything() -> None: ...


def test_policies_do_not_apply_outside_a_durable_function():
    @step(retries=3)
    def plain() -> None:
        tries["plain"] += 1
        raise ConnectionError("once")

    with pytest.raises(ConnectionError):
        plain()
    assert tries["plain"] == 1
