"""The console's bulk cancel and its jobs page, as HTML without a browser: "Cancel
these runs" from the runs list counts the runs the filters match, keeps CSRF, starts a
job on the server that cancels each one with an audit entry, and the jobs page shows
its progress; a token whose role may not start one changes nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.console_thread import ConsoleThread
from tests.helpers import eventually, get_run, node, run_status, submit, workflow
from tests.test_auth import TOKENS, bearer, write_tokens
from tests.test_console_html import Browserless, csrf_of, signed_in, visitor

__all__ = ["visitor"]  # the fixture, used by name


def test_cancel_these_runs_counts_confirms_and_starts_a_job(
    cyclone_server: Any, visitor: Browserless
) -> None:
    billing = [submit(cyclone_server, workflow("billing", node("a"))) for _ in range(3)]
    other = submit(cyclone_server, workflow("shipping", node("a")))
    runs = visitor.get("/runs?workflow=billing&match=exact")
    assert 'href="/runs/cancel-matching?workflow=billing&amp;match=exact' in runs.text
    assert "/runs/cancel-matching" not in visitor.get("/runs?status=completed").text

    confirm = visitor.get("/runs/cancel-matching?workflow=billing&match=exact")
    assert confirm.status == 200
    assert re.search(r'id="bulk-count"><strong>3</strong> runs to cancel', confirm.text)
    assert 'name="confirm_all"' not in confirm.text
    form = {"reason": "bad deploy"}
    target = "/runs/cancel-matching?workflow=billing&match=exact"
    assert visitor.post(target, form).status == 403  # no CSRF token
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.bulk_actions") == [(0,)]

    posted = visitor.post(target, {**form, "csrf": csrf_of(confirm)})
    assert posted.status == 303
    started = visitor.get(posted.headers["location"])
    assert "Started cancelling 3 run(s)" in started.text
    job_id = re.search(r"job ([0-9a-f-]{36})", started.text).group(1)  # type: ignore[union-attr]

    def finished() -> bool:
        row = visitor.get("/bulk").text.split(job_id, 1)[1].split("</tr>")[0]
        return "<td>done</td>" in row

    eventually(finished, "the job to be done")
    page = visitor.get("/bulk")
    assert re.search(r'<progress max="3" value="3">', page.text)
    assert "3 done, 0 skipped, 0 failed of 3" in page.text
    for run_id in billing:
        run = get_run(cyclone_server, run_id)
        assert run_status(run) == "cancelled"
        [entry] = run.audit
        assert (entry.action, entry.actor, entry.reason) == ("cancel", "console-test", "bad deploy")
        assert entry.details.struct_value["bulk_action"] == job_id
    assert run_status(get_run(cyclone_server, other)) == "running"


def test_cancel_every_run_needs_the_box_ticked(cyclone_server: Any, visitor: Browserless) -> None:
    runs = [submit(cyclone_server, workflow(f"w{i}", node("a"))) for i in range(2)]
    confirm = visitor.get("/runs/cancel-matching")
    assert 'name="confirm_all"' in confirm.text
    refused = visitor.post("/runs/cancel-matching", {"reason": "", "csrf": csrf_of(confirm)})
    assert refused.status == 400 and "confirm_all" in refused.text
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.bulk_actions") == [(0,)]
    started = visitor.post(
        "/runs/cancel-matching", {"confirm_all": "yes", "csrf": csrf_of(confirm)}
    )
    assert "Started cancelling 2 run(s)" in visitor.get(started.headers["location"]).text
    eventually(
        lambda: all(run_status(get_run(cyclone_server, r)) == "cancelled" for r in runs),
        "every run cancelled",
    )


def test_a_client_token_cannot_start_a_bulk_cancel_and_nothing_changes(
    server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))
    admin = bearer(TOKENS["admin"])
    from cyclone.v1 import workflow_service_pb2

    run_id = server.workflows.Submit(
        workflow_service_pb2.SubmitRequest(workflow=workflow("billing", node("a"))),
        metadata=admin,
    ).run_id
    console = ConsoleThread(server.address)
    try:
        client = signed_in(console.url, TOKENS["client"])
        # Even counting them is a dry run of the bulk action, which the role may not
        # start: the page says so at once, and offers no button.
        confirm = client.get("/runs/cancel-matching?workflow=billing")
        assert confirm.status == 403 and "PERMISSION_DENIED" in confirm.text
        assert "Confirm: cancel" not in confirm.text
        refused = client.post(
            "/runs/cancel-matching?workflow=billing", {"reason": "x", "csrf": csrf_of(confirm)}
        )
        assert refused.status == 403 and "PERMISSION_DENIED" in refused.text
        run = server.workflows.GetRun(
            workflow_service_pb2.GetRunRequest(run_id=run_id), metadata=admin
        ).run
        assert run_status(run) == "running" and list(run.audit) == []
        assert server.sql("SELECT count(*) FROM cyclone.bulk_actions") == [(0,)]
        assert client.get("/bulk").status == 200  # reading the jobs is a client's right
    finally:
        console.stop()
