"""The console's buttons that act, as HTML without a browser (tests/test_console.py has
the same flows in Chromium): Resolve on a blocked run's header, Send event on a waiting
node, Start run from a workflow seen, Retry failed runs in bulk. Each is confirmed,
keeps CSRF, shows the server's refusal with nothing written, and is audited."""

from __future__ import annotations

import html
import re
import urllib.parse
from pathlib import Path
from typing import Any

from tests.console_thread import ConsoleThread
from tests.helpers import claim, eventually, get_run, node, run_status, submit, workflow
from tests.test_auth import TOKENS, bearer, write_tokens
from tests.test_blocked import blocked_run
from tests.test_console_html import Browserless, csrf_of, signed_in, visitor
from tests.test_waits import SUSPENDED, wait_request

__all__ = ["visitor"]  # the fixture, used by name


def failed_run(server: Any, name: str = "report", metadata: Any = None) -> str:
    """A run of ``name`` whose only node failed for good."""
    from cyclone.v1 import worker_service_pb2, workflow_service_pb2

    run_id = server.workflows.Submit(
        workflow_service_pb2.SubmitRequest(
            workflow=workflow(name, node("build", action=f"build-{name}", max_attempts=1))
        ),
        metadata=metadata,
    ).run_id
    [step] = server.workers.Claim(
        worker_service_pb2.ClaimRequest(
            worker_id="w",
            actions=[worker_service_pb2.ActionSpec(name=f"build-{name}")],
            max_steps=1,
        ),
        metadata=metadata,
    ).steps
    server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=step.run_id,
            node="build",
            lease_token=step.lease_token,
            failure=worker_service_pb2.Failure(message="disk full", non_retryable=True),
        ),
        metadata=metadata,
    )
    return str(run_id)


def waiting_run(server: Any) -> str:
    """A run whose node 'approve' waits for the event 'approved'."""
    run_id = submit(server, workflow("approval", node("approve", action="approve")))
    [step] = claim(server, "approve")
    assert server.workers.Wait(wait_request(step, "event:approved", event="approved")).decision == (
        SUSPENDED
    )
    return run_id


def test_a_blocked_runs_header_offers_resolve_and_a_bad_result_writes_nothing(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id, _ = blocked_run(cyclone_server)
    page = visitor.get(f"/runs/{run_id}")
    header = re.search(r'aria-label="Run actions">(.*?)</div>', page.text, re.S)
    assert header, page.text
    assert f'href="/runs/{run_id}/act/resolve?node=charge"' in header.group(1)
    assert "Cancel run" in header.group(1)

    confirm = visitor.get(f"/runs/{run_id}/act/resolve?node=charge")
    assert confirm.status == 200 and "What did you find" in confirm.text
    form = {"choice": "result", "result": "{not json", "reason": "checked the PSP"}
    bad = visitor.post(
        f"/runs/{run_id}/act/resolve?node=charge", {**form, "csrf": csrf_of(confirm)}
    )
    assert bad.status == 400 and "not valid JSON" in bad.text
    assert visitor.post(f"/runs/{run_id}/act/resolve?node=charge", form).status == 403
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "blocked" and list(run.audit) == []

    form["result"] = '{"charge_id": "ch_9"}'
    done = visitor.post(f"/runs/{run_id}/act/resolve?node=charge", {**form, "csrf": csrf_of(bad)})
    assert done.status == 303
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "running"
    assert [(a.action, a.node, a.reason) for a in run.audit] == [
        ("resolve_result", "charge", "checked the PSP")
    ]


def test_a_waiting_node_offers_send_event_prefilled_and_bad_json_sends_nothing(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id = waiting_run(cyclone_server)
    page = visitor.get(f"/runs/{run_id}?node=approve")
    link = f'href="/runs/{run_id}/event?node=approve"'
    assert link in page.text and "Send event" in page.text
    assert link not in visitor.get(f"/runs/{run_id}").text  # only in the node's panel

    form_page = visitor.get(f"/runs/{run_id}/event?node=approve")
    assert form_page.status == 200
    assert re.search(r'name="name" value="approved"', form_page.text), form_page.text
    path = f"/runs/{run_id}/event?node=approve"
    bad = visitor.post(
        path, {"name": "approved", "payload": "{'by': 1}", "csrf": csrf_of(form_page)}
    )
    assert bad.status == 400 and "the payload is not valid JSON" in bad.text
    assert "{&#39;by&#39;: 1}" in bad.text  # the form keeps what was typed
    assert visitor.post(path, {"name": "approved", "payload": "1", "csrf": "guess"}).status == 403
    assert visitor.post(path, {"name": "approved", "payload": "1"}).status == 403
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.events")[0][0] == 0
    assert list(get_run(cyclone_server, run_id).audit) == []

    sent = visitor.post(
        path, {"name": "approved", "payload": '{"by": "ann"}', "key": "", "csrf": csrf_of(bad)}
    )
    assert sent.status == 303
    assert "Sent+event+approved" in sent.headers["location"]
    rows = cyclone_server.sql("SELECT name, payload->>'by', sent_by FROM cyclone.events")
    assert rows == [("approved", "ann", "console-test")]
    assert [a.action for a in get_run(cyclone_server, run_id).audit] == ["send_event"]
    # The node is woken at once: claimable again.
    eventually(lambda: claim(cyclone_server, "approve"), "the woken node")


def test_start_run_reuses_the_latest_definition_and_refusals_write_nothing(
    cyclone_server: Any, visitor: Browserless
) -> None:
    fetch_node = node(
        "fetch", action="fetch", max_attempts=4, backoff=7, timeout=30, input={"src": "s3"}
    )
    fetch_node.concurrency.key = "{run.day}"
    fetch_node.concurrency.limit = 2
    first = submit(
        cyclone_server,
        workflow("report", fetch_node, node("build", deps=["fetch"], rule="all_done")),
        input={"day": "monday"},
    )
    runs = visitor.get("/runs")
    assert 'href="/runs/new"' in runs.text and "Start run" in runs.text
    chooser = visitor.get("/runs/new")
    assert chooser.status == 200 and 'data-workflow="report"' in chooser.text
    assert visitor.get("/runs/new?workflow=nothing-like-it").status == 404

    page = visitor.get("/runs/new?workflow=report")
    assert page.status == 200 and first in page.text
    definition = html.unescape(
        re.search(r'name="definition"[^>]*>(.*?)</textarea>', page.text, re.S).group(1)  # type: ignore[union-attr]
    )
    assert '"max_attempts": 4' in definition and '"timeout": 30.0' in definition
    assert '"trigger_rule": "all_done"' in definition and '"src": "s3"' in definition
    assert '"initial_backoff": 7.0' in definition and '"max_backoff": 7.0' in definition
    assert '"key": "monday"' in definition and '"limit": 2' in definition
    form = {"workflow": "report", "definition": definition, "key": "", "priority": "0"}

    def count() -> int:
        return int(cyclone_server.sql("SELECT count(*) FROM cyclone.runs")[0][0])

    bad_input = visitor.post("/runs/new", {**form, "input": "{day", "csrf": csrf_of(page)})
    assert bad_input.status == 400 and "the input is not valid JSON" in bad_input.text
    cyclic = definition.replace('"name": "fetch"', '"name": "fetch", "depends_on": ["build"]')
    refused = visitor.post(
        "/runs/new", {**form, "definition": cyclic, "input": "{}", "csrf": csrf_of(page)}
    )
    assert refused.status == 400 and "cycle" in refused.text.lower()
    assert visitor.post("/runs/new", {**form, "input": "{}"}).status == 403
    assert count() == 1

    started = visitor.post(
        "/runs/new", {**form, "input": '{"day": "tuesday"}', "csrf": csrf_of(page)}
    )
    assert started.status == 303
    new_id = urllib.parse.urlsplit(started.headers["location"]).path.rsplit("/", 1)[1]
    assert new_id != first and count() == 2
    run = get_run(cyclone_server, new_id)
    assert run.workflow == "report" and run.input.struct_value.fields["day"].string_value == (
        "tuesday"
    )
    fetch, build = run.steps
    assert (fetch.node, fetch.max_attempts, fetch.timeout.seconds) == ("fetch", 4, 30)
    assert (fetch.retry.initial_backoff.seconds, fetch.retry.max_backoff.seconds) == (7, 7)
    assert (fetch.concurrency_key, fetch.concurrency_limit) == ("monday", 2)
    assert fetch.input.struct_value.fields["src"].string_value == "s3"
    assert (build.node, list(build.depends_on)) == ("build", ["fetch"])


def test_retry_failed_runs_confirms_the_count_and_retries_each_with_an_audit(
    cyclone_server: Any, visitor: Browserless
) -> None:
    failed = [failed_run(cyclone_server) for _ in range(3)]
    other = failed_run(cyclone_server, "other")
    runs = visitor.get("/runs?workflow=report&status=failed")
    assert 'href="/runs/retry-failed?workflow=report' in runs.text
    assert "/runs/retry-failed" not in visitor.get("/runs?status=running").text

    confirm = visitor.get("/runs/retry-failed?workflow=report")
    assert confirm.status == 200
    assert re.search(r'id="bulk-count"><strong>3</strong> failed runs match', confirm.text)
    assert all(r in confirm.text for r in failed) and other not in confirm.text
    listed = re.search(r'name="runs" value="([^"]*)"', confirm.text).group(1)  # type: ignore[union-attr]
    form = {"runs": listed, "reason": "disk freed"}
    assert visitor.post("/runs/retry-failed?workflow=report", form).status == 403
    assert visitor.post("/runs/retry-failed", {**form, "csrf": "guess"}).status == 403
    assert all(run_status(get_run(cyclone_server, r)) == "failed" for r in failed)

    done = visitor.post("/runs/retry-failed?workflow=report", {**form, "csrf": csrf_of(confirm)})
    assert done.status == 200 and "Retried 3 of 3 runs." in done.text
    for run_id in failed:
        run = get_run(cyclone_server, run_id)
        assert run_status(run) == "running"
        assert [(a.action, a.node, a.actor, a.reason) for a in run.audit] == [
            ("retry_all", "", "console-test", "disk freed")
        ]
        # The retry raised the node's limit; its policy, as submitted, is unchanged.
        assert (run.steps[0].max_attempts, run.steps[0].retry.max_attempts) == (2, 1)
    assert run_status(get_run(cyclone_server, other)) == "failed"
    # Posted again: no run is failed any more, and each one says why.
    again = visitor.post("/runs/retry-failed?workflow=report", {**form, "csrf": csrf_of(confirm)})
    assert "Retried 0 of 3 runs. 3 not retried." in again.text
    none_left = visitor.get("/runs/retry-failed?workflow=report")
    assert "No failed run matches" in none_left.text and 'name="runs"' not in none_left.text


def test_a_client_token_cannot_retry_failed_runs_and_nothing_changes(
    server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))
    admin = bearer(TOKENS["admin"])
    failed = [failed_run(server, metadata=admin) for _ in range(2)]
    console = ConsoleThread(server.address)
    try:
        client = signed_in(console.url, TOKENS["client"])
        confirm = client.get("/runs/retry-failed")
        assert confirm.status == 200 and "<strong>2</strong> failed runs match" in confirm.text
        listed = re.search(r'name="runs" value="([^"]*)"', confirm.text).group(1)  # type: ignore[union-attr]
        refused = client.post(
            "/runs/retry-failed", {"runs": listed, "reason": "x", "csrf": csrf_of(confirm)}
        )
        assert refused.status == 403 and "PERMISSION_DENIED" in refused.text
        from cyclone.v1 import workflow_service_pb2

        for run_id in failed:
            run = server.workflows.GetRun(
                workflow_service_pb2.GetRunRequest(run_id=run_id), metadata=admin
            ).run
            assert run_status(run) == "failed" and list(run.audit) == []
    finally:
        console.stop()
