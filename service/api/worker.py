"""WorkerService: claims, heartbeats, completions, step calls, waits and child
runs of the steps workers hold."""

from __future__ import annotations

import asyncio
import logging
import time

from cyclone.v1 import (
    worker_service_pb2 as worker_pb,
)
from cyclone.v1 import (
    worker_service_pb2_grpc as worker_grpc,
)
from service import errors
from service.api import convert, wire
from service.api.build import (
    STEP_CALL_DECISION,
    WAIT_DECISION,
    answer_bytes,
    complete_response,
    rare_parts,
    refusal,
    result_bytes,
)
from service.api.callbacks import CallbacksWorker
from service.api.queries import WorkerInbox
from service.api.status import rpc
from service.api.streams import emit_chunks
from service.api.submit import new_run_of
from service.api.validate import (
    Context,
    item,
    limits_of,
    logs_json,
    payloads_of,
    seconds,
    wait_key,
)
from service.api.work import WorkStream
from service.api.worker_requests import WorkerRequests
from service.config import Settings
from service.db import Database
from service.db.completion import Report, StepCallKey
from service.db.records import (
    Refused,
    StepCallBegun,
)
from service.engine.activity import ActionActivity, Handouts
from service.engine.claims import Claims
from service.engine.notify import Dispatcher
from service.engine.reports import Outcomes, log_outcome
from service.engine.streams import StreamHub
from service.metrics import Metrics

log = logging.getLogger("cyclone")


class WorkerServicer(
    WorkStream, WorkerRequests, CallbacksWorker, WorkerInbox, worker_grpc.WorkerServiceServicer
):
    def __init__(
        self,
        db: Database,
        dispatcher: Dispatcher,
        settings: Settings,
        metrics: Metrics,
        activity: ActionActivity,
        handouts: Handouts,
        hub: StreamHub | None = None,
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        #: Told of the chunks EmitChunks stores (this server's live readers).
        self.hub = hub if hub is not None else StreamHub(db, settings.stream_recheck_s)
        self.settings = settings
        self.metrics = metrics
        self.handouts = handouts
        self.payloads = payloads_of(settings)
        self.limits = limits_of(settings)
        #: Set when the server stops: waiting claims and Work streams answer at once.
        self.stopping = asyncio.Event()
        self.claims = Claims(db, dispatcher, settings, metrics, activity, handouts, self.stopping)
        self.outcomes = Outcomes(db, metrics, handouts)
        # Node names already found valid (dag.check_name), so that a step's outcome
        # need not check its node's name again; at most MAX_NODE_NAMES of them.
        self.node_names: set[str] = set()

    @rpc
    async def Claim(
        self, request: worker_pb.ClaimRequest, context: Context
    ) -> worker_pb.ClaimResponse:
        who = self._claimer(
            request.worker_id,
            request.actions,
            request.lease if request.HasField("lease") else None,
            request.build_id,
            request.shard_node,
        )
        limit = request.max_steps or 1
        if not 1 <= limit <= self.settings.max_claim_batch:
            raise errors.InvalidArgument(
                f"max_steps must be between 1 and {self.settings.max_claim_batch}, got {limit}"
            )
        wait = seconds(request.wait) if request.HasField("wait") else 0.0
        if not 0 <= wait <= self.settings.max_wait_s:
            raise errors.InvalidArgument(
                f"wait must be between 0s and {self.settings.max_wait_s:g}s, got {wait:g}s"
            )

        steps, blocked = await self.claims.waiting(who, limit, wait)
        response = wire.claim_response(steps, rare_parts)
        if blocked:
            response.blocked.extend(await self._blocked_steps(blocked))
        return response

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
            logs_json=logs_json(request),
        )
        return worker_pb.HeartbeatResponse(
            lease_expires_at=convert.timestamp(row.lease_expires_at), cancelled=row.cancelled
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
    async def EmitChunks(
        self, request: worker_pb.EmitChunksRequest, context: Context
    ) -> worker_pb.EmitChunksResponse:
        try:
            return await emit_chunks(self.db, self.hub, self.settings, request)
        except (errors.LeaseLost, errors.NotFound):
            self.metrics.refused.inc()
            raise

    @rpc
    async def Wait(
        self, request: worker_pb.WaitRequest, context: Context
    ) -> worker_pb.WaitResponse:
        wait = wait_key(*self._step_key(request), request)
        try:
            row = await self.db.waits.step_wait(wait, logs_json(request))
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
        if self.outcomes.applied(outcome, done):
            log_outcome(outcome, done, await self.outcomes.attempt(outcome))
        return complete_response(done)

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
            item(i, "completions", self._completion, c) for i, c in enumerate(request.completions)
        ]
        ends = [
            item(i, "step_call_ends", self._step_call_end, c)
            for i, c in enumerate(request.step_call_ends)
        ]
        begins = [
            item(i, "step_call_begins", self._step_call, c)
            for i, c in enumerate(request.step_call_begins)
        ]
        response = worker_pb.CompleteManyResponse()
        report, answers = await self.outcomes.apply(ends, begins, outcomes, brief=request.brief)
        if report is not None:
            self._report_calls(report, begins, response, brief=request.brief)
        results = []
        now = time.monotonic()
        # Runs finished, by status: their counters are incremented once per batch.
        finished: dict[str, int] = {}
        try:
            for outcome, answer in zip(outcomes, answers, strict=True):
                if isinstance(answer, Refused):
                    self.metrics.refused.inc()
                    results.append(result_bytes(worker_pb.CompleteResult(error=refusal(answer))))
                    continue
                if self.outcomes.applied(outcome, answer, now, finished):
                    log_outcome(outcome, answer, await self.outcomes.attempt(outcome))
                results.append(answer_bytes(answer))
        finally:
            for status, n in finished.items():
                self.outcomes.finished(status).inc(n)
        # The results, appended as the bytes they serialize to (service.api.wire): a
        # message's fields may come in any order, a repeated field's items apart.
        results.append(response.SerializeToString())
        return b"".join(results)

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
                response.step_call_end_results.add(error=refusal(ended))
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
                response.step_call_begin_results.add(error=refusal(begun))
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
            self.outcomes.uncertain_call(call, row)
        return response
