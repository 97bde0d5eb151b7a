"""Bulk actions through the API, on real servers: cancel, retry and resolve-discard
every run a ListRuns filter matches, as a job the servers work through; dry runs,
refusals, progress and cancelling a job."""

from __future__ import annotations

import grpc
import psycopg
import pytest
from google.protobuf import json_format

from cyclone.v1 import admin_service_pb2 as admin_pb
from cyclone.v1 import admin_service_pb2_grpc, types_pb2
from cyclone.v1 import workflow_service_pb2 as workflow_pb
from tests import test_step_calls as step_calls
from tests.helpers import (
    claim,
    eventually,
    fail,
    get_run,
    node,
    rpc_error,
    run_status,
    submit,
    workflow,
)
from tests.test_blocked import blocked_run
from tests.test_processes import stubs

CANCEL = admin_pb.BULK_ACTION_KIND_CANCEL
RETRY = admin_pb.BULK_ACTION_KIND_RETRY
RESOLVE_DISCARD = admin_pb.BULK_ACTION_KIND_RESOLVE_DISCARD
DONE = admin_pb.BULK_ACTION_STATE_DONE


def start(server, action, actor="dora", **request):
    return server.admin.StartBulkAction(
        admin_pb.StartBulkActionRequest(action=action, **request),
        metadata=[("cyclone-actor", actor)],
    )


def finished(server, job_id):
    """The job once it is no longer running."""

    def check():
        job = server.admin.GetBulkAction(admin_pb.GetBulkActionRequest(job_id=job_id)).job
        return job if job.state != admin_pb.BULK_ACTION_STATE_RUNNING else None

    return eventually(check, f"bulk action {job_id} to end")


def audit_of(server, run_id):
    return [
        (a.action, a.actor, a.reason, json_format.MessageToDict(a.details))
        for a in get_run(server, run_id).audit
    ]


def failed_run(server, name):
    run_id = submit(server, workflow(name, node("a", action=name, max_attempts=1)))
    [step] = claim(server, name)
    fail(server, step, non_retryable=True)
    return run_id


def test_bulk_cancel_by_workflow_cancels_exactly_the_matching_running_runs(cyclone_server):
    billing = [submit(cyclone_server, workflow("billing", node("a"))) for _ in range(7)]
    other = [submit(cyclone_server, workflow("shipping", node("a"))) for _ in range(3)]
    done = start(
        cyclone_server,
        CANCEL,
        filter=workflow_pb.ListRunsRequest(
            workflow="billing", statuses=[types_pb2.RUN_STATUS_RUNNING]
        ),
        reason="bad deploy",
    )
    assert (done.matched, done.matched_at_least) == (7, False)
    job = finished(cyclone_server, done.job.job_id)
    assert job.state == DONE
    assert (job.touched, job.skipped, job.failed, job.total) == (7, 0, 0, 7)
    assert job.actor == "dora" and job.filter.workflow == "billing"
    for run_id in billing:
        assert run_status(get_run(cyclone_server, run_id)) == "cancelled"
        [entry] = audit_of(cyclone_server, run_id)
        assert entry[:3] == ("cancel", "dora", "bad deploy")
        assert entry[3]["bulk_action"] == job.job_id
    for run_id in other:
        run = get_run(cyclone_server, run_id)
        assert run_status(run) == "running" and not run.audit
    listed = cyclone_server.admin.ListBulkActions(admin_pb.ListBulkActionsRequest()).jobs
    assert [j.job_id for j in listed] == [job.job_id]


def test_bulk_retry_reopens_the_failed_runs(cyclone_server):
    failed = [failed_run(cyclone_server, "etl") for _ in range(3)]
    running = submit(cyclone_server, workflow("etl", node("b", action="other")))
    reply = start(cyclone_server, RETRY, filter=workflow_pb.ListRunsRequest(workflow="etl"))
    assert reply.matched == 3
    job = finished(cyclone_server, reply.job.job_id)
    assert (job.state, job.touched, job.skipped, job.failed) == (DONE, 3, 0, 0)
    for run_id in failed:
        assert run_status(get_run(cyclone_server, run_id)) == "running"
        [entry] = audit_of(cyclone_server, run_id)
        assert entry[0] == "retry_all" and entry[3]["bulk_action"] == job.job_id
    assert not get_run(cyclone_server, running).audit
    assert len(claim(cyclone_server, "etl")) == 3  # the failed nodes run again


def test_bulk_resolve_discard_releases_the_blocked_runs(cyclone_server):
    run_id, _ = blocked_run(cyclone_server)  # blocked on its node "charge"
    on_call, _ = step_calls._blocked(cyclone_server)  # blocked on a step call
    running = submit(cyclone_server, workflow("order", node("other")))
    reply = start(
        cyclone_server,
        RESOLVE_DISCARD,
        filter=workflow_pb.ListRunsRequest(statuses=[types_pb2.RUN_STATUS_BLOCKED]),
    )
    assert reply.matched == 2
    job = finished(cyclone_server, reply.job.job_id)
    assert (job.touched, job.skipped, job.failed) == (2, 0, 0)
    for blocked in (run_id, on_call):
        run = get_run(cyclone_server, blocked)
        assert run_status(run) == "running"
        assert [(a.action, a.details.struct_value["bulk_action"]) for a in run.audit] == [
            ("resolve_discard", job.job_id)
        ]
    assert get_run(cyclone_server, on_call).audit[0].details.struct_value["step_id"] == "charge"
    assert not get_run(cyclone_server, running).audit


def test_dry_run_counts_and_writes_nothing(cyclone_server):
    runs = [submit(cyclone_server, workflow("billing", node("a"))) for _ in range(4)]
    failed_run(cyclone_server, "billing")
    reply = start(
        cyclone_server, CANCEL, filter=workflow_pb.ListRunsRequest(workflow="billing"), dry_run=True
    )
    assert (reply.matched, reply.HasField("job")) == (5, False)
    retry = start(
        cyclone_server, RETRY, filter=workflow_pb.ListRunsRequest(workflow="billing"), dry_run=True
    )
    assert retry.matched == 1
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.bulk_actions") == [(0,)]
    assert all(run_status(get_run(cyclone_server, r)) == "running" for r in runs)


def test_match_everything_needs_confirm_all(cyclone_server):
    runs = [submit(cyclone_server, workflow(f"w{i}", node("a"))) for i in range(3)]
    error = rpc_error(start, cyclone_server, CANCEL, reason="all")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "confirm_all" in error.details()
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.bulk_actions") == [(0,)]
    reply = start(cyclone_server, CANCEL, confirm_all=True)
    job = finished(cyclone_server, reply.job.job_id)
    assert job.touched == 3
    assert all(run_status(get_run(cyclone_server, r)) == "cancelled" for r in runs)


def test_bad_requests_are_refused(cyclone_server):
    def refused(action, **request):
        error = rpc_error(start, cyclone_server, action, **request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        return error.details()

    assert "action is required" in refused(admin_pb.BULK_ACTION_KIND_UNSPECIFIED)
    assert "run_id_prefix" in refused(
        CANCEL, filter=workflow_pb.ListRunsRequest(run_id_prefix="xyz")
    )
    assert "page_size" in refused(CANCEL, filter=workflow_pb.ListRunsRequest(page_size=5))
    assert "applies only" in refused(
        RETRY, filter=workflow_pb.ListRunsRequest(statuses=[types_pb2.RUN_STATUS_COMPLETED])
    )
    assert "unknown run status" in refused(
        CANCEL, filter=workflow_pb.ListRunsRequest(statuses=[42])
    )
    assert "reason" in refused(
        CANCEL, filter=workflow_pb.ListRunsRequest(workflow="x"), reason="r" * 3000
    )
    # What ListRuns refuses, a bulk action refuses alike.
    for hostile in (
        workflow_pb.ListRunsRequest(workflow="bad\x00name"),
        workflow_pb.ListRunsRequest(key_prefix="k" * 100_000),
        workflow_pb.ListRunsRequest(workflow_prefix="w" * 100_000),
        workflow_pb.ListRunsRequest(key="k\x00"),
    ):
        listed = rpc_error(cyclone_server.workflows.ListRuns, hostile)
        assert listed.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused(CANCEL, filter=hostile) == listed.details()
    missing = "0190a1b2-0000-7000-8000-000000000000"
    for call in (cyclone_server.admin.GetBulkAction, cyclone_server.admin.CancelBulkAction):
        request_type = (
            admin_pb.GetBulkActionRequest
            if call == cyclone_server.admin.GetBulkAction
            else admin_pb.CancelBulkActionRequest
        )
        assert rpc_error(call, request_type(job_id=missing)).code() == grpc.StatusCode.NOT_FOUND
        assert rpc_error(call, request_type(job_id="nope")).code() == (
            grpc.StatusCode.INVALID_ARGUMENT
        )
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.bulk_actions") == [(0,)]


def test_cancelling_a_job_stops_it_and_keeps_what_it_did(server_factory):
    server = server_factory(bulk_rate=2)
    runs = [submit(server, workflow("billing", node("a"))) for _ in range(30)]
    reply = start(server, CANCEL, filter=workflow_pb.ListRunsRequest(workflow="billing"))
    job_id = reply.job.job_id

    def touched():
        job = server.admin.GetBulkAction(admin_pb.GetBulkActionRequest(job_id=job_id)).job
        return job.touched > 0

    eventually(touched, "the first batch")
    stopped = server.admin.CancelBulkAction(
        admin_pb.CancelBulkActionRequest(job_id=job_id), metadata=[("cyclone-actor", "erin")]
    ).job
    assert stopped.state == admin_pb.BULK_ACTION_STATE_CANCELLED
    assert stopped.cancelled_by == "erin"
    again = rpc_error(
        server.admin.CancelBulkAction, admin_pb.CancelBulkActionRequest(job_id=job_id)
    )
    assert again.code() == grpc.StatusCode.FAILED_PRECONDITION
    # Once cancelled, no batch moves it: what it did is what it reports.
    server.stop()
    after = server_factory().admin.GetBulkAction(admin_pb.GetBulkActionRequest(job_id=job_id)).job
    cancelled = [
        r
        for r in runs
        if server.sql("SELECT status FROM cyclone.runs WHERE run_id = %s", r)[0][0] == "cancelled"
    ]
    assert after.touched == stopped.touched == len(cancelled)
    assert 0 < len(cancelled) < len(runs)


@pytest.mark.slow
def test_a_job_whose_server_is_killed_resumes_elsewhere_and_takes_each_run_once(
    server_process, database_url
):
    flags = ("--bulk-rate", "4", "--bulk-lease", "2", "--sweep-interval", "0.2")
    first = server_process(*flags)
    client = stubs(first.address)
    client.admin = admin_service_pb2_grpc.AdminServiceStub(client.channel)
    runs = [submit(client, workflow("billing", node("a"))) for _ in range(24)]
    job_id = start(
        client, CANCEL, filter=workflow_pb.ListRunsRequest(workflow="billing")
    ).job.job_id

    def progress():
        with psycopg.connect(database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT touched FROM cyclone.bulk_actions WHERE job_id = %s", (job_id,)
            ).fetchone()
        assert row is not None
        return row[0]

    eventually(lambda: progress() >= 4, "a first batch")
    first.process.kill()
    first.process.wait()
    assert progress() < len(runs)
    # A server started later (with another lease holder's name) takes the job over
    # once the dead one's lease lapses, from its cursor.
    second = stubs(server_process(*flags).address)
    second.admin = admin_service_pb2_grpc.AdminServiceStub(second.channel)
    job = finished(second, job_id)
    assert (job.state, job.touched, job.skipped, job.failed) == (DONE, len(runs), 0, 0)
    for run_id in runs:
        entries = [
            (a.action, a.details.struct_value["bulk_action"]) for a in get_run(second, run_id).audit
        ]
        assert entries == [("cancel", job_id)]
