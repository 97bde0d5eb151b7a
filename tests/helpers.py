"""Small builders for the core tests, which speak the raw protobuf API."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NoReturn

import grpc
import pytest
from google.protobuf import duration_pb2, json_format, struct_pb2

from cyclone.v1 import types_pb2, worker_service_pb2, workflow_service_pb2

#: Upper bound of any wait in the tests; reached only when something is broken.
PATIENCE = 20.0


def eventually(
    check: Callable[[], Any],
    what: str,
    timeout: float = PATIENCE,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``, with what
    ``detail`` says then (a process's log, say)."""
    end = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > end:
            said = f"\n{detail()}" if detail is not None else ""
            pytest.fail(f"timed out waiting for {what}{said}")
        time.sleep(0.02)


def missing_tool(reason: str) -> NoReturn:
    """Stop a test that needs a tool this machine lacks (grpcurl, Go, Node.js, Chromium).

    `make test` skips it, with ``reason`` in the summary. `make test-all` sets
    CYCLONE_TEST_ALL=1 to run everything, and there the missing tool fails the test."""
    if os.environ.get("CYCLONE_TEST_ALL") == "1":
        pytest.fail(f"{reason} (CYCLONE_TEST_ALL=1: every test must run)", pytrace=False)
    pytest.skip(reason)


def value(obj: Any) -> struct_pb2.Value:
    return json_format.ParseDict(obj, struct_pb2.Value())


def seconds(s: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(s * 1e9))
    return d


RULES = {
    "all_success": types_pb2.TRIGGER_RULE_ALL_SUCCESS,
    "all_done": types_pb2.TRIGGER_RULE_ALL_DONE,
    "one_failed": types_pb2.TRIGGER_RULE_ONE_FAILED,
}


def node(
    name: str,
    action: str = "work",
    deps: tuple[str, ...] | list[str] = (),
    *,
    rule: str = "all_success",
    max_attempts: int = 3,
    backoff: float | None = None,
    timeout: float | None = None,
    input: Any = None,
) -> types_pb2.Node:
    n = types_pb2.Node(name=name, action=action, depends_on=list(deps), trigger_rule=RULES[rule])
    n.retry.max_attempts = max_attempts
    if backoff is not None:
        n.retry.initial_backoff.CopyFrom(seconds(backoff))
        n.retry.max_backoff.CopyFrom(seconds(max(backoff, 1)))
    if timeout is not None:
        n.timeout.CopyFrom(seconds(timeout))
    if input is not None:
        n.input.CopyFrom(value(input))
    return n


def workflow(name: str, *nodes: types_pb2.Node) -> types_pb2.Workflow:
    return types_pb2.Workflow(name=name, nodes=list(nodes))


def submit(server: Any, wf: types_pb2.Workflow, input: Any = None) -> str:
    request = workflow_service_pb2.SubmitRequest(workflow=wf)
    if input is not None:
        request.input.CopyFrom(value(input))
    return server.workflows.Submit(request).run_id


def claim(
    server: Any,
    *actions: str,
    n: int = 10,
    wait: float = 0,
    unsafe: tuple[str, ...] = (),
    lease: float | None = None,
    worker: str = "test-worker",
) -> list[worker_service_pb2.ClaimedStep]:
    request = worker_service_pb2.ClaimRequest(
        worker_id=worker,
        actions=[
            worker_service_pb2.ActionSpec(name=a, unsafe_to_repeat=a in unsafe)
            for a in (actions or ("work",))
        ],
        max_steps=n,
    )
    if wait:
        request.wait.CopyFrom(seconds(wait))
    if lease is not None:
        request.lease.CopyFrom(seconds(lease))
    return list(server.workers.Claim(request, timeout=wait + 30).steps)


def complete(server: Any, step: Any, output: Any = None) -> worker_service_pb2.CompleteResponse:
    return server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token, output=value(output)
        )
    )


def fail(
    server: Any,
    step: Any,
    message: str = "boom",
    *,
    non_retryable: bool = False,
    retry_after: float | None = None,
) -> worker_service_pb2.CompleteResponse:
    failure = worker_service_pb2.Failure(
        message=message, type="RuntimeError", non_retryable=non_retryable
    )
    if retry_after is not None:
        failure.retry_after.CopyFrom(seconds(retry_after))
    return server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token, failure=failure
        )
    )


def get_run(server: Any, run_id: str) -> types_pb2.Run:
    return server.workflows.GetRun(workflow_service_pb2.GetRunRequest(run_id=run_id)).run


def statuses(run: types_pb2.Run) -> dict[str, str]:
    """{node: "completed"} for every step of a run."""
    return {
        s.node: types_pb2.StepStatus.Name(s.status).removeprefix("STEP_STATUS_").lower()
        for s in run.steps
    }


def run_status(run: types_pb2.Run) -> str:
    return types_pb2.RunStatus.Name(run.status).removeprefix("RUN_STATUS_").lower()


def drain(server: Any, *actions: str, output: Any = None) -> list[str]:
    """Claim and complete until nothing is ready; returns the nodes in completion order."""
    done = []
    while steps := claim(server, *actions, n=100):
        for step in steps:
            complete(server, step, output if output is not None else {"node": step.node})
            done.append(step.node)
    return done


def rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def table_counts(server: Any) -> dict[str, int]:
    tables = ("runs", "steps", "step_errors", "audit", "submit_keys")
    return {t: server.sql(f"SELECT count(*) FROM cyclone.{t}")[0][0] for t in tables}
