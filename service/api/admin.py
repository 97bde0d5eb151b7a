"""AdminService: retry and resolve steps and step calls of blocked runs, change a run's
tags; the builds' RPCs are in service.api.builds, the pauses' in service.api.pauses, the
bulk actions' in service.api.bulk, the default deadlines' in service.api.deadlines."""

from __future__ import annotations

import json
import logging
import uuid

from cyclone.v1 import (
    admin_service_pb2 as admin_pb,
)
from cyclone.v1 import (
    admin_service_pb2_grpc as admin_grpc,
)
from cyclone.v1 import (
    types_pb2,
)
from service import errors
from service.api.build import attempt_of, run_proto
from service.api.builds import BuildsAdmin
from service.api.bulk import BulkAdmin
from service.api.callbacks import CallbacksAdmin
from service.api.deadlines import DeadlinesAdmin
from service.api.ids import parse_uuid
from service.api.pauses import PausesAdmin
from service.api.status import rpc
from service.api.validate import (
    MAX_ERROR_TEXT,
    MAX_REASON,
    MAX_TAGS,
    Context,
    actor_of,
    node_name,
    payloads_of,
    step_call_name,
    tag_key,
    tags_json,
    text,
)
from service.config import Settings
from service.db import Database

log = logging.getLogger("cyclone")


class AdminServicer(
    BuildsAdmin,
    PausesAdmin,
    BulkAdmin,
    DeadlinesAdmin,
    CallbacksAdmin,
    admin_grpc.AdminServiceServicer,
):
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.payloads = payloads_of(settings)

    async def _run(self, run_id: uuid.UUID) -> types_pb2.Run:
        return run_proto(await self.db.runs.run_get(run_id))

    @rpc
    async def Retry(
        self, request: admin_pb.RetryRequest, context: Context
    ) -> admin_pb.RetryResponse:
        run_id = parse_uuid(request.run_id)
        node = node_name(request.node)
        reason = text(request.reason, "reason", MAX_REASON)
        await self.db.operator.step_retry(run_id, [node], actor=actor_of(context), reason=reason)
        run = await self._run(run_id)
        attempt = attempt_of(run, node)
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
        reason = text(request.reason, "reason", MAX_REASON)
        nodes = await self.db.operator.step_retry(
            run_id, None, actor=actor_of(context), reason=reason
        )
        log.info("run %s: retried %s", run_id, ", ".join(nodes), extra={"run_id": str(run_id)})
        return admin_pb.RetryAllResponse(nodes=nodes, run=await self._run(run_id))

    @rpc
    async def Resolve(
        self, request: admin_pb.ResolveRequest, context: Context
    ) -> admin_pb.ResolveResponse:
        run_id = parse_uuid(request.run_id)
        step_id = step_call_name(request.step_id, "step_id") if request.step_id else None
        # With a step_id the node may be left out: the one the run is blocked on.
        node = node_name(request.node) if request.node or step_id is None else None
        reason = text(request.reason, "reason", MAX_REASON)
        choice = request.WhichOneof("resolution")
        if choice == "result":
            value: str | None = self.payloads.to_json(request.result, "result")
        elif choice == "error":
            if not request.error:
                raise errors.InvalidArgument("error must say what failed")
            value = json.dumps(text(request.error, "error", MAX_ERROR_TEXT))
        elif choice == "discard":
            if not request.discard:
                raise errors.InvalidArgument("discard must be true to discard")
            value = None
        else:
            raise errors.InvalidArgument("resolution is required: result, error or discard")
        actor = actor_of(context)
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
        attempt = attempt_of(run, node)
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

    @rpc
    async def SetRunTags(
        self, request: admin_pb.SetRunTagsRequest, context: Context
    ) -> admin_pb.SetRunTagsResponse:
        run_id = parse_uuid(request.run_id)
        reason = text(request.reason, "reason", MAX_REASON)
        set_json = tags_json(request.set_tags, "set_tags") or "{}"
        if len(request.remove_keys) > MAX_TAGS:
            raise errors.InvalidArgument(
                f"remove_keys names {len(request.remove_keys)} keys; "
                f"a run carries at most {MAX_TAGS} tags"
            )
        remove = [tag_key(k, "remove_keys") for k in request.remove_keys]
        if not request.set_tags and not remove:
            raise errors.InvalidArgument("set_tags or remove_keys is required")
        tags = await self.db.operator.run_tags_set(
            run_id,
            set_json=set_json,
            remove=remove,
            max_tags=MAX_TAGS,
            actor=actor_of(context),
            reason=reason,
        )
        log.info(
            "run %s: tags changed to %s (%s)",
            run_id,
            json.dumps(tags, sort_keys=True),
            reason or "no reason given",
            extra={"run_id": str(run_id)},
        )
        return admin_pb.SetRunTagsResponse(run=await self._run(run_id))
