"""Hostile input: whatever a client sends, the server answers with a status that says
what is wrong (never UNKNOWN, never INTERNAL for a client's mistake), keeps serving,
and leaves the database byte for byte as it was."""

from __future__ import annotations

import random
import re
import uuid
from typing import Any

import grpc
import pytest

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2
from tests.helpers import claim, complete, get_run, node, rpc_error, submit, value
from tests.helpers import workflow as wf
from tests.snapshot import database_snapshot
from tests.test_auth import METHODS

READ_ONLY = ("/GetRun", "/ListRuns", "/Explain")
CLIENT_MISTAKES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
}


@pytest.fixture
def busy(server_factory: Any) -> Any:
    """A server with small limits, holding a run with a claimed step, a completed one
    and a pending one (so that the snapshot has something in every table)."""
    server = server_factory(
        max_message_bytes=1 << 20, max_payload_bytes=8 * 1024, max_json_depth=8, max_wait_s=0.2
    )
    submit(server, wf("wf", node("a"), node("b"), node("c", deps=["a", "b"])), {"k": 1})
    first, second = claim(server, n=2)
    complete(server, first, {"done": first.node})
    server.held = second
    server.workflows.CancelRun(
        workflow_service_pb2.CancelRunRequest(
            run_id=submit(server, wf("other", node("x"))), reason="so audit has a row"
        )
    )
    return server


def assert_client_mistake(error: grpc.RpcError, *words: str) -> None:
    assert error.code() in CLIENT_MISTAKES, (error.code(), error.details())
    for word in words:
        assert word in error.details(), (word, error.details())


def raw(server: Any, method: str, payload: bytes) -> grpc.StatusCode:
    call = server.channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        call(payload, timeout=10)
    except grpc.RpcError as error:
        assert error.code() in CLIENT_MISTAKES, (method, payload[:40], error.details())
        return error.code()
    return grpc.StatusCode.OK


def valid_requests(server: Any) -> list[bytes]:
    """Serialized requests that are valid, to truncate and corrupt."""
    step = server.held
    return [
        workflow_service_pb2.SubmitRequest(
            workflow=wf("wf", node("a", input={"x": [1, "two"]}), node("b", deps=["a"])),
            input=value({"k": "v"}),
        ).SerializeToString(),
        worker_service_pb2.CompleteRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token, output=value([1])
        ).SerializeToString(),
        worker_service_pb2.ClaimRequest(
            worker_id="w", actions=[worker_service_pb2.ActionSpec(name="work")], max_steps=3
        ).SerializeToString(),
    ]


# A fuzz loop of thousands of requests: make test-all.
@pytest.mark.slow
def test_random_and_truncated_protobuf_bytes_never_crash_and_refusals_change_nothing(
    busy: Any,
) -> None:
    before = database_snapshot(busy)
    rng = random.Random(8)
    payloads = [b"\xff", b"\x0a", b"\x0a\xff\xff\xff\xff\x0f", b"\x08" + b"\xff" * 10]
    payloads += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) for _ in range(4)]
    for good in valid_requests(busy):
        payloads += [good[:cut] for cut in range(1, len(good), max(1, len(good) // 5))]
        for _ in range(2):
            corrupt = bytearray(good)
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
            payloads.append(bytes(corrupt))
    seen: set[grpc.StatusCode] = set()
    current = before
    for method in METHODS:
        for payload in payloads:
            code = raw(busy, method, payload)
            seen.add(code)
            if method.endswith(READ_ONLY):
                continue
            # A corrupted request may still be a valid one (protobuf is lenient), and
            # then it may change things; a refused one never does.
            after = database_snapshot(busy)
            if code != grpc.StatusCode.OK:
                assert after == current, (method, payload)
            current = after
    assert database_snapshot(busy) == current
    assert grpc.StatusCode.INVALID_ARGUMENT in seen
    assert health(busy) == "SERVING"


def health(server: Any) -> str:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    response = health_pb2_grpc.HealthStub(server.channel).Check(health_pb2.HealthCheckRequest())
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def test_invalid_utf8_in_a_string_field_is_invalid_argument(busy: Any) -> None:
    before = database_snapshot(busy)
    good = workflow_service_pb2.SubmitRequest(workflow=wf("wf", node("AAAA"))).SerializeToString()
    bad = good.replace(b"AAAA", b"\xff\xfeAA")
    error = rpc_error(
        busy.channel.unary_unary("/cyclone.v1.WorkflowService/Submit"), bad, timeout=10
    )
    assert_client_mistake(error, "not a valid Submit request")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert database_snapshot(busy) == before


def test_a_message_over_the_grpc_limit_is_resource_exhausted_naming_the_limit(busy: Any) -> None:
    before = database_snapshot(busy)
    big = workflow_service_pb2.SubmitRequest(
        workflow=wf("wf", node("a")), input=value({"blob": "x" * 1_100_000})
    )
    error = rpc_error(busy.workflows.Submit, big)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(1 << 20) in error.details()
    assert database_snapshot(busy) == before


def test_a_payload_over_its_limit_is_resource_exhausted_naming_the_limit(busy: Any) -> None:
    before = database_snapshot(busy)
    blob = {"blob": "x" * 10_000}
    for where, call, args in (
        ("run input", submit, (busy, wf("wf", node("a")), blob)),
        ("node 'a' input", submit, (busy, wf("wf", node("a", input=blob)))),
        ("output", complete, (busy, busy.held, blob)),
    ):
        error = rpc_error(call, *args)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"{where} is 100" in error.details()
        assert "the limit is 8192" in error.details()
    assert database_snapshot(busy) == before


def nested(depth: int) -> Any:
    obj: Any = "bottom"
    for i in range(depth - 1):
        obj = [obj] if i % 2 else {"k": obj}
    return obj


def test_deeply_nested_json_is_invalid_argument(busy: Any) -> None:
    """Past the setting (8 here) the server says so; past protobuf's own recursion limit
    (100 messages, each JSON level being two or three) the request does not even
    parse, which is invalid input too."""
    before = database_snapshot(busy)
    call = busy.channel.unary_unary("/cyclone.v1.WorkflowService/Submit")
    for depth in (9, 16, 50, 5000):
        request = workflow_service_pb2.SubmitRequest(workflow=wf("wf", node("a")))
        try:
            request.input.CopyFrom(value(nested(depth)))
            payload = request.SerializeToString()
        except Exception:
            # The client's own protobuf refuses to build it: craft the bytes by hand.
            payload = request.SerializeToString() + deep_value_bytes(depth)
        error = rpc_error(call, payload, timeout=10)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        if depth <= 16:
            assert "run input is nested more than 8 levels" in error.details()
        else:
            assert "not a valid Submit request" in error.details()
    assert database_snapshot(busy) == before


def deep_value_bytes(depth: int) -> bytes:
    """SubmitRequest.input (field 2) as a Value of lists nested ``depth`` deep."""
    inner = b"\x1a\x00"  # Value.string_value = ""
    for _ in range(depth):
        inner = b"\x32" + _varint(len(lv := b"\x0a" + _varint(len(inner)) + inner)) + lv
    return b"\x12" + _varint(len(inner)) + inner


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


BAD_WORKFLOWS = {
    "a cycle": (
        wf("wf", node("a", deps=["c"]), node("b", deps=["a"]), node("c", deps=["b"])),
        "cycle",
    ),
    "a self-edge": (wf("wf", node("a", deps=["a"])), "depends on itself"),
    "an unknown node": (wf("wf", node("a", deps=["ghost"])), "unknown node 'ghost'"),
    "a duplicate node": (wf("wf", node("a"), node("a")), "defined twice"),
    "a repeated dependency": (wf("wf", node("a"), node("b", deps=["a", "a"])), "twice"),
    "no nodes": (wf("wf"), "no nodes"),
    "a 10,000-deep chain": (
        wf("deep", node("n0"), *(node(f"n{i}", deps=[f"n{i - 1}"]) for i in range(1, 10_000))),
        "the limit is 5000",
    ),
    "fan-in over the limit": (
        wf(
            "in",
            *(node(f"u{i}") for i in range(1001)),
            node("z", deps=[f"u{i}" for i in range(1001)]),
        ),
        "1001 dependencies; the limit is 1000",
    ),
    "fan-out over the limit": (
        wf("out", node("root"), *(node(f"d{i}", deps=["root"]) for i in range(1001))),
        "1001 dependents; the limit is 1000",
    ),
    "an SQL-looking workflow name": (wf("x'); DROP TABLE cyclone.runs; --", node("a")), "invalid"),
    "an SQL-looking node name": (wf("wf", node("a' OR '1'='1")), "invalid"),
    "an SQL-looking action": (wf("wf", node("a", action="a;DELETE FROM cyclone.steps")), "invalid"),
    "a NUL byte in a node name": (wf("wf", node("a\x00b")), "invalid"),
    "a NUL byte in a node's input": (wf("wf", node("a", input={"k": "a\x00b"})), "NUL"),
    "a NUL byte in an input key": (wf("wf", node("a", input={"a\x00": 1})), "NUL"),
    "a name past 128 characters": (wf("w" * 129, node("a")), "the limit is 128"),
    "a composed é": (wf("wf", node("caf\u00e9")), "invalid"),
    "a decomposed é": (wf("wf", node("cafe\u0301")), "invalid"),
}


def test_bad_workflows_are_invalid_argument_naming_the_fault_and_store_nothing(
    busy: Any,
) -> None:
    before = database_snapshot(busy)
    for case, (workflow, words) in BAD_WORKFLOWS.items():
        for call, request in (
            (busy.workflows.Submit, workflow_service_pb2.SubmitRequest(workflow=workflow)),
            (
                busy.workflows.SubmitOnce,
                workflow_service_pb2.SubmitOnceRequest(workflow=workflow, key="k"),
            ),
        ):
            error = rpc_error(call, request, timeout=30)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (case, error.details())
            assert words in error.details(), (case, error.details())
    assert database_snapshot(busy) == before


def test_mixed_normalization_names_are_both_refused_so_they_never_collide() -> None:
    """The name rule is ASCII only: 'é' as one code point and as e + combining accent
    are both refused, so two names that look alike can never name two nodes."""
    from cyclone import dag

    for name in ("caf\u00e9", "cafe\u0301"):
        with pytest.raises(dag.InvalidWorkflow, match="invalid"):
            dag.check_name("node", name)


def test_sql_looking_strings_in_payloads_are_stored_as_plain_data(busy: Any) -> None:
    text = "'); DROP TABLE cyclone.runs; -- \" OR 1=1 $$ \\x00"
    run_id = submit(busy, wf("sqlish", node("a", action="sqlish")), {"q": text})
    (step,) = claim(busy, "sqlish")
    complete(busy, step, {"echo": text})
    run = get_run(busy, run_id)
    assert run.status == types_pb2.RUN_STATUS_COMPLETED
    assert run.input.struct_value.fields["q"].string_value == text
    assert busy.sql("SELECT count(*) FROM cyclone.runs")[0][0] == 3


def test_hostile_run_ids_are_refused(busy: Any) -> None:
    before = database_snapshot(busy)
    for text, code, words in (
        ("' OR 1=1 --", grpc.StatusCode.INVALID_ARGUMENT, "not a UUID"),
        ("a\x00", grpc.StatusCode.INVALID_ARGUMENT, "not a UUID"),
        (str(uuid.uuid4()), grpc.StatusCode.NOT_FOUND, ""),
    ):
        for call, request in (
            (busy.workflows.GetRun, workflow_service_pb2.GetRunRequest(run_id=text)),
            (busy.workflows.CancelRun, workflow_service_pb2.CancelRunRequest(run_id=text)),
        ):
            error = rpc_error(call, request)
            assert error.code() == code and words in error.details(), error.details()
    assert database_snapshot(busy) == before


def test_nul_bytes_in_reasons_errors_and_keys_are_invalid_argument(busy: Any) -> None:
    before = database_snapshot(busy)
    step = busy.held
    failure = worker_service_pb2.Failure(message="bad\x00", type="E")
    calls = [
        (
            busy.workers.Complete,
            worker_service_pb2.CompleteRequest(
                run_id=step.run_id, node=step.node, lease_token=step.lease_token, failure=failure
            ),
        ),
        (
            busy.workflows.CancelRun,
            workflow_service_pb2.CancelRunRequest(run_id=step.run_id, reason="r\x00"),
        ),
        (
            busy.workflows.SubmitOnce,
            workflow_service_pb2.SubmitOnceRequest(workflow=wf("wf", node("a")), key="k\x00"),
        ),
        (
            busy.workers.Claim,
            worker_service_pb2.ClaimRequest(
                worker_id="w\x00", actions=[worker_service_pb2.ActionSpec(name="work")]
            ),
        ),
    ]
    for call, request in calls:
        error = rpc_error(call, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "NUL" in error.details()
    assert database_snapshot(busy) == before


def test_a_worker_cannot_complete_or_heartbeat_a_step_it_does_not_hold(busy: Any) -> None:
    """Wrong, foreign (another step's, another run's), expired and superseded lease
    tokens are refused and change nothing; the holder's token still works after."""
    submit(busy, wf("lease", node("p", action="lease"), node("q", action="lease")))
    mine, other_step = claim(busy, "lease", n=2)
    submit(busy, wf("lease2", node("p", action="lease")))
    (other_run,) = claim(busy, "lease")

    def attempt(step: Any, token: str) -> list[grpc.RpcError]:
        complete_request = worker_service_pb2.CompleteRequest(
            run_id=step.run_id, node=step.node, lease_token=token, output=value({"stolen": 1})
        )
        heartbeat = worker_service_pb2.HeartbeatRequest(
            run_id=step.run_id, node=step.node, lease_token=token
        )
        return [
            rpc_error(busy.workers.Complete, complete_request),
            rpc_error(busy.workers.Heartbeat, heartbeat),
        ]

    before = database_snapshot(busy)
    for token in (str(uuid.uuid4()), other_step.lease_token, other_run.lease_token):
        for error in attempt(mine, token):
            assert error.code() == grpc.StatusCode.ABORTED, error.details()
    for error in attempt(mine, "not-a-uuid"):
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert database_snapshot(busy) == before

    busy.advance_clock(3600)  # past every lease, before any sweep
    expired = database_snapshot(busy)
    for error in attempt(mine, mine.lease_token):
        assert error.code() == grpc.StatusCode.ABORTED, error.details()
    assert database_snapshot(busy) == expired

    assert busy.sweep() >= 1
    again = next(s for s in claim(busy, "lease", n=10) if s.node == mine.node)
    assert again.attempt == mine.attempt + 1 and again.lease_token != mine.lease_token
    superseded = database_snapshot(busy)
    for error in attempt(mine, mine.lease_token):
        assert error.code() == grpc.StatusCode.ABORTED
        assert error.details()
    assert database_snapshot(busy) == superseded
    assert complete(busy, again, {"ok": 1}).status == types_pb2.STEP_STATUS_COMPLETED


def test_an_unexpected_error_is_internal_with_an_id_and_no_internals(busy: Any) -> None:
    """A server fault (here: a table gone under the server) reaches the caller as
    INTERNAL with an error id to find in the log, and nothing of the SQL or the code."""
    busy.sql("ALTER TABLE cyclone.audit RENAME TO audit_gone")
    error = rpc_error(get_run, busy, busy.held.run_id)
    assert error.code() == grpc.StatusCode.INTERNAL
    details = error.details()
    assert re.fullmatch(r"internal error \(id [0-9a-f]{12}\); see the server log", details)
    for leak in ("audit", "SELECT", "relation", "Traceback", "File ", ".py", "psycopg"):
        assert leak not in details


def test_workflow_size_limits_are_settings(server_factory: Any) -> None:
    server = server_factory(max_nodes=3, max_dependencies=1, max_dependents=2)
    before = database_snapshot(server)
    for workflow, words in (
        (wf("big", *(node(f"n{i}") for i in range(4))), "4 nodes; the limit is 3"),
        (wf("in", node("a"), node("b"), node("c", deps=["a", "b"])), "the limit is 1"),
        (
            wf("out", node("a"), *(node(f"d{i}", deps=["a"]) for i in range(2)), node("x")),
            "4 nodes",
        ),
    ):
        error = rpc_error(submit, server, workflow)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in error.details()
    assert database_snapshot(server) == before
    fan_out = wf("out", node("a"), node("d0", deps=["a"]), node("d1", deps=["a"]))
    assert submit(server, fan_out)
    small = server_factory(max_dependents=1)
    error = rpc_error(submit, small, fan_out)
    assert "node 'a' has 2 dependents; the limit is 1" in error.details()
