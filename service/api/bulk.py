"""AdminService's bulk actions: cancel, retry or resolve-discard every run a ListRuns
filter matches, as a job the servers work through (service/engine/bulk.py)."""

from __future__ import annotations

import logging
from typing import Any

from google.protobuf import json_format

from cyclone.v1 import admin_service_pb2 as admin_pb
from service import errors
from service.api import convert
from service.api.ids import parse_uuid
from service.api.status import rpc
from service.api.validate import (
    MAX_COUNT_LIMIT,
    MAX_REASON,
    Context,
    actor_of,
    decode_page_token,
    encode_page_token,
    page_size,
    resolved_run_filters,
    text,
)
from service.db import Database
from service.db.bulk import BulkJob

log = logging.getLogger("cyclone")

ACTIONS = {
    admin_pb.BULK_ACTION_KIND_CANCEL: "cancel",
    admin_pb.BULK_ACTION_KIND_RETRY: "retry",
    admin_pb.BULK_ACTION_KIND_RESOLVE_DISCARD: "resolve_discard",
}
ACTION_KINDS = {name: kind for kind, name in ACTIONS.items()}

#: The run statuses each action applies to (cyclone.bulk_apply acts on no other).
APPLIES_TO = {
    "cancel": ["running", "failed", "blocked"],
    "retry": ["failed"],
    "resolve_discard": ["blocked"],
}

STATES = {
    "running": admin_pb.BULK_ACTION_STATE_RUNNING,
    "done": admin_pb.BULK_ACTION_STATE_DONE,
    "cancelled": admin_pb.BULK_ACTION_STATE_CANCELLED,
}


def bulk_proto(row: BulkJob) -> admin_pb.BulkAction:
    job = admin_pb.BulkAction(
        job_id=str(row.job_id),
        action=ACTION_KINDS[row.action],
        reason=row.reason,
        actor=row.actor,
        state=STATES[row.state],
        total=row.total,
        total_at_least=row.total_at_least,
        touched=row.touched,
        skipped=row.skipped,
        failed=row.failed,
        last_error=row.last_error or "",
        cancelled_by=row.cancelled_by or "",
        created_at=convert.timestamp(row.created_at),
        updated_at=convert.timestamp(row.updated_at),
        finished_at=convert.timestamp(row.finished_at),
    )
    json_format.ParseDict(row.filter, job.filter, ignore_unknown_fields=True)
    return job


def bulk_statuses(action: str, asked: list[str] | None) -> list[str]:
    """The statuses a job takes: those of the filter the action applies to."""
    applies = APPLIES_TO[action]
    if asked is None:
        return applies
    statuses = [s for s in asked if s in applies]
    if not statuses:
        raise errors.InvalidArgument(
            f"statuses {', '.join(asked)}: a {action} bulk action applies only to "
            f"{', '.join(applies)} runs"
        )
    return statuses


class BulkAdmin:
    """StartBulkAction, GetBulkAction, ListBulkActions, CancelBulkAction."""

    db: Database

    async def _bulk_query(self, request: admin_pb.StartBulkActionRequest) -> dict[str, Any]:
        """The runs a job takes, as runs_list filters them: ListRuns' filters checked
        as ListRuns checks them, the statuses narrowed to the action's."""
        action = ACTIONS.get(request.action)
        if action is None:
            raise errors.InvalidArgument("action is required: cancel, retry or resolve_discard")
        if request.filter.page_size or request.filter.page_token:
            raise errors.InvalidArgument(
                "filter.page_size and filter.page_token do not apply to a bulk action"
            )
        query = await resolved_run_filters(request.filter, self.db.runs.runs_workflows)
        if all(value is None for value in query.values()) and not request.confirm_all:
            raise errors.InvalidArgument(
                "the filter sets no field, so it takes every run: set confirm_all to mean it"
            )
        query["statuses"] = bulk_statuses(action, query["statuses"])
        return query

    @rpc
    async def StartBulkAction(
        self, request: admin_pb.StartBulkActionRequest, context: Context
    ) -> admin_pb.StartBulkActionResponse:
        query = await self._bulk_query(request)
        action = ACTIONS[request.action]
        reason = text(request.reason, "reason", MAX_REASON)
        counted = await self.db.runs.runs_count(**query, limit=MAX_COUNT_LIMIT + 1)
        matched = sum(min(n, MAX_COUNT_LIMIT) for n in counted.values())
        at_least = any(n > MAX_COUNT_LIMIT for n in counted.values())
        response = admin_pb.StartBulkActionResponse(matched=matched, matched_at_least=at_least)
        if request.dry_run:
            return response
        row = await self.db.bulk.bulk_start(
            action=action,
            filter_json=json_format.MessageToJson(request.filter),
            query=query,
            reason=reason,
            actor=actor_of(context),
            total=matched,
            total_at_least=at_least,
        )
        log.warning(
            "bulk action %s started by %s: %s of %s%d run(s) (%s)",
            row.job_id,
            row.actor,
            action,
            "at least " if at_least else "",
            matched,
            reason or "no reason given",
        )
        response.job.CopyFrom(bulk_proto(row))
        return response

    @rpc
    async def GetBulkAction(
        self, request: admin_pb.GetBulkActionRequest, context: Context
    ) -> admin_pb.GetBulkActionResponse:
        row = await self.db.bulk.bulk_get(parse_uuid(request.job_id, "job_id"))
        return admin_pb.GetBulkActionResponse(job=bulk_proto(row))

    @rpc
    async def ListBulkActions(
        self, request: admin_pb.ListBulkActionsRequest, context: Context
    ) -> admin_pb.ListBulkActionsResponse:
        size = page_size(request.page_size)
        after = decode_page_token(request.page_token) if request.page_token else None
        rows = await self.db.bulk.bulk_list(after=after, limit=size + 1)
        response = admin_pb.ListBulkActionsResponse(jobs=[bulk_proto(r) for r in rows[:size]])
        if len(rows) > size:
            last = rows[size - 1]
            response.next_page_token = encode_page_token(last.created_at, last.job_id)
        return response

    @rpc
    async def CancelBulkAction(
        self, request: admin_pb.CancelBulkActionRequest, context: Context
    ) -> admin_pb.CancelBulkActionResponse:
        job_id = parse_uuid(request.job_id, "job_id")
        row = await self.db.bulk.bulk_cancel(job_id, actor_of(context))
        log.warning("bulk action %s cancelled by %s", job_id, row.cancelled_by)
        return admin_pb.CancelBulkActionResponse(job=bulk_proto(row))
