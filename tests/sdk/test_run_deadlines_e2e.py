"""Run deadlines through the Python SDK and the command line, on real servers: a
handler told through its cancel signal at its run's deadline and reading
ctx.run_deadline, submit(deadline=...), the default deadlines of workflows, and the
`cyclone submit --deadline` and `cyclone workflow-deadline` commands."""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client, InvalidArgument, NotFound, RunStatus, Worker, Workflow, cli
from tests.helpers import PATIENCE
from tests.sdk.conftest import running


def _worker(server: Any) -> Worker:
    return Worker(server.address, concurrency=2, lease=3.0, claim_wait=2.0, shutdown_grace=5.0)


def test_a_handler_is_told_at_its_runs_deadline(server_factory: Any) -> None:
    server = server_factory(deadline_interval_s=0.2)
    worker = _worker(server)
    started, told = threading.Event(), threading.Event()

    @worker.action("slow")
    def slow(ctx: Any) -> str:
        started.set()
        if ctx.cancelled.wait(PATIENCE):  # only the deadline's cancel ends it
            told.set()
        return "too late"

    wf = Workflow("w")
    wf.node("slow")
    with Client(server.address) as client, running(worker):
        run_id = client.submit(wf, deadline=dt.timedelta(seconds=2))
        assert started.wait(PATIENCE)
        assert told.wait(PATIENCE), "the handler was not told of the deadline's cancel"
        run = client.get_run(run_id)
    assert run.status == RunStatus.CANCELLED
    [entry] = [a for a in run.audit if a.action == "cancel"]
    assert entry.actor == "cyclone" and entry.reason.startswith("deadline exceeded at ")


def test_a_handler_reads_its_runs_deadline(client: Client, make_worker: Any) -> None:
    worker = make_worker()
    seen: list[Any] = []

    @worker.action("read")
    def read(ctx: Any) -> None:
        seen.append(ctx.run_deadline)

    wf = Workflow("w")
    wf.node("read")
    with running(worker):
        run = client.wait(client.submit(wf, deadline=dt.timedelta(hours=1)), timeout=PATIENCE)
    assert run.status == RunStatus.COMPLETED
    assert run.deadline is not None and seen == [run.deadline]


def test_ctx_run_deadline_is_none_for_a_run_without_one(client: Client, make_worker: Any) -> None:
    worker = make_worker()
    seen: list[Any] = []

    @worker.action("quick")
    def quick(ctx: Any) -> None:
        seen.append(ctx.run_deadline)

    wf = Workflow("w")
    wf.node("quick")
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    assert run.status == RunStatus.COMPLETED and seen == [None] and run.deadline is None


def test_submit_takes_a_deadline_as_a_time_or_a_delay(client: Client) -> None:
    wf = Workflow("w")
    wf.node("a")
    at = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(minutes=30)
    assert client.get_run(client.submit(wf, deadline=at)).deadline == at
    once = client.submit_once(wf, "k", deadline=at + dt.timedelta(minutes=1))
    assert client.get_run(once.run_id).deadline == at + dt.timedelta(minutes=1)
    run = client.get_run(client.submit(wf, deadline=dt.timedelta(hours=1)))
    assert run.deadline is not None
    assert dt.timedelta(minutes=59) < run.deadline - run.created_at <= dt.timedelta(hours=1)
    [listed] = [r for r in client.list_runs().runs if r.run_id == run.run_id]
    assert listed.deadline == run.deadline
    with pytest.raises(InvalidArgument, match="aware datetime"):
        client.submit(wf, deadline=dt.datetime(2030, 1, 1))  # no time zone
    with pytest.raises(InvalidArgument, match="not in the future"):
        client.submit(wf, deadline=dt.timedelta(seconds=-1))


def test_client_sets_lists_and_clears_default_deadlines(client: Client) -> None:
    got = client.set_workflow_deadline("w", dt.timedelta(minutes=15), reason="fast")
    assert (got.workflow, got.deadline, got.reason) == ("w", dt.timedelta(minutes=15), "fast")
    assert got.set_by == "sdk-tests" and got.set_at is not None
    client.set_workflow_deadline("v", 90)
    listed = client.list_workflow_deadlines()
    assert [(d.workflow, d.deadline.total_seconds()) for d in listed] == [("v", 90), ("w", 900)]
    wf = Workflow("w")
    wf.node("a")
    run = client.get_run(client.submit(wf))
    assert run.deadline is not None and run.deadline - run.created_at == dt.timedelta(minutes=15)
    assert client.clear_workflow_deadline("w").deadline == dt.timedelta(minutes=15)
    with pytest.raises(NotFound):
        client.clear_workflow_deadline("w")
    with pytest.raises(InvalidArgument, match="above zero"):
        client.set_workflow_deadline("w", 0)


def _cli(capsys: Any, server: Any, *argv: str) -> tuple[int, str, str]:
    code = cli.main([*argv, "--address", server.address])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_submits_with_a_deadline_and_shows_it(
    capsys: Any, cyclone_server: Any, client: Client, tmp_path: Path
) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text("name: order\nnodes:\n  - name: charge\n")
    code, out, _ = _cli(capsys, cyclone_server, "submit", str(path), "--deadline", "10m")
    assert code == 0
    run = client.get_run(out.strip())
    assert run.deadline is not None
    assert dt.timedelta(minutes=9) < run.deadline - run.created_at <= dt.timedelta(minutes=10)
    code, out, _ = _cli(capsys, cyclone_server, "run", "show", run.run_id)
    assert code == 0 and " deadline " in out
    when = "2099-01-01T00:00:00Z"
    code, _, err = _cli(capsys, cyclone_server, "submit", str(path), "--deadline", when)
    assert code == 1 and "366 days" in err


def test_the_cli_sets_lists_and_clears_a_workflow_deadline(
    capsys: Any, cyclone_server: Any
) -> None:
    code, out, _ = _cli(
        capsys, cyclone_server, "workflow-deadline", "set", "order", "1h", "--reason", "sla"
    )
    assert code == 0 and out.strip() == "workflow order: default deadline 1h"
    code, out, _ = _cli(capsys, cyclone_server, "workflow-deadline", "list")
    assert code == 0 and out.startswith("order  1h  set by ") and "reason: sla" in out
    code, out, _ = _cli(capsys, cyclone_server, "workflow-deadline", "list", "--json")
    [row] = json.loads(out)
    assert (row["workflow"], row["deadline"], row["reason"]) == ("order", 3600, "sla")
    code, out, _ = _cli(capsys, cyclone_server, "workflow-deadline", "clear", "order")
    assert code == 0 and "cleared" in out
    code, _, err = _cli(capsys, cyclone_server, "workflow-deadline", "clear", "order")
    assert code == 1 and "no default deadline" in err
    with pytest.raises(SystemExit) as usage:
        cli.main(["workflow-deadline", "set", "order", "soon"])
    assert usage.value.code == 2 and "duration" in capsys.readouterr().err
