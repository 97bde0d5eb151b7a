"""The console's Pause and Resume buttons on a run's page, as HTML without a browser:
confirmed, CSRF-checked, audited, and refused with nothing written for a token whose
role may not pause."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.console_thread import ConsoleThread
from tests.helpers import claim, get_run, node, submit, workflow
from tests.test_auth import TOKENS, bearer, write_tokens
from tests.test_console_html import Browserless, csrf_of, signed_in, visitor

__all__ = ["visitor"]  # the fixture, used by name


def test_pause_and_resume_buttons_hold_and_release_the_run(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id = submit(cyclone_server, workflow("order", node("charge")))
    page = visitor.get(f"/runs/{run_id}")
    assert f'href="/runs/{run_id}/act/pause"' in page.text
    assert "/act/resume" not in page.text
    confirm = visitor.get(f"/runs/{run_id}/act/pause")
    assert confirm.status == 200
    forged = visitor.post(f"/runs/{run_id}/act/pause", {"reason": "x", "csrf": "guess"})
    assert forged.status == 403 and not get_run(cyclone_server, run_id).HasField("pause")
    done = visitor.post(
        f"/runs/{run_id}/act/pause", {"reason": "ledger check", "csrf": csrf_of(confirm)}
    )
    assert done.status == 303
    assert claim(cyclone_server) == []
    page = visitor.get(f"/runs/{run_id}")
    assert 'id="run-pause"' in page.text and "ledger check" in page.text
    assert f'href="/runs/{run_id}/act/resume"' in page.text
    confirm = visitor.get(f"/runs/{run_id}/act/resume")
    done = visitor.post(f"/runs/{run_id}/act/resume", {"reason": "", "csrf": csrf_of(confirm)})
    assert done.status == 303
    assert [s.node for s in claim(cyclone_server)] == ["charge"]
    audit = [(a.action, a.actor, a.reason) for a in get_run(cyclone_server, run_id).audit]
    assert audit == [
        ("pause", "console-test", "ledger check"),
        ("resume", "console-test", ""),
    ]


def test_a_client_token_cannot_pause_a_run_and_nothing_changes(
    server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))
    admin = bearer(TOKENS["admin"])
    from cyclone.v1 import workflow_service_pb2

    run_id = server.workflows.Submit(
        workflow_service_pb2.SubmitRequest(workflow=workflow("order", node("charge"))),
        metadata=admin,
    ).run_id
    console = ConsoleThread(server.address)
    try:
        client = signed_in(console.url, TOKENS["client"])
        confirm = client.get(f"/runs/{run_id}/act/pause")
        refused = client.post(
            f"/runs/{run_id}/act/pause", {"reason": "x", "csrf": csrf_of(confirm)}
        )
        assert refused.status == 403 and "PERMISSION_DENIED" in refused.text
        run = server.workflows.GetRun(
            workflow_service_pb2.GetRunRequest(run_id=run_id), metadata=admin
        ).run
        assert not run.HasField("pause") and list(run.audit) == []
    finally:
        console.stop()


def test_the_node_of_a_paused_run_says_why_on_its_page(
    cyclone_server: Any, visitor: Browserless
) -> None:
    from tests.test_pauses import pause_run

    run_id = submit(cyclone_server, workflow("order", node("charge")))
    pause_run(cyclone_server, run_id, "audit")
    page = visitor.get(f"/runs/{run_id}?node=charge")
    assert page.status == 200
    assert "Why: paused" in page.text and "paused by ops@example" in page.text
