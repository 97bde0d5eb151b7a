"""AdminService's pause RPCs: pause and resume a run, a workflow or an action, and list
the paused workflows and actions (service/schema/75_pauses.sql)."""

from __future__ import annotations

import logging
import uuid

from cyclone import dag
from cyclone.v1 import admin_service_pb2 as admin_pb
from cyclone.v1 import types_pb2
from service import errors
from service.api import convert
from service.api.build import run_proto
from service.api.ids import parse_uuid
from service.api.status import rpc
from service.api.validate import MAX_REASON, Context, actor_of, text
from service.db import Database
from service.db.operator import Pause

log = logging.getLogger("cyclone")

#: PauseKind by the engine's names, and back.
PAUSE_KIND = {
    "workflow": types_pb2.PAUSE_KIND_WORKFLOW,
    "action": types_pb2.PAUSE_KIND_ACTION,
}


def paused_name(kind: str, value: str) -> str:
    """A workflow's or an action's name from a request: INVALID_ARGUMENT unless it is a
    name a workflow or an action can have."""
    if not value:
        raise errors.InvalidArgument(f"name is required: the {kind} to pause or resume")
    if "\x00" in value:
        raise errors.InvalidArgument(f"name contains a NUL character: no {kind} has one")
    try:
        dag.check_name(kind, value)
    except dag.InvalidWorkflow as e:
        raise errors.InvalidArgument(str(e)) from None
    return value


def pause_proto(row: Pause) -> types_pb2.Pause:
    return types_pb2.Pause(
        kind=PAUSE_KIND[row.kind],
        name=row.name,
        pause=types_pb2.RunPause(actor=row.actor, reason=row.reason, at=convert.timestamp(row.at)),
    )


class PausesAdmin:
    """The pause RPCs of AdminServicer."""

    db: Database

    async def _paused_run(self, run_id: uuid.UUID) -> types_pb2.Run:
        return run_proto(await self.db.runs.run_get(run_id))

    @rpc
    async def PauseRun(
        self, request: admin_pb.PauseRunRequest, context: Context
    ) -> admin_pb.PauseRunResponse:
        run_id = parse_uuid(request.run_id)
        reason = text(request.reason, "reason", MAX_REASON)
        actor = actor_of(context)
        changed = await self.db.operator.run_pause(run_id, actor=actor, reason=reason)
        if changed:
            log.warning(
                "run %s paused by %s (%s)",
                run_id,
                actor,
                reason or "no reason given",
                extra={"run_id": str(run_id)},
            )
        run = await self._paused_run(run_id)
        return admin_pb.PauseRunResponse(run=run, changed=changed)

    @rpc
    async def ResumeRun(
        self, request: admin_pb.ResumeRunRequest, context: Context
    ) -> admin_pb.ResumeRunResponse:
        run_id = parse_uuid(request.run_id)
        reason = text(request.reason, "reason", MAX_REASON)
        actor = actor_of(context)
        changed = await self.db.operator.run_resume(run_id, actor=actor, reason=reason)
        if changed:
            log.warning("run %s resumed by %s", run_id, actor, extra={"run_id": str(run_id)})
        run = await self._paused_run(run_id)
        return admin_pb.ResumeRunResponse(run=run, changed=changed)

    async def _change(
        self, kind: str, name: str, reason: str, context: Context, *, pause: bool
    ) -> bool:
        """Pause (``pause``) or resume a workflow or an action; whether it changed."""
        name = paused_name(kind, name)
        reason = text(reason, "reason", MAX_REASON)
        actor = actor_of(context)
        change = self.db.operator.pause_set if pause else self.db.operator.pause_clear
        changed = await change(kind, name, actor=actor, reason=reason)
        if changed:
            verb = "paused" if pause else "resumed"
            log.warning("%s %s %s by %s (%s)", kind, name, verb, actor, reason or "no reason")
        return changed

    async def _pause_of(self, kind: str, name: str) -> types_pb2.RunPause:
        for row in await self.db.operator.pauses_list():
            if row.kind == kind and row.name == name:
                return pause_proto(row).pause
        return types_pb2.RunPause()

    @rpc
    async def PauseWorkflow(
        self, request: admin_pb.PauseWorkflowRequest, context: Context
    ) -> admin_pb.PauseWorkflowResponse:
        changed = await self._change("workflow", request.name, request.reason, context, pause=True)
        return admin_pb.PauseWorkflowResponse(
            changed=changed, pause=await self._pause_of("workflow", request.name)
        )

    @rpc
    async def ResumeWorkflow(
        self, request: admin_pb.ResumeWorkflowRequest, context: Context
    ) -> admin_pb.ResumeWorkflowResponse:
        changed = await self._change("workflow", request.name, request.reason, context, pause=False)
        return admin_pb.ResumeWorkflowResponse(changed=changed)

    @rpc
    async def PauseAction(
        self, request: admin_pb.PauseActionRequest, context: Context
    ) -> admin_pb.PauseActionResponse:
        changed = await self._change("action", request.name, request.reason, context, pause=True)
        return admin_pb.PauseActionResponse(
            changed=changed, pause=await self._pause_of("action", request.name)
        )

    @rpc
    async def ResumeAction(
        self, request: admin_pb.ResumeActionRequest, context: Context
    ) -> admin_pb.ResumeActionResponse:
        changed = await self._change("action", request.name, request.reason, context, pause=False)
        return admin_pb.ResumeActionResponse(changed=changed)

    @rpc
    async def ListPauses(
        self, request: admin_pb.ListPausesRequest, context: Context
    ) -> admin_pb.ListPausesResponse:
        rows = await self.db.operator.pauses_list()
        # Workflows first, then actions (the order ListPausesResponse promises).
        rows.sort(key=lambda r: (r.kind != "workflow", r.name))
        return admin_pb.ListPausesResponse(pauses=[pause_proto(r) for r in rows])
