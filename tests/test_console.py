"""The console in a real browser: Playwright driving Debian's Chromium (/usr/bin/chromium,
installed by .ci/run) against a real server. One browser for all of them.

With CYCLONE_SCREENSHOTS=DIR (make screenshots), the flows also save the pictures of
docs/console.md there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from cyclone.v1 import types_pb2, worker_service_pb2
from tests.console_thread import ConsoleThread
from tests.helpers import (
    claim,
    complete,
    drain,
    fail,
    get_run,
    missing_tool,
    node,
    run_status,
    submit,
    workflow,
)
from tests.test_auth import TOKENS, write_tokens
from tests.test_blocked import blocked_run
from tests.test_tls import credentials as tls_credentials
from tests.test_tls import pki as tls_pki
from tests.test_tls import submit_over, tls_settings

#: test_tls's certificates (a server CA and the server's certificate), for this module too.
pki = tls_pki
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: How long the browser waits for what a live region (refreshed every 2 s) must show.
LIVE_MS = 20_000
SHOTS = os.environ.get("CYCLONE_SCREENSHOTS")
expect.set_options(timeout=LIVE_MS)


# One browser for this module, closed after it: while Playwright's sync API is open, the
# main thread has a running event loop, and later tests' asyncio.run() would fail.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        missing_tool(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    opened.set_default_timeout(LIVE_MS)
    yield opened
    context.close()


def console_for(server: Any) -> ConsoleThread:
    return ConsoleThread(server.address)


@pytest.fixture
def console(cyclone_server: Any) -> Iterator[ConsoleThread]:
    started = console_for(cyclone_server)
    yield started
    started.stop()


def shoot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def row(page: Page, run_id: str) -> Any:
    return page.locator(f'tr[data-run="{run_id}"]')


def test_a_submitted_run_appears_and_turns_completed_without_a_reload(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    page.goto(f"{console.url}/runs")
    page.evaluate("window.notReloaded = true")
    run_id = submit(
        cyclone_server,
        workflow("order", node("charge"), node("ship", deps=["charge"])),
        input={"order": 7},
    )
    expect(row(page, run_id)).to_contain_text("running")
    assert drain(cyclone_server) == ["charge", "ship"]
    expect(row(page, run_id)).to_contain_text("completed")
    expect(page.locator('[data-status="completed"]')).to_have_text("1")
    assert page.evaluate("window.notReloaded") is True
    shoot(page, "runs")


def test_a_run_page_draws_the_dag_and_updates_the_nodes_live(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id = submit(
        cyclone_server,
        workflow(
            "order",
            node("charge"),
            node("receipt", deps=["charge"]),
            node("audit", deps=["charge", "receipt"], rule="all_done"),
        ),
    )
    page.goto(f"{console.url}/runs/{run_id}?node=receipt")
    boxes = page.locator("svg.dag a.node")
    expect(boxes).to_have_count(3)
    expect(page.locator("svg.dag path.edge")).to_have_count(3)
    # Laid out in layers: each node below the nodes it depends on.
    y = {
        n: page.locator(f'svg.dag a[data-node="{n}"] rect').get_attribute("y")
        for n in ("charge", "receipt", "audit")
    }
    assert float(y["charge"]) < float(y["receipt"]) < float(y["audit"])  # type: ignore[arg-type]
    expect(page.locator(".explain")).to_contain_text("waiting_on_upstream")
    [step] = claim(cyclone_server)
    expect(page.locator('svg.dag a[data-node="charge"]')).to_have_class(re.compile("s-running"))
    complete(cyclone_server, step, {"charge_id": "ch_1"})
    expect(page.locator('svg.dag a[data-node="charge"]')).to_have_class(re.compile("s-completed"))
    shoot(page, "run")


def test_a_running_nodes_log_lines_appear_live_by_attempt(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id = submit(cyclone_server, workflow("order", node("charge")))
    [first] = claim(cyclone_server)
    fail(cyclone_server, first, "declined")
    cyclone_server.advance_clock(3600)
    [second] = claim(cyclone_server)
    page.goto(f"{console.url}/runs/{run_id}?node=charge")
    page.evaluate("window.notReloaded = true")
    expect(page.locator("#no-logs")).to_contain_text("come with the step's heartbeats")
    cyclone_server.workers.Heartbeat(
        worker_service_pb2.HeartbeatRequest(
            run_id=run_id,
            node="charge",
            lease_token=second.lease_token,
            logs=[types_pb2.LogLine(level="WARNING", message="card slow", logger="shop")],
        )
    )
    lines = page.locator('pre.log[data-attempt="2"]')
    expect(lines).to_contain_text("WARNING shop: card slow")
    expect(page.locator("#logs-2")).to_have_text("Attempt 2 · 1 line")
    assert page.evaluate("window.notReloaded") is True


def test_a_blocked_run_is_resolved_from_the_console_and_completes(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id, _ = blocked_run(cyclone_server)
    page.goto(f"{console.url}/attention")
    expect(row(page, run_id)).to_contain_text("EffectUncertain")
    shoot(page, "attention")
    row(page, run_id).get_by_role("link").first.click()
    page.get_by_label("Node actions").get_by_role("link", name="Resolve").click()
    page.get_by_label("The effect happened, with this result").check()
    page.get_by_label("Result as JSON").fill('{"charge_id": "ch_9"}')
    page.get_by_label("Reason").fill("found ch_9 at the PSP")
    shoot(page, "resolve")
    page.get_by_role("button", name=re.compile("Confirm")).click()
    expect(page.get_by_role("status").first).to_contain_text("Resolved")
    expect(page.locator("#run-status")).to_contain_text("running")
    assert sorted(drain(cyclone_server, "work", "side")) == ["receipt", "side"]
    expect(page.locator("#run-status")).to_contain_text("completed")
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "completed"
    [entry] = run.audit
    assert (entry.action, entry.actor, entry.reason) == (
        "resolve_result",
        "console-test",
        "found ch_9 at the PSP",
    )
    page.reload()
    expect(page.locator("#audit-h + div")).to_contain_text("found ch_9 at the PSP")


TRACEBACK = 'Traceback (most recent call last):\n  File "build.py", line 3\nOSError: disk full'


def failed_run(server: Any) -> str:
    from cyclone.v1 import worker_service_pb2

    run_id = submit(server, workflow("report", node("build", max_attempts=1)))
    [step] = claim(server)
    failure = worker_service_pb2.Failure(message="disk full", type="OSError", details=TRACEBACK)
    server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=run_id, node="build", lease_token=step.lease_token, failure=failure
        )
    )
    assert run_status(get_run(server, run_id)) == "failed"
    return run_id


def test_a_failed_node_is_retried_from_the_console(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id = failed_run(cyclone_server)
    page.goto(f"{console.url}/runs/{run_id}?node=build")
    expect(page.locator(".errors")).to_contain_text("OSError")
    traceback = page.locator(".errors details pre")
    expect(traceback).to_be_hidden()
    page.get_by_text("Traceback", exact=True).click()
    expect(traceback).to_have_text(TRACEBACK)
    page.get_by_role("link", name="Retry node").click()
    page.get_by_label("Reason").fill("freed some space")
    page.get_by_role("button", name=re.compile("Confirm")).click()
    expect(page.get_by_role("status").first).to_contain_text("Reopened build")
    [step] = claim(cyclone_server)
    assert (step.node, step.attempt) == ("build", 2)
    complete(cyclone_server, step)
    expect(page.locator("#run-status")).to_contain_text("completed")


def test_an_admin_action_is_refused_to_a_client_token(
    server_factory: Any, tmp_path: Path, page: Page
) -> None:
    server = server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))
    run_id = submit_as_admin(server)
    console = console_for(server)
    try:
        page.goto(f"{console.url}/runs/{run_id}?node=build")
        expect(page).to_have_url(re.compile("/login"))
        page.get_by_label("Token").fill("not-a-token")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("UNAUTHENTICATED")
        page.get_by_label("Token").fill(TOKENS["client"])
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#run-status")).to_contain_text("failed")
        # The cookie holds a random session id, never the token.
        cookies = page.context.cookies()
        assert cookies and all(TOKENS["client"] not in c["value"] for c in cookies)
        page.get_by_role("link", name="Retry node").click()
        page.get_by_role("button", name=re.compile("Confirm")).click()
        expect(page.get_by_role("alert")).to_contain_text("PERMISSION_DENIED")
        shoot(page, "refused")
        assert run_status(get_run_as_admin(server, run_id)) == "failed"
    finally:
        console.stop()


def submit_as_admin(server: Any) -> str:
    from cyclone.v1 import worker_service_pb2, workflow_service_pb2
    from tests.test_auth import bearer

    admin = bearer(TOKENS["admin"])
    run_id = server.workflows.Submit(
        workflow_service_pb2.SubmitRequest(
            workflow=workflow("report", node("build", max_attempts=1))
        ),
        metadata=admin,
    ).run_id
    [step] = server.workers.Claim(
        worker_service_pb2.ClaimRequest(
            worker_id="w", actions=[worker_service_pb2.ActionSpec(name="work")], max_steps=1
        ),
        metadata=admin,
    ).steps
    server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=run_id,
            node="build",
            lease_token=step.lease_token,
            failure=worker_service_pb2.Failure(message="boom", non_retryable=True),
        ),
        metadata=admin,
    )
    return run_id


def get_run_as_admin(server: Any, run_id: str) -> Any:
    from cyclone.v1 import workflow_service_pb2
    from tests.test_auth import bearer

    return server.workflows.GetRun(
        workflow_service_pb2.GetRunRequest(run_id=run_id), metadata=bearer(TOKENS["admin"])
    ).run


HOSTILE = "<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"


def test_a_hostile_run_input_is_shown_escaped(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id = submit(
        cyclone_server,
        workflow("hostile", node("step", input={"html": HOSTILE})),
        input={"html": HOSTILE, "huge": "A" * 200_000},
    )
    [step] = claim(cyclone_server)
    fail(cyclone_server, step, HOSTILE)
    page.goto(f"{console.url}/runs/{run_id}?node=step")
    expect(page.locator("#input-h + pre")).to_contain_text(HOSTILE)
    expect(page.locator("#input-h + pre")).to_contain_text("cut:")
    expect(page.locator(".errors")).to_contain_text(HOSTILE)
    assert page.evaluate("window.pwned") is None
    assert page.locator("main script, main img").count() == 0


def test_a_post_without_the_session_csrf_token_is_refused(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id = submit(cyclone_server, workflow("order", node("charge")))
    page.goto(f"{console.url}/runs/{run_id}")
    refused = page.request.post(
        f"{console.url}/runs/{run_id}/act/cancel", form={"reason": "forged", "csrf": "guess"}
    )
    assert refused.status == 403
    assert run_status(get_run(cyclone_server, run_id)) == "running"


def test_the_runs_page_is_usable_at_phone_width(
    cyclone_server: Any, console: ConsoleThread, browser: Browser
) -> None:
    run_id = submit(cyclone_server, workflow("order", node("charge")))
    context = browser.new_context(viewport={"width": 390, "height": 844})
    try:
        phone = context.new_page()
        phone.goto(f"{console.url}/runs")
        expect(row(phone, run_id)).to_be_visible()
        # Nothing wider than the screen but the scrollable tables.
        width = phone.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, width
        shoot(phone, "phone")
    finally:
        context.close()


def test_needs_a_person_lists_steps_backing_off_and_expired_leases(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    flaky = submit(cyclone_server, workflow("sync", node("pull", action="pull")))
    [step] = claim(cyclone_server, "pull")
    fail(cyclone_server, step, "upstream timeout", retry_after=3600)
    lost = submit(cyclone_server, workflow("sync", node("push", action="push")))
    claim(cyclone_server, "push", lease=1)  # never heartbeats; the sweep is not run
    page.goto(f"{console.url}/attention")
    backing_off = page.locator("#backoff-h + div")
    expect(backing_off).to_contain_text("upstream timeout")
    expect(backing_off.get_by_role("link")).to_have_attribute("href", re.compile(flaky))
    # The lease ends a second after the claim: the live region shows it then.
    expired = page.locator("#lease-h + div")
    expect(expired.get_by_role("link")).to_have_attribute("href", re.compile(lost))


def test_the_workers_page_shows_who_runs_what_and_the_activity_of_ready_actions(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    submit(cyclone_server, workflow("mailing", node("render", action="render")))
    submit(cyclone_server, workflow("mailing", node("send", action="send")))
    claim(cyclone_server, "render", worker="renderer-7")
    page.goto(f"{console.url}/workers")
    worker = page.locator('tr[data-worker="renderer-7"]')
    expect(worker.locator("td.state")).to_have_text("busy")
    expect(worker.locator("td.serves")).to_have_text("render")
    expect(worker.locator("td").nth(4)).to_have_text("1: render")
    # An action no worker asked for: listed with its ready step, asked for by nobody.
    expect(page.locator('tr[data-action="send"]')).to_contain_text("nobody")
    expect(page.locator('tr[data-action="send"] td').nth(5)).to_have_text("1")
    shoot(page, "workers")


def test_the_runs_list_filters_by_workflow_status_and_key(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    from cyclone.v1 import workflow_service_pb2

    order = submit(cyclone_server, workflow("order", node("charge")))
    report = submit(cyclone_server, workflow("report", node("build", max_attempts=1)))
    keyed = cyclone_server.workflows.SubmitOnce(
        workflow_service_pb2.SubmitOnceRequest(
            workflow=workflow("order", node("charge")), key="order-42"
        )
    ).run_id
    page.goto(f"{console.url}/runs")
    page.get_by_label("Workflow").fill("report")
    page.get_by_role("button", name="Show").click()
    expect(row(page, report)).to_be_visible()
    expect(page.locator("tr[data-run]")).to_have_count(1)
    page.goto(f"{console.url}/runs?workflow=order&key=order-42")
    expect(row(page, keyed)).to_contain_text("order-42")
    expect(page.locator("tr[data-run]")).to_have_count(1)
    # A key alone: the server's filter (CountRuns counts by it too).
    page.goto(f"{console.url}/runs?key=order-42")
    expect(row(page, keyed)).to_be_visible()
    expect(page.locator("tr[data-run]")).to_have_count(1)
    expect(page.locator('[data-status="running"]')).to_have_text("1")
    [step] = claim(cyclone_server, "work", n=1)
    fail(cyclone_server, step, "no", non_retryable=True)
    failed = step.run_id
    page.goto(f"{console.url}/runs?status=failed")
    expect(row(page, failed)).to_be_visible()
    expect(page.locator("tr[data-run]")).to_have_count(1)
    assert {order, report, keyed} >= {failed}


def test_a_durable_function_shows_its_journal_and_a_blocked_step_call_is_resolved(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    from tests.test_step_calls import UNCERTAIN, begin, blocked_on_charge, journal

    run_id, second = blocked_on_charge(cyclone_server)
    assert begin(cyclone_server, second, "charge", 2, unsafe=True).decision == UNCERTAIN
    page.goto(f"{console.url}/runs/{run_id}?node=body")
    entries = page.locator("table.journal tbody tr")
    expect(entries).to_have_count(2)
    expect(entries.nth(0)).to_contain_text("lookup")
    expect(entries.nth(0)).to_contain_text("succeeded")
    expect(entries.nth(1)).to_contain_text("charge")
    expect(entries.nth(1)).to_contain_text("unsafe")
    expect(entries.nth(1)).to_contain_text("started")
    expect(page.locator(".errors")).to_contain_text("worker died")
    page.get_by_label("Node actions").get_by_role("link", name="Resolve").click()
    expect(page.locator("form.confirm")).to_contain_text("step call charge")
    page.get_by_label("The effect did not happen").check()
    page.get_by_role("button", name=re.compile("Confirm")).click()
    expect(page.get_by_role("status").first).to_contain_text("runs again")
    assert [row[0] for row in journal(cyclone_server, run_id)] == ["lookup"]
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "running"
    assert run.audit[0].action == "resolve_discard"


def test_the_console_calls_a_server_that_serves_tls(
    server_factory: Any,
    pki: dict[str, Any],
    page: Page,
) -> None:
    server = server_factory(**tls_settings(pki))
    run_id = submit_over(server.address, tls_credentials(pki))
    console = ConsoleThread(server.address, tls_credentials(pki))
    try:
        page.goto(f"{console.url}/runs")
        expect(row(page, run_id)).to_contain_text("running")
    finally:
        console.stop()


def schedules_client(server: Any, token: str | None = None) -> Any:
    from pyclient.client import Client

    return Client(server.address, token=token)


def nightly(client: Any, name: str = "nightly") -> None:
    from pyclient.workflow import Workflow

    wf = Workflow("report")
    wf.node("build")
    client.create_schedule(name, wf, {"full": True}, cron="0 3 * * *", time_zone="Europe/Paris")


def schedule_row(page: Page, name: str) -> Any:
    return page.locator(f'tr[data-schedule="{name}"]')


def test_the_schedules_page_lists_a_schedule_and_pauses_and_resumes_it(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    with schedules_client(cyclone_server) as client:
        nightly(client)
        page.goto(f"{console.url}/schedules")
        found = schedule_row(page, "nightly")
        expect(found).to_contain_text("0 3 * * *")
        expect(found).to_contain_text("Europe/Paris")
        expect(found.locator(".state")).to_have_text("active")
        shoot(page, "schedules")
        page.get_by_role("link", name="Pause nightly").click()
        page.get_by_role("button", name=re.compile("Confirm")).click()
        expect(page.get_by_role("status")).to_contain_text("nightly paused")
        expect(schedule_row(page, "nightly").locator(".state")).to_have_text("paused")
        assert client.get_schedule("nightly").paused is True
        page.get_by_role("link", name="Resume nightly").click()
        page.get_by_role("button", name=re.compile("Confirm")).click()
        expect(schedule_row(page, "nightly").locator(".state")).to_have_text("active")
        assert client.get_schedule("nightly").paused is False
        page.get_by_role("link", name="Delete nightly").click()
        page.get_by_role("button", name=re.compile("Confirm")).click()
        expect(page.get_by_role("status")).to_contain_text("nightly deleted")
        expect(schedule_row(page, "nightly")).to_have_count(0)
        assert client.list_schedules().schedules == ()


def test_a_schedule_is_created_from_the_console_and_the_apis_refusal_is_shown(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    page.goto(f"{console.url}/schedules/new")
    page.get_by_label("Name", exact=True).fill("poll")
    page.get_by_label("At a fixed interval").check()
    page.get_by_label("Every (seconds)").fill("300")
    page.get_by_label(re.compile("^Workflow")).fill('{"name": "poll", "nodes": [{"name": "x"}]}')
    page.get_by_label(re.compile("^Run input")).fill("{not json")
    page.get_by_role("button", name="Create the schedule").click()
    expect(page.get_by_role("alert")).to_contain_text("the input is not valid JSON")
    page.get_by_label(re.compile("^Run input")).fill('{"since": 0}')
    page.get_by_label("On a cron expression").check()
    page.get_by_label(re.compile("^Cron expression")).fill("61 * * * *")
    page.get_by_role("button", name="Create the schedule").click()
    # The server's own message for a bad cron expression, with its status.
    expect(page.get_by_role("alert")).to_contain_text("INVALID_ARGUMENT")
    expect(page.get_by_role("alert")).to_contain_text("61")
    with schedules_client(cyclone_server) as client:
        assert client.list_schedules().schedules == ()
        page.get_by_label("At a fixed interval").check()
        page.get_by_role("button", name="Create the schedule").click()
        expect(schedule_row(page, "poll")).to_contain_text("every 300")
        made = client.get_schedule("poll")
        assert (made.interval.total_seconds(), made.input) == (300, {"since": 0})


def test_a_client_token_is_refused_pausing_a_schedule(
    server_factory: Any, tmp_path: Path, page: Page
) -> None:
    server = server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))
    with schedules_client(server, TOKENS["admin"]) as admin:
        nightly(admin)
        console = console_for(server)
        try:
            page.goto(f"{console.url}/schedules")
            page.get_by_label("Token").fill(TOKENS["client"])
            page.get_by_role("button", name="Sign in").click()
            expect(schedule_row(page, "nightly").locator(".state")).to_have_text("active")
            page.get_by_role("link", name="Pause nightly").click()
            page.get_by_role("button", name=re.compile("Confirm")).click()
            expect(page.get_by_role("alert")).to_contain_text("PERMISSION_DENIED")
            assert admin.get_schedule("nightly").paused is False
        finally:
            console.stop()
