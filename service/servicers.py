"""The gRPC servicers: protobuf in, domain calls, protobuf out. No SQL here.

Servicers raise domain errors (service.errors) and let :func:`service.errors.rpc`
answer them; a workflow the shared validator refuses (cyclone.dag.InvalidWorkflow)
is left to it too."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeAlias, TypeVar

import grpc
from google.protobuf import duration_pb2, struct_pb2

from cyclone import dag, flow
from cyclone.v1 import (
    admin_service_pb2 as admin_pb,
)
from cyclone.v1 import (
    admin_service_pb2_grpc as admin_grpc,
)
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
    worker_service_pb2_grpc as worker_grpc,
)
from cyclone.v1 import (
    workflow_service_pb2 as workflow_pb,
)
from cyclone.v1 import (
    workflow_service_pb2_grpc as workflow_grpc,
)
from service import auth, convert, errors, wire
from service.activity import ActionActivity, Handouts
from service.api.ids import CANONICAL_UUID, parse_uuid, uuid_text
from service.config import Settings
from service.db import Database
from service.db.completion import Report, StepCallEnd, StepCallKey
from service.db.records import (
    ClaimedStep,
    Completion,
    Failure,
    Outcome,
    Refused,
    StepCallBegun,
    StepJson,
)
from service.db.runs import BIG_WORKFLOW, LogRow, RunRow, RunSummary
from service.db.waits import WaitKey
from service.errors import rpc, stream_rpc
from service.explain import explain
from service.metrics import Metrics
from service.notify import Dispatcher
from service.waits import EVENT_ACTION, RESERVED_PREFIX, event_node_input, event_wait

log = logging.getLogger("cyclone")

T = TypeVar("T")

MAX_WORKER_ID = 200
MAX_REASON = 2000
MAX_ERROR_TEXT = 64 * 1024
#: Longest step_id and function name of a step call, and the largest seq.
MAX_STEP_CALL_NAME = 200
MAX_STEP_CALL_SEQ = 100_000
#: Most actions one Claim may name.
MAX_CLAIM_ACTIONS = 1000
#: The function a child run's step call is journaled under (StartChild).
CHILD_FUNCTION = "cyclone.start_child"


def _seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def _text(value: str, what: str, limit: int) -> str:
    if len(value) > limit:
        raise errors.InvalidArgument(f"{what} is {len(value)} characters; the limit is {limit}")
    if "\x00" in value:
        raise errors.InvalidArgument(f"{what} contains a NUL character")
    return value


Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


def _actor(context: Context) -> str:
    """Who to name in audit entries: the authenticated caller when auth is on."""
    identity = auth.caller.get()
    if identity is not None:
        return identity.name
    for key, value in context.invocation_metadata() or ():
        if key == "cyclone-actor" and value:
            return _text(str(value), "cyclone-actor metadata", 200)
    return context.peer() or "unknown"


def _step_call_name(value: str, what: str) -> str:
    """A step call's step_id or function: 1 to 200 printable characters."""
    if not value:
        raise errors.InvalidArgument(f"{what} is required")
    if len(value) > MAX_STEP_CALL_NAME:
        raise errors.InvalidArgument(
            f"{what} is {len(value)} characters; the limit is {MAX_STEP_CALL_NAME}"
        )
    if not value.isprintable():
        raise errors.InvalidArgument(
            f"{what} {dag.excerpt(value)} holds a control or other unprintable character"
        )
    return value


#: Most node names WorkerServicer keeps as checked (node_names).
_MAX_NODE_NAMES = 10_000


def _node_name(value: str) -> str:
    dag.check_name("node", value)
    return value


def _payloads(settings: Settings) -> convert.Payloads:
    return convert.Payloads(settings.max_payload_bytes, settings.max_json_depth)


def _limits(settings: Settings) -> dag.Limits:
    """The workflow limits of this server (--max-nodes and the others)."""
    return dag.Limits(
        settings.max_nodes, settings.max_dependencies, settings.max_dependents, settings.max_edges
    )


def _page_size(asked: int) -> int:
    """A List call's page size: 1 to 1000, 50 when not given."""
    size = asked or 50
    if not 1 <= size <= 1000:
        raise errors.InvalidArgument(f"page_size must be between 1 and 1000, got {size}")
    return size


def _run_head(row: RunRow | RunSummary) -> types_pb2.Run:
    """A run without its steps."""
    run = types_pb2.Run(
        run_id=str(row.run_id),
        workflow=row.workflow,
        status=convert.RUN_STATUS[row.status],
        submit_key=row.submit_key or "",
        created_at=convert.timestamp(row.created_at),
        updated_at=convert.timestamp(row.updated_at),
        finished_at=convert.timestamp(row.finished_at),
        parent_run_id=str(row.parent_run_id or ""),
        parent_node=row.parent_node or "",
        parent_step_id=row.parent_step_id or "",
    )
    convert.set_json(run, "input", row.input)
    if row.error:
        e = row.error
        run.error.CopyFrom(
            types_pb2.RunError(
                kind=e.get("kind", ""),
                message=e.get("message", ""),
                node=e.get("node", ""),
                attempt=e.get("attempt") or 0,
                started_at=convert.timestamp(e.get("started_at")),
                step_id=e.get("step_id", ""),
            )
        )
    return run


def _run_summary(row: RunSummary) -> types_pb2.Run:
    """A run as ListRuns shows it: its step counts, not its steps."""
    run = _run_head(row)
    for status, n in (row.step_counts or {}).items():
        run.step_counts[status] = n
    return run


def _step_error(e: Mapping[str, Any]) -> types_pb2.StepError:
    """One recorded error of a step, as read from cyclone.step_errors (Explain's rows
    carry no details nor retryable)."""
    return types_pb2.StepError(
        attempt=e["attempt"],
        kind=e["kind"],
        type=e["type"],
        message=e["message"],
        details=e.get("details", ""),
        retryable=e.get("retryable", False),
        at=convert.timestamp(e["at"]),
    )


def _step_proto(s: StepJson, step_errors: list[types_pb2.StepError]) -> types_pb2.Step:
    """One step as GetRun shows it (with its journal when the row has one)."""
    step = types_pb2.Step(
        node=s["node"],
        action=s["action"],
        status=convert.STEP_STATUS[s["status"]],
        attempt=s["attempt"],
        max_attempts=s["max_attempts"],
        depends_on=s["depends_on"],
        trigger_rule=convert.TRIGGER_RULE_ENUM[s["trigger_rule"]],
        errors=step_errors,
        worker_id=s["worker_id"] or "",
        lease_expires_at=convert.timestamp(s["lease_expires_at"]),
        available_at=convert.timestamp(s["available_at"]),
        started_at=convert.timestamp(s["started_at"]),
        finished_at=convert.timestamp(s["finished_at"]),
        effect_uncertain=s["effect_uncertain"],
        last_heartbeat_at=convert.timestamp(s["last_heartbeat_at"]),
        resumes=s["resumes"],
        waiting_for=s["waiting_for"] or "",
        priority=s["priority"],
        concurrency_key=s["concurrency_key"] or "",
    )
    step.timeout.FromNanoseconds(int(float(s["timeout_s"]) * 1e9))
    for field in ("input", "output", "progress"):
        convert.set_json(step, field, s[field])
    step.journal.extend(convert.step_call(j) for j in s.get("journal") or ())
    return step


def _run_proto(row: RunRow) -> types_pb2.Run:
    """A run with its steps, their errors and its audit trail."""
    run = _run_head(row)
    run.priority = row.priority
    if row.start_at is not None:
        run.start_at.FromDatetime(row.start_at)
    errors_by_node: dict[str, list[types_pb2.StepError]] = {}
    for e in row.errors:
        errors_by_node.setdefault(e["node"], []).append(_step_error(e))
    for s in row.steps:
        step = _step_proto(s, errors_by_node.get(s["node"], []))
        run.steps.append(step)
        run.step_counts[s["status"]] = run.step_counts[s["status"]] + 1
    for a in row.audit:
        entry = types_pb2.AuditEntry(
            action=a["action"],
            node=a["node"],
            actor=a["actor"],
            reason=a["reason"],
            at=convert.timestamp(a["at"]),
        )
        convert.set_json(entry, "details", a["details"])
        run.audit.append(entry)
    return run


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
        # Served by the server (service.waits.EventNodes): a reserved action, with the
        # event's name and timeout as the node's input.
        if node.action or node.HasField("input"):
            raise dag.InvalidWorkflow(
                f"node {dag.excerpt(node.name)} waits for an event: it takes no action and no input"
            )
        action = EVENT_ACTION
        node_input = event_node_input(
            node.event.name,
            _seconds(node.event.timeout) if node.event.HasField("timeout") else None,
            f"node {dag.excerpt(node.name)}",
        )
    elif node.HasField("input"):
        node_input = payloads.to_python(node.input, f"node {dag.excerpt(node.name)} input")

    def dur(msg: types_pb2.Node | types_pb2.RetryPolicy, field: str, default: float) -> float:
        return _seconds(getattr(msg, field)) if msg.HasField(field) else default

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


def _start_at(
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


class WorkflowServicer(workflow_grpc.WorkflowServiceServicer):
    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: Metrics,
        report_activity: Callable[[], Awaitable[None]],
    ) -> None:
        self.db = db
        self.settings = settings
        self.limits = _limits(settings)
        self.payloads = _payloads(settings)
        self.metrics = metrics
        # Writes this server's latest news of workers first, so that Explain on a
        # single server is exact; other servers' news is at most a few seconds old.
        self.report_activity = report_activity

    async def _submit(
        self,
        request: workflow_pb.SubmitRequest | workflow_pb.SubmitOnceRequest,
        key: str | None,
    ) -> tuple[uuid.UUID, bool]:
        if not request.HasField("workflow"):
            raise errors.InvalidArgument("workflow is required")
        flow.check_priority("run", request.priority)
        start_at = _start_at(request)
        run = await new_run_of(request, self.limits, self.payloads)
        nodes = run.nodes
        run_id, created = await self.db.runs.run_submit(
            workflow=request.workflow.name,
            nodes=nodes,
            input_json=run.input_json,
            submit_key=key,
            start_at=start_at,
            priority=request.priority,
        )
        if created:
            self.metrics.submitted.labels(request.workflow.name).inc()
            log.info(
                "run %s submitted (workflow %s, %d nodes)",
                run_id,
                request.workflow.name,
                len(nodes),
                extra={"run_id": str(run_id), "workflow": request.workflow.name},
            )
        return run_id, created

    @rpc
    async def Submit(
        self, request: workflow_pb.SubmitRequest, context: Context
    ) -> workflow_pb.SubmitResponse:
        run_id, _ = await self._submit(request, None)
        return workflow_pb.SubmitResponse(run_id=str(run_id))

    @rpc
    async def SubmitOnce(
        self, request: workflow_pb.SubmitOnceRequest, context: Context
    ) -> workflow_pb.SubmitOnceResponse:
        dag.check_submit_key(request.key)
        run_id, created = await self._submit(request, request.key)
        return workflow_pb.SubmitOnceResponse(run_id=str(run_id), created=created)

    @rpc
    async def GetRun(
        self, request: workflow_pb.GetRunRequest, context: Context
    ) -> workflow_pb.GetRunResponse:
        run_id = parse_uuid(request.run_id)
        row = await self.db.runs.run_get(run_id)
        run = _run_proto(row)
        if request.logs:
            by_node: dict[str, list[types_pb2.LogLine]] = {}
            for line in await self.db.runs.step_logs(run_id):
                by_node.setdefault(line.node, []).append(_log_line(line))
            for step in run.steps:
                step.logs.extend(by_node.get(step.node, ()))
        return workflow_pb.GetRunResponse(run=run)

    @rpc
    async def ListRuns(
        self, request: workflow_pb.ListRunsRequest, context: Context
    ) -> workflow_pb.ListRunsResponse:
        size = _page_size(request.page_size)
        filters = _run_filters(request)
        after = _decode_page_token(request.page_token) if request.page_token else None
        rows = await self.db.runs.runs_list(**filters, after=after, limit=size + 1)
        page = rows[:size]
        token = ""
        if len(rows) > size:
            last = page[-1]
            token = _encode_page_token(last.created_at, last.run_id)
        return workflow_pb.ListRunsResponse(
            runs=[_run_summary(r) for r in page], next_page_token=token
        )

    @rpc
    async def CountRuns(
        self, request: workflow_pb.CountRunsRequest, context: Context
    ) -> workflow_pb.CountRunsResponse:
        limit = request.limit or DEFAULT_COUNT_LIMIT
        if not 1 <= limit <= MAX_COUNT_LIMIT:
            raise errors.InvalidArgument(
                f"limit must be between 1 and {MAX_COUNT_LIMIT:,}, got {limit}"
            )
        filters = _run_filters(request)
        statuses = filters.pop("statuses") or list(convert.RUN_STATUS)
        counted = await self.db.runs.runs_count(**filters, statuses=statuses, limit=limit + 1)
        return workflow_pb.CountRunsResponse(
            counts=[
                workflow_pb.RunCount(
                    status=convert.RUN_STATUS[status],
                    count=min(counted[status], limit),
                    at_least=counted[status] > limit,
                )
                for status in convert.RUN_STATUS
                if status in statuses
            ]
        )

    @rpc
    async def ListSteps(
        self, request: workflow_pb.ListStepsRequest, context: Context
    ) -> workflow_pb.ListStepsResponse:
        size = _page_size(request.page_size)
        running = request.status == types_pb2.STEP_STATUS_RUNNING
        if request.backing_off:
            if request.status not in (
                types_pb2.STEP_STATUS_UNSPECIFIED,
                types_pb2.STEP_STATUS_AVAILABLE,
            ):
                raise errors.InvalidArgument(
                    "backing_off lists available steps; it cannot be combined with status "
                    + types_pb2.StepStatus.Name(request.status)
                )
            if request.lease_expired:
                raise errors.InvalidArgument("lease_expired applies to running steps only")
        elif not running:
            raise errors.InvalidArgument(
                "status must be STEP_STATUS_RUNNING, or set backing_off for the available "
                "steps backing off; other steps are listed per run (GetRun)"
            )
        for value, what in ((request.worker_id, "worker_id"), (request.action, "action")):
            if value:
                _text(value, what, MAX_FILTER)
        after = _decode_position(request.page_token) if request.page_token else None
        rows = await self.db.steps.steps_list(
            kind="running" if running else "backing_off",
            lease_expired=request.lease_expired,
            worker_id=request.worker_id or None,
            action=request.action or None,
            after=after,
            limit=size + 1,
        )
        page = rows[:size]
        token = ""
        if len(rows) > size:
            last = page[-1]
            token = _encode_page_token(last.at, last.run_id, last.step["node"])
        return workflow_pb.ListStepsResponse(
            steps=[
                workflow_pb.RunStep(
                    run_id=str(r.run_id),
                    workflow=r.workflow,
                    step=_step_proto(r.step, [_step_error(e) for e in r.errors]),
                )
                for r in page
            ],
            next_page_token=token,
        )

    @rpc
    async def ListWorkers(
        self, request: workflow_pb.ListWorkersRequest, context: Context
    ) -> workflow_pb.ListWorkersResponse:
        await self.report_activity()
        running, actions = await self.db.workers.workers_list()
        workers: dict[str, workflow_pb.WorkerSummary] = {}
        by_action: dict[str, int] = {}
        for r in running:
            by_action[r.action] = by_action.get(r.action, 0) + r.running
            w = workers.get(r.worker_id)
            if w is None:
                if len(workers) == MAX_WORKERS_LISTED:
                    continue
                w = workers[r.worker_id] = workflow_pb.WorkerSummary(worker_id=r.worker_id)
            w.actions.append(r.action)
            w.running += r.running
            w.lease_expired += r.lease_expired
            beat = r.last_heartbeat_at
            if beat is not None and (
                not w.HasField("last_heartbeat_at") or beat > w.last_heartbeat_at.ToDatetime(UTC)
            ):
                w.last_heartbeat_at.FromDatetime(beat)
        return workflow_pb.ListWorkersResponse(
            workers=list(workers.values()),
            actions=[
                workflow_pb.ActionActivity(
                    action=a.action,
                    last_polled_at=convert.timestamp(a.polled_at),
                    last_polled_by=a.polled_by or "",
                    last_claimed_at=convert.timestamp(a.claimed_at),
                    last_claimed_by=a.claimed_by or "",
                    ready_ahead=a.ready_count,
                    running=by_action.get(a.action, 0),
                )
                for a in actions
            ],
        )

    @rpc
    async def CancelRun(
        self, request: workflow_pb.CancelRunRequest, context: Context
    ) -> workflow_pb.CancelRunResponse:
        run_id = parse_uuid(request.run_id)
        reason = _text(request.reason, "reason", MAX_REASON)
        await self.db.operator.run_cancel(
            run_id, actor=_actor(context), reason=reason, keep_children=request.keep_children
        )
        log.info(
            "run %s cancelled%s",
            run_id,
            " (its child runs kept)" if request.keep_children else "",
            extra={"run_id": str(run_id)},
        )
        row = await self.db.runs.run_get(run_id)
        return workflow_pb.CancelRunResponse(run=_run_proto(row))

    @rpc
    async def SendEvent(
        self, request: workflow_pb.SendEventRequest, context: Context
    ) -> workflow_pb.SendEventResponse:
        run_id = parse_uuid(request.run_id)
        name = _step_call_name(request.name, "name")
        key = _step_call_name(request.key, "key") if request.key else None
        payload = self.payloads.optional_json(request, "payload", "payload")
        sent = await self.db.waits.event_send(
            run_id, name, payload_json=payload, key=key, actor=_actor(context)
        )
        log.info(
            "run %s: event %s %s (id %d)",
            run_id,
            name,
            "sent" if sent.created else "already sent with this key",
            sent.event_id,
            extra={"run_id": str(run_id)},
        )
        return workflow_pb.SendEventResponse(event_id=sent.event_id, created=sent.created)

    @rpc
    async def Explain(
        self, request: workflow_pb.ExplainRequest, context: Context
    ) -> workflow_pb.ExplainResponse:
        run_id = parse_uuid(request.run_id)
        node = _node_name(request.node)
        await self.report_activity()
        row = await self.db.runs.step_explain(run_id, node)
        why = explain(row)
        run = await self.db.runs.run_get(run_id, node)
        response = workflow_pb.ExplainResponse(
            reason=EXPLAIN_REASON[why.reason],
            message=why.message,
            run_status=convert.RUN_STATUS[row.run_status],
        )
        proto = _run_proto(run)
        response.step.CopyFrom(proto.steps[0])
        if proto.HasField("error"):
            response.run_error.CopyFrom(proto.error)
        for u in why.upstream:
            state = workflow_pb.NodeState(
                node=u["node"], status=convert.STEP_STATUS[u["status"]], attempt=u["attempt"]
            )
            if e := u.get("error"):
                state.last_error.CopyFrom(_step_error(e))
            response.upstream.append(state)
        if why.about_workers:
            response.action.CopyFrom(
                workflow_pb.ActionActivity(
                    action=row.action,
                    last_polled_at=convert.timestamp(row.polled_at),
                    last_polled_by=row.polled_by or "",
                    last_claimed_at=convert.timestamp(row.claimed_at),
                    last_claimed_by=row.claimed_by or "",
                    ready_ahead=row.ready_ahead or 0,
                    running=row.action_running or 0,
                )
            )
        return response


#: BeginStepCall's decisions by the engine's names.
STEP_CALL_DECISION = {
    "run": worker_pb.STEP_CALL_DECISION_RUN,
    "recorded": worker_pb.STEP_CALL_DECISION_RECORDED,
    "uncertain": worker_pb.STEP_CALL_DECISION_UNCERTAIN,
}

#: Wait's decisions by the engine's names.
WAIT_DECISION = {
    "ready": worker_pb.WAIT_DECISION_READY,
    "suspended": worker_pb.WAIT_DECISION_SUSPENDED,
}

#: Explain's reasons (service.explain) by their names in ExplainReason.
EXPLAIN_REASON = {
    name.removeprefix("EXPLAIN_REASON_").lower(): name
    for name, number in workflow_pb.ExplainReason.items()
    if number
}


def _item(i: int, field: str, parse: Callable[[Any], T], request: Any) -> T:
    """One item of a batch, validated; its errors name it (field[i])."""
    try:
        return parse(request)
    except (errors.CycloneError, dag.InvalidWorkflow) as exc:
        raise type(exc)(f"{field}[{i}]: {exc}") from None


def _refusal(refused: Refused) -> worker_pb.CompleteError:
    """A refused batch item, with the status its single RPC would have answered."""
    error = refused.error
    status = errors.status(error, "CompleteMany")
    answer = worker_pb.CompleteError(code=status.code.value[0], message=status.message)
    if isinstance(error, errors.LeaseLost) and error.current_attempt is not None:
        answer.current_attempt = error.current_attempt
    return answer


#: CountRuns counts each status exactly up to its limit: this one by default, at most
#: MAX_COUNT_LIMIT (each count reads up to limit + 1 index entries).
DEFAULT_COUNT_LIMIT = 1000
MAX_COUNT_LIMIT = 100_000
#: Longest worker_id or action a ListSteps filter takes.
MAX_FILTER = 200
#: ListWorkers' most workers.
MAX_WORKERS_LISTED = 1000


def _run_filters(
    request: workflow_pb.ListRunsRequest | workflow_pb.CountRunsRequest,
) -> dict[str, Any]:
    """ListRuns' and CountRuns' filters, validated, as the store takes them."""
    if len(request.statuses) > len(convert.RUN_STATUS):
        raise errors.InvalidArgument(
            f"statuses names {len(request.statuses)} statuses; there are {len(convert.RUN_STATUS)}"
        )
    statuses = []
    for s in request.statuses:
        if s not in convert.RUN_STATUS_NAME:
            raise errors.InvalidArgument(f"unknown run status {s} in statuses")
        statuses.append(convert.RUN_STATUS_NAME[s])
    if request.workflow:
        dag.check_name("workflow", request.workflow)
    if request.key:
        dag.check_submit_key(request.key)
    return {
        "workflow": request.workflow or None,
        "statuses": statuses or None,
        "created_after": (
            convert.to_datetime(request.created_after, "created_after")
            if request.HasField("created_after")
            else None
        ),
        "created_before": (
            convert.to_datetime(request.created_before, "created_before")
            if request.HasField("created_before")
            else None
        ),
        "key": request.key or None,
    }


def _encode_page_token(at: datetime, run_id: uuid.UUID, node: str | None = None) -> str:
    """A position in a list: a run's (created_at, run_id), or a step's (time, run_id,
    node)."""
    parts = [at.isoformat(), str(run_id)] + ([node] if node is not None else [])
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode()


#: Longer than any token this server issues (about 100 characters).
MAX_PAGE_TOKEN = 256


def _decode_page_token(token: str) -> tuple[datetime, uuid.UUID]:
    """The run a ListRuns page token names."""
    at, run_id, _ = _decode_position(token, node=False)
    return at, run_id


def _decode_position(token: str, *, node: bool = True) -> tuple[datetime, uuid.UUID, str]:
    """The position a page token names (a step's with ``node``; else node is "").
    Anything this server did not issue (too long, not base64, not a JSON list of two
    strings, or three for a step, a naive time, not a UUID) is INVALID_ARGUMENT, and a
    token is never parsed past its length limit."""
    bad = errors.InvalidArgument("page_token is not one this server issued")
    if len(token) > MAX_PAGE_TOKEN:
        raise bad
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
        if not (
            isinstance(decoded, list)
            and len(decoded) == (3 if node else 2)
            and all(isinstance(part, str) for part in decoded)
        ):
            raise bad
        at = datetime.fromisoformat(decoded[0])
        if at.tzinfo is None:
            raise bad
        return at, uuid.UUID(decoded[1]), decoded[2] if node else ""
    except (ValueError, TypeError, UnicodeError, RecursionError):
        raise bad from None


class Claimer(NamedTuple):
    """Who claims, and what: a Claim's (or a Work stream's) worker and actions, checked."""

    worker_id: str
    actions: list[str]
    #: The actions the worker marks unsafe_to_repeat.
    unsafe: list[str]
    #: The actions it declares rate limited: (count, period_s).
    rates: dict[str, tuple[int, float]]
    lease_s: float


def _rare_parts(r: ClaimedStep) -> worker_pb.ClaimedStep | None:
    """The parts of a claimed step that service.wire leaves to the Python API (its
    upstream failures and journal), or None when it has none."""
    if not r.upstream_failures and not r.journal:
        return None
    step = worker_pb.ClaimedStep()
    for u in r.upstream_failures or ():
        failure = step.upstream_failures.add(
            node=u["node"], status=convert.STEP_STATUS[u["status"]]
        )
        if (e := u["error"]) is not None:
            failure.error.CopyFrom(_step_error(e))
    step.journal.extend(convert.step_call(j) for j in r.journal or ())
    return step


class WorkerServicer(worker_grpc.WorkerServiceServicer):
    def __init__(
        self,
        db: Database,
        dispatcher: Dispatcher,
        settings: Settings,
        metrics: Metrics,
        activity: ActionActivity,
        handouts: Handouts,
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.settings = settings
        self.metrics = metrics
        self.activity = activity
        self.handouts = handouts
        self.payloads = _payloads(settings)
        self.limits = _limits(settings)
        self.stopping = asyncio.Event()
        # The finished-runs counter by final status: labels() costs a lock per call.
        self.finished: dict[str, Any] = {}
        # Node names already found valid (dag.check_name), so that a step's outcome
        # need not check its node's name again; at most _MAX_NODE_NAMES of them.
        self.node_names: set[str] = set()

    def _lease(self, requested: duration_pb2.Duration | None) -> float:
        if requested is None:
            return self.settings.lease_s
        lease = _seconds(requested)
        if not 1.0 <= lease <= self.settings.max_lease_s:
            raise errors.InvalidArgument(
                f"lease must be between 1s and {self.settings.max_lease_s:g}s, got {lease:g}s"
            )
        return lease

    def _claimer(
        self,
        worker_id: str,
        specs: Sequence[worker_pb.ActionSpec],
        lease: duration_pb2.Duration | None,
    ) -> Claimer:
        """Who claims and what, validated (ClaimRequest's and WorkOpen's fields)."""
        worker_id = _text(worker_id, "worker_id", MAX_WORKER_ID)
        if not worker_id:
            raise errors.InvalidArgument("worker_id is required")
        if not specs:
            raise errors.InvalidArgument("actions must name at least one action")
        if len(specs) > MAX_CLAIM_ACTIONS:
            raise errors.InvalidArgument(
                f"actions names {len(specs)} actions; the limit is {MAX_CLAIM_ACTIONS}"
            )
        actions, unsafe = [], []
        rates: dict[str, tuple[int, float]] = {}
        for spec in specs:
            dag.check_name("action", spec.name)
            if spec.name.startswith(RESERVED_PREFIX):
                raise errors.InvalidArgument(
                    f"action {spec.name!r}: names starting with {RESERVED_PREFIX!r} are "
                    "served by the server itself"
                )
            actions.append(spec.name)
            if spec.unsafe_to_repeat:
                unsafe.append(spec.name)
            if spec.HasField("rate_limit"):
                period = (
                    _seconds(spec.rate_limit.period) if spec.rate_limit.HasField("period") else 0.0
                )
                where = f"action {spec.name!r}"
                flow.check_rate_limit(where, spec.rate_limit.count, period)
                # The first declaration of an action counts, as for the rest of its spec.
                rates.setdefault(spec.name, (spec.rate_limit.count, period))
        return Claimer(worker_id, actions, unsafe, rates, self._lease(lease))

    @rpc
    async def Claim(
        self, request: worker_pb.ClaimRequest, context: Context
    ) -> worker_pb.ClaimResponse:
        who = self._claimer(
            request.worker_id, request.actions, request.lease if request.HasField("lease") else None
        )
        worker_id, actions, unsafe, rates, lease = who
        limit = request.max_steps or 1
        if not 1 <= limit <= self.settings.max_claim_batch:
            raise errors.InvalidArgument(
                f"max_steps must be between 1 and {self.settings.max_claim_batch}, got {limit}"
            )
        wait = _seconds(request.wait) if request.HasField("wait") else 0.0
        if not 0 <= wait <= self.settings.max_wait_s:
            raise errors.InvalidArgument(
                f"wait must be between 0s and {self.settings.max_wait_s:g}s, got {wait:g}s"
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        waiting = False
        try:
            while True:
                with self.dispatcher.subscribe(actions) as ready:
                    self.activity.polled(actions, worker_id)
                    rows = await self._claim(worker_id, actions, unsafe, limit, lease, rates)
                    blocked = [r for r in rows if self._blocked(r)]
                    steps = [r for r in rows if not r.blocked]
                    if steps:
                        self._handed_out(steps, lease)
                        self.activity.claimed({r.action for r in steps}, worker_id)
                    remaining = deadline - loop.time()
                    if steps or blocked or remaining <= 0 or self.stopping.is_set():
                        response = wire.claim_response(steps, _rare_parts)
                        if blocked:
                            response.blocked.extend(await self._blocked_steps(blocked))
                        return response
                    if not waiting:
                        waiting = True
                        self.metrics.waiting_claims.inc()
                    due = await self.db.steps.step_next_due(actions)
                    # The wake-up is the notification; the timeout only covers backoffs
                    # coming due, and is a safety net (--claim-recheck) should a
                    # notification ever be missed.
                    recheck = self.settings.claim_recheck_s
                    timeout = min(remaining, recheck if due is None else max(due, 0.001))
                    # Awaited directly, not through a task: a wake-up resumes this claim
                    # in one turn of the event loop. A stopping server wakes every waiter.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(timeout):
                            await ready.wait()
        finally:
            if waiting:
                self.metrics.waiting_claims.dec()

    async def _claim(
        self,
        worker_id: str,
        actions: list[str],
        unsafe: list[str],
        limit: int,
        lease: float,
        rates: Mapping[str, tuple[int, float]],
    ) -> Sequence[ClaimedStep]:
        """Claim, and if the caller goes away meanwhile, hand the steps back at once
        rather than leave them leased to nobody until the lease runs out."""
        claim = asyncio.ensure_future(
            self.db.steps.step_claim(
                worker_id=worker_id,
                actions=actions,
                unsafe=unsafe,
                limit=limit,
                lease_s=lease,
                rates=rates,
            )
        )
        try:
            return await asyncio.shield(claim)
        except asyncio.CancelledError:
            rows = [r for r in await claim if not r.blocked]
            if rows:
                released = await asyncio.shield(self.db.steps.steps_release(rows))
                log.info("claim cancelled by its caller: %d step(s) handed back", released)
                for r in rows:
                    log.info(
                        "step %s/%s handed back: the caller of its claim went away, so "
                        "attempt %d did not start",
                        r.run_id,
                        r.node,
                        r.attempt,
                        extra={"run_id": str(r.run_id), "node": r.node, "attempt": r.attempt},
                    )
            raise

    def _handed_out(self, rows: Sequence[ClaimedStep], lease: float) -> None:
        """Note the steps handed out (their outcomes are timed and logged with their
        attempt) and count them."""
        debug = log.isEnabledFor(logging.DEBUG)
        now = time.monotonic()
        add = self.handouts.add
        # One claim's steps mostly share their action and lease times: the lifetime
        # (datetime arithmetic) and the action's metrics are looked up once per value.
        lifetimes: dict[tuple[Any, Any], float] = {}
        actions: dict[str, Any] = {}
        claimed: dict[str, int] = {}
        for r in rows:
            times = (r.deadline_at, r.lease_expires_at)
            lifetime = lifetimes.get(times)
            if lifetime is None:
                lifetime = lifetimes[times] = (
                    r.deadline_at - r.lease_expires_at
                ).total_seconds() + lease
            action = r.action
            add(r.lease_token, action, r.attempt, lifetime, now)
            per_action = actions.get(action)
            if per_action is None:
                per_action = actions[action] = self.metrics.action(action)
                claimed[action] = 0
            claimed[action] += 1
            per_action.claim_wait.observe(r.waited_s)
            if debug:
                log.debug(
                    "claimed %s/%s attempt %d",
                    r.run_id,
                    r.node,
                    r.attempt,
                    extra={"run_id": r.run_id, "node": r.node, "attempt": r.attempt},
                )
        for action, n in claimed.items():
            actions[action].claimed.inc(n)

    def _step_key(
        self,
        request: worker_pb.HeartbeatRequest
        | worker_pb.CompleteRequest
        | worker_pb.BeginStepCallRequest
        | worker_pb.EndStepCallRequest
        | worker_pb.StartChildRequest
        | worker_pb.WaitRequest,
    ) -> tuple[str, str, str]:
        """The held step a request names: its run and lease token as canonical text."""
        return (
            uuid_text(request.run_id),
            _node_name(request.node),
            uuid_text(request.lease_token, "lease_token"),
        )

    @rpc
    async def Heartbeat(
        self, request: worker_pb.HeartbeatRequest, context: Context
    ) -> worker_pb.HeartbeatResponse:
        run_id, node, token = self._step_key(request)
        lease = self._lease(request.lease if request.HasField("lease") else None)
        progress = self.payloads.optional_json(request, "progress", "progress")
        row = await self.db.steps.step_heartbeat(
            run_id,
            node,
            token,
            lease_s=lease,
            progress_json=progress,
            logs_json=_logs_json(request),
        )
        return worker_pb.HeartbeatResponse(
            lease_expires_at=convert.timestamp(row.lease_expires_at), cancelled=row.cancelled
        )

    def _step_call(
        self,
        request: worker_pb.BeginStepCallRequest
        | worker_pb.EndStepCallRequest
        | worker_pb.StartChildRequest,
    ) -> StepCallKey:
        """A validated step call of a held step (a child's start: function
        cyclone.start_child)."""
        run_id, node, token = self._step_key(request)
        _check_seq(request.seq)
        if isinstance(request, worker_pb.StartChildRequest):
            function, unsafe = CHILD_FUNCTION, False
        else:
            function = _step_call_name(request.function, "function")
            unsafe = request.unsafe_to_repeat
        return StepCallKey(
            run_id=run_id,
            node=node,
            lease_token=token,
            step_id=_step_call_name(request.step_id, "step_id"),
            seq=request.seq,
            function=function,
            unsafe=unsafe,
        )

    @rpc
    async def StartChild(
        self, request: worker_pb.StartChildRequest, context: Context
    ) -> worker_pb.StartChildResponse:
        parent = self._step_call(request)
        if not request.HasField("workflow"):
            raise errors.InvalidArgument("workflow is required")
        child = await new_run_of(request, self.limits, self.payloads)
        nodes = child.nodes
        try:
            row = await self.db.runs.child_start(
                parent, workflow=request.workflow.name, nodes=nodes, input_json=child.input_json
            )
        except (errors.LeaseLost, errors.NotFound):
            self.metrics.refused.inc()
            raise
        if row.created:
            self.metrics.submitted.labels(request.workflow.name).inc()
            log.info(
                "run %s submitted (workflow %s, %d nodes) as a child of %s/%s, step call %s",
                row.child_run_id,
                request.workflow.name,
                len(nodes),
                parent.run_id,
                parent.node,
                parent.step_id,
                extra={"run_id": str(row.child_run_id), "workflow": request.workflow.name},
            )
        return worker_pb.StartChildResponse(
            child_run_id=str(row.child_run_id),
            created=row.created,
            call=convert.step_call(row.call),
        )

    @rpc
    async def BeginStepCall(
        self, request: worker_pb.BeginStepCallRequest, context: Context
    ) -> worker_pb.BeginStepCallResponse:
        call = self._step_call(request)
        try:
            row = await self.db.reports.step_call_begin(call)
        except (errors.LeaseLost, errors.NotFound):
            self.metrics.refused.inc()
            raise
        return self._begun(call, row)

    @rpc
    async def Wait(
        self, request: worker_pb.WaitRequest, context: Context
    ) -> worker_pb.WaitResponse:
        wait = _wait_key(*self._step_key(request), request)
        try:
            row = await self.db.waits.step_wait(wait)
        except (errors.LeaseLost, errors.NotFound):
            self.metrics.refused.inc()
            raise
        if row.decision == "suspended":
            self.handouts.pop(wait.lease_token)
            log.debug(
                "%s/%s waits (%s): lease given up until %s",
                wait.run_id,
                wait.node,
                row.call["waiting_for"],
                row.call["wake_at"] or "woken",
                extra={"run_id": str(wait.run_id), "node": wait.node},
            )
        return worker_pb.WaitResponse(
            decision=WAIT_DECISION[row.decision], call=convert.step_call(row.call)
        )

    @rpc
    async def EndStepCall(
        self, request: worker_pb.EndStepCallRequest, context: Context
    ) -> worker_pb.EndStepCallResponse:
        end = self._step_call_end(request)
        try:
            row = await self.db.reports.step_call_end(
                end.key, output_json=end.output_json, error_json=end.error_json
            )
        except (errors.LeaseLost, errors.NotFound):
            self.metrics.refused.inc()
            raise
        assert row.call is not None  # only a brief CompleteMany leaves it out
        return worker_pb.EndStepCallResponse(
            call=convert.step_call(row.call), duplicate=row.duplicate
        )

    def _step_call_end(self, request: worker_pb.EndStepCallRequest) -> StepCallEnd:
        """A validated step call end: the call's key and its output or error."""
        call = self._step_call(request)
        outcome = request.WhichOneof("outcome")
        if outcome == "output":
            output = self.payloads.to_json(request.output, "output")
            return StepCallEnd(call, output_json=output, error_json=None)
        if outcome == "error":
            e = request.error
            error = json.dumps(
                {
                    "type": _text(e.type, "error.type", MAX_STEP_CALL_NAME),
                    "message": _text(e.message, "error.message", MAX_ERROR_TEXT),
                    "details": _text(e.details, "error.details", MAX_ERROR_TEXT),
                },
                ensure_ascii=False,
            )
            return StepCallEnd(call, output_json=None, error_json=error)
        raise errors.InvalidArgument("outcome is required: set output or error")

    def _completion(self, request: worker_pb.CompleteRequest) -> Outcome:
        """A validated outcome: the step's key plus its output or failure."""
        run_id, node, token = request.run_id, request.node, request.lease_token
        # What workers send back is canonical UUID text and a node name seen before:
        # one regex match per id and a set lookup; anything else takes the full checks
        # (and their errors).
        if (
            CANONICAL_UUID.fullmatch(run_id) is None
            or CANONICAL_UUID.fullmatch(token) is None
            or node not in self.node_names
        ):
            run_id, node, token = self._step_key(request)
            if len(self.node_names) < _MAX_NODE_NAMES:
                self.node_names.add(node)
        outcome = request.WhichOneof("outcome")
        if outcome == "output":
            output = self.payloads.to_json(request.output, "output")
            logs = _logs_json(request) if request.logs else None
            return Outcome(run_id, node, token, output_json=output, logs_json=logs)
        if outcome == "failure":
            f = request.failure
            retry_after = _seconds(f.retry_after) if f.HasField("retry_after") else None
            if retry_after is not None and not 0 <= retry_after <= dag.MAX_BACKOFF_S:
                raise errors.InvalidArgument(
                    f"retry_after must be between 0s and {dag.MAX_BACKOFF_S:g}s"
                )
            failure = Failure(
                type=_text(f.type, "failure.type", 200),
                message=_text(f.message, "failure.message", MAX_ERROR_TEXT),
                details=_text(f.details, "failure.details", MAX_ERROR_TEXT),
                retryable=not f.non_retryable,
                retry_after_s=retry_after,
                uncertain=f.effect_uncertain,
            )
            return Outcome(run_id, node, token, failure=failure, logs_json=_logs_json(request))
        raise errors.InvalidArgument("outcome is required: set output or failure")

    @rpc
    async def Complete(
        self, request: worker_pb.CompleteRequest, context: Context
    ) -> worker_pb.CompleteResponse:
        outcome = self._completion(request)
        try:
            done = await self.db.reports.step_complete(outcome)
        except (errors.LeaseLost, errors.NotFound):
            self.metrics.refused.inc()
            raise
        if self._outcome(outcome, done):
            _log_outcome(outcome, done, await self._attempt(outcome))
        return _complete_response(done)

    @rpc
    async def CompleteMany(
        self, request: worker_pb.CompleteManyRequest, context: Context
    ) -> worker_pb.CompleteManyResponse:
        return worker_pb.CompleteManyResponse.FromString(await self._report(request))

    async def _report(self, request: worker_pb.CompleteManyRequest) -> bytes:
        """CompleteMany's work: the items checked and applied; the answer serialized."""
        sizes = (
            len(request.completions),
            len(request.step_call_ends),
            len(request.step_call_begins),
        )
        if max(sizes) > 1000 or sum(sizes) == 0:
            raise errors.InvalidArgument(
                "completions, step_call_ends and step_call_begins must hold 0 to 1000 items "
                f"each, at least one in all, got {', '.join(map(str, sizes))}"
            )
        outcomes = [
            _item(i, "completions", self._completion, c) for i, c in enumerate(request.completions)
        ]
        ends = [
            _item(i, "step_call_ends", self._step_call_end, c)
            for i, c in enumerate(request.step_call_ends)
        ]
        begins = [
            _item(i, "step_call_begins", self._step_call, c)
            for i, c in enumerate(request.step_call_begins)
        ]
        response = worker_pb.CompleteManyResponse()
        if ends or begins:
            report = await self.db.reports.step_report_many(
                ends, begins, outcomes, brief=request.brief
            )
            answers = report.completions
            self._report_calls(report, begins, response, brief=request.brief)
        else:
            answers = await self.db.reports.step_complete_many(outcomes)
        results = []
        now = time.monotonic()
        # Runs finished, by status: their counters are incremented once per batch.
        finished: dict[str, int] = {}
        try:
            for outcome, answer in zip(outcomes, answers, strict=True):
                if isinstance(answer, Refused):
                    self.metrics.refused.inc()
                    results.append(_result_bytes(worker_pb.CompleteResult(error=_refusal(answer))))
                    continue
                if self._outcome(outcome, answer, now, finished):
                    _log_outcome(outcome, answer, await self._attempt(outcome))
                results.append(_answer_bytes(answer))
        finally:
            for status, n in finished.items():
                self._finished(status).inc(n)
        # The results, appended as the bytes they serialize to (service.wire): a
        # message's fields may come in any order, a repeated field's items apart.
        results.append(response.SerializeToString())
        return b"".join(results)

    @stream_rpc
    async def Work(
        self, requests: AsyncIterator[worker_pb.WorkRequest], context: Context
    ) -> AsyncIterator[bytes]:
        """A worker's session: claims made as the credit allows, reports answered in
        order (WorkerService.Work in the protos). Yields serialized WorkResponses."""
        stream = aiter(requests)
        request = await anext(stream, None)
        if request is None:
            return
        if not request.HasField("open"):
            raise errors.InvalidArgument("the first message of a Work stream must set open")
        opened = request.open
        who = self._claimer(
            opened.worker_id, opened.actions, opened.lease if opened.HasField("lease") else None
        )
        credit = 0
        reading: asyncio.Future[worker_pb.WorkRequest | None] | None = None
        self.metrics.work_streams.inc()
        try:
            with self.dispatcher.subscribe(who.actions) as ready:
                while True:
                    answer: bytes | None = None
                    if request is not None:
                        if reading is not None and request.HasField("open"):
                            raise errors.InvalidArgument(
                                "open may be set only in the first message of a Work stream"
                            )
                        credit = _credit(credit, request.credit)
                        if request.HasField("report"):
                            answer = await self._report(request.report)
                        request = None
                        # The next request is read meanwhile; its arrival wakes the wait.
                        reading = asyncio.ensure_future(anext(stream, None))
                        reading.add_done_callback(lambda _: ready.set())
                    assert reading is not None
                    if self.stopping.is_set():
                        if answer is not None:
                            yield _work_answer(answer)
                        return
                    steps = b""
                    full = False
                    if credit > 0:
                        # Cleared before the claim: a wake-up while it runs is not lost.
                        ready.clear()
                        limit = min(credit, self.settings.max_claim_batch)
                        try:
                            steps, handed = await self._work_claim(who, limit)
                        except Exception:
                            if answer is not None:  # applied: its answer goes first
                                yield _work_answer(answer)
                            raise
                        credit -= handed
                        full = handed == limit
                    if answer is not None:
                        yield steps + _work_answer(answer)
                    elif steps:
                        yield steps
                    if full and credit > 0:
                        continue  # as many as asked: more may be ready
                    if not reading.done():
                        await self._work_wait(who, ready, reading, credit > 0)
                    if reading.done():
                        request = reading.result()
                        if request is None:
                            return  # the worker closed its side: the session is over
        finally:
            self.metrics.work_streams.dec()
            if reading is not None and not reading.done():
                reading.cancel()

    async def _work_claim(self, who: Claimer, limit: int) -> tuple[bytes, int]:
        """One claim of a Work stream: the serialized steps and blocked runs of a
        WorkResponse, and how many steps it hands out."""
        worker_id, actions, unsafe, rates, lease = who
        self.activity.polled(actions, worker_id)
        rows = await self._claim(worker_id, actions, unsafe, limit, lease, rates)
        blocked = [r for r in rows if self._blocked(r)]
        steps = [r for r in rows if not r.blocked]
        out = b""
        if steps:
            self._handed_out(steps, lease)
            self.activity.claimed({r.action for r in steps}, worker_id)
            out = wire.work_steps(steps, _rare_parts)
        if blocked:
            response = worker_pb.WorkResponse(blocked=await self._blocked_steps(blocked))
            out += response.SerializeToString()
        return out, len(steps)

    async def _work_wait(
        self,
        who: Claimer,
        ready: asyncio.Event,
        reading: asyncio.Future[Any],
        claiming: bool,
    ) -> None:
        """Wait for the next request of a Work stream, and while the worker has credit
        left, for a step to become ready (a notification, or a backoff coming due)."""
        if not claiming:
            ready.clear()
            if not reading.done():
                await ready.wait()  # set by the request's arrival (and by notifications)
            return
        due = await self.db.steps.step_next_due(who.actions)
        recheck = self.settings.claim_recheck_s
        timeout = recheck if due is None else min(recheck, max(due, 0.001))
        self.metrics.waiting_claims.inc()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await ready.wait()
        finally:
            self.metrics.waiting_claims.dec()

    def _report_calls(
        self,
        report: Report,
        begins: list[StepCallKey],
        response: worker_pb.CompleteManyResponse,
        *,
        brief: bool,
    ) -> None:
        """The answers to a CompleteMany's step call ends and begins (``brief``: with
        no entry for an end or a RUN)."""
        for ended in report.ends:
            if isinstance(ended, Refused):
                self.metrics.refused.inc()
                response.step_call_end_results.add(error=_refusal(ended))
            elif brief or ended.call is None:
                response.step_call_end_results.add().response.duplicate = ended.duplicate
            else:
                response.step_call_end_results.add(
                    response=worker_pb.EndStepCallResponse(
                        call=convert.step_call(ended.call), duplicate=ended.duplicate
                    )
                )
        for call, begun in zip(begins, report.begins, strict=True):
            if isinstance(begun, Refused):
                self.metrics.refused.inc()
                response.step_call_begin_results.add(error=_refusal(begun))
            else:
                response.step_call_begin_results.add(response=self._begun(call, begun, brief=brief))

    def _begun(
        self, call: StepCallKey, row: StepCallBegun, *, brief: bool = False
    ) -> worker_pb.BeginStepCallResponse:
        """BeginStepCall's answer (``brief``: a RUN without its entry); an UNCERTAIN one
        ends the node's lease here too."""
        response = worker_pb.BeginStepCallResponse(
            decision=STEP_CALL_DECISION[row.decision],
            run_status=convert.RUN_STATUS[row.run_status],
        )
        if row.call is not None and not (brief and row.decision == "run"):
            response.call.CopyFrom(convert.step_call(row.call))
        if row.decision == "uncertain":
            # The node's lease is over: no outcome of it will come.
            handout = self.handouts.pop(call.lease_token)
            if row.run_status == "blocked":
                self.metrics.blocked.labels(handout.action if handout else "").inc()
            _log_uncertain_call(call, row)
        return response

    def _finished(self, status: str) -> Any:
        """The counter of runs finished with ``status``."""
        finished = self.finished.get(status)
        if finished is None:
            finished = self.finished[status] = self.metrics.finished.labels(status)
        return finished

    def _outcome(
        self,
        outcome: Outcome,
        done: Completion,
        now: float | None = None,
        finished: dict[str, int] | None = None,
    ) -> bool:
        """Count, time and log an accepted outcome. True when its log line still needs
        the attempt: the step was handed out by another server. ``now``: time.monotonic()
        of the answer, when the caller has it; ``finished``: runs finished by status,
        tallied there for the caller to count rather than counted here."""
        if done.duplicate:
            return False
        failure = outcome.failure
        m = self.metrics
        if failure is None:
            m.completed.inc()
        else:
            m.failed.labels(_FAILED_OUTCOME.get(done.step_status, done.step_status)).inc()
            if done.step_status == "discarded":
                m.discarded.labels("handler").inc()
        if done.run_status in _FINAL_RUN and done.step_status in _FINAL:
            if finished is None:
                self._finished(done.run_status).inc()
            else:
                finished[done.run_status] = finished.get(done.run_status, 0) + 1
        handout = self.handouts.pop(outcome.lease_token)
        if done.step_status == "uncertain":
            # An unsafe handler stopped without an outcome: the run is blocked now.
            m.blocked.labels(handout.action if handout else "").inc()
        logged = failure is not None or log.isEnabledFor(logging.DEBUG)
        if handout is None:
            return logged
        per_action = m.action(handout.action)
        seconds = per_action.completed_seconds if failure is None else per_action.failed_seconds
        seconds.observe((time.monotonic() if now is None else now) - handout.claimed)
        if logged:
            _log_outcome(outcome, done, handout.attempt)
        return False

    async def _attempt(self, outcome: Outcome) -> int | None:
        """The attempt of a step another server handed out, for its log line."""
        return await self.db.steps.step_attempt(outcome.run_id, outcome.node)

    async def _blocked_steps(self, rows: Sequence[ClaimedStep]) -> list[worker_pb.BlockedStep]:
        """What a claim blocked, with the reason each run's error gives, for its worker."""
        if not rows:
            return []
        run_errors = await self.db.runs.runs_errors([r.run_id for r in rows])
        found = []
        for r in rows:
            error = run_errors.get(r.run_id) or {}
            found.append(
                worker_pb.BlockedStep(
                    run_id=r.run_id,
                    node=r.node,
                    attempt=r.attempt,
                    action=r.action,
                    step_id=error.get("step_id") or "",
                    reason=error.get("message") or "EffectUncertain",
                )
            )
        return found

    def _blocked(self, row: ClaimedStep) -> bool:
        if row.blocked:
            self.metrics.blocked.labels(row.action).inc()
        return _blocked(row)


_FAILED_OUTCOME = {"available": "retry", "pending": "held", "uncertain": "uncertain"}
_FINAL = ("completed", "discarded")
_FINAL_RUN = ("completed", "failed")


#: Lines one Heartbeat or Complete may carry; the cap per attempt is the engine's
#: (service/schema/55_step_logs.sql: 1000 lines, 256 KiB), this bounds one request.
MAX_LOG_LINES = 1001
MAX_LOG_MESSAGE = 4096


def _logs_json(request: worker_pb.HeartbeatRequest | worker_pb.CompleteRequest) -> str | None:
    """step_logs_add's lines of a request, as JSON; None when it carries none. Every line
    sent is checked, kept or not: a NUL character in a text (which Postgres refuses) or
    a time outside the Timestamp range refuses the whole request, naming the line."""
    if not request.logs:
        return None
    lines = []
    for i, line in enumerate(request.logs):
        level, logger, message = line.level, line.logger, line.message
        for field, text in (("level", level), ("logger", logger), ("message", message)):
            if "\x00" in text:
                raise errors.InvalidArgument(f"logs[{i}].{field} contains a NUL character")
        at = convert.to_datetime(line.at, f"logs[{i}].at") if line.HasField("at") else None
        if i >= MAX_LOG_LINES:
            continue  # more than an attempt keeps: checked, not sent on
        item: dict[str, Any] = {
            "level": level[:16],
            "logger": logger[:200],
            "message": message[:MAX_LOG_MESSAGE],
        }
        if at is not None:
            item["at"] = at.isoformat()
        lines.append(item)
    return json.dumps(lines, ensure_ascii=False)


def _log_line(row: LogRow) -> types_pb2.LogLine:
    line = types_pb2.LogLine(
        level=row.level, message=row.message, attempt=row.attempt, logger=row.logger
    )
    line.at.FromDatetime(row.at)
    return line


def _check_seq(seq: int) -> None:
    if not 1 <= seq <= MAX_STEP_CALL_SEQ:
        raise errors.InvalidArgument(f"seq must be between 1 and {MAX_STEP_CALL_SEQ}, got {seq}")


def _wait_key(run_id: str, node: str, token: str, request: worker_pb.WaitRequest) -> WaitKey:
    """A validated Wait: the step call's key and what it waits for."""
    _check_seq(request.seq)
    key = WaitKey(run_id, node, token, _step_call_name(request.step_id, "step_id"), request.seq, "")
    until = request.WhichOneof("until")
    if until == "wake_at":
        wake_at = convert.to_datetime(request.wake_at, "wake_at")
        return dataclasses.replace(key, function="cyclone.sleep", wake_at=wake_at)
    if until == "event":
        event = request.event
        timeout = _seconds(event.timeout) if event.HasField("timeout") else None
        name, timeout = event_wait(event.name, timeout, "event")
        return dataclasses.replace(key, function="cyclone.event", event=name, timeout_s=timeout)
    if until == "child_run_id":
        child = parse_uuid(request.child_run_id, "child_run_id")
        return dataclasses.replace(key, function="cyclone.child", child=child)
    raise errors.InvalidArgument("until is required: wake_at, event or child_run_id")


_RESULTS = wire.field_tag(worker_pb.CompleteManyResponse, "results")
#: CompleteManyResponse.results entries without a retry time, serialized, by (step
#: status, run status, duplicate): a few dozen at most, each made once.
_ANSWERS: dict[tuple[str, str, bool], bytes] = {}


#: The most credit a Work stream may hold unused.
MAX_WORK_CREDIT = 10_000
_WORK_REPORT = wire.field_tag(worker_pb.WorkResponse, "report")


def _credit(held: int, granted: int) -> int:
    """A Work stream's credit after a request grants ``granted`` more."""
    if not 0 <= granted <= 1000:
        raise errors.InvalidArgument(f"credit must be between 0 and 1000, got {granted}")
    if held + granted > MAX_WORK_CREDIT:
        raise errors.InvalidArgument(
            f"credit unused would be {held + granted}; the limit is {MAX_WORK_CREDIT}"
        )
    return held + granted


def _work_answer(report: bytes) -> bytes:
    """WorkResponse.report, serialized, from a serialized CompleteManyResponse."""
    return wire.length_delimited(_WORK_REPORT, report)


def _result_bytes(result: worker_pb.CompleteResult) -> bytes:
    """One entry of CompleteManyResponse.results, serialized."""
    return wire.length_delimited(_RESULTS, result.SerializeToString())


def _answer_bytes(done: Completion) -> bytes:
    """The serialized CompleteManyResponse.results entry answering an applied outcome."""
    if done.retry_at is not None:
        return _result_bytes(worker_pb.CompleteResult(response=_complete_response(done)))
    key = (done.step_status, done.run_status, done.duplicate)
    answer = _ANSWERS.get(key)
    if answer is None:
        result = worker_pb.CompleteResult(response=_complete_response(done))
        answer = _ANSWERS[key] = _result_bytes(result)
    return answer


def _complete_response(done: Completion) -> worker_pb.CompleteResponse:
    response = worker_pb.CompleteResponse(
        status=convert.STEP_STATUS[done.step_status],
        run_status=convert.RUN_STATUS[done.run_status],
        duplicate=done.duplicate,
    )
    if done.retry_at is not None:
        response.retry_at.FromDatetime(done.retry_at)
    return response


def _log_outcome(outcome: Outcome, done: Completion, attempt: int | None) -> None:
    run_id, node = outcome.run_id, outcome.node
    status, retry_at = done.step_status, done.retry_at
    extra = {"run_id": str(run_id), "node": node, "attempt": attempt}
    failure = outcome.failure
    if failure is None:
        log.debug("completed %s/%s attempt %s", run_id, node, attempt, extra=extra)
    elif status in ("uncertain", "pending") and failure.uncertain:
        # A holding state, not a failure: a warning, as for any blocked run.
        log.warning(
            "step %s/%s stopped at attempt %s without an outcome and is unsafe to repeat "
            "(%s: %s); its run is blocked until resolved with `cyclone resolve`",
            run_id,
            node,
            attempt,
            failure.type,
            failure.message,
            extra=extra,
        )
    elif status == "discarded":
        log.error(
            "step %s/%s discarded at attempt %s: %s: %s",
            run_id,
            node,
            attempt,
            failure.type,
            failure.message,
            extra=extra,
        )
    else:
        # A retry in a blocked run is held (pending) until the run is resolved.
        when = "held until its blocked run is resolved" if status == "pending" else retry_at
        log.info(
            "step %s/%s failed at attempt %s, retry at %s: %s: %s",
            run_id,
            node,
            attempt,
            when,
            failure.type,
            failure.message,
            extra=extra,
        )


def _log_uncertain_call(call: StepCallKey, row: StepCallBegun) -> None:
    extra = {"run_id": str(call.run_id), "node": call.node, "step_id": call.step_id}
    attempt = row.call["attempt"] if row.call else None
    if row.run_status == "blocked" and row.call is not None:
        log.warning(
            "run %s blocked: node %s, step call %s (function %s) started at attempt %s with "
            "no outcome and is unsafe to repeat; resolve it with `cyclone resolve %s %s`",
            call.run_id,
            call.node,
            call.step_id,
            row.call["function"],
            attempt,
            call.run_id,
            call.step_id,
            extra=extra,
        )
    else:
        log.warning(
            "node %s of run %s held: step call %s is uncertain and the run is %s",
            call.node,
            call.run_id,
            call.step_id,
            row.run_status,
            extra=extra,
        )


def _blocked(row: ClaimedStep) -> bool:
    if row.blocked:
        log.warning(
            "run %s blocked: node %s (action %s) lost its lease at attempt %d with no "
            "outcome and is unsafe to repeat; resolve it with `cyclone resolve %s %s`",
            row.run_id,
            row.node,
            row.action,
            row.attempt,
            row.run_id,
            row.node,
            extra={"run_id": str(row.run_id), "node": row.node, "attempt": row.attempt},
        )
    return bool(row.blocked)


def _attempt(run: types_pb2.Run, node: str) -> int:
    return next(s.attempt for s in run.steps if s.node == node)


class AdminServicer(admin_grpc.AdminServiceServicer):
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.payloads = _payloads(settings)

    async def _run(self, run_id: uuid.UUID) -> types_pb2.Run:
        return _run_proto(await self.db.runs.run_get(run_id))

    @rpc
    async def Retry(
        self, request: admin_pb.RetryRequest, context: Context
    ) -> admin_pb.RetryResponse:
        run_id = parse_uuid(request.run_id)
        node = _node_name(request.node)
        reason = _text(request.reason, "reason", MAX_REASON)
        await self.db.operator.step_retry(run_id, [node], actor=_actor(context), reason=reason)
        run = await self._run(run_id)
        attempt = _attempt(run, node)
        log.info(
            "node %s of run %s retried after attempt %d",
            node,
            run_id,
            attempt,
            extra={"run_id": str(run_id), "node": node, "attempt": attempt},
        )
        return admin_pb.RetryResponse(run=run)

    @rpc
    async def RetryAll(
        self, request: admin_pb.RetryAllRequest, context: Context
    ) -> admin_pb.RetryAllResponse:
        run_id = parse_uuid(request.run_id)
        reason = _text(request.reason, "reason", MAX_REASON)
        nodes = await self.db.operator.step_retry(
            run_id, None, actor=_actor(context), reason=reason
        )
        log.info("run %s: retried %s", run_id, ", ".join(nodes), extra={"run_id": str(run_id)})
        return admin_pb.RetryAllResponse(nodes=nodes, run=await self._run(run_id))

    @rpc
    async def Resolve(
        self, request: admin_pb.ResolveRequest, context: Context
    ) -> admin_pb.ResolveResponse:
        run_id = parse_uuid(request.run_id)
        step_id = _step_call_name(request.step_id, "step_id") if request.step_id else None
        # With a step_id the node may be left out: the one the run is blocked on.
        node = _node_name(request.node) if request.node or step_id is None else None
        reason = _text(request.reason, "reason", MAX_REASON)
        choice = request.WhichOneof("resolution")
        if choice == "result":
            value: str | None = self.payloads.to_json(request.result, "result")
        elif choice == "error":
            if not request.error:
                raise errors.InvalidArgument("error must say what failed")
            value = json.dumps(_text(request.error, "error", MAX_ERROR_TEXT))
        elif choice == "discard":
            if not request.discard:
                raise errors.InvalidArgument("discard must be true to discard")
            value = None
        else:
            raise errors.InvalidArgument("resolution is required: result, error or discard")
        actor = _actor(context)
        if step_id is None:
            assert node is not None
            await self.db.operator.step_resolve(
                run_id, node, choice=choice, value_json=value, actor=actor, reason=reason
            )
        else:
            node = await self.db.operator.step_call_resolve(
                run_id, node, step_id, choice=choice, value_json=value, actor=actor, reason=reason
            )
        run = await self._run(run_id)
        attempt = _attempt(run, node)
        log.warning(
            "run %s: node %s%s resolved as %s at attempt %d (%s)",
            run_id,
            node,
            f", step call {step_id}," if step_id else "",
            choice,
            attempt,
            reason or "no reason given",
            extra={"run_id": str(run_id), "node": node, "attempt": attempt},
        )
        return admin_pb.ResolveResponse(run=run)
