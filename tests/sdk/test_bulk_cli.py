"""Bulk actions through the Python client (sync and async) and the `cyclone bulk`
commands, on a real server."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from pyclient import AsyncClient, InvalidArgument, NotFound, Workflow, cli


def _cli(capsys, server, *argv: str) -> tuple[int, str, str]:
    code = cli.main([*argv, "--address", server.address, "--actor", "olga"])
    out, err = capsys.readouterr()
    return code, out, err


def _runs(client, name: str, n: int) -> list[str]:
    wf = Workflow(name)
    wf.node("a")
    return [client.submit(wf) for _ in range(n)]


def test_client_starts_follows_and_lists_bulk_actions(client, cyclone_server):
    billing = _runs(client, "billing", 3)
    other = _runs(client, "shipping", 2)
    dry = client.start_bulk("cancel", workflow="billing", dry_run=True)
    assert (dry.job, dry.matched, dry.at_least) == (None, 3, False)
    started = client.start_bulk("cancel", workflow="billing", status="running", reason="rollback")
    assert started.job is not None and started.matched == 3
    job = client.wait_bulk(started.job.job_id, poll=0.05)
    assert (job.state, job.action, job.touched, job.skipped, job.failed) == (
        "done",
        "cancel",
        3,
        0,
        0,
    )
    assert job.filter == {"workflow": "billing", "statuses": ["RUN_STATUS_RUNNING"]}
    assert job.actor == "sdk-tests" and job.reason == "rollback"
    assert {client.get_run(r).status for r in billing} == {"cancelled"}
    assert {client.get_run(r).status for r in other} == {"running"}
    assert [j.job_id for j in client.list_bulk().jobs] == [job.job_id]
    with pytest.raises(InvalidArgument, match="confirm_all"):
        client.start_bulk("retry")
    with pytest.raises(InvalidArgument, match="unknown bulk action"):
        client.start_bulk("delete", workflow="billing")
    with pytest.raises(NotFound):
        client.get_bulk("0190a1b2-0000-7000-8000-000000000000")

    async def through_async() -> tuple[int, str]:
        async with AsyncClient(cyclone_server.address) as aclient:
            counted = await aclient.start_bulk("cancel", workflow="shipping", dry_run=True)
            listed = await aclient.list_bulk()
            return counted.matched, listed.jobs[0].job_id

    assert asyncio.run(through_async()) == (2, job.job_id)


def test_cli_bulk_cancel_waits_then_status_and_list(capsys, client, cyclone_server):
    runs = _runs(client, "billing", 4)
    code, out, _ = _cli(
        capsys, cyclone_server, "bulk", "cancel", "--workflow", "billing", "--dry-run"
    )
    assert code == 0 and out.strip() == "would cancel 4 run(s); nothing changed"
    assert {client.get_run(r).status for r in runs} == {"running"}

    code, out, _ = _cli(
        capsys,
        cyclone_server,
        "bulk",
        "cancel",
        "--workflow",
        "billing",
        "--status",
        "running",
        "--reason",
        "bad deploy",
    )
    assert code == 0, out
    assert "done, 4 touched, 0 skipped, 0 failed of 4" in out
    assert {client.get_run(r).status for r in runs} == {"cancelled"}
    job_id = out.split()[2].rstrip(":")
    [entry] = client.get_run(runs[0]).audit
    assert (entry.actor, entry.reason, entry.details["bulk_action"]) == (
        "olga",
        "bad deploy",
        job_id,
    )

    code, out, _ = _cli(capsys, cyclone_server, "bulk", "status", job_id, "--json")
    assert code == 0 and json.loads(out)["touched"] == 4
    code, out, _ = _cli(capsys, cyclone_server, "bulk", "list")
    assert code == 0 and job_id in out
    code, _, err = _cli(capsys, cyclone_server, "bulk", "stop", job_id)
    assert code == 1 and "already done" in err
    code, _, err = _cli(capsys, cyclone_server, "bulk", "retry")
    assert code == 1 and "confirm_all" in err

    more = _runs(client, "billing", 2)
    code, out, _ = _cli(
        capsys, cyclone_server, "bulk", "cancel", "--workflow", "billing", "--no-wait"
    )
    assert code == 0
    job = client.wait_bulk(out.strip(), poll=0.05)
    assert job.touched == 2 and {client.get_run(r).status for r in more} == {"cancelled"}


def test_cli_bulk_shows_a_progress_bar_on_a_terminal(capsys, monkeypatch, client, cyclone_server):
    runs = _runs(client, "billing", 3)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, _ = _cli(capsys, cyclone_server, "bulk", "cancel", "--workflow", "billing")
    assert code == 0 and "done, 3 touched, 0 skipped, 0 failed of 3" in out
    assert {client.get_run(r).status for r in runs} == {"cancelled"}
