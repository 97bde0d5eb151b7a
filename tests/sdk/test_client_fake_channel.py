"""Client code paths against grpcio-testing's fake channel: requests, metadata, errors."""

from __future__ import annotations

import concurrent.futures
import datetime as dt

import grpc
import grpc_testing
import pytest

from cyclone.jsonvalue import from_value, to_value
from cyclone.v1 import admin_service_pb2 as admin_pb
from cyclone.v1 import types_pb2
from cyclone.v1 import workflow_service_pb2 as wf_pb
from pyclient import Client, FailedPrecondition, InvalidArgument, NotFound, WaitTimeout, Workflow

SERVICES = {
    "WorkflowService": wf_pb.DESCRIPTOR.services_by_name["WorkflowService"],
    "AdminService": admin_pb.DESCRIPTOR.services_by_name["AdminService"],
}


class FakeServer:
    """Runs client calls in a thread and answers them from the test, one at a time."""

    def __init__(self) -> None:
        self.channel = grpc_testing.channel(SERVICES.values(), grpc_testing.strict_real_time())
        self.pool = concurrent.futures.ThreadPoolExecutor(1)

    def call(self, fn, *args, **kwargs) -> concurrent.futures.Future:
        return self.pool.submit(fn, *args, **kwargs)

    def answer(self, service: str, method: str, response=None, code=grpc.StatusCode.OK, details=""):
        """Take the next request to ``method``; answer it; return (metadata, request)."""
        descriptor = SERVICES[service].methods_by_name[method]
        metadata, request, rpc = self.channel.take_unary_unary(descriptor)
        rpc.terminate(response, (), code, details)
        return dict(metadata), request

    def close(self) -> None:
        self.pool.shutdown()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def _workflow() -> Workflow:
    wf = Workflow("order")
    wf.node("charge")
    return wf


def _run(status=types_pb2.RUN_STATUS_RUNNING, run_id="r1") -> types_pb2.Run:
    return types_pb2.Run(
        run_id=run_id,
        workflow="order",
        status=status,
        steps=[types_pb2.Step(node="charge", status=types_pb2.STEP_STATUS_RUNNING, attempt=1)],
    )


def test_submit_sends_the_workflow_input_token_and_actor(server):
    client = Client(channel=server.channel, token="s3cret", actor="alice")
    future = server.call(client.submit, _workflow(), {"order_id": "o-1"})
    metadata, request = server.answer(
        "WorkflowService", "Submit", wf_pb.SubmitResponse(run_id="r1")
    )
    assert future.result(5) == "r1"
    assert request.workflow == _workflow().to_proto()
    assert from_value(request.input) == {"order_id": "o-1"}
    assert metadata["authorization"] == "Bearer s3cret"
    assert metadata["cyclone-actor"] == "alice"


def test_submit_without_input_leaves_it_unset(server):
    client = Client(channel=server.channel)
    future = server.call(client.submit, _workflow())
    metadata, request = server.answer("WorkflowService", "Submit", wf_pb.SubmitResponse(run_id="r"))
    future.result(5)
    assert not request.HasField("input")
    assert "authorization" not in metadata


def test_submit_once_reports_whether_the_run_was_created(server):
    client = Client(channel=server.channel)
    future = server.call(client.submit_once, _workflow(), "order-o-1", {"a": 1})
    _, request = server.answer(
        "WorkflowService", "SubmitOnce", wf_pb.SubmitOnceResponse(run_id="r0", created=False)
    )
    submitted = future.result(5)
    assert (submitted.run_id, submitted.created) == ("r0", False)
    assert request.key == "order-o-1"


def test_an_empty_submit_key_is_refused_before_the_network(server):
    with pytest.raises(InvalidArgument, match="submit key is empty"):
        Client(channel=server.channel).submit_once(_workflow(), "")


def test_server_errors_keep_their_message(server):
    client = Client(channel=server.channel)
    future = server.call(client.get_run, "nope")
    server.answer(
        "WorkflowService", "GetRun", code=grpc.StatusCode.NOT_FOUND, details="run nope not found"
    )
    with pytest.raises(NotFound, match=r"^run nope not found$"):
        future.result(5)


def test_get_run_returns_plain_values(server):
    client = Client(channel=server.channel)
    proto = _run(types_pb2.RUN_STATUS_COMPLETED)
    proto.input.CopyFrom(to_value({"amount": 42}))
    proto.created_at.FromDatetime(dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC))
    future = server.call(client.get_run, "r1")
    server.answer("WorkflowService", "GetRun", wf_pb.GetRunResponse(run=proto))
    run = future.result(5)
    assert run.status == "completed"
    assert run.status.finished
    assert run.input == {"amount": 42}
    assert run.created_at == dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    assert run.finished_at is None
    assert run.step("charge").status == "running"


def test_wait_polls_until_the_run_stops_running(server):
    client = Client(channel=server.channel)
    future = server.call(client.wait, "r1", 10)
    for status in (types_pb2.RUN_STATUS_RUNNING, types_pb2.RUN_STATUS_RUNNING):
        server.answer("WorkflowService", "GetRun", wf_pb.GetRunResponse(run=_run(status)))
    server.answer(
        "WorkflowService", "GetRun", wf_pb.GetRunResponse(run=_run(types_pb2.RUN_STATUS_BLOCKED))
    )
    assert future.result(5).status == "blocked"


def test_wait_gives_up_after_its_timeout(server):
    client = Client(channel=server.channel)
    future = server.call(client.wait, "r1", 0.01)
    server.answer("WorkflowService", "GetRun", wf_pb.GetRunResponse(run=_run()))
    server.answer("WorkflowService", "GetRun", wf_pb.GetRunResponse(run=_run()))
    with pytest.raises(WaitTimeout, match="still running"):
        future.result(5)


def test_list_runs_sends_filters_and_iter_runs_follows_pages(server):
    client = Client(channel=server.channel)
    after = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    future = server.call(
        lambda: list(
            client.iter_runs(workflow="order", status=["failed", "blocked"], created_after=after)
        )
    )
    _, first = server.answer(
        "WorkflowService",
        "ListRuns",
        wf_pb.ListRunsResponse(runs=[_run(run_id="a"), _run(run_id="b")], next_page_token="p2"),
    )
    _, second = server.answer(
        "WorkflowService", "ListRuns", wf_pb.ListRunsResponse(runs=[_run(run_id="c")])
    )
    assert [r.run_id for r in future.result(5)] == ["a", "b", "c"]
    assert first.workflow == "order"
    assert list(first.statuses) == [types_pb2.RUN_STATUS_FAILED, types_pb2.RUN_STATUS_BLOCKED]
    assert first.created_after.ToDatetime(tzinfo=dt.UTC) == after
    assert (first.page_token, second.page_token) == ("", "p2")


def test_iter_runs_stops_at_its_limit_without_fetching_more(server):
    client = Client(channel=server.channel)
    future = server.call(lambda: list(client.iter_runs(limit=1)))
    server.answer(
        "WorkflowService",
        "ListRuns",
        wf_pb.ListRunsResponse(runs=[_run(run_id="a"), _run(run_id="b")], next_page_token="p2"),
    )
    assert [r.run_id for r in future.result(5)] == ["a"]


def test_an_unknown_status_filter_is_refused():
    with pytest.raises(InvalidArgument, match="unknown run status"):
        Client(channel=grpc_testing.channel([], grpc_testing.strict_real_time())).list_runs(
            status="lost"
        )


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"result": {"charge_id": "ch_1"}}, "result", {"charge_id": "ch_1"}),
        ({"result": None}, "result", None),
        ({"error": "card declined"}, "error", "card declined"),
        ({"discard": True}, "discard", True),
    ],
)
def test_resolve_sends_exactly_the_chosen_resolution(server, kwargs, field, value):
    client = Client(channel=server.channel, actor="ops")
    future = server.call(client.resolve, "r1", node="charge", reason="checked stripe", **kwargs)
    metadata, request = server.answer(
        "AdminService", "Resolve", admin_pb.ResolveResponse(run=_run())
    )
    future.result(5)
    assert request.WhichOneof("resolution") == field
    got = from_value(request.result) if field == "result" else getattr(request, field)
    assert got == value
    assert (request.reason, metadata["cyclone-actor"]) == ("checked stripe", "ops")


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"error": "x", "discard": True}, {"result": 1, "error": "x"}],
    ids=["none", "error-and-discard", "result-and-error"],
)
def test_resolve_needs_exactly_one_resolution(server, kwargs):
    with pytest.raises(InvalidArgument, match="exactly one"):
        Client(channel=server.channel).resolve("r1", "charge", reason="x", **kwargs)


def test_resolve_of_a_step_call_sends_its_step_id_and_needs_no_node_nor_reason(server):
    client = Client(channel=server.channel)
    future = server.call(lambda: client.resolve("r1", step_id="charge", discard=True))
    _, request = server.answer("AdminService", "Resolve", admin_pb.ResolveResponse(run=_run()))
    future.result(5)
    assert (request.run_id, request.node, request.step_id) == ("r1", "", "charge")
    assert request.reason == "" and request.discard


@pytest.mark.parametrize(
    ("error", "target", "sent"),
    [
        (
            types_pb2.RunError(kind="EffectUncertain", node="pay", step_id="charge"),
            "charge",
            ("pay", "charge"),
        ),
        (types_pb2.RunError(kind="EffectUncertain", node="charge"), "charge", ("charge", "")),
        # The node of a step-call block, as older callers wrote it: sent as the node, so
        # the server's refusal names the step id to give.
        (
            types_pb2.RunError(kind="EffectUncertain", node="pay", step_id="charge"),
            "pay",
            ("pay", ""),
        ),
        # A step call named like its node is the step call.
        (
            types_pb2.RunError(kind="EffectUncertain", node="pay", step_id="pay"),
            "pay",
            ("pay", "pay"),
        ),
    ],
    ids=["step-call", "node", "node-of-a-step-call", "step-call-named-as-its-node"],
)
def test_resolve_takes_the_clis_target_a_step_id_or_the_blocked_node(server, error, target, sent):
    """As `cyclone resolve RUN TARGET`: the run's error tells a step id from a node."""
    client = Client(channel=server.channel)
    future = server.call(lambda: client.resolve("r1", target, discard=True))
    blocked = _run(types_pb2.RUN_STATUS_BLOCKED)
    blocked.error.CopyFrom(error)
    server.answer("WorkflowService", "GetRun", wf_pb.GetRunResponse(run=blocked))
    _, request = server.answer("AdminService", "Resolve", admin_pb.ResolveResponse(run=_run()))
    future.result(5)
    assert (request.node, request.step_id) == sent


def test_resolve_with_node_and_target_sends_the_target_as_the_step_id_unread(server):
    client = Client(channel=server.channel)
    future = server.call(lambda: client.resolve("r1", "charge", node="pay", result=1))
    _, request = server.answer("AdminService", "Resolve", admin_pb.ResolveResponse(run=_run()))
    future.result(5)
    assert (request.node, request.step_id) == ("pay", "charge")


def test_retry_refused_by_the_server_is_failed_precondition(server):
    client = Client(channel=server.channel)
    future = server.call(client.retry, "r1", "charge", "again")
    _, request = server.answer(
        "AdminService",
        "Retry",
        code=grpc.StatusCode.FAILED_PRECONDITION,
        details="node charge is completed, not discarded",
    )
    with pytest.raises(FailedPrecondition, match="not discarded"):
        future.result(5)
    assert (request.run_id, request.node, request.reason) == ("r1", "charge", "again")


def test_retry_all_returns_the_reopened_nodes(server):
    client = Client(channel=server.channel)
    future = server.call(client.retry_all, "r1")
    server.answer(
        "AdminService", "RetryAll", admin_pb.RetryAllResponse(nodes=["a", "b"], run=_run())
    )
    retried = future.result(5)
    assert retried.nodes == ("a", "b")
    assert retried.run.run_id == "r1"


def test_cancel_sends_the_reason(server):
    client = Client(channel=server.channel)
    future = server.call(client.cancel, "r1", "customer asked")
    _, request = server.answer(
        "WorkflowService",
        "CancelRun",
        wf_pb.CancelRunResponse(run=_run(types_pb2.RUN_STATUS_CANCELLED)),
    )
    assert future.result(5).status == "cancelled"
    assert request.reason == "customer asked"
