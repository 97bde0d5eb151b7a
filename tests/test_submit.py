"""Submit and SubmitOnce: validation, atomicity, idempotency under concurrency."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from cyclone.v1 import workflow_service_pb2
from tests.helpers import claim, complete, node, rpc_error, submit, table_counts, value, workflow


def test_submit_creates_a_run_with_every_step_and_releases_only_roots(cyclone_server):
    run_id = submit(
        cyclone_server,
        workflow("order", node("a"), node("b", deps=["a"]), node("c", deps=["a"])),
        input={"order": 7},
    )
    rows = cyclone_server.sql(
        "SELECT node, status FROM cyclone.steps WHERE run_id = %s ORDER BY node", run_id
    )
    assert rows == [("a", "available"), ("b", "pending"), ("c", "pending")]
    [run] = cyclone_server.sql("SELECT status, input FROM cyclone.runs WHERE run_id = %s", run_id)
    assert run == ("running", {"order": 7})


def test_every_submit_makes_a_new_run(cyclone_server):
    wf = workflow("w", node("a"))
    assert submit(cyclone_server, wf) != submit(cyclone_server, wf)


def test_run_ids_are_uuid_v7(cyclone_server):
    import uuid

    run_id = submit(cyclone_server, workflow("w", node("a")))
    assert uuid.UUID(run_id).version == 7


BAD_WORKFLOWS = [
    (workflow("", node("a")), "workflow name is empty"),
    (workflow("bad name", node("a")), "workflow name 'bad name' is invalid"),
    (workflow("w"), "workflow 'w' has no nodes"),
    (workflow("w", node("a"), node("a")), "node 'a' is defined twice"),
    (workflow("w", node("a", deps=["ghost"])), "node 'a' depends on unknown node 'ghost'"),
    (workflow("w", node("a", deps=["a"])), "node 'a' depends on itself"),
    (
        workflow("w", node("a", deps=["c"]), node("b", deps=["a"]), node("c", deps=["b"])),
        "is part of a cycle",
    ),
    (workflow("w", node("a", action="")), "node 'a': action name is empty"),
    (workflow("w", node("a'; DROP TABLE cyclone.runs; --")), "node name"),
    (workflow("w", node("a\x00b")), "node name"),
    (workflow("w", node("a", max_attempts=101)), "node 'a': max_attempts must be between 1"),
    (workflow("w", node("a", timeout=0.5)), "node 'a': timeout must be between"),
    (workflow("w", node("a", rule="all_success"), node("b", deps=["a", "a"])), "twice"),
]


@pytest.mark.parametrize(("wf", "message"), BAD_WORKFLOWS)
def test_invalid_workflow_is_refused_with_a_message_and_writes_nothing(cyclone_server, wf, message):
    before = table_counts(cyclone_server)
    error = rpc_error(
        cyclone_server.workflows.Submit, workflow_service_pb2.SubmitRequest(workflow=wf)
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()
    assert table_counts(cyclone_server) == before


def test_too_many_nodes_is_refused_naming_the_limit(cyclone_server):
    chain = [node("n0")] + [node(f"n{i}", deps=[f"n{i - 1}"]) for i in range(1, 10_000)]
    error = rpc_error(
        cyclone_server.workflows.Submit,
        workflow_service_pb2.SubmitRequest(workflow=workflow("deep", *chain)),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "10000 nodes; the limit is 5000" in error.details()
    assert table_counts(cyclone_server)["runs"] == 0


def test_missing_workflow_is_invalid(cyclone_server):
    error = rpc_error(cyclone_server.workflows.Submit, workflow_service_pb2.SubmitRequest())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "workflow is required" in error.details()


def test_deeply_nested_input_is_refused(cyclone_server):
    nested = value(1)
    for _ in range(40):
        outer = value([])
        outer.list_value.values.append(nested)
        nested = outer
    request = workflow_service_pb2.SubmitRequest(workflow=workflow("w", node("a")))
    request.input.CopyFrom(nested)
    error = rpc_error(cyclone_server.workflows.Submit, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nested more than 32 levels" in error.details()
    assert table_counts(cyclone_server)["runs"] == 0


def test_oversized_payload_is_refused_naming_the_limit(server_factory):
    server = server_factory(max_payload_bytes=1000)
    request = workflow_service_pb2.SubmitRequest(workflow=workflow("w", node("a")))
    request.input.CopyFrom(value({"blob": "x" * 5000}))
    error = rpc_error(server.workflows.Submit, request)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the limit is 1000" in error.details()


def test_each_server_in_a_process_keeps_its_own_payload_limits(server_factory):
    strict = server_factory(max_payload_bytes=1000, max_json_depth=4)
    lenient = server_factory(max_payload_bytes=100_000, max_json_depth=32)
    deep = value("leaf")
    for _ in range(10):
        outer = value([])
        outer.list_value.values.append(deep)
        deep = outer
    for payload, limit in ((value({"blob": "x" * 5000}), "1000"), (deep, "4 levels")):
        request = workflow_service_pb2.SubmitRequest(workflow=workflow("w", node("a")))
        request.input.CopyFrom(payload)
        # The server started last does not lift the limits of the one before it...
        assert limit in rpc_error(strict.workflows.Submit, request).details()
        # ...and the strict one does not impose its limits on the lenient one.
        assert lenient.workflows.Submit(request).run_id


def _submit_once(server, key, wf=None):
    return server.workflows.SubmitOnce(
        workflow_service_pb2.SubmitOnceRequest(workflow=wf or workflow("pay", node("a")), key=key)
    )


def test_submit_once_returns_the_existing_run_and_says_so(cyclone_server):
    first = _submit_once(cyclone_server, "order-1")
    second = _submit_once(cyclone_server, "order-1")
    assert first.created and not second.created
    assert first.run_id == second.run_id
    assert _submit_once(cyclone_server, "order-2").run_id != first.run_id


def test_submit_once_keys_are_scoped_by_workflow_name(cyclone_server):
    a = _submit_once(cyclone_server, "k", workflow("one", node("a")))
    b = _submit_once(cyclone_server, "k", workflow("two", node("a")))
    assert a.created and b.created and a.run_id != b.run_id


def test_submit_once_makes_one_run_under_20_concurrent_calls(cyclone_server):
    with ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(lambda _: _submit_once(cyclone_server, "same"), range(20)))
    assert len({r.run_id for r in replies}) == 1
    assert sum(r.created for r in replies) == 1
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.runs")[0][0] == 1
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.steps")[0][0] == 1


def test_a_keyed_run_takes_its_keys_name_based_id_the_same_in_sql_and_python(cyclone_server):
    from service.db.runs import submit_key_id

    run_id = _submit_once(cyclone_server, "order-9").run_id
    assert uuid.UUID(run_id) == submit_key_id("pay", "order-9")
    assert uuid.UUID(run_id).version == 8
    keys = [("pay", "order-9"), ("wf", "ключ ☃"), ("a.b", "x" * 256)]
    for wf, key in keys:
        (row,) = cyclone_server.sql("SELECT cyclone.submit_key_id(%s, %s)", wf, key)
        assert row[0] == submit_key_id(wf, key)
    # The workflow and the key are kept apart: ("ab", "c") is not ("a", "bc").
    assert submit_key_id("ab", "c") != submit_key_id("a", "bc")


def test_a_key_made_before_the_name_based_ids_keeps_its_run(cyclone_server):
    """A key row whose run has a UUIDv7 id (made before migration 0027) still answers."""
    legacy = uuid.UUID("01890000-0000-7000-8000-000000000001")
    cyclone_server.sql(
        "INSERT INTO cyclone.submit_keys (key_id, workflow, submit_key, run_id, created_at)"
        " VALUES (cyclone.submit_key_id('pay', 'old'), 'pay', 'old', %s, now())",
        legacy,
    )
    again = _submit_once(cyclone_server, "old")
    assert (again.run_id, again.created) == (str(legacy), False)


def test_submit_once_needs_a_key(cyclone_server):
    error = rpc_error(_submit_once, cyclone_server, "")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "submit key is empty" in error.details()


def test_a_join_after_a_fan_out_to_1000_is_released_once_every_leaf_completed(cyclone_server):
    nodes = [node("root")]
    nodes += [node(f"leaf{i}", deps=["root"]) for i in range(1000)]
    nodes.append(node("join", deps=[f"leaf{i}" for i in range(1000)]))
    run_id = submit(cyclone_server, workflow("fan", *nodes))
    [root] = claim(cyclone_server)
    complete(cyclone_server, root, {"n": 0})
    leaves_done, join = 0, None
    while join is None:
        batch = claim(cyclone_server, n=500)
        assert batch, "the join never became ready"
        for step in batch:
            if step.node == "join":
                # Released only once every leaf completed.
                assert leaves_done == 1000
                join = step
            else:
                complete(cyclone_server, step, {"leaf": step.node})
                leaves_done += 1
    # The join sees every leaf's output.
    assert len(join.upstream_outputs) == 1000
    assert join.upstream_outputs["leaf999"].struct_value["leaf"] == "leaf999"
    complete(cyclone_server, join)
    [(status,)] = cyclone_server.sql("SELECT status FROM cyclone.runs WHERE run_id = %s", run_id)
    assert status == "completed"


def test_a_claimed_step_carries_its_runs_deadline_and_traceparent(cyclone_server):
    wf = workflow("w", node("a"), node("b", deps=["a"]))
    plain, marked = submit(cyclone_server, wf), submit(cyclone_server, wf)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    cyclone_server.sql(
        "UPDATE cyclone.runs SET deadline = '2100-01-02T03:04:05Z', traceparent = %s"
        " WHERE run_id = %s",
        parent,
        marked,
    )
    # Both paths of the claim: roots (no upstream) first, then a node with upstream.
    for _ in range(2):
        steps = {s.run_id: s for s in claim(cyclone_server, n=10)}
        assert not steps[plain].HasField("run_deadline") and not steps[plain].traceparent
        step = steps[marked]
        assert step.run_deadline.ToJsonString() == "2100-01-02T03:04:05Z"
        assert step.traceparent == parent
        for s in steps.values():
            complete(cyclone_server, s)
