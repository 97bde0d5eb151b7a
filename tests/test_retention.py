"""Retention: finished runs past their age are deleted in small batches, with their
steps, errors and audit; failed and blocked runs are kept; claims never wait on it."""

from __future__ import annotations

import psycopg
import pytest

from cyclone.v1 import workflow_service_pb2
from service.config import parse
from tests.helpers import (
    claim,
    complete,
    drain,
    eventually,
    fail,
    node,
    submit,
    table_counts,
    workflow,
)

DAY = 86400


def run_statuses(server) -> dict[str, str]:
    return {str(r): s for r, s in server.sql("SELECT run_id, status FROM cyclone.runs")}


def purge(server) -> int:
    return server.call(server.server.purge)


def finished_runs(server, completed: int) -> dict[str, list[str]]:
    """Runs in every final and unfinished status; their ids by status."""
    ids: dict[str, list[str]] = {"completed": [], "cancelled": [], "failed": [], "blocked": []}
    for _ in range(completed):
        ids["completed"].append(submit(server, workflow("w", node("a"), node("b", deps=["a"]))))
    drain(server, "work")
    cancelled = submit(server, workflow("w", node("a", action="idle")))
    server.workflows.CancelRun(
        workflow_service_pb2.CancelRunRequest(run_id=cancelled, reason="not needed"),
        metadata=[("cyclone-actor", "ops")],
    )
    ids["cancelled"].append(cancelled)
    ids["failed"].append(submit(server, workflow("w", node("a", action="flaky"))))
    [step] = claim(server, "flaky")
    fail(server, step, "no", non_retryable=True)
    ids["blocked"].append(submit(server, workflow("w", node("a", action="charge"))))
    claim(server, "charge", unsafe=("charge",), lease=5)
    server.advance_clock(6)
    assert server.sweep() == 1
    assert claim(server, "charge", unsafe=("charge",)) == []
    return ids


def test_finished_runs_past_the_age_go_with_their_steps_and_the_rest_stay(server_factory):
    server = server_factory(retention_s=7 * DAY, retention_batch=2)
    old = finished_runs(server, completed=5)
    running = submit(server, workflow("w", node("a", action="idle")))
    server.advance_clock(6 * DAY)
    recent = submit(server, workflow("w", node("a")))
    drain(server, "work")
    assert purge(server) == 0  # nothing is 7 days old yet

    server.advance_clock(1 * DAY + 60)
    assert purge(server) == 6  # 5 completed + 1 cancelled, two per statement
    left = run_statuses(server)
    assert set(left) == {*old["failed"], *old["blocked"], running, recent}
    assert left[running] == "running" and left[recent] == "completed"
    # The cascades took the steps, errors and audit of the deleted runs.
    counts = table_counts(server)
    assert counts == {"runs": 4, "steps": 4, "step_errors": 2, "audit": 0, "submit_keys": 0}

    # Failed runs go only under --retention-failed, and blocked runs never.
    server.advance_clock(365 * DAY)
    assert purge(server) == 1  # the recent completed run, now a year old
    stricter = server_factory(retention_s=None, retention_failed_s=30 * DAY)
    assert purge(stricter) == 1
    assert set(run_statuses(server)) == {*old["blocked"], running}


def test_claims_go_on_while_a_purge_holds_the_runs_it_deletes(server_factory, database_url):
    server = server_factory(retention_s=DAY)
    for _ in range(20):
        submit(server, workflow("w", node("a")))
    drain(server, "work")
    server.advance_clock(2 * DAY)
    fresh = [submit(server, workflow("w", node("a"))) for _ in range(5)]

    with psycopg.connect(database_url) as conn:  # a purge in flight: not committed yet
        deleting = conn.execute("SELECT cyclone.runs_purge(interval '1 day', false, 10)")
        assert deleting.fetchone()[0] == 10
        # Claims and completions of other runs do not wait for it (a wait would end in
        # the claim's deadline, failing the test).
        steps = claim(server, n=10)
        for step in steps:
            complete(server, step)
        assert sorted(s.run_id for s in steps) == sorted(fresh)
        # A second purger (another server) skips the locked runs and takes the others.
        assert purge(server) == 10
        conn.commit()
    assert run_statuses(server) == dict.fromkeys(fresh, "completed")


def test_the_server_purges_on_its_own_while_new_runs_are_claimed(server_factory):
    server = server_factory(retention_s=3600, retention_interval_s=0.05, retention_batch=3)
    old = [submit(server, workflow("w", node("a"))) for _ in range(10)]
    drain(server, "work")
    server.advance_clock(7200)
    new = []

    def old_runs_gone_while_a_new_one_runs() -> bool:
        new.append(submit(server, workflow("w", node("a"))))
        assert drain(server, "work") == ["a"]  # claimed and completed at once
        return not set(old) & set(run_statuses(server))

    eventually(old_runs_gone_while_a_new_one_runs, "retention to delete the old runs")
    assert run_statuses(server) == dict.fromkeys(new, "completed")


@pytest.mark.parametrize(
    ("flag", "seconds"),
    [
        ("7d", 7 * DAY),
        ("12h", 12 * 3600),
        ("90m", 5400),
        ("3600", 3600),
        ("off", None),
        ("0", None),
    ],
)
def test_retention_takes_an_age_or_off(flag, seconds):
    assert parse(["--retention", flag]).retention_s == seconds
    assert parse(["--retention-failed", flag]).retention_failed_s == seconds


def _submit_once(server, key: str) -> workflow_service_pb2.SubmitOnceResponse:
    return server.workflows.SubmitOnce(
        workflow_service_pb2.SubmitOnceRequest(workflow=workflow("pay", node("a")), key=key)
    )


def test_a_submit_once_key_outlives_its_deleted_run_for_the_key_retention(server_factory):
    server = server_factory(retention_s=7 * DAY, key_retention_s=30 * DAY)
    first = _submit_once(server, "order-1")
    drain(server, "work")
    server.advance_clock(8 * DAY)
    assert purge(server) == 1
    assert run_statuses(server) == {}
    # The run is gone; its key still answers with it, and makes no second run.
    again = _submit_once(server, "order-1")
    assert (again.run_id, again.created) == (first.run_id, False)
    assert run_statuses(server) == {}

    server.advance_clock(23 * DAY)  # 31 days after the key was used
    purge(server)
    assert server.sql("SELECT count(*) FROM cyclone.submit_keys")[0][0] == 0
    third = _submit_once(server, "order-1")
    # A new run, under the key's name-based id again (the first run is long gone: a
    # key is forgotten only once its run was deleted; docs/scaling.md).
    assert third.created and third.run_id == first.run_id
    assert run_statuses(server) == {third.run_id: "running"}


def test_a_key_is_never_forgotten_while_its_run_exists(server_factory):
    server = server_factory(retention_s=None, key_retention_s=1 * DAY)
    first = _submit_once(server, "order-1")
    server.advance_clock(2 * DAY)
    purge(server)
    assert _submit_once(server, "order-1").run_id == first.run_id


def test_key_retention_is_a_flag_with_a_default_longer_than_run_retention():
    defaults = parse([])
    assert defaults.key_retention_s is not None and defaults.retention_s is not None
    assert defaults.key_retention_s > defaults.retention_s
    assert parse(["--key-retention", "90d"]).key_retention_s == 90 * DAY
