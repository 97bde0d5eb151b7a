"""The console's lists as HTML, without a browser: the runs page's search, paging both
ways, "more exist", start and duration; the workers page (idle workers, builds,
health, the server's own action); the runs waiting for a worker on "Needs a person";
long texts cut at a word."""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Iterator
from typing import Any

import pytest

from console.text import clip, clip_text
from cyclone.v1 import worker_service_pb2 as K
from cyclone.v1 import workflow_service_pb2 as W
from tests.console_thread import ConsoleThread
from tests.helpers import claim, complete, eventually, fail, node, submit, workflow
from tests.test_console_html import Browserless
from tests.test_waits import event_node


@pytest.fixture
def visitor(cyclone_server: Any) -> Iterator[Browserless]:
    console = ConsoleThread(cyclone_server.address)
    yield Browserless(console.url)
    console.stop()


def rows_of(text: str) -> list[str]:
    return re.findall(r'<tr data-run="([0-9a-f-]{36})"', text)


def settled(server: Any) -> None:
    """The server has taken up the event node: it waits, available, for its event."""
    eventually(
        lambda: server.sql(
            "SELECT 1 FROM cyclone.steps WHERE action = 'cyclone.event' "
            "AND status = 'available' AND waiting_for IS NOT NULL"
        ),
        "the event node waits for its event",
    )


def submit_once(server: Any, name: str, key: str) -> str:
    request = W.SubmitOnceRequest(workflow=workflow(name, node("a")), key=key)
    return str(server.workflows.SubmitOnce(request).run_id)


def test_the_runs_page_finds_runs_by_id_prefix_workflow_prefix_and_key_prefix(
    cyclone_server: Any, visitor: Browserless
) -> None:
    eu = submit_once(cyclone_server, "orders.eu", "cart-1")
    us = submit_once(cyclone_server, "orders.us", "cart-2")
    report = submit_once(cyclone_server, "reports", "daily-1")
    assert set(rows_of(visitor.get("/runs?workflow=orders").text)) == {eu, us}
    assert rows_of(visitor.get("/runs?workflow=orders&match=exact").text) == []
    assert rows_of(visitor.get("/runs?workflow=orders.eu&match=exact").text) == [eu]
    assert set(rows_of(visitor.get("/runs?key=cart-").text)) == {eu, us}
    assert rows_of(visitor.get("/runs?key=daily").text) == [report]
    assert rows_of(visitor.get(f"/runs?run={us}").text) == [us]
    assert rows_of(visitor.get(f"/runs?run={us[:8].upper()}").text) == [us]
    page = visitor.get("/runs?run=not-hex")
    assert page.status == 200 and rows_of(page.text) == []
    assert "hex digits" in page.text
    # The search form keeps what was typed.
    assert 'name="workflow" value="orders"' in visitor.get("/runs?workflow=orders").text


def test_the_runs_page_pages_both_ways_and_says_when_more_exist(
    cyclone_server: Any, visitor: Browserless
) -> None:
    ids = [submit(cyclone_server, workflow("paged", node("a"))) for _ in range(45)][::-1]
    first = visitor.get("/runs?workflow=paged&size=20")
    assert rows_of(first.text) == ids[:20]
    assert "20 runs shown; more exist, older." in first.text
    assert 'rel="prev"' not in first.text
    older = re.search(r'<a href="(/runs\?[^"]+)" rel="next">Older runs', first.text)
    assert older
    second = visitor.get(html.unescape(older.group(1)))
    assert rows_of(second.text) == ids[20:40]
    assert "20 runs shown; more exist on both sides." in second.text
    newer = re.search(r'<a href="(/runs\?[^"]+)" rel="prev">. Newer runs', second.text)
    assert newer
    back = visitor.get(html.unescape(newer.group(1)))
    assert rows_of(back.text) == ids[:20]
    assert "more exist, older" in back.text
    last = visitor.get(
        html.unescape(re.findall(r'<a href="(/runs\?[^"]+)" rel="next"', second.text)[0])
    )
    assert rows_of(last.text) == ids[40:]
    assert "5 runs shown; more exist, newer." in last.text
    assert 'rel="next"' not in last.text
    everything = visitor.get("/runs?workflow=paged&size=50")
    assert "45 runs shown: all that match." in everything.text


def test_the_runs_page_shows_when_each_run_started_and_how_long_it_took(
    cyclone_server: Any, visitor: Browserless
) -> None:
    done = submit(cyclone_server, workflow("timed", node("a")))
    [step] = claim(cyclone_server, "work")
    complete(cyclone_server, step, {"ok": True})
    running = submit(cyclone_server, workflow("timed", node("a")))
    page = visitor.get("/runs?workflow=timed")
    assert '<th scope="col">Started</th><th scope="col">Duration</th>' in page.text

    def cells(run_id: str) -> tuple[str, str]:
        row = re.search(rf'<tr data-run="{run_id}">(.*?)</tr>', page.text, re.S)
        assert row, page.text
        started = re.search(r'<td class="started">(.*?)</td>', row.group(1))
        took = re.search(r'<td class="duration">(.*?)</td>', row.group(1))
        assert started and took
        return started.group(1), took.group(1)

    started, took = cells(done)
    assert started.endswith(" UTC")
    assert re.fullmatch(r"\d+ ms|\d+\.\d s", took), took
    assert cells(running)[1].endswith(" so far")


def test_the_workers_page_lists_idle_workers_with_build_and_health_and_the_servers_action(
    cyclone_server: Any, visitor: Browserless
) -> None:
    submit(cyclone_server, workflow("order", node("charge", action="charge-card")))
    claim(cyclone_server, "charge-card", worker="busy-1")
    idle = K.ClaimRequest(
        worker_id="idle-1",
        actions=[K.ActionSpec(name="send-mail")],
        max_steps=1,
        build_id="v2.3.1",
    )
    assert not cyclone_server.workers.Claim(idle).steps
    cyclone_server.sql(
        "INSERT INTO cyclone.worker_health (worker_id, unhealthy_since) VALUES ('frozen-1', now())"
    )
    submit(cyclone_server, workflow("approval", event_node("wait", "approved")))
    settled(cyclone_server)
    page = visitor.get("/workers")
    assert page.status == 200

    def row(kind: str, name: str) -> str:
        found = re.search(rf'<tr data-{kind}="{re.escape(name)}">(.*?)</tr>', page.text, re.S)
        assert found, page.text
        return found.group(1)

    idle_row = row("worker", "idle-1")
    assert '<td class="state">idle</td>' in idle_row
    assert "<code>v2.3.1</code>" in idle_row
    assert '<td class="serves">send-mail</td>' in idle_row
    assert "healthy" in idle_row and "unhealthy" not in idle_row
    busy_row = row("worker", "busy-1")
    assert '<td class="state">busy</td>' in busy_row and "charge-card" in busy_row
    frozen_row = row("worker", "frozen-1")
    assert '<strong class="unhealthy">unhealthy</strong>' in frozen_row
    event_row = row("action", "cyclone.event")
    assert "served by the server itself" in event_row and "nobody" not in event_row
    assert "<td>idle-1</td>" in row("action", "send-mail")


def test_needs_a_person_lists_the_runs_waiting_on_an_action_no_worker_serves(
    cyclone_server: Any, visitor: Browserless
) -> None:
    stuck = submit(cyclone_server, workflow("export", node("dump", action="nobody-serves-me")))
    served = submit(cyclone_server, workflow("mail", node("send", action="mailer")))
    # A worker asks for mailer (and gets its step): that action is served.
    assert claim(cyclone_server, "mailer", worker="mail-worker", n=1)
    submit(cyclone_server, workflow("approval", event_node("wait", "approved")))
    settled(cyclone_server)
    page = visitor.get("/attention")
    assert page.status == 200
    section = page.text.split('id="unserved-h"', 1)[1].split("</section>", 1)[0]
    assert 'data-action="nobody-serves-me"' in section
    assert "no worker ever asked for it" in section
    assert f'data-run="{stuck}"' in section
    assert "cyclone.event" not in section
    assert "mailer" not in section and served not in section


def test_long_texts_are_cut_at_a_word_with_the_whole_text_in_a_title(
    cyclone_server: Any, visitor: Browserless
) -> None:
    assert clip_text("the quick brown fox jumps", 12) == "the quick…"
    assert clip_text("short", 12) == "short"
    assert clip_text("averyveryverylongword and more", 10) == "averyveryv…"
    assert str(clip("a <b> c " * 20, 10)).startswith('<span class="clipped" title="a &lt;b&gt; c')
    key = "customer order number " * 6 + "end"
    run_id = submit_once(cyclone_server, "keyed", key)
    page = visitor.get("/runs?workflow=keyed")
    row = re.search(rf'<tr data-run="{run_id}">(.*?)</tr>', page.text, re.S)
    assert row
    cell = re.search(r'<span class="clipped" title="([^"]*)">([^<]*)</span>', row.group(1))
    assert cell, row.group(1)
    assert html.unescape(cell.group(1)) == key
    shown = html.unescape(cell.group(2))
    assert shown.endswith("…") and len(shown) <= 61
    assert key.startswith(shown[:-1]) and key[len(shown) - 1] == " "


def lane_of(page: str, node_name: str) -> str:
    found = re.search(rf'<g class="tl-lane" data-node="{node_name}">(.*?)</g>\s*</g>', page, re.S)
    assert found, page
    return found.group(1)


def kinds(lane: str) -> list[tuple[str, str]]:
    return re.findall(r'data-kind="(\w+)" data-attempt="(\d+)"', lane)


def test_the_run_page_draws_a_timeline_of_attempts_waits_resumes_and_operator_actions(
    cyclone_server: Any, visitor: Browserless
) -> None:
    from cyclone.v1 import admin_service_pb2 as A
    from tests.test_waits import server_now, wait_request

    run_id = submit(
        cyclone_server,
        workflow(
            "tl",
            node("a", max_attempts=3, backoff=0.001),
            node("b", deps=["a"], max_attempts=1),
        ),
    )
    [first] = claim(cyclone_server, n=1)
    fail(cyclone_server, first, "first try failed")
    second = eventually(lambda: claim(cyclone_server, n=1), "the second attempt")[0]
    wake = server_now(cyclone_server) + dt.timedelta(seconds=30)
    cyclone_server.workers.Wait(wait_request(second, wake_at=wake))
    cyclone_server.advance_clock(31)
    [third] = claim(cyclone_server, n=1)
    complete(cyclone_server, third, {"ok": True})
    [b] = claim(cyclone_server, n=1)
    fail(cyclone_server, b, "no luck", non_retryable=True)
    cyclone_server.admin.Retry(A.RetryRequest(run_id=run_id, node="b", reason="try b again"))

    page = visitor.get(f"/runs/{run_id}")
    assert page.status == 200
    assert '<svg class="timeline"' in page.text
    a = lane_of(page.text, "a")
    found = kinds(a)
    assert ("fail", "1") in found
    # The journal entry of the sleep names the attempt that last wrote it (the third,
    # whose claim ended the sleep).
    assert ("wait", "3") in found and ("resume", "3") in found
    assert ("attempt", "3") in found
    assert [k for k, _ in found].count("attempt") == 1
    assert "first try failed" in a
    assert "wait for sleep" in a and "the node resumes" in a
    lane_b = lane_of(page.text, "b")
    assert ("fail", "1") in kinds(lane_b) and "no luck" in lane_b
    ops = re.findall(r'class="tl-op op-(\w+)" data-kind="op"[^>]*><title>([^<]*)</title>', lane_b)
    assert [(action, "try b again" in title) for action, title in ops] == [("retry", True)]
    # The axis is labelled from the run's creation on.
    assert ">+0 ms<" in page.text or ">+0.0 s<" in page.text


def test_an_action_is_unserved_once_no_worker_asked_for_it_lately() -> None:
    from console.survey import NO_WORKER_AFTER, unserved, worker_state
    from pyclient.models import ActionActivity, WorkerSummary

    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def action(
        name: str,
        polled: dt.datetime | None,
        ready: int = 3,
        running: int = 0,
        by_server: bool = False,
    ) -> ActionActivity:
        return ActionActivity(
            name, polled, "w" if polled else "", None, "", ready, running, by_server
        )

    lately = now - NO_WORKER_AFTER + dt.timedelta(seconds=1)
    long_ago = now - NO_WORKER_AFTER - dt.timedelta(seconds=1)
    found = unserved(
        [
            action("never", None),
            action("stale", long_ago),
            action("asked", lately),
            action("idle", None, ready=0),
            action("busy", long_ago, running=1),
            action("cyclone.event", None, by_server=True),
        ],
        now,
    )
    assert [a.action for a in found] == ["never", "stale"]

    def worker(running: int, seen: dt.datetime | None) -> WorkerSummary:
        return WorkerSummary("w", (), running, None, 0, last_seen_at=seen)

    assert worker_state(worker(1, None), now) == "busy"
    assert worker_state(worker(0, now - dt.timedelta(seconds=5)), now) == "idle"
    assert worker_state(worker(0, now - dt.timedelta(minutes=5)), now) == "quiet"
    assert worker_state(worker(0, None), now) == "quiet"
