"""The Prometheus endpoint: counters move with the work, histograms time it, gauges
read the database's state at a scrape."""

from __future__ import annotations

import re
import socket
import urllib.request
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.metrics import parse_listen
from tests.conftest import ROOT
from tests.helpers import claim, complete, eventually, fail, node, rpc_error, submit, workflow


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def metered(server_factory):
    server = server_factory(metrics_listen="127.0.0.1:0")
    server.server.metrics.gauge_max_age_s = 0  # every scrape reads the database
    return server


def test_counters_and_histograms_follow_the_work(metered):
    runs = [submit(metered, workflow("order", node("a"), node("b", deps=["a"]))) for _ in range(4)]
    metered.advance_clock(60)  # the steps have been ready a minute when claimed
    steps = claim(metered, n=10)
    assert len(steps) == 4
    complete(metered, steps[0])
    complete(metered, steps[0])  # a repeat is not counted again
    fail(metered, steps[1], "flaky", retry_after=30)
    fail(metered, steps[2], "broken", non_retryable=True)
    # steps[3] is abandoned: its lease expires and this server's sweep reclaims it.
    metered.advance_clock(600)
    assert metered.call(metered.server.sweep) == 1
    stale = rpc_error(complete, metered, steps[3])
    assert stale.code() == grpc.StatusCode.ABORTED

    def scraped() -> Any:
        # An aborted call is counted once its status has gone out: it may reach the
        # client first.
        samples = scrape(metered.server.metrics_port)
        done = (
            value(samples, "cyclone_rpc_duration_seconds_count", method="WorkerService/Complete")
            == 5
        )
        return samples if done else None

    m = eventually(scraped, "the five Completes counted")
    assert value(m, "cyclone_runs_submitted_total", workflow="order") == 4
    assert value(m, "cyclone_steps_claimed_total", action="work") == 4
    assert value(m, "cyclone_steps_completed_total") == 1
    assert value(m, "cyclone_steps_failed_total", outcome="retry") == 1
    assert value(m, "cyclone_steps_failed_total", outcome="discarded") == 1
    assert value(m, "cyclone_steps_discarded_total", cause="handler") == 1
    assert value(m, "cyclone_lease_expiries_total", action="work") == 1
    assert value(m, "cyclone_completions_refused_total") == 1
    assert value(m, "cyclone_runs_finished_total", status="failed") == 1
    # Claim wait: each step had waited about 60s, on the database's clock.
    assert value(m, "cyclone_claim_wait_seconds_count", action="work") == 4
    assert value(m, "cyclone_claim_wait_seconds_bucket", action="work", le="30.0") == 0
    assert value(m, "cyclone_claim_wait_seconds_bucket", action="work", le="60.0") == 0
    assert value(m, "cyclone_claim_wait_seconds_bucket", action="work", le="300.0") == 4
    # Step duration: timed for the outcomes this server handed out.
    assert value(m, "cyclone_step_duration_seconds_count", action="work", outcome="completed") == 1
    assert value(m, "cyclone_step_duration_seconds_count", action="work", outcome="failed") == 2
    # RPCs by method and code, and their latency by method.
    assert value(m, "cyclone_rpcs_total", method="WorkflowService/Submit", code="OK") == 4
    assert value(m, "cyclone_rpcs_total", method="WorkerService/Complete", code="OK") == 4
    assert value(m, "cyclone_rpcs_total", method="WorkerService/Complete", code="ABORTED") == 1
    assert value(m, "cyclone_rpc_duration_seconds_count", method="WorkerService/Complete") == 5
    assert value(m, "cyclone_db_pool_size") == 4
    assert value(m, "cyclone_db_pool_wait_seconds_count") > 0
    # Gauges from the database: the discarded run failed, three are running.
    assert value(m, "cyclone_runs", status="failed") == 1
    assert value(m, "cyclone_runs", status="running") == 3
    assert value(m, "cyclone_runs", status="blocked") == 0
    assert value(m, "cyclone_database_up") == 1
    assert len(runs) == 4


def test_gauges_show_ready_backlog_expired_leases_and_blocked_runs(metered):
    port = metered.server.metrics_port
    for _ in range(3):
        submit(metered, workflow("w", node("a", action="charge")))
    metered.advance_clock(45)
    m = scrape(port)
    assert value(m, "cyclone_steps_ready", action="charge") == 3
    assert value(m, "cyclone_steps_ready_oldest_seconds", action="charge") >= 45
    held = claim(metered, "charge", n=2, unsafe=("charge",), lease=5)
    metered.advance_clock(6)
    m = scrape(port)
    assert value(m, "cyclone_steps_ready", action="charge") == 1
    assert value(m, "cyclone_steps_running", action="charge") == 2
    assert value(m, "cyclone_steps_lease_expired", action="charge") == 2  # not swept yet
    assert metered.call(metered.server.sweep) == 2
    assert claim(metered, "charge", n=10, unsafe=("charge",)) != []  # blocks two, takes one
    m = scrape(port)
    assert value(m, "cyclone_runs", status="blocked") == 2
    assert value(m, "cyclone_runs_blocked_total", action="charge") == 2
    assert value(m, "cyclone_steps_lease_expired", action="charge") == 0
    assert len(held) == 2


def test_database_gauges_are_reused_between_close_scrapes(metered):
    port = metered.server.metrics_port
    metered.server.metrics.gauge_max_age_s = 3600
    assert value(scrape(port), "cyclone_runs", status="running") == 0
    submit(metered, workflow("w", node("a")))
    assert value(scrape(port), "cyclone_runs", status="running") == 0  # read before
    metered.server.metrics.gauge_max_age_s = 0
    assert value(scrape(port), "cyclone_runs", status="running") == 1


def test_a_busy_metrics_port_leaves_the_server_serving_without_metrics(server_factory):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = server_factory(metrics_listen=f"127.0.0.1:{port}")
        assert server.server.metrics_port is None
        submit(server, workflow("w", node("a")))  # still serving
    assert server_factory(metrics_listen="off").server.metrics_port is None


def test_metrics_listen_takes_host_port_or_off():
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    assert parse_listen(":9464") == ("0.0.0.0", 9464)
    assert parse_listen("off") is None
    with pytest.raises(ValueError):
        parse_listen("9464x")


def test_docs_list_every_metric_the_server_exposes(metered):
    submit(metered, workflow("w", node("a")))
    [step] = claim(metered)
    complete(metered, step)
    with urllib.request.urlopen(
        f"http://127.0.0.1:{metered.server.metrics_port}/metrics", timeout=10
    ) as reply:
        exposed = {
            family.name
            for family in text_string_to_metric_families(reply.read().decode())
            if family.name.startswith("cyclone_")
        }
    page = (ROOT / "docs" / "metrics.md").read_text()
    documented = {name.removesuffix("_total") for name in re.findall(r"`(cyclone_\w+)`", page)}
    assert exposed == documented


#: Exported but left off the dashboard, each for a reason.
NOT_ON_THE_DASHBOARD: set[str] = set()


def _exported_names(port: int) -> dict[str, set[str]]:
    """The metric families the server exports, by their names in the exposition (e.g.
    cyclone_rpcs_total), each with the sample names a query may use for it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    kinds = dict(re.findall(r"^# TYPE (cyclone_\w+) (\w+)$", text, re.M))
    return {
        name: {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        if kind == "histogram"
        else {name}
        for name, kind in kinds.items()
    }


def test_the_grafana_dashboard_queries_only_metrics_the_server_exports(metered):
    """docs/grafana/cyclone.json: every query names exported metrics, every exported
    metric is on it (or listed as left off), and its panels are well formed."""
    import json

    dashboard = json.loads((ROOT / "docs" / "grafana" / "cyclone.json").read_text())
    families = _exported_names(metered.server.metrics_port)
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    used: set[str] = set()
    for p in panels:
        assert p["title"] and p["description"] and p["targets"], p["title"]
        for target in p["targets"]:
            used |= set(re.findall(r"\bcyclone_\w+", target["expr"]))
    exported = set().union(*families.values())
    assert used - exported == set(), "queries name metrics the server does not export"
    missing = {f for f, names in families.items() if not names & used}
    assert missing == NOT_ON_THE_DASHBOARD, "exported metrics missing from the dashboard"


def test_bulk_actions_count_the_runs_they_work_and_how_they_end(metered):
    from cyclone.v1 import admin_service_pb2 as admin_pb
    from cyclone.v1 import workflow_service_pb2 as workflow_pb

    for _ in range(5):
        submit(metered, workflow("billing", node("a")))
    started = metered.admin.StartBulkAction(
        admin_pb.StartBulkActionRequest(
            action=admin_pb.BULK_ACTION_KIND_CANCEL,
            filter=workflow_pb.ListRunsRequest(workflow="billing"),
            reason="bad deploy",
        )
    )

    def counted() -> Any:
        samples = scrape(metered.server.metrics_port)
        ended = value(samples, "cyclone_bulk_actions_finished_total", state="done") == 1
        return samples if ended else None

    m = eventually(counted, f"bulk action {started.job.job_id} counted as done")
    assert value(m, "cyclone_bulk_runs_total", action="cancel", outcome="touched") == 5
    assert value(m, "cyclone_bulk_runs_total", action="cancel", outcome="skipped") == 0
