"""The limits of durable functions against a real server and a real Worker: a step
result or a body's output over the payload limit, and a journal at its size, each end
in a typed error the user sees, checked before anything is sent."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pyclient import (
    JournalFull,
    OutputTooLarge,
    RetryPolicy,
    StepCallStatus,
    StepFailed,
    StepResultTooLarge,
    step,
)
from tests.helpers import PATIENCE
from tests.sdk.conftest import running

pytestmark = pytest.mark.usefixtures("cyclone_server")

#: Retries at once: a node wrongly left to retry would run its handler again.
AT_ONCE = RetryPolicy(max_attempts=3, initial_backoff=0, max_backoff=0)

#: Twice the server's default payload limit (1 MiB).
BIG = "x" * 2_000_000


def test_a_step_result_over_the_limit_fails_that_call_and_the_body_can_catch_it(
    client, make_worker
):
    small_runs = threading.Event()

    @step
    def big() -> str:
        small_runs.wait(PATIENCE)  # a step of another run shares the stream meanwhile
        return BIG

    @step
    def small(n: int) -> int:
        small_runs.set()
        return n + 1

    worker = make_worker(concurrency=4)

    @worker.workflow("big_step")
    def big_step(ctx: Any) -> dict:
        try:
            big()
        except StepFailed as e:
            assert isinstance(e.exception, StepResultTooLarge)
            return {"caught": e.type_name, "message": e.message}
        return {"caught": None}

    @worker.workflow("small_steps")
    def small_steps(ctx: Any) -> int:
        return small(small(1))

    with running(worker):
        big_id = client.start("big_step", retry=AT_ONCE)
        small_id = client.start("small_steps", retry=AT_ONCE)
        run = client.wait(big_id, timeout=PATIENCE)
        other = client.wait(small_id, timeout=PATIENCE)
    assert run.status == "completed", run
    out = run.step("big_step").output
    assert out["caught"] == "StepResultTooLarge"
    assert "'big'" in out["message"] and "the limit of a step result is 1048576" in out["message"]
    assert "store it elsewhere" in out["message"]
    (call,) = run.step("big_step").journal
    assert (call.seq, call.step_id, call.status) == (1, "big", StepCallStatus.FAILED)
    assert call.error is not None and call.error.type == "StepResultTooLarge"
    assert run.step("big_step").attempt == 1
    assert other.status == "completed" and other.step("small_steps").output == 3


def test_an_unsafe_step_result_over_the_limit_ends_its_entry_failed(client, make_worker):
    calls: list[int] = []

    @step(unsafe_to_repeat=True)
    def send() -> str:
        calls.append(1)
        return BIG

    worker = make_worker()

    @worker.workflow("big_unsafe")
    def big_unsafe(ctx: Any) -> str:
        try:
            send()
        except StepFailed as e:
            return e.type_name
        return "sent"

    with running(worker):
        run = client.wait(client.start("big_unsafe", retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "completed" and run.step("big_unsafe").output == "StepResultTooLarge"
    (call,) = run.step("big_unsafe").journal
    assert call.status == StepCallStatus.FAILED and call.unsafe_to_repeat
    assert call.error is not None and call.error.type == "StepResultTooLarge"
    assert calls == [1]


def test_a_body_output_over_the_limit_fails_the_node_for_good_with_its_cause(client, make_worker):
    attempts: list[int] = []

    @step
    def prepare() -> int:
        return 1

    worker = make_worker()

    @worker.workflow("big_output")
    def big_output(ctx: Any) -> str:
        attempts.append(ctx.attempt)
        prepare()
        return BIG

    with running(worker):
        run = client.wait(client.start("big_output", retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "failed"
    node = run.step("big_output")
    assert attempts == [1] and node.attempt == 1
    error = node.last_error
    assert error is not None and error.type == "OutputTooLarge" and not error.retryable
    assert "the limit of an output is 1048576 bytes" in error.message
    assert run.error is not None and run.error.node == "big_output"
    assert OutputTooLarge.__name__ == error.type


def test_a_journal_at_its_limit_fails_the_node_for_good_naming_the_limit(client, make_worker):
    made: list[int] = []

    @step
    def tick(n: int) -> int:
        return n

    worker = make_worker(max_step_calls=5)

    @worker.workflow("many_calls")
    def many_calls(ctx: Any) -> int:
        for n in range(6):
            made.append(n)
            tick(n)
        return 6

    with running(worker):
        run = client.wait(client.start("many_calls", retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "failed"
    node = run.step("many_calls")
    error = node.last_error
    assert error is not None and error.type == "JournalFull" and not error.retryable
    assert "more than 5 step calls" in error.message and "child runs" in error.message
    assert node.attempt == 1 and made == [0, 1, 2, 3, 4, 5]
    assert [c.seq for c in node.journal] == [1, 2, 3, 4, 5]
    assert JournalFull.__name__ == error.type


def test_the_call_past_the_journals_10000_fails_the_node_for_good(client, make_worker):
    # Not waiting for each record before the next call: 10,000 calls in one body would
    # otherwise take a durable commit each, one after the other.
    @step(record="async")
    def noop() -> None:
        return None

    worker = make_worker()

    @worker.workflow("ten_thousand")
    def ten_thousand(ctx: Any) -> str:
        for _ in range(10_001):
            noop()
        return "unreachable"

    with running(worker):
        # Ten thousand records: more time than one call's patience on a busy machine.
        run = client.wait(client.start("ten_thousand", retry=AT_ONCE), timeout=PATIENCE * 6)
    assert run.status == "failed"
    node = run.step("ten_thousand")
    error = node.last_error
    assert error is not None and error.type == "JournalFull" and not error.retryable
    assert "more than 10000 step calls" in error.message
    assert node.attempt == 1 and len(node.journal) == 10_000


def test_a_retried_attempt_replays_the_too_large_result_as_the_same_failure(client, make_worker):
    runs: list[int] = []
    seen: list[tuple[int, str]] = []

    @step
    def big() -> str:
        runs.append(1)
        return BIG

    @step
    def fallback() -> str:
        return "small"

    worker = make_worker()

    @worker.workflow("big_replayed")
    def big_replayed(ctx: Any) -> str:
        try:
            big()
        except StepFailed as e:
            assert isinstance(e.exception, StepResultTooLarge)
            seen.append((ctx.attempt, e.message))
            fallback()  # the body went on from the failure: its entry is kept
        if ctx.attempt == 1:
            raise ConnectionError("crash after the call")
        return "done"

    with running(worker):
        run = client.wait(client.start("big_replayed", retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "completed" and run.step("big_replayed").attempt == 2
    assert runs == [1]
    assert [a for a, _ in seen] == [1, 2] and seen[0][1] == seen[1][1]
