"""The run page's node panel as HTML, without a browser: step logs by attempt (also in
the live region the page polls), the waiting state with its reason and time limit,
tries of the retry policy apart from resumes, why an error was not retried and what it
means, "effect uncertain" only when it matters, a cancelled run's waits."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import pytest

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from tests.console_thread import ConsoleThread
from tests.helpers import claim, fail, node, submit, workflow
from tests.test_console_html import HOSTILE, Browserless
from tests.test_waits import wait_request


@pytest.fixture
def visitor(cyclone_server: Any) -> Iterator[Browserless]:
    console = ConsoleThread(cyclone_server.address)
    yield Browserless(console.url)
    console.stop()


def _beat(server: Any, step: Any, *messages: str) -> None:
    server.workers.Heartbeat(
        worker_service_pb2.HeartbeatRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            logs=[types_pb2.LogLine(level="INFO", message=m, logger="shop") for m in messages],
        )
    )


def _panel(page: str) -> str:
    found = re.search(r'<section class="node-panel".*?</section>', page, re.S)
    assert found, page
    return found.group(0)


def _fact(panel: str, dt: str) -> str:
    found = re.search(rf"<dt>{dt}</dt><dd[^>]*>(.*?)</dd>", panel, re.S)
    assert found, panel
    return html.unescape(re.sub(r"<[^>]+>", "", found.group(1)))


def test_the_node_panel_shows_its_logs_by_attempt_live_and_escaped(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id = submit(cyclone_server, workflow("logs", node("a"), node("b")))
    first = next(s for s in claim(cyclone_server) if s.node == "a")
    _beat(cyclone_server, first, "charging", HOSTILE)
    fail(cyclone_server, first, "declined")
    cyclone_server.advance_clock(3600)
    [second] = claim(cyclone_server)
    _beat(cyclone_server, second, "charging again")

    panel = _panel(visitor.get(f"/runs/{run_id}?node=a").text)
    assert HOSTILE not in panel and html.escape(HOSTILE, quote=False) in panel
    # Newest attempt first, each with its own lines.
    headings = re.findall(r"<h4[^>]*>(.*?)</h4>", panel)
    assert [html.unescape(h) for h in headings] == ["Attempt 2 · 1 line", "Attempt 1 · 2 lines"]
    logs = dict(re.findall(r'<pre class="log" data-attempt="(\d+)"[^>]*>(.*?)</pre>', panel, re.S))
    assert "INFO shop: charging again" in logs["2"] and "charging" in logs["1"]
    assert "charging again" not in logs["1"]

    # The live region the page polls brings lines sent since.
    _beat(cyclone_server, second, "charged")
    live = _panel(visitor.get(f"/runs/{run_id}/live?node=a").text)
    assert "Attempt 2 · 2 lines" in html.unescape(live) and "charged" in live
    # Another node has none, and says why while it runs.
    other = _panel(visitor.get(f"/runs/{run_id}?node=b").text)
    assert 'id="no-logs"' in other and "come with the step's heartbeats" in other


def test_a_node_waiting_for_an_event_shows_waiting_and_why(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id = submit(cyclone_server, workflow("gate", node("a")))
    [step] = claim(cyclone_server)
    cyclone_server.workers.Wait(wait_request(step, "event:approved", event="approved"))
    page = visitor.get(f"/runs/{run_id}?node=a").text
    assert 'data-node="a" aria-label="a: waiting"' in page  # the DAG's box
    row = re.search(r'<tr data-node="a"[^>]*>(.*?)</tr>', page, re.S)
    assert row and "s-waiting" in row.group(1) and "1 / 3" in row.group(1)
    assert "resumed" not in row.group(1)
    panel = _panel(page)
    assert 'id="node-h">Node a <span class="badge s-waiting">waiting</span>' in panel
    assert _fact(panel, "Waiting for").startswith("event approved (send it with SendEvent")
    assert _fact(panel, "Waiting for").endswith(", with no time limit")
    assert _fact(panel, "Tries") == "1 of 3 (2 left)"
    assert _fact(panel, "Attempt") == "1"
    assert "Why: waiting" in panel and "Why: backing_off" not in panel


def test_errors_say_why_they_were_not_retried_and_what_they_mean(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id = submit(
        cyclone_server,
        workflow(
            "shop",
            node("charge", max_attempts=1),
            node("refund", action="refund"),
            node("ship", action="ship"),
        ),
    )
    [charge] = claim(cyclone_server, "work")
    fail(cyclone_server, charge, "card declined")
    [refund] = claim(cyclone_server, "refund")
    fail(cyclone_server, refund, "card stolen", non_retryable=True)
    claim(cyclone_server, "ship", lease=5)
    cyclone_server.advance_clock(6)
    assert cyclone_server.sweep() == 1

    charged = _panel(visitor.get(f"/runs/{run_id}?node=charge").text)
    assert "retries exhausted: 1 of 1 tries" in charged and "not retryable" not in charged
    refunded = _panel(visitor.get(f"/runs/{run_id}?node=refund").text)
    assert "not retryable" in refunded and "retries exhausted" not in refunded
    shipped = _panel(visitor.get(f"/runs/{run_id}?node=ship").text)
    assert "WorkerLost: its worker stopped answering" in html.unescape(shipped)
    # A safe action that lost its worker: its effect is not worth a warning.
    assert "<dt>Effect</dt>" not in shipped
    assert _fact(shipped, "Attempt") == "1 (1 of 10 worker lost: not tries)"


def test_an_unsafe_node_that_lost_its_worker_says_its_effect_is_uncertain(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id = submit(cyclone_server, workflow("pay", node("pay", action="pay")))
    claim(cyclone_server, "pay", unsafe=("pay",), lease=5)
    cyclone_server.advance_clock(6)
    cyclone_server.sweep()
    claim(cyclone_server, "pay", unsafe=("pay",))  # finds it uncertain: the run blocks
    panel = _panel(visitor.get(f"/runs/{run_id}?node=pay").text)
    assert "<dt>Effect</dt>" in panel
    # Its lost worker's error was not retried: the claim blocked the run instead.
    assert "not retried: its effect is uncertain" in panel


def test_a_cancelled_runs_wait_reads_cancelled(cyclone_server: Any, visitor: Browserless) -> None:
    run_id = submit(cyclone_server, workflow("gate", node("a")))
    [step] = claim(cyclone_server)
    cyclone_server.workers.Wait(wait_request(step, "event:go", event="go"))
    cyclone_server.workflows.CancelRun(workflow_service_pb2.CancelRunRequest(run_id=run_id))
    panel = _panel(visitor.get(f"/runs/{run_id}?node=a").text)
    journal = re.search(r'<table class="journal">.*?</table>', panel, re.S)
    assert journal and "s-cancelled" in journal.group(0) and "waiting" not in journal.group(0)


def test_the_steps_tables_last_error_is_clipped_with_the_whole_in_its_title(
    cyclone_server: Any, visitor: Browserless
) -> None:
    long = "declined " + " ".join(f"reason{i}" for i in range(60)) + " " + HOSTILE
    run_id = submit(cyclone_server, workflow("long", node("a", max_attempts=1)))
    [step] = claim(cyclone_server)
    fail(cyclone_server, step, long)
    page = visitor.get(f"/runs/{run_id}").text
    row = re.search(r'<tr[^>]*data-node="a".*?</tr>', page, re.S)
    assert row, page
    cell = re.search(r'<span class="clipped" title="([^"]*)">([^<]*)</span>', row.group(0))
    assert cell, row.group(0)
    title, shown = html.unescape(cell.group(1)), html.unescape(cell.group(2))
    assert title.endswith(long) and title.startswith("RuntimeError: ")  # the whole text
    assert shown.endswith("…") and len(shown) <= 121 and HOSTILE not in row.group(0)
