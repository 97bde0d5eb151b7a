"""The console's lists and the run's timeline in a real browser (Playwright on
/usr/bin/chromium, the fixtures of tests/test_console.py): search, paging both ways,
"more exist", start and duration, the workers page, runs waiting for a worker, cut
texts, the timeline. With CYCLONE_SCREENSHOTS=DIR they save docs/console's pictures."""

# ruff: noqa: F811 (the fixtures imported from tests.test_console are parameters here)
from __future__ import annotations

import datetime as dt
import time
from typing import Any

from playwright.sync_api import Page, expect

from cyclone.v1 import admin_service_pb2 as A
from cyclone.v1 import worker_service_pb2 as K
from cyclone.v1 import workflow_service_pb2 as W
from tests.console_thread import ConsoleThread
from tests.helpers import claim, complete, eventually, fail, node, submit, workflow
from tests.test_console import browser, console, page, row, shoot  # noqa: F401
from tests.test_console_lists import settled
from tests.test_waits import event_node, server_now, wait_request


def submit_once(server: Any, name: str, key: str) -> str:
    request = W.SubmitOnceRequest(workflow=workflow(name, node("a")), key=key)
    return str(server.workflows.SubmitOnce(request).run_id)


def test_the_runs_page_searches_by_run_id_workflow_and_key_prefix(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    eu = submit_once(cyclone_server, "orders.eu", "cart-1")
    us = submit_once(cyclone_server, "orders.us", "cart-2")
    report = submit_once(cyclone_server, "reports", "daily-1")
    page.goto(f"{console.url}/runs")
    form = page.get_by_role("search", name="Filter runs")
    form.get_by_label("Workflow", exact=True).fill("orders")
    form.get_by_role("button", name="Show").click()
    expect(row(page, eu)).to_be_visible()
    expect(row(page, us)).to_be_visible()
    expect(row(page, report)).to_have_count(0)
    form.get_by_label("Workflow", exact=True).fill("")
    form.get_by_label("Run id", exact=True).fill(report[:13])
    form.get_by_role("button", name="Show").click()
    expect(row(page, report)).to_be_visible()
    expect(page.locator("tr[data-run]")).to_have_count(1)
    form.get_by_label("Run id", exact=True).fill("")
    form.get_by_label("Key", exact=True).fill("cart-")
    form.get_by_label("Match").select_option("exact")
    form.get_by_role("button", name="Show").click()
    expect(page.locator("tr[data-run]")).to_have_count(0)
    form.get_by_label("Match").select_option("prefix")
    form.get_by_role("button", name="Show").click()
    expect(page.locator("tr[data-run]")).to_have_count(2)
    shoot(page, "runs-search")


def test_the_runs_page_pages_both_ways_says_more_exist_and_shows_start_and_duration(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    ids = [submit(cyclone_server, workflow("paged", node("a"))) for _ in range(25)][::-1]
    page.goto(f"{console.url}/runs?workflow=paged&size=20")
    shown = page.locator("#runs-shown")
    expect(shown).to_have_text("20 runs shown; more exist, older.")
    expect(page.get_by_role("columnheader", name="Started")).to_be_visible()
    expect(page.get_by_role("columnheader", name="Duration")).to_be_visible()
    expect(row(page, ids[0]).locator("td.duration")).to_contain_text("so far")
    page.get_by_role("link", name="Older runs").click()
    expect(shown).to_have_text("5 runs shown; more exist, newer.")
    expect(row(page, ids[24])).to_be_visible()
    page.get_by_role("link", name="Newer runs").click()
    expect(shown).to_have_text("20 runs shown; more exist, older.")
    expect(row(page, ids[0])).to_be_visible()
    shoot(page, "runs-paging")


def test_the_workers_page_shows_idle_workers_builds_health_and_the_servers_action(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    idle = K.ClaimRequest(
        worker_id="mailer-1", actions=[K.ActionSpec(name="send-mail")], build_id="v2.3.1"
    )
    assert not cyclone_server.workers.Claim(idle).steps
    submit(cyclone_server, workflow("order", node("charge", action="charge-card")))
    claim(cyclone_server, "charge-card", worker="payments-1")
    cyclone_server.sql(
        "INSERT INTO cyclone.worker_health (worker_id, unhealthy_since) VALUES ('frozen-1', now())"
    )
    submit(cyclone_server, workflow("approval", event_node("wait", "approved")))
    settled(cyclone_server)
    page.goto(f"{console.url}/workers")
    mailer = page.locator('tr[data-worker="mailer-1"]')
    expect(mailer.locator("td.state")).to_have_text("idle")
    expect(mailer.locator("td.build")).to_have_text("v2.3.1")
    expect(mailer.locator("td.serves")).to_have_text("send-mail")
    expect(page.locator('tr[data-worker="payments-1"] td.state')).to_have_text("busy")
    expect(page.locator('tr[data-worker="frozen-1"] td.health')).to_contain_text("unhealthy")
    event = page.locator('tr[data-action="cyclone.event"]')
    expect(event).to_contain_text("served by the server itself")
    expect(event).not_to_contain_text("nobody")
    shoot(page, "workers")


def test_needs_a_person_shows_runs_waiting_for_a_worker_and_links_to_them(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    stuck = submit(cyclone_server, workflow("export", node("dump", action="no-such-worker")))
    page.goto(f"{console.url}/attention")
    section = page.get_by_role("region", name="Waiting for a worker")
    expect(section.locator('[data-action="no-such-worker"]')).to_contain_text(
        "no worker ever asked for it"
    )
    section.locator(f'tr[data-run="{stuck}"] a').click()
    expect(page).to_have_url(f"{console.url}/runs/{stuck}?node=dump")


def test_a_long_key_is_cut_at_a_word_and_shown_whole_in_its_title(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    key = "customer order number " * 6 + "end"
    run_id = submit_once(cyclone_server, "keyed", key)
    page.goto(f"{console.url}/runs?workflow=keyed")
    cell = row(page, run_id).locator("span.clipped")
    expect(cell).to_have_attribute("title", key)
    text = cell.inner_text()
    assert text.endswith("…") and key.startswith(text[:-1]) and key[len(text) - 1] == " "


def test_the_run_page_draws_the_timeline_with_attempts_waits_and_operator_actions(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id = submit(
        cyclone_server,
        workflow("tl", node("a", max_attempts=3, backoff=0.001), node("b", deps=["a"])),
    )
    # Real (short) durations, so that the picture shows bars in proportion.
    [first] = claim(cyclone_server, n=1)
    time.sleep(0.4)
    fail(cyclone_server, first, "first try failed")
    second = eventually(lambda: claim(cyclone_server, n=1), "the second attempt")[0]
    time.sleep(0.3)
    wake = server_now(cyclone_server) + dt.timedelta(seconds=1.5)
    cyclone_server.workers.Wait(wait_request(second, wake_at=wake))
    third = eventually(lambda: claim(cyclone_server, n=1), "the end of the sleep")[0]
    time.sleep(0.5)
    complete(cyclone_server, third, {"ok": True})
    [b] = claim(cyclone_server, n=1)
    time.sleep(0.3)
    fail(cyclone_server, b, "no luck", non_retryable=True)
    cyclone_server.admin.Retry(A.RetryRequest(run_id=run_id, node="b", reason="try b again"))
    page.goto(f"{console.url}/runs/{run_id}")
    timeline = page.locator("svg.timeline")
    expect(timeline).to_be_visible()
    lane_a = timeline.locator('g.tl-lane[data-node="a"]')
    expect(lane_a.locator('[data-kind="fail"]')).to_have_count(1)
    expect(lane_a.locator('[data-kind="wait"]')).to_have_count(1)
    expect(lane_a.locator('[data-kind="resume"]')).to_have_count(1)
    expect(lane_a.locator('[data-kind="attempt"] title')).to_contain_text("attempt 3")
    op = timeline.locator('g.tl-lane[data-node="b"] [data-kind="op"] title')
    expect(op).to_contain_text("try b again")
    timeline.locator('g.tl-lane[data-node="b"] text.tl-name').click()
    expect(page).to_have_url(f"{console.url}/runs/{run_id}?node=b")
    timeline.scroll_into_view_if_needed()
    shoot(page, "timeline")
