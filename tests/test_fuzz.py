"""Property-based fuzzing of Submit and Complete: whatever a client sends, a client's
mistake is answered with a status that names it, never INTERNAL or UNKNOWN.

Hypothesis runs a modest, derandomized set of examples against one server and one
database per test, so that the suite stays fast and a failure reproduces.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2, struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from tests.conftest import TEST_SETTINGS, RunningServer
from tests.helpers import claim, node, submit, workflow

FUZZ = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NEVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}

POOL = ["a", "b", "c", "d_1", "e.f", "g:h-i"]
names = st.one_of(
    st.sampled_from(POOL),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:-]{0,20}", fullmatch=True),
    st.text(max_size=12),
    st.sampled_from(["", "x" * 129, "a\x00", "caf\u00e9", "a'; DROP TABLE x; --", " a"]),
)
floats = st.floats(allow_nan=True, allow_infinity=True)
json_values = st.recursive(
    st.none() | st.booleans() | floats | st.integers(-(2**60), 2**60) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
durations = st.builds(
    duration_pb2.Duration,
    seconds=st.integers(-(2**40), 2**40) | st.integers(-5, 1000),
    nanos=st.integers(-(10**9), 10**9),
)


def to_value(obj: Any) -> struct_pb2.Value:
    """Build a Value by hand, so that NaN, infinities and huge ints get through."""
    v = struct_pb2.Value()
    if obj is None:
        v.null_value = struct_pb2.NULL_VALUE
    elif isinstance(obj, bool):
        v.bool_value = obj
    elif isinstance(obj, int | float):
        v.number_value = float(obj)
    elif isinstance(obj, str):
        v.string_value = obj
    elif isinstance(obj, list):
        v.list_value.values.extend(to_value(x) for x in obj)
    else:
        for key, item in obj.items():
            v.struct_value.fields[key].CopyFrom(to_value(item))
    return v


@st.composite
def nodes(draw: Any) -> types_pb2.Node:
    n = types_pb2.Node(
        name=draw(names),
        action=draw(names),
        depends_on=draw(st.lists(names, max_size=3)),
        trigger_rule=draw(st.integers(0, 4) | st.integers(-3, 2**31 - 1)),
    )
    if draw(st.booleans()):
        n.retry.max_attempts = draw(st.integers(-(2**31), 2**31 - 1) | st.integers(0, 5))
        n.retry.backoff_multiplier = draw(floats)
        if draw(st.booleans()):
            n.retry.initial_backoff.CopyFrom(draw(durations))
            n.retry.max_backoff.CopyFrom(draw(durations))
    if draw(st.booleans()):
        n.timeout.CopyFrom(draw(durations))
    if draw(st.booleans()):
        n.input.CopyFrom(to_value(draw(json_values)))
    return n


def outcome(call: Any, request: Any) -> grpc.StatusCode:
    try:
        call(request, timeout=30)
    except grpc.RpcError as error:
        assert error.code() not in NEVER, (error.code(), error.details(), request)
        return error.code()
    return grpc.StatusCode.OK


@pytest.fixture
def server(server_process: Any, database_url: str) -> Iterator[RunningServer]:
    """A cyclone-server process, reached through RunningServer's stubs and SQL (not
    started: the process serves). A process rather than a server in a thread of the
    test, because Hypothesis checks that nothing touches the global `random` while
    it draws, and a server's background loops do."""
    process = server_process("--max-payload-bytes", "4096", "--max-json-depth", "5")
    remote = RunningServer(database_url, TEST_SETTINGS, address=process.address)
    yield remote
    remote.stop()


def test_submit_never_answers_a_client_mistake_with_internal(server: RunningServer) -> None:
    seen: set[grpc.StatusCode] = set()

    @FUZZ
    @given(
        name=names,
        body=st.lists(nodes(), max_size=6),
        run_input=st.none() | json_values,
        key=st.none() | st.text(max_size=10),
    )
    def submit_anything(name: str, body: list, run_input: Any, key: str | None) -> None:
        wf = types_pb2.Workflow(name=name, nodes=body)
        if key is None:
            request: Any = workflow_service_pb2.SubmitRequest(workflow=wf)
            call = server.workflows.Submit
        else:
            request = workflow_service_pb2.SubmitOnceRequest(workflow=wf, key=key)
            call = server.workflows.SubmitOnce
        if run_input is not None:
            request.input.CopyFrom(to_value(run_input))
        seen.add(outcome(call, request))

    submit_anything()
    assert grpc.StatusCode.INVALID_ARGUMENT in seen
    stored = server.sql("SELECT count(*) FROM cyclone.runs")[0][0]
    assert stored == server.sql("SELECT count(DISTINCT run_id) FROM cyclone.steps")[0][0]


def test_complete_never_answers_a_client_mistake_with_internal(server: RunningServer) -> None:
    submit(server, workflow("held", *(node(f"n{i}", action="fz") for i in range(40))))
    held = claim(server, "fz", n=40)
    run_ids = [*sorted({s.run_id for s in held}), str(uuid.uuid4()), "nope", ""]
    tokens = [*(s.lease_token for s in held), str(uuid.uuid4()), "x", ""]
    seen: set[grpc.StatusCode] = set()

    @FUZZ
    @given(
        run_id=st.sampled_from(run_ids) | st.text(max_size=40),
        node_name=st.sampled_from([s.node for s in held]) | names,
        token=st.sampled_from(tokens) | st.text(max_size=40),
        output=st.none() | json_values,
        failure=st.none()
        | st.builds(
            worker_service_pb2.Failure,
            type=st.text(max_size=30),
            message=st.text(max_size=30),
            details=st.text(max_size=30),
            non_retryable=st.booleans(),
        ),
        retry_after=st.none() | durations,
    )
    def complete_anything(
        run_id: str, node_name: str, token: str, output: Any, failure: Any, retry_after: Any
    ) -> None:
        request = worker_service_pb2.CompleteRequest(
            run_id=run_id, node=node_name, lease_token=token
        )
        if failure is not None:
            request.failure.CopyFrom(failure)
            if retry_after is not None:
                request.failure.retry_after.CopyFrom(retry_after)
        elif output is not None:
            request.output.CopyFrom(to_value(output))
        seen.add(outcome(server.workers.Complete, request))
        many = worker_service_pb2.CompleteManyRequest(completions=[request, request])
        seen.add(outcome(server.workers.CompleteMany, many))

    complete_anything()
    assert {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OK} <= seen
