"""The limits a server announces on the Work stream (WorkResponse.limits), adopted by
the Python worker: a server with a smaller --max-payload-bytes than the SDK's default
gets step results and outputs checked against its own limit, before they are sent, so
that nothing is refused on the wire. A Worker setting may lower a limit, never raise
it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pyclient import (
    Client,
    RetryPolicy,
    StepCallStatus,
    StepFailed,
    StepResultTooLarge,
    Worker,
    step,
)
from tests.helpers import PATIENCE
from tests.sdk.conftest import running

#: The server's payload limit in these tests, far below the SDK's default (1 MiB).
LIMIT = 4096

#: Retries at once: a node wrongly left to retry would run its handler again.
AT_ONCE = RetryPolicy(max_attempts=3, initial_backoff=0, max_backoff=0)


@pytest.fixture
def small_server(server_factory) -> Any:
    return server_factory(max_payload_bytes=LIMIT)


def worker_on(server: Any, **settings: Any) -> Worker:
    return Worker(server.address, concurrency=2, lease=3.0, shutdown_grace=5.0, **settings)


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the worker logged of requests the server refused or did not take."""
    words = ("not recorded", "refused", "not delivered", "RESOURCE_EXHAUSTED", "failed (")
    return [r.getMessage() for r in caplog.records if any(w in r.getMessage() for w in words)]


def serve_big_step(server: Any, worker: Worker, size: int) -> Any:
    """A body whose first step returns ``size`` characters, caught; then another step."""

    @step
    def big() -> str:
        return "x" * size

    @step
    def after(n: int) -> int:
        return n + 1

    @worker.workflow("big_step")
    def big_step(ctx: Any) -> dict:
        try:
            big()
        except StepFailed as e:
            assert isinstance(e.exception, StepResultTooLarge)
            return {"message": e.message, "after": after(1)}
        return {"message": None, "after": after(1)}

    with Client(server.address, actor="sdk-tests") as client, running(worker):
        return client.wait(client.start("big_step", retry=AT_ONCE), timeout=PATIENCE)


def test_a_step_result_over_the_servers_own_limit_fails_that_call_naming_it(small_server, caplog):
    caplog.set_level(logging.INFO)
    run = serve_big_step(small_server, worker_on(small_server), 2 * LIMIT)

    assert run.status == "completed", run
    out = run.step("big_step").output
    assert out["message"] is not None, out
    assert f"the limit of a step result is {LIMIT} bytes" in out["message"]
    assert out["after"] == 2
    first, second = run.step("big_step").journal
    assert (first.step_id, first.status) == ("big", StepCallStatus.FAILED)
    assert first.error is not None and first.error.type == "StepResultTooLarge"
    assert (second.step_id, second.status) == ("after", StepCallStatus.SUCCEEDED)
    assert run.step("big_step").attempt == 1
    # Checked before it was sent: the server refused nothing.
    assert refusals(caplog) == []


def test_a_handler_output_over_the_servers_limit_fails_the_node_naming_it(small_server):
    worker = worker_on(small_server)

    @worker.action("big_output")
    def big_output(ctx: Any) -> str:
        return "x" * (2 * LIMIT)

    with Client(small_server.address, actor="sdk-tests") as client, running(worker):
        run = client.wait(client.start("big_output", retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "failed", run
    error = run.step("big_output").last_error
    assert error is not None and error.type == "OutputTooLarge"
    assert f"the limit of an output is {LIMIT} bytes" in error.message


def test_a_worker_setting_over_the_servers_limit_does_not_raise_it(small_server, caplog):
    caplog.set_level(logging.INFO)
    run = serve_big_step(
        small_server, worker_on(small_server, max_payload_bytes=1 << 20), 2 * LIMIT
    )

    assert run.status == "completed", run
    assert f"the limit of a step result is {LIMIT} bytes" in run.step("big_step").output["message"]
    said = [r.getMessage() for r in caplog.records if "max_payload_bytes" in r.getMessage()]
    assert any(f"over the server's {LIMIT}" in m for m in said), said
    assert refusals(caplog) == []


def test_a_worker_setting_under_the_servers_limit_is_kept(small_server, caplog):
    caplog.set_level(logging.INFO)
    run = serve_big_step(small_server, worker_on(small_server, max_payload_bytes=1000), 2000)

    assert run.status == "completed", run
    assert "the limit of a step result is 1000 bytes" in run.step("big_step").output["message"]
    said = [r.getMessage() for r in caplog.records if "max_payload_bytes" in r.getMessage()]
    assert any(f"lower than the server's {LIMIT}" in m for m in said), said
