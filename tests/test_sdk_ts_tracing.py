"""The TypeScript SDK's step spans (docs/tracing.md): a worker with a tracer provider
registered runs a traced run's step in a span that is a child of the run's trace
context, with the handler's own spans under it, and a failed step's span says so."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cyclone.v1 import workflow_service_pb2 as wf_pb
from pyclient import RetryPolicy, Workflow
from tests import test_polyglot as polyglot
from tests.helpers import PATIENCE, eventually, value
from tests.test_polyglot import ROOT, Process, _tool

pytestmark = [pytest.mark.slow, pytest.mark.polyglot, pytest.mark.timeout(600)]

# The fixtures of the polyglot tests, shared.
start_process = polyglot.start_process
ts_sdk = polyglot.ts_sdk
operator = polyglot.operator

#: The trace a client's Submit continues: the run's steps are in it.
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def cyclone_server(server_factory: Any) -> Any:
    """A server with tracing on, so that each run keeps its traceparent."""
    return server_factory(tracing="console")


@pytest.fixture
def traced_worker(cyclone_server, start_process, ts_sdk) -> Process:
    worker = ROOT / "tests" / "ts_traced_worker.mjs"
    return start_process("ts-traced-worker", _tool("node"), worker, cyclone_server.address)


def _spans(worker: Process) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in worker.log.splitlines() if line.startswith("span ")]


def _submit(server: Any, wf: Workflow, run_input: Any) -> str:
    request = wf_pb.SubmitRequest(workflow=wf.to_proto())
    request.input.CopyFrom(value(run_input))
    return server.workflows.Submit(request, metadata=(("traceparent", PARENT),)).run_id


def test_a_ts_step_runs_in_a_span_of_its_runs_trace(cyclone_server, traced_worker, operator):
    wf = Workflow("traced_shop")
    wf.node("charge", action="ts.charge")
    run_id = _submit(cyclone_server, wf, {"amount": 42})
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", traced_worker.log
    [(stored,)] = cyclone_server.sql(
        "SELECT traceparent FROM cyclone.runs WHERE run_id = %s", run_id
    )
    submit_span = stored.split("-")[2]
    eventually(lambda: len(_spans(traced_worker)) >= 2, "the worker's spans", PATIENCE)
    inner, step = _spans(traced_worker)[:2]
    assert step["name"] == "step charge" and step["trace_id"] == TRACE
    assert step["parent_span_id"] == submit_span
    assert step["kind"] == 4  # CONSUMER
    assert step["status"] == 1  # OK
    assert step["attributes"] == {
        "cyclone.run_id": run_id,
        "cyclone.node": "charge",
        "cyclone.workflow": "traced_shop",
        "cyclone.action": "ts.charge",
        "cyclone.attempt": 1,
        "cyclone.worker_id": step["attributes"]["cyclone.worker_id"],
        "cyclone.outcome": "completed",
    }
    assert step["attributes"]["cyclone.worker_id"]
    assert inner["name"] == "charge card" and inner["trace_id"] == TRACE
    assert inner["parent_span_id"] == step["span_id"]
    traced_worker.stop()


def test_a_failed_ts_steps_span_has_the_error(cyclone_server, traced_worker, operator):
    wf = Workflow("traced_decline")
    wf.node("pay", action="ts.decline", retry=RetryPolicy(max_attempts=1))
    run_id = _submit(cyclone_server, wf, {"amount": 1})
    assert operator.wait(run_id, timeout=PATIENCE).status == "failed", traced_worker.log
    eventually(lambda: _spans(traced_worker), "the worker's span", PATIENCE)
    [step] = _spans(traced_worker)
    assert step["name"] == "step pay" and step["trace_id"] == TRACE
    assert step["status"] == 2  # ERROR
    assert step["events"] == ["exception"]
    assert step["attributes"]["cyclone.outcome"] == "failed"
    traced_worker.stop()
