"""grpcurl against a live server: reflection, describe, and a 3-node workflow worked
entirely through JSON calls, as an operator or a polyglot client would."""

from __future__ import annotations

import json
import subprocess

import pytest


@pytest.fixture
def call(grpcurl, cyclone_server):
    def run(method: str, body: dict | None = None, *args: str) -> dict:
        cmd = [grpcurl, "-plaintext", *args]
        if body is not None:
            cmd += ["-d", json.dumps(body)]
        cmd += [cyclone_server.address, method]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout) if out.stdout.strip().startswith("{") else out.stdout

    return run


def test_reflection_lists_every_service_and_rpc(call):
    services = call("list")
    for service in (
        "cyclone.v1.WorkflowService",
        "cyclone.v1.WorkerService",
        "cyclone.v1.AdminService",
        "grpc.health.v1.Health",
    ):
        assert service in services


@pytest.mark.parametrize(
    ("service", "rpcs", "comment"),
    [
        (
            "cyclone.v1.WorkflowService",
            ["Submit", "SubmitOnce", "GetRun", "ListRuns", "CancelRun"],
            "// Submit with a key: at most one run per (workflow name, key)",
        ),
        (
            "cyclone.v1.WorkerService",
            ["Claim", "Heartbeat", "Complete"],
            "// Reports the outcome of a held step.",
        ),
        (
            "cyclone.v1.AdminService",
            ["Retry", "RetryAll", "Resolve"],
            "// Reopens one discarded node in place",
        ),
    ],
)
def test_describe_shows_each_rpc_with_its_comment(grpcurl, cyclone_server, service, rpcs, comment):
    out = subprocess.run(
        [grpcurl, "-plaintext", cyclone_server.address, "describe", service],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for rpc in rpcs:
        assert f"rpc {rpc} (" in out
    assert comment in out  # the proto comments travel with reflection


def test_health_check_says_serving(call):
    assert call("grpc.health.v1.Health/Check", {})["status"] == "SERVING"


def test_a_three_node_workflow_worked_entirely_through_grpcurl(call):
    submitted = call(
        "cyclone.v1.WorkflowService/Submit",
        {
            "workflow": {
                "name": "greet",
                "nodes": [
                    {"name": "fetch", "action": "fetch", "input": {"url": "https://example.com"}},
                    {"name": "render", "action": "render", "depends_on": ["fetch"]},
                    {
                        "name": "send",
                        "action": "send",
                        "depends_on": ["render"],
                        "retry": {"max_attempts": 5},
                        "timeout": "30s",
                    },
                ],
            },
            "input": {"to": "ops@example.com"},
        },
    )
    run_id = submitted["runId"]  # replies use proto3 JSON names
    for expected in ("fetch", "render", "send"):
        claimed = call(
            "cyclone.v1.WorkerService/Claim",
            {
                "worker_id": "grpcurl",
                "actions": [{"name": "fetch"}, {"name": "render"}, {"name": "send"}],
                "max_steps": 5,
                "wait": "5s",
            },
        )
        [step] = claimed["steps"]
        assert (step["runId"], step["node"], step["attempt"]) == (run_id, expected, 1)
        beat = call(
            "cyclone.v1.WorkerService/Heartbeat",
            {"run_id": run_id, "node": expected, "lease_token": step["leaseToken"]},
        )
        assert "leaseExpiresAt" in beat
        done = call(
            "cyclone.v1.WorkerService/Complete",
            {
                "run_id": run_id,
                "node": expected,
                "lease_token": step["leaseToken"],
                "output": {"did": expected},
            },
        )
        assert done["status"] == "STEP_STATUS_COMPLETED"
    run = call("cyclone.v1.WorkflowService/GetRun", {"run_id": run_id})["run"]
    assert run["status"] == "RUN_STATUS_COMPLETED"
    assert [s["output"] for s in run["steps"]] == [
        {"did": "fetch"},
        {"did": "render"},
        {"did": "send"},
    ]
    listed = call(
        "cyclone.v1.WorkflowService/ListRuns",
        {"workflow": "greet", "statuses": ["RUN_STATUS_COMPLETED"]},
    )
    assert [r["runId"] for r in listed["runs"]] == [run_id]


def test_grpcurl_sees_a_clear_error_for_bad_input(grpcurl, cyclone_server):
    out = subprocess.run(
        [
            grpcurl,
            "-plaintext",
            "-d",
            json.dumps(
                {
                    "workflow": {
                        "name": "w",
                        "nodes": [{"name": "a", "action": "x", "depends_on": ["b"]}],
                    }
                }
            ),
            cyclone_server.address,
            "cyclone.v1.WorkflowService/Submit",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "InvalidArgument" in out.stderr
    assert "node 'a' depends on unknown node 'b'" in out.stderr


def test_grpcurl_describes_a_single_method_with_its_comment(grpcurl, cyclone_server):
    out = subprocess.run(
        [
            grpcurl,
            "-plaintext",
            cyclone_server.address,
            "describe",
            "cyclone.v1.WorkerService.Complete",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "rpc Complete ( .cyclone.v1.CompleteRequest )" in out
    assert "// Reports the outcome of a held step." in out
