"""WorkflowService: submit, read, list, count, cancel runs; send events; explain."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC
from typing import Any

from cyclone import dag, flow
from cyclone.v1 import (
    types_pb2,
)
from cyclone.v1 import (
    workflow_service_pb2 as workflow_pb,
)
from cyclone.v1 import (
    workflow_service_pb2_grpc as workflow_grpc,
)
from service import errors, tracing
from service.api import convert
from service.api.build import (
    EXPLAIN_REASON,
    log_line,
    run_proto,
    run_summary,
    set_flow_wait,
    step_error,
    step_proto,
)
from service.api.ids import parse_uuid
from service.api.queries import RunMessages
from service.api.status import rpc, stream_rpc
from service.api.streams import list_streams, read_stream
from service.api.submit import deadline_time, new_run_of, start_time
from service.api.validate import (
    DEFAULT_COUNT_LIMIT,
    MAX_COUNT_LIMIT,
    MAX_FILTER,
    MAX_REASON,
    MAX_WORKERS_LISTED,
    NEWER,
    Context,
    actor_of,
    decode_position,
    decode_runs_page_token,
    encode_page_token,
    limits_of,
    node_name,
    page_size,
    payloads_of,
    resolved_run_filters,
    step_call_name,
    steps_kind,
    tags_json,
    text,
)
from service.config import Settings
from service.db import Database
from service.engine.explain import explain
from service.engine.streams import StreamHub
from service.engine.waits import RESERVED_PREFIX
from service.metrics import Metrics

log = logging.getLogger("cyclone")


class WorkflowServicer(RunMessages, workflow_grpc.WorkflowServiceServicer):
    def __init__(
        self,
        db: Database,
        settings: Settings,
        metrics: Metrics,
        report_activity: Callable[[], Awaitable[None]],
        hub: StreamHub | None = None,
    ) -> None:
        self.db = db
        #: The live readers of output streams (ReadStream).
        self.hub = hub if hub is not None else StreamHub(db, settings.stream_recheck_s)
        self.settings = settings
        self.limits = limits_of(settings)
        self.payloads = payloads_of(settings)
        self.metrics = metrics
        # Writes this server's latest news of workers first, so that Explain on a
        # single server is exact; other servers' news is at most a few seconds old.
        self.report_activity = report_activity
        # With tracing on, each run keeps the traceparent of the span that submitted it.
        self.traceparent = tracing.submit_traceparent if settings.tracing != "off" else None

    async def _submit(
        self,
        request: workflow_pb.SubmitRequest | workflow_pb.SubmitOnceRequest,
        key: str | None,
    ) -> tuple[uuid.UUID, bool]:
        if not request.HasField("workflow"):
            raise errors.InvalidArgument("workflow is required")
        flow.check_priority("run", request.priority)
        tags = tags_json(request.tags, "tags")
        start_at = start_time(request)
        deadline = deadline_time(request, start_at)
        run = await new_run_of(request, self.limits, self.payloads)
        nodes = run.nodes
        run_id, created = await self.db.runs.run_submit(
            workflow=request.workflow.name,
            nodes=nodes,
            input_json=run.input_json,
            submit_key=key,
            start_at=start_at,
            priority=request.priority,
            tags_json=tags,
            deadline=deadline,
            traceparent=self.traceparent() if self.traceparent is not None else None,
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

    @stream_rpc
    async def ReadStream(
        self, request: workflow_pb.ReadStreamRequest, context: Context
    ) -> AsyncIterator[workflow_pb.ReadStreamResponse]:
        async for chunk in read_stream(self.db, self.hub, request, context):
            yield chunk

    @rpc
    async def ListStreams(
        self, request: workflow_pb.ListStreamsRequest, context: Context
    ) -> workflow_pb.ListStreamsResponse:
        return await list_streams(self.db, request)

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
        logs_node = node_name(request.logs_node) if request.logs_node else None
        row = await self.db.runs.run_get(run_id)
        run = run_proto(row)
        for step in run.steps:
            self._with_budget(step)
        await self._with_full_keys(run)
        if request.logs:
            by_node: dict[str, list[types_pb2.LogLine]] = {}
            for line in await self.db.runs.step_logs(run_id, logs_node):
                by_node.setdefault(line.node, []).append(log_line(line))
            for step in run.steps:
                step.logs.extend(by_node.get(step.node, ()))
        return workflow_pb.GetRunResponse(run=run)

    async def _with_full_keys(self, run: types_pb2.Run) -> None:
        """Ready steps held back by a full concurrency key wait for a slot (counted
        after the run's read: a step may take the slot meanwhile, as with Explain)."""
        ready = [
            s
            for s in run.steps
            if s.status == types_pb2.STEP_STATUS_AVAILABLE
            and s.concurrency_key
            and s.concurrency_limit > 0
            and not s.waiting
        ]
        if not ready:
            return
        running = await self.db.runs.keys_running(sorted({s.concurrency_key for s in ready}))
        for step in ready:
            if running.get(step.concurrency_key, 0) >= step.concurrency_limit:
                set_flow_wait(step, "concurrency_limited", None)

    def _with_budget(self, step: types_pb2.Step) -> types_pb2.Step:
        """The step with this server's recovery budget (--max-recoveries)."""
        step.max_recoveries = self.settings.max_recoveries
        return step

    @rpc
    async def ListRuns(
        self, request: workflow_pb.ListRunsRequest, context: Context
    ) -> workflow_pb.ListRunsResponse:
        size = page_size(request.page_size)
        filters = await self._run_filters(request)
        at = decode_runs_page_token(request.page_token) if request.page_token else None
        newer = at is not None and at[2]
        after = (at[0], at[1]) if at else None
        rows = await self.db.runs.runs_list(**filters, after=after, newer=newer, limit=size + 1)
        more = len(rows) > size
        page = rows[1:] if more and newer else rows[:size]
        older = newer or more  # a page of newer runs came from older ones
        newest = not (at and not newer) and not (newer and more)
        response = workflow_pb.ListRunsResponse(runs=[run_summary(r) for r in page])
        if page and older:
            response.next_page_token = encode_page_token(page[-1].created_at, page[-1].run_id)
        if page and not newest:
            first = page[0]
            response.prev_page_token = encode_page_token(first.created_at, first.run_id, NEWER)
        return response

    async def _run_filters(
        self, request: workflow_pb.ListRunsRequest | workflow_pb.CountRunsRequest
    ) -> dict[str, Any]:
        """The request's filters, a workflow prefix turned into the names it matches."""
        return await resolved_run_filters(request, self.db.runs.runs_workflows)

    @rpc
    async def CountRuns(
        self, request: workflow_pb.CountRunsRequest, context: Context
    ) -> workflow_pb.CountRunsResponse:
        limit = request.limit or DEFAULT_COUNT_LIMIT
        if not 1 <= limit <= MAX_COUNT_LIMIT:
            raise errors.InvalidArgument(
                f"limit must be between 1 and {MAX_COUNT_LIMIT:,}, got {limit}"
            )
        filters = await self._run_filters(request)
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
        size = page_size(request.page_size)
        kind = steps_kind(request)
        for value, what in ((request.worker_id, "worker_id"), (request.action, "action")):
            if value:
                text(value, what, MAX_FILTER)
        after = decode_position(request.page_token) if request.page_token else None
        rows = await self.db.steps.steps_list(
            kind=kind,
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
            token = encode_page_token(last.at, last.run_id, last.step["node"])
        return workflow_pb.ListStepsResponse(
            steps=[
                workflow_pb.RunStep(
                    run_id=str(r.run_id),
                    workflow=r.workflow,
                    step=self._with_budget(step_proto(r.step, [step_error(e) for e in r.errors])),
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
        for u in await self.db.workers.workers_unhealthy():
            w = workers.get(u.worker_id)
            if w is None:
                if len(workers) == MAX_WORKERS_LISTED:
                    continue
                w = workers[u.worker_id] = workflow_pb.WorkerSummary(worker_id=u.worker_id)
            w.unhealthy = True
            w.unhealthy_since.FromDatetime(u.unhealthy_since)
        for seen in await self.db.workers.workers_seen_list():
            w = workers.get(seen.worker_id)
            if w is None:
                if len(workers) == MAX_WORKERS_LISTED:
                    continue
                w = workers[seen.worker_id] = workflow_pb.WorkerSummary(worker_id=seen.worker_id)
            w.build_id = seen.build_id or ""
            w.last_seen_at.FromDatetime(seen.seen_at)
            w.serves.extend(seen.actions)
        return workflow_pb.ListWorkersResponse(
            workers=[workers[w] for w in sorted(workers)],
            actions=[
                workflow_pb.ActionActivity(
                    action=a.action,
                    last_polled_at=convert.timestamp(a.polled_at),
                    last_polled_by=a.polled_by or "",
                    last_claimed_at=convert.timestamp(a.claimed_at),
                    last_claimed_by=a.claimed_by or "",
                    ready_ahead=a.ready_count,
                    running=by_action.get(a.action, 0),
                    served_by_server=a.action.startswith(RESERVED_PREFIX),
                )
                for a in actions
            ],
        )

    @rpc
    async def CancelRun(
        self, request: workflow_pb.CancelRunRequest, context: Context
    ) -> workflow_pb.CancelRunResponse:
        run_id = parse_uuid(request.run_id)
        reason = text(request.reason, "reason", MAX_REASON)
        await self.db.operator.run_cancel(
            run_id, actor=actor_of(context), reason=reason, keep_children=request.keep_children
        )
        log.info(
            "run %s cancelled%s",
            run_id,
            " (its child runs kept)" if request.keep_children else "",
            extra={"run_id": str(run_id)},
        )
        row = await self.db.runs.run_get(run_id)
        return workflow_pb.CancelRunResponse(run=run_proto(row))

    @rpc
    async def SendEvent(
        self, request: workflow_pb.SendEventRequest, context: Context
    ) -> workflow_pb.SendEventResponse:
        run_id = parse_uuid(request.run_id)
        name = step_call_name(request.name, "name")
        key = step_call_name(request.key, "key") if request.key else None
        payload = self.payloads.optional_json(request, "payload", "payload")
        sent = await self.db.waits.event_send(
            run_id, name, payload_json=payload, key=key, actor=actor_of(context)
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
        node = node_name(request.node)
        await self.report_activity()
        row = await self.db.runs.step_explain(run_id, node)
        why = explain(row, self.settings.max_recoveries)
        run = await self.db.runs.run_get(run_id, node)
        response = workflow_pb.ExplainResponse(
            reason=EXPLAIN_REASON[why.reason],
            message=why.message,
            run_status=convert.RUN_STATUS[row.run_status],
        )
        proto = run_proto(run)
        response.step.CopyFrom(proto.steps[0])
        set_flow_wait(response.step, why.reason, row.rate_reopens_at)
        if proto.HasField("error"):
            response.run_error.CopyFrom(proto.error)
        for u in why.upstream:
            state = workflow_pb.NodeState(
                node=u["node"], status=convert.STEP_STATUS[u["status"]], attempt=u["attempt"]
            )
            if e := u.get("error"):
                state.last_error.CopyFrom(step_error(e))
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
