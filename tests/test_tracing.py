"""OpenTelemetry tracing (docs/tracing.md): one trace from a client's Submit through the
server to each step a worker runs; nothing at all with tracing off; hostile trace
context ignored.

The client and the worker use the process's global tracer provider, the server its own
(``--tracing``): each gets an in-memory exporter here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from cyclone.v1 import worker_service_pb2
from cyclone.v1 import workflow_service_pb2 as wf_pb
from cyclone.v1 import workflow_service_pb2_grpc as wf_pb_grpc
from pyclient import Client, NonRetryableError, Worker, Workflow
from service import config, tracing
from tests.helpers import PATIENCE, claim, eventually
from tests.sdk.conftest import running

#: Where test_a_trace_spans_client_server_and_worker writes the spans it saw, as JSON
#: lines, when set (tests/trace_picture.py draws docs/tracing-trace.svg from them).
SPANS_OUT = os.environ.get("CYCLONE_TRACE_SPANS_OUT")


@pytest.fixture(scope="module")
def sdk_spans() -> Iterator[InMemorySpanExporter]:
    """The spans of this process's clients and workers (the global tracer provider)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


@pytest.fixture
def traced_server(server_factory: Any) -> Iterator[tuple[Any, InMemorySpanExporter]]:
    server = server_factory(tracing="console")
    exporter = InMemorySpanExporter()
    server.server.tracing.provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield server, exporter


def _worker(address: str) -> Worker:
    return Worker(address, concurrency=2, lease=3.0, claim_wait=2.0, shutdown_grace=5.0)


def _stored_traceparent(server: Any, run_id: str) -> str | None:
    return server.sql("SELECT traceparent FROM cyclone.runs WHERE run_id = %s", run_id)[0][0]


def _hex(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _named(spans: Any, name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {[s.name for s in spans]}"
    return found[0]


def test_a_trace_spans_client_server_and_worker(traced_server, sdk_spans) -> None:
    server, server_spans = traced_server
    sdk_spans.clear()
    worker = _worker(server.address)

    tracer = trace.get_tracer("tests")

    # The step's span is current in its handler, sync or async: the handler's own spans
    # are its children.
    @worker.action("charge")
    def charge(ctx, amount: int) -> dict[str, int]:
        with tracer.start_as_current_span("charge card"):
            return {"charged": amount}

    @worker.action("notify")
    async def notify(ctx) -> None:
        with tracer.start_as_current_span("send mail"):
            raise NonRetryableError("the mail server said no")

    wf = Workflow("traced")
    wf.node("charge")
    wf.node("notify", depends_on="charge")
    with running(worker), Client(server.address) as client:
        with tracer.start_as_current_span("checkout") as root:
            run_id = client.submit(wf, 42)
        run = client.wait(run_id, timeout=PATIENCE)
    assert run.status == "failed"
    server.server.tracing.provider.force_flush()
    trace_id = root.get_span_context().trace_id
    root_id = root.get_span_context().span_id

    # The server's Submit span continues the client's span; the run keeps its context.
    submit = _named(server_spans.get_finished_spans(), "cyclone.v1.WorkflowService/Submit")
    assert submit.context.trace_id == trace_id
    assert _parent(submit) == root_id
    assert submit.kind == trace.SpanKind.SERVER
    assert submit.attributes["cyclone.workflow"] == "traced"
    assert submit.attributes["rpc.grpc.status_code"] == 0
    assert _stored_traceparent(server, run_id) == tracing.format_traceparent(submit)

    # Each step's handler span is a child of the Submit span, with the step's attributes
    # and its outcome as the status.
    worker_spans = sdk_spans.get_finished_spans()
    steps = {s.name: s for s in worker_spans if s.name.startswith("step ")}
    assert set(steps) == {"step charge", "step notify"}
    for node, step in (("charge", steps["step charge"]), ("notify", steps["step notify"])):
        assert step.context.trace_id == trace_id
        assert _parent(step) == submit.context.span_id
        assert step.attributes["cyclone.run_id"] == run_id
        assert step.attributes["cyclone.node"] == node
        assert step.attributes["cyclone.action"] == node
        assert step.attributes["cyclone.attempt"] == 1
        assert step.attributes["cyclone.workflow"] == "traced"
    for inner, step in (("charge card", "step charge"), ("send mail", "step notify")):
        assert _parent(_named(worker_spans, inner)) == steps[step].context.span_id
    assert steps["step charge"].status.status_code == StatusCode.OK
    assert steps["step charge"].attributes["cyclone.outcome"] == "completed"
    assert steps["step notify"].status.status_code == StatusCode.ERROR
    assert "the mail server said no" in (steps["step notify"].status.description or "")
    assert steps["step notify"].attributes["cyclone.outcome"] == "failed"

    # The server's claim and completion of each step are in the same trace too.
    finished = server_spans.get_finished_spans()
    for node, step_status in (("charge", "completed"), ("notify", "discarded")):
        claim = _named(finished, f"claim {node}")
        complete = _named(finished, f"complete {node}")
        for span in (claim, complete):
            assert span.context.trace_id == trace_id
            assert _parent(span) == submit.context.span_id
            assert span.attributes["cyclone.run_id"] == run_id
            assert span.attributes["cyclone.node"] == node
        assert claim.attributes["cyclone.attempt"] == 1
        assert complete.attributes["cyclone.step_status"] == step_status
    assert _named(finished, "complete notify").attributes["cyclone.run_status"] == "failed"
    if SPANS_OUT:
        _write_spans(SPANS_OUT, [root, *worker_spans, *finished], trace_id)


def _write_spans(path: str, spans: list[Any], trace_id: int) -> None:
    """The spans of one trace as JSON lines, for docs/trace_picture.py."""
    with open(path, "w", encoding="utf-8") as out:
        for span in spans:
            if span.context.trace_id != trace_id:
                continue
            record = json.loads(span.to_json())
            record["scope"] = span.instrumentation_scope.name if span.instrumentation_scope else ""
            out.write(json.dumps(record) + "\n")


def test_with_tracing_off_nothing_is_exported_nor_stored(cyclone_server, sdk_spans) -> None:
    assert cyclone_server.server.tracing is None
    assert cyclone_server.server.handouts.spans is None
    sdk_spans.clear()
    worker = _worker(cyclone_server.address)

    @worker.action("charge")
    def charge(ctx) -> str:
        return "ok"

    wf = Workflow("untraced")
    wf.node("charge")
    tracer = trace.get_tracer("tests")
    with running(worker), Client(cyclone_server.address) as client:
        with tracer.start_as_current_span("checkout"):
            run_id = client.submit(wf)
        assert client.wait(run_id, timeout=PATIENCE).status == "completed"
    # The client sent its context; the server neither traced nor kept it, so the
    # worker's step had no trace to continue.
    assert _stored_traceparent(cyclone_server, run_id) is None
    assert [s.name for s in sdk_spans.get_finished_spans()] == ["checkout"]


BAD_TRACEPARENTS = [
    "garbage",
    # Ids of all zeros are invalid.
    "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
    # Upper case, a version this server does not know, a missing field.
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-01",
    # Over long: a valid one with 4,000 more characters.
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-" + "a" * 4000,
]


@pytest.mark.parametrize("bad", BAD_TRACEPARENTS)
def test_a_malformed_traceparent_is_ignored(traced_server, bad: str) -> None:
    server, server_spans = traced_server
    wf = Workflow("hostile")
    wf.node("a")
    request = wf_pb.SubmitRequest(workflow=wf.to_proto())
    metadata = (("traceparent", bad), ("tracestate", "k=" + "v" * 2000))
    run_id = server.workflows.Submit(request, metadata=metadata).run_id
    server.server.tracing.provider.force_flush()
    submit = _named(server_spans.get_finished_spans(), "cyclone.v1.WorkflowService/Submit")
    # A trace of its own: no parent, no trace id from the header, no trace state.
    assert submit.parent is None
    assert "4bf92f3577b34da6a3ce929d0e0e4736" not in _hex(submit)[0]
    assert not submit.context.trace_state
    stored = _stored_traceparent(server, run_id)
    assert stored == tracing.format_traceparent(submit)
    assert stored is not None and tracing.valid_traceparent(stored) and stored != bad


def test_a_well_formed_traceparent_and_tracestate_are_continued(traced_server) -> None:
    server, server_spans = traced_server
    wf = Workflow("continued")
    wf.node("a")
    request = wf_pb.SubmitOnceRequest(workflow=wf.to_proto(), key="k1")
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    metadata = (("traceparent", parent), ("tracestate", "vendor=abc"))
    run_id = server.workflows.SubmitOnce(request, metadata=metadata).run_id
    server.server.tracing.provider.force_flush()
    submit = _named(server_spans.get_finished_spans(), "cyclone.v1.WorkflowService/SubmitOnce")
    assert _hex(submit)[0] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert _parent(submit) == 0x00F067AA0BA902B7
    assert submit.context.trace_state.get("vendor") == "abc"
    assert _stored_traceparent(server, run_id).startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")


def test_a_child_run_continues_its_parents_trace(traced_server) -> None:
    server, _ = traced_server
    parent = Workflow("traced_parent")
    parent.node("body", action="traced_body")
    metadata = (("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),)
    run_id = server.workflows.Submit(
        wf_pb.SubmitRequest(workflow=parent.to_proto()), metadata=metadata
    ).run_id
    [step] = claim(server, "traced_body")
    child = Workflow("traced_child")
    child.node("k")
    started = server.workers.StartChild(
        worker_service_pb2.StartChildRequest(
            run_id=run_id,
            node="body",
            lease_token=step.lease_token,
            step_id="child",
            seq=1,
            workflow=child.to_proto(),
        )
    )
    stored = _stored_traceparent(server, run_id)
    assert stored is not None and stored.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
    assert _stored_traceparent(server, started.child_run_id) == stored
    [kid] = claim(server, "k")
    assert kid.traceparent == stored


def test_a_refused_call_is_a_span_with_its_status(traced_server) -> None:
    server, server_spans = traced_server
    with pytest.raises(grpc.RpcError) as refused:
        server.workflows.GetRun(wf_pb.GetRunRequest(run_id="not-a-uuid"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # An aborted call's status reaches the caller before its span ends.
    spans = eventually(server_spans.get_finished_spans, "the GetRun span")
    span = _named(spans, "cyclone.v1.WorkflowService/GetRun")
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert span.attributes["cyclone.run_id"] == "not-a-uuid"
    # Health checks are not traced.
    assert all("grpc.health" not in s.name for s in server_spans.get_finished_spans())


def test_the_carrier_keeps_only_well_formed_headers() -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert tracing.carrier([("traceparent", good), ("tracestate", "a=b")]) == {
        "traceparent": good,
        "tracestate": "a=b",
    }
    for bad in BAD_TRACEPARENTS:
        assert tracing.carrier([("traceparent", bad), ("tracestate", "a=b")]) == {}
    # A trace state alone, or an over-long one, is dropped.
    assert tracing.carrier([("tracestate", "a=b")]) == {}
    assert tracing.carrier([("traceparent", good), ("tracestate", "a" * 600)]) == {
        "traceparent": good
    }
    assert tracing.carrier([("traceparent", b"binary"), ("other", "x")]) == {}


def test_tracing_takes_only_its_modes(capsys) -> None:
    assert config.parse([]).tracing == "off"
    assert config.parse(["--tracing", "otlp"]).tracing == "otlp"
    with pytest.raises(SystemExit):
        config.parse(["--tracing", "jaeger"])
    assert "--tracing must be off, otlp, otlp-http or console" in capsys.readouterr().err


def test_the_sdk_and_the_server_import_no_opentelemetry_until_asked() -> None:
    """Off (and with OpenTelemetry not installed) nothing of it is loaded: the client,
    the worker and the server import it only once tracing is on."""
    code = (
        "import sys\n"
        "import pyclient, pyclient.worker, pyclient.client, service.server, service.main\n"
        "from service import config\n"
        "config.parse([])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": f"{root}:{root}/core"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_a_server_process_prints_its_spans_with_tracing_console(server_process) -> None:
    """--tracing console, end to end in a real process: the Submit span of a client's
    trace is printed, by the exporter's thread, at the latest when the server stops."""
    server = server_process("--tracing", "console")
    wf = Workflow("printed")
    wf.node("a")
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with grpc.insecure_channel(server.address) as channel:
        stub = wf_pb_grpc.WorkflowServiceStub(channel)
        request = wf_pb.SubmitRequest(workflow=wf.to_proto())
        run_id = stub.Submit(request, metadata=(("traceparent", parent),)).run_id
    server.stop()
    printed = "".join(server.output)
    assert '"name": "cyclone.v1.WorkflowService/Submit"' in printed
    assert '"trace_id": "0x4bf92f3577b34da6a3ce929d0e0e4736"' in printed
    assert '"cyclone.workflow": "printed"' in printed
    assert run_id
    assert '"service.name": "cyclone-server"' in printed
