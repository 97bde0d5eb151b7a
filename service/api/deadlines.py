"""AdminService's default deadlines of workflow names: set, clear, list
(docs/time-and-events.md, "Run deadlines")."""

from __future__ import annotations

import logging

from google.protobuf import duration_pb2

from cyclone import dag, flow
from cyclone.v1 import admin_service_pb2 as admin_pb
from service import errors
from service.api import convert
from service.api.status import rpc
from service.api.validate import MAX_REASON, Context, actor_of, seconds, text
from service.db import Database
from service.db.operator import WorkflowDeadline

log = logging.getLogger("cyclone")


def workflow_of(value: str) -> str:
    """A workflow name from a request: INVALID_ARGUMENT unless a valid name."""
    if not value:
        raise errors.InvalidArgument("workflow is required")
    try:
        dag.check_name("workflow", value)
    except dag.InvalidWorkflow as e:
        raise errors.InvalidArgument(str(e)) from None
    return value


def deadline_seconds(d: duration_pb2.Duration, what: str = "deadline") -> float:
    """A default deadline from a request: INVALID_ARGUMENT unless above zero and at
    most flow.MAX_START_AHEAD_S (366 days)."""
    if not -(10**12) < d.seconds < 10**12 or not -(10**9) < d.nanos < 10**9:
        raise errors.InvalidArgument(f"{what} is out of range (seconds {d.seconds})")
    value = seconds(d)
    if value <= 0:
        raise errors.InvalidArgument(f"{what} must be above zero (got {value:g} s)")
    if value > flow.MAX_START_AHEAD_S:
        raise errors.InvalidArgument(
            f"{what} is {value / 86400:.0f} days; the limit is "
            f"{flow.MAX_START_AHEAD_S / 86400:.0f} days"
        )
    return value


def deadline_proto(row: WorkflowDeadline) -> admin_pb.WorkflowDeadline:
    deadline = duration_pb2.Duration()
    deadline.FromMicroseconds(round(row.seconds * 1e6))
    return admin_pb.WorkflowDeadline(
        workflow=row.workflow,
        deadline=deadline,
        set_by=row.set_by,
        set_at=convert.timestamp(row.set_at),
        reason=row.reason,
    )


def _log(workflow: str, what: str, actor: str, reason: str) -> None:
    """The server's log line of a change to a default deadline: what, who and why."""
    why = f": {reason}" if reason else ""
    log.info("workflow %s: default deadline %s by %s%s", workflow, what, actor, why)


class DeadlinesAdmin:
    """The default deadlines' RPCs of AdminService (mixed into AdminServicer)."""

    db: Database

    @rpc
    async def SetWorkflowDeadline(
        self, request: admin_pb.SetWorkflowDeadlineRequest, context: Context
    ) -> admin_pb.SetWorkflowDeadlineResponse:
        workflow = workflow_of(request.workflow)
        if not request.HasField("deadline"):
            raise errors.InvalidArgument(
                "deadline is required (ClearWorkflowDeadline clears a default deadline)"
            )
        value = deadline_seconds(request.deadline)
        reason = text(request.reason, "reason", MAX_REASON)
        actor = actor_of(context)
        row = await self.db.operator.workflow_deadline_set(
            workflow, value, actor=actor, reason=reason
        )
        _log(workflow, f"set to {value:g}s", actor, reason)
        return admin_pb.SetWorkflowDeadlineResponse(deadline=deadline_proto(row))

    @rpc
    async def ClearWorkflowDeadline(
        self, request: admin_pb.ClearWorkflowDeadlineRequest, context: Context
    ) -> admin_pb.ClearWorkflowDeadlineResponse:
        workflow = workflow_of(request.workflow)
        reason = text(request.reason, "reason", MAX_REASON)
        row = await self.db.operator.workflow_deadline_clear(workflow)
        if row is None:
            raise errors.NotFound(f"workflow {workflow} has no default deadline")
        _log(workflow, f"({row.seconds:g}s) cleared", actor_of(context), reason)
        return admin_pb.ClearWorkflowDeadlineResponse(deadline=deadline_proto(row))

    @rpc
    async def ListWorkflowDeadlines(
        self, request: admin_pb.ListWorkflowDeadlinesRequest, context: Context
    ) -> admin_pb.ListWorkflowDeadlinesResponse:
        rows = await self.db.operator.workflow_deadlines_list()
        return admin_pb.ListWorkflowDeadlinesResponse(deadlines=[deadline_proto(r) for r in rows])
