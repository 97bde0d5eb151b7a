"""Every operator action sent twice at once, to two servers on one database:
exactly one of the two takes effect, the other is refused with FAILED_PRECONDITION
naming why, the audit trail records the action once, and the engine's invariants
(tests.model.database_violations) hold afterwards."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import psycopg
import pytest

from cyclone.v1 import admin_service_pb2, workflow_service_pb2
from tests.helpers import claim, fail, get_run, node, run_status, submit, value, workflow
from tests.model import assert_database_invariants

ROUNDS = 3  # runs per action, each raced by its own pair of requests, all at once


def discarded_run(server: Any, i: int) -> str:
    """a -> c (c all_done) and b; a and c end discarded, the run failed."""
    run_id = submit(
        server,
        workflow(
            f"race{i}",
            node("a", action=f"a{i}", max_attempts=1),
            node("b", action=f"b{i}", max_attempts=1),
            node("c", action=f"c{i}", deps=["a"], rule="all_done", max_attempts=1),
        ),
    )
    [a] = claim(server, f"a{i}")
    fail(server, a, non_retryable=True)
    [b] = claim(server, f"b{i}")
    fail(server, b, non_retryable=True)
    [c] = claim(server, f"c{i}")
    fail(server, c, non_retryable=True)
    assert run_status(get_run(server, run_id)) == "failed"
    return run_id


def blocked_run(server: Any, i: int) -> str:
    """charge (unsafe) -> receipt, refund (one_failed); charge lost its lease and met an
    unsafe worker: the run is blocked on it."""
    run_id = submit(
        server,
        workflow(
            f"race{i}",
            node("charge", action=f"charge{i}"),
            node("receipt", action=f"receipt{i}", deps=["charge"]),
            node("refund", action=f"refund{i}", deps=["charge"], rule="one_failed"),
        ),
    )
    [_] = claim(server, f"charge{i}", unsafe=(f"charge{i}",), lease=5)
    return run_id


def block_all(server: Any, runs: list[str]) -> None:
    server.advance_clock(6)
    assert server.sweep() == len(runs)
    for i in range(len(runs)):
        assert claim(server, f"charge{i}", unsafe=(f"charge{i}",)) == []
    assert {run_status(get_run(server, r)) for r in runs} == {"blocked"}


def running_run(server: Any, i: int) -> str:
    run_id = submit(server, workflow(f"race{i}", node("a", action=f"a{i}"), node("b", deps=["a"])))
    claim(server, f"a{i}")  # one step running, held by a worker
    return run_id


def resolve_request(choice: str) -> Callable[[str], Any]:
    def request(run_id: str) -> Any:
        r = admin_service_pb2.ResolveRequest(run_id=run_id, node="charge", reason="checked")
        if choice == "result":
            r.result.CopyFrom(value({"charge_id": "ch_1"}))
        elif choice == "error":
            r.error = "the card was declined"
        else:
            r.discard = True
        return r

    return request


# action: (setup(server, i) -> run_id, rpc(server) -> callable, request(run_id), audit action)
ACTIONS: dict[str, tuple[Any, Any, Any, str]] = {
    "retry": (
        discarded_run,
        lambda s: s.admin.Retry,
        lambda run_id: admin_service_pb2.RetryRequest(run_id=run_id, node="a", reason="r"),
        "retry",
    ),
    "retry_all": (
        discarded_run,
        lambda s: s.admin.RetryAll,
        lambda run_id: admin_service_pb2.RetryAllRequest(run_id=run_id, reason="r"),
        "retry_all",
    ),
    "resolve_result": (
        blocked_run,
        lambda s: s.admin.Resolve,
        resolve_request("result"),
        "resolve_result",
    ),
    "resolve_error": (
        blocked_run,
        lambda s: s.admin.Resolve,
        resolve_request("error"),
        "resolve_error",
    ),
    "resolve_discard": (
        blocked_run,
        lambda s: s.admin.Resolve,
        resolve_request("discard"),
        "resolve_discard",
    ),
    "cancel": (
        running_run,
        lambda s: s.workflows.CancelRun,
        lambda run_id: workflow_service_pb2.CancelRunRequest(run_id=run_id, reason="r"),
        "cancel",
    ),
}


@pytest.mark.parametrize("action", list(ACTIONS))
def test_an_operator_action_sent_twice_at_once_to_two_servers_applies_once(
    server_factory: Any, database_url: str, action: str
) -> None:
    setup, rpc, request, audited = ACTIONS[action]
    first, second = server_factory(), server_factory()
    runs = [setup(first, i) for i in range(ROUNDS)]
    if setup is blocked_run:
        block_all(first, runs)

    calls = [(server, run_id) for run_id in runs for server in (first, second)]
    start = threading.Barrier(len(calls))

    def send(call: tuple[Any, str]) -> Any:
        """OK, or (code, details) of the refusal."""
        server, run_id = call
        start.wait()
        try:
            rpc(server)(request(run_id), timeout=30)
            return grpc.StatusCode.OK
        except grpc.RpcError as error:
            return error.code(), error.details()

    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(send, calls))

    for k, run_id in enumerate(runs):
        pair = answers[2 * k : 2 * k + 2]
        ok = [a for a in pair if a == grpc.StatusCode.OK]
        refused = [a for a in pair if a != grpc.StatusCode.OK]
        assert len(ok) == 1, f"{action} on run {run_id}: answers {pair}"
        [(code, details)] = refused
        assert code == grpc.StatusCode.FAILED_PRECONDITION, (code, details)
        assert details, "a refusal says why"
        [(count,)] = first.sql(
            "SELECT count(*) FROM cyclone.audit WHERE run_id = %s AND action = %s",
            run_id,
            audited,
        )
        assert count == 1, f"{action} on run {run_id} audited {count} times"

    with psycopg.connect(database_url, autocommit=True) as conn:
        assert_database_invariants(conn)
