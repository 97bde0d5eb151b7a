"""The console's buttons that act, in Chromium (tests/test_console_actions.py has the same
flows as plain HTTP): Resolve on a blocked run's header, Send event on a waiting node,
Start run from a workflow seen, Retry failed runs in bulk; and their refusals (a client
token cannot bulk-retry, a forged form is refused)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.console_thread import ConsoleThread
from tests.helpers import drain, get_run, node, run_status, submit, workflow
from tests.test_auth import TOKENS, bearer, write_tokens
from tests.test_blocked import blocked_run
from tests.test_console import browser, console_for, page, row, shoot
from tests.test_console_actions import failed_run, waiting_run

__all__ = ["browser", "page"]  # fixtures, used by name


@pytest.fixture
def console(cyclone_server: Any) -> Iterator[ConsoleThread]:
    started = console_for(cyclone_server)
    yield started
    started.stop()


def test_resolve_on_a_blocked_runs_header_resolves_it(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id, _ = blocked_run(cyclone_server)
    page.goto(f"{console.url}/runs/{run_id}")
    header = page.get_by_label("Run actions")
    expect(header.get_by_role("link", name="Cancel run")).to_be_visible()
    header.get_by_role("link", name="Resolve charge").click()
    page.get_by_label("The effect did not happen").check()
    page.get_by_label("Reason").fill("no charge at the PSP")
    page.get_by_role("button", name=re.compile("Confirm")).click()
    expect(page.get_by_role("status").first).to_contain_text("the step runs again")
    expect(page.locator("#run-status")).to_contain_text("running")
    run = get_run(cyclone_server, run_id)
    assert [(a.action, a.node, a.reason) for a in run.audit] == [
        ("resolve_discard", "charge", "no charge at the PSP")
    ]


def test_send_event_on_a_waiting_node_wakes_it(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    run_id = waiting_run(cyclone_server)
    page.goto(f"{console.url}/runs/{run_id}?node=approve")
    page.get_by_label("Node actions").get_by_role("link", name="Send event").click()
    expect(page.get_by_label("Event name")).to_have_value("approved")
    page.get_by_label("Payload (JSON)").fill('{"by": "ann"}')
    shoot(page, "send-event")
    page.get_by_label("Payload (JSON)").fill("{by: ann}")
    page.get_by_role("button", name=re.compile("Confirm")).click()
    expect(page.get_by_role("alert")).to_contain_text("the payload is not valid JSON")
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.events")[0][0] == 0
    page.get_by_label("Payload (JSON)").fill('{"by": "ann"}')
    page.get_by_role("button", name=re.compile("Confirm")).click()
    expect(page.get_by_role("status").first).to_contain_text("Sent event approved")
    assert cyclone_server.sql("SELECT payload->>'by' FROM cyclone.events") == [("ann",)]
    assert [a.action for a in get_run(cyclone_server, run_id).audit] == ["send_event"]


def test_start_run_from_a_workflow_seen_with_new_input(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    submit(
        cyclone_server,
        workflow("report", node("fetch"), node("build", deps=["fetch"])),
        input={"day": "monday"},
    )
    page.goto(f"{console.url}/runs")
    page.get_by_role("link", name="Start run").click()
    page.get_by_role("link", name="report", exact=True).click()
    expect(page.get_by_label("Definition (JSON)")).to_contain_text('"fetch"')
    page.get_by_label("Input (JSON)").fill('{"day": "tuesday"}')
    shoot(page, "start-run")
    page.get_by_label("Input (JSON)").fill('{"day": ')
    page.get_by_role("button", name=re.compile("Confirm")).click()
    expect(page.get_by_role("alert")).to_contain_text("the input is not valid JSON")
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.runs")[0][0] == 1
    page.get_by_label("Input (JSON)").fill('{"day": "tuesday"}')
    page.get_by_role("button", name=re.compile("Confirm")).click()
    expect(page.get_by_role("status").first).to_contain_text("Run started.")
    expect(page.locator("#input-h + pre")).to_contain_text("tuesday")
    assert sorted(drain(cyclone_server)) == ["build", "build", "fetch", "fetch"]  # both runs
    expect(page.locator("#run-status")).to_contain_text("completed")


def test_retry_failed_runs_from_a_filtered_list(
    cyclone_server: Any, console: ConsoleThread, page: Page
) -> None:
    failed = [failed_run(cyclone_server) for _ in range(2)]
    other = failed_run(cyclone_server, "other")
    page.goto(f"{console.url}/runs?workflow=report&status=failed")
    expect(row(page, failed[0])).to_be_visible()
    page.get_by_role("link", name="Retry failed runs").click()
    expect(page.locator("#bulk-count")).to_contain_text("2 failed runs match")
    page.get_by_label("Reason").fill("disk freed")
    shoot(page, "retry-failed")
    page.get_by_role("button", name="Confirm: retry 2 failed runs").click()
    expect(page.get_by_role("status")).to_contain_text("Retried 2 of 2 runs.")
    for run_id in failed:
        run = get_run(cyclone_server, run_id)
        assert run_status(run) == "running"
        assert [(a.action, a.reason) for a in run.audit] == [("retry_all", "disk freed")]
    assert run_status(get_run(cyclone_server, other)) == "failed"
    forged = page.request.post(
        f"{console.url}/runs/retry-failed", form={"runs": other, "csrf": "guess"}
    )
    assert forged.status == 403
    assert run_status(get_run(cyclone_server, other)) == "failed"


def test_a_client_token_is_refused_retrying_failed_runs(
    server_factory: Any, tmp_path: Path, page: Page
) -> None:
    server = server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))
    admin = bearer(TOKENS["admin"])
    failed = [failed_run(server, metadata=admin) for _ in range(2)]
    console = console_for(server)
    try:
        page.goto(f"{console.url}/runs?status=failed")
        page.get_by_label("Token").fill(TOKENS["client"])
        page.get_by_role("button", name="Sign in").click()
        page.get_by_role("link", name="Retry failed runs").click()
        expect(page.locator("#bulk-count")).to_contain_text("2 failed runs match")
        page.get_by_role("button", name=re.compile("Confirm")).click()
        expect(page.get_by_role("alert")).to_contain_text("PERMISSION_DENIED")
        from cyclone.v1 import workflow_service_pb2

        for run_id in failed:
            run = server.workflows.GetRun(
                workflow_service_pb2.GetRunRequest(run_id=run_id), metadata=admin
            ).run
            assert run_status(run) == "failed" and list(run.audit) == []
    finally:
        console.stop()
