"""Step logs through the SDK Worker: what a handler logs with the logging module (in its
own thread or task, or in a thread it starts with its context) reaches the server with
its heartbeats and completion, per attempt; nothing logged elsewhere does. And a worker
whose claim blocked a run says so in its log."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from pyclient import RetryPolicy, Workflow, cli, sleep
from tests.helpers import PATIENCE, claim, eventually, node, submit, workflow
from tests.sdk.conftest import running

pytestmark = pytest.mark.usefixtures("cyclone_server")

shop = logging.getLogger("shop")


def test_a_handlers_log_lines_are_stored_per_attempt(client, make_worker, caplog):
    caplog.set_level(logging.INFO)
    worker = make_worker()
    elsewhere = threading.Event()

    @worker.action("charge")
    def charge(ctx):
        shop.info("charging, attempt %d", ctx.attempt)
        if ctx.attempt == 1:
            try:
                raise ValueError("card declined")
            except ValueError:
                shop.exception("first try failed")
                raise
        # Logged meanwhile by another thread, outside any handler: not a step's line.
        threading.Thread(target=lambda: (shop.info("not a step line"), elsewhere.set())).start()
        assert elsewhere.wait(PATIENCE)
        return "ok"

    @worker.action("ship")
    async def ship(ctx):
        shop.warning("shipping from the task")
        await asyncio.to_thread(shop.info, "and from a thread with its context")
        return "shipped"

    wf = Workflow("logged")
    c = wf.node("charge", retry=RetryPolicy(max_attempts=3, initial_backoff=0.05))
    wf.node("ship", depends_on=c)
    with running(worker):
        run_id = client.submit(wf)
        assert client.wait(run_id, timeout=PATIENCE).status == "completed"
    run = client.get_run(run_id, logs=True)
    charged = [(line.attempt, line.level, line.message) for line in run.step("charge").logs]
    assert charged[0] == (1, "INFO", "charging, attempt 1")
    assert charged[1][:2] == (1, "ERROR") and "ValueError: card declined" in charged[1][2]
    assert charged[2:] == [(2, "INFO", "charging, attempt 2")]
    assert {line.logger for line in run.step("charge").logs} == {"shop"}
    assert [(line.level, line.message) for line in run.step("ship").logs] == [
        ("WARNING", "shipping from the task"),
        ("INFO", "and from a thread with its context"),
    ]
    assert client.get_run(run_id).step("charge").logs == ()


def test_lines_of_a_long_handler_go_with_its_heartbeats(client, make_worker, cyclone_server):
    worker = make_worker(lease=3.0)
    seen = threading.Event()

    @worker.action("long")
    def long(ctx):
        shop.warning("started")
        # Until the line is stored, which only a heartbeat can do while this runs.
        deadline = time.monotonic() + PATIENCE
        while not seen.is_set() and time.monotonic() < deadline:
            ctx.heartbeat()
            time.sleep(0.05)
        return "done"

    def stored() -> bool:
        lines = client.get_run(run_id, logs=True).step("long").logs
        if lines:
            seen.set()
        return bool(lines)

    wf = Workflow("long")
    wf.node("long")
    with running(worker):
        run_id = client.submit(wf)
        eventually(stored, "the line stored while the handler runs")
        assert client.wait(run_id, timeout=PATIENCE).status == "completed"
    assert [line.message for line in client.get_run(run_id, logs=True).step("long").logs] == [
        "started"
    ]


def test_a_worker_logs_the_run_its_claim_blocked(make_worker, cyclone_server, caplog):
    caplog.set_level(logging.INFO)
    run_id = submit(cyclone_server, workflow("order", node("charge", action="charge")))
    claim(cyclone_server, "charge", unsafe=("charge",), lease=5)
    cyclone_server.advance_clock(6)
    assert cyclone_server.sweep() == 1
    worker = make_worker()

    @worker.action("charge", unsafe_to_repeat=True)
    def charge(ctx):
        raise AssertionError("never handed out")

    def warned() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.name == "pyclient.worker" and f"run {run_id} blocked" in r.getMessage()
        ]

    with running(worker):
        [record] = eventually(warned, "the worker's warning")
    text = record.getMessage()
    assert record.levelno == logging.WARNING
    assert "node charge" in text and "attempt 1" in text
    assert text.count(f"cyclone resolve {run_id} charge") == 1
    assert " UTC" in text and "." not in text.split("started ")[1].split(")")[0]


def test_nul_characters_in_lines_and_errors_are_sent_escaped(client, make_worker):
    """The server refuses a NUL character in any text; the worker writes it as the two
    characters \\0, so that a handler's line or error never costs it its completion."""
    worker = make_worker()

    @worker.action("parse")
    def parse(ctx):
        shop.warning("read %s", "half\x00way")
        if ctx.attempt == 1:
            raise ValueError("bad byte \x00 in input")
        return "ok"

    wf = Workflow("nul")
    wf.node("parse", retry=RetryPolicy(max_attempts=2, initial_backoff=0.05))
    with running(worker):
        run_id = client.submit(wf)
        assert client.wait(run_id, timeout=PATIENCE).status == "completed"
    step = client.get_run(run_id, logs=True).step("parse")
    assert [line.message for line in step.logs] == ["read half\\0way", "read half\\0way"]
    [error] = step.errors
    assert error.message == "bad byte \\0 in input"
    assert "bad byte \\0 in input" in error.details and "\x00" not in error.details


def test_a_durable_bodys_lines_before_a_sleep_are_kept_with_their_attempt(
    client, make_worker, capsys, caplog
):
    """The attempt that suspends on a durable sleep sends no Complete: its lines go with
    the Wait, and the resumed attempt's with its completion."""
    caplog.set_level(logging.INFO)
    worker = make_worker()

    @worker.workflow("napper")
    def napper(ctx, order: str) -> str:
        shop.info("before the nap, attempt %d", ctx.attempt)
        sleep(0.2)
        shop.info("after the nap, attempt %d", ctx.attempt)
        return order

    with running(worker):
        run_id = client.start("napper", "o-1")
        assert client.wait(run_id, timeout=PATIENCE).status == "completed"
    step = client.get_run(run_id, logs=True).steps[0]
    assert step.resumes == 1
    # The resumed attempt runs the body again from its start (replaying the journal).
    assert [(line.attempt, line.message) for line in step.logs] == [
        (1, "before the nap, attempt 1"),
        (2, "before the nap, attempt 2"),
        (2, "after the nap, attempt 2"),
    ]
    assert cli.main(["logs", run_id, step.node], client=client) == 0
    shown = capsys.readouterr().out
    assert "attempt 1" in shown and "before the nap, attempt 1" in shown
    assert "attempt 2" in shown and "after the nap, attempt 2" in shown
