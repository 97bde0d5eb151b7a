"""What every path that creates a run stores: the workflow validated, its keys
evaluated for the run input (Submit, SubmitOnce, StartChild, schedules)."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any, TypeAlias

from google.protobuf import struct_pb2

from cyclone import dag, flow
from cyclone.v1 import (
    schedule_service_pb2 as schedule_pb,
)
from cyclone.v1 import (
    types_pb2,
)
from cyclone.v1 import (
    worker_service_pb2 as worker_pb,
)
from cyclone.v1 import (
    workflow_service_pb2 as workflow_pb,
)
from service import errors
from service.api import convert
from service.api.validate import seconds
from service.db.runs import BIG_WORKFLOW
from service.engine.waits import EVENT_ACTION, RESERVED_PREFIX, event_node_input


def _node_spec(node: types_pb2.Node, payloads: convert.Payloads) -> dag.NodeSpec:
    retry = node.retry
    defaults = dag.NodeSpec(name=node.name, action=node.action)
    action, node_input = node.action, None
    if node.action.startswith(RESERVED_PREFIX):
        raise dag.InvalidWorkflow(
            f"node {dag.excerpt(node.name)}: action names starting with {RESERVED_PREFIX!r} "
            "are the server's own"
        )
    if node.HasField("event"):
        # Served by the server (service.engine.waits.EventNodes): a reserved action, with the
        # event's name and timeout as the node's input.
        if node.action or node.HasField("input"):
            raise dag.InvalidWorkflow(
                f"node {dag.excerpt(node.name)} waits for an event: it takes no action and no input"
            )
        action = EVENT_ACTION
        node_input = event_node_input(
            node.event.name,
            seconds(node.event.timeout) if node.event.HasField("timeout") else None,
            f"node {dag.excerpt(node.name)}",
        )
    elif node.HasField("input"):
        node_input = payloads.to_python(node.input, f"node {dag.excerpt(node.name)} input")

    def dur(msg: types_pb2.Node | types_pb2.RetryPolicy, field: str, default: float) -> float:
        return seconds(getattr(msg, field)) if msg.HasField(field) else default

    return dag.NodeSpec(
        name=node.name,
        action=action,
        depends_on=tuple(node.depends_on),
        trigger_rule=convert.TRIGGER_RULE.get(node.trigger_rule, f"<{node.trigger_rule}>"),
        max_attempts=retry.max_attempts or defaults.max_attempts,
        initial_backoff_s=dur(retry, "initial_backoff", defaults.initial_backoff_s),
        max_backoff_s=dur(retry, "max_backoff", defaults.max_backoff_s),
        backoff_multiplier=retry.backoff_multiplier or defaults.backoff_multiplier,
        timeout_s=dur(node, "timeout", defaults.timeout_s),
        input=node_input,
        priority=node.priority if node.HasField("priority") else None,
        concurrency_key=node.concurrency.key if node.HasField("concurrency") else None,
        concurrency_limit=node.concurrency.limit if node.HasField("concurrency") else None,
    )


def _keyed(nodes: list[dag.NodeSpec], run_input: Any) -> list[dag.NodeSpec]:
    """The nodes with their concurrency key templates evaluated (docs/flow-control.md)."""
    out = []
    for n in nodes:
        if n.concurrency_key is not None:
            where = f"node {n.name!r}"
            key = flow.KeyTemplate.parse(where, n.concurrency_key).render(where, run_input, n.input)
            if "\x00" in key:
                raise flow.InvalidFlow(f"{where}: concurrency key contains a NUL character")
            n = dataclasses.replace(n, concurrency_key=key)
        out.append(n)
    return out


def start_time(
    request: workflow_pb.SubmitRequest | workflow_pb.SubmitOnceRequest,
) -> datetime | None:
    """The run's start time; INVALID_ARGUMENT past flow.MAX_START_AHEAD_S from now."""
    if not request.HasField("start_at"):
        return None
    start_at = convert.to_datetime(request.start_at, "start_at")
    ahead = (start_at - datetime.now(UTC)).total_seconds()
    if ahead > flow.MAX_START_AHEAD_S:
        raise errors.InvalidArgument(
            f"start_at is {ahead / 86400:.0f} days ahead; the limit is "
            f"{flow.MAX_START_AHEAD_S / 86400:.0f} days"
        )
    return start_at


def deadline_time(
    request: workflow_pb.SubmitRequest | workflow_pb.SubmitOnceRequest,
    start_at: datetime | None,
) -> datetime | None:
    """The run's deadline (None: the workflow's default, if any); INVALID_ARGUMENT when
    it is not in the future, is past flow.MAX_START_AHEAD_S from now, or comes before
    the run's start time."""
    if not request.HasField("deadline"):
        return None
    deadline = convert.to_datetime(request.deadline, "deadline")
    now = datetime.now(UTC)
    if deadline <= now:
        raise errors.InvalidArgument(
            f"deadline {deadline.isoformat()} is not in the future (now {now.isoformat()})"
        )
    ahead = (deadline - now).total_seconds()
    if ahead > flow.MAX_START_AHEAD_S:
        raise errors.InvalidArgument(
            f"deadline is {ahead / 86400:.0f} days ahead; the limit is "
            f"{flow.MAX_START_AHEAD_S / 86400:.0f} days"
        )
    if start_at is not None and deadline <= start_at:
        raise errors.InvalidArgument(
            f"deadline {deadline.isoformat()} is not after start_at {start_at.isoformat()}"
        )
    return deadline


def _validated(
    workflow: types_pb2.Workflow, limits: dag.Limits, payloads: convert.Payloads
) -> list[dag.NodeSpec]:
    """The workflow's nodes, validated; InvalidWorkflow names what is wrong."""
    if len(workflow.nodes) > limits.max_nodes:
        raise dag.InvalidWorkflow(
            f"workflow {dag.excerpt(workflow.name)} has {len(workflow.nodes)} nodes; "
            f"the limit is {limits.max_nodes}"
        )
    # Counted before anything is built from the nodes.
    dag.check_edges(workflow.name, sum(len(n.depends_on) for n in workflow.nodes), limits)
    # Names first, so that a bad name is reported before anything derived from it.
    specs = [_node_spec(n, payloads) for n in workflow.nodes]
    return dag.validate_workflow(workflow.name, specs, limits)


async def _validated_off_loop(
    workflow: types_pb2.Workflow, limits: dag.Limits, payloads: convert.Payloads
) -> list[dag.NodeSpec]:
    """_validated, in a worker thread when the workflow is large, so that a big Submit
    does not hold up the other calls this server is answering."""
    size = len(workflow.nodes) + sum(len(n.depends_on) for n in workflow.nodes)
    if size > BIG_WORKFLOW:
        return await asyncio.to_thread(_validated, workflow, limits, payloads)
    return _validated(workflow, limits, payloads)


@dataclasses.dataclass(frozen=True, slots=True)
class NewRun:
    """A run as it is stored: the validated nodes, each concurrency key evaluated for
    this run input, and the input as JSON text (None when there is none)."""

    nodes: list[dag.NodeSpec]
    input_json: str | None


async def new_run(
    workflow: types_pb2.Workflow,
    run_input: struct_pb2.Value | None,
    limits: dag.Limits,
    payloads: convert.Payloads,
) -> NewRun:
    """What every path that creates a run stores (Submit, SubmitOnce, CreateSchedule
    for its firings, StartChild): the workflow validated and its key templates
    evaluated against ``run_input`` (docs/flow-control.md). InvalidWorkflow, or the
    payload's INVALID_ARGUMENT or RESOURCE_EXHAUSTED, names what is wrong; nothing is
    written before it returns."""
    nodes = await _validated_off_loop(workflow, limits, payloads)
    input_json = None if run_input is None else payloads.to_json(run_input, "run input")
    if any(n.concurrency_key is not None for n in nodes):
        value = None if run_input is None else payloads.to_python(run_input, "run input")
        nodes = _keyed(nodes, value)
    return NewRun(nodes, input_json)


#: The requests that create runs: each has a ``workflow`` and an optional ``input``.
RunRequest: TypeAlias = (
    workflow_pb.SubmitRequest
    | workflow_pb.SubmitOnceRequest
    | worker_pb.StartChildRequest
    | schedule_pb.Schedule
)


async def new_run_of(request: RunRequest, limits: dag.Limits, payloads: convert.Payloads) -> NewRun:
    """new_run of a request's workflow and input."""
    run_input = request.input if request.HasField("input") else None
    return await new_run(request.workflow, run_input, limits, payloads)
