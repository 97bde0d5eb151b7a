"""The bulk actions' calls (Client.start_bulk and its kin): cancel, retry or
resolve-discard every run a ListRuns filter matches, as a job on the server."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping

from cyclone.v1 import admin_service_pb2 as admin_pb
from cyclone.v1 import workflow_service_pb2 as wf_pb
from pyclient._requests import Call, _set_run_filters, _set_tags
from pyclient.errors import InvalidArgument
from pyclient.models import BulkAction, BulkPage, BulkStarted

#: The actions start_bulk takes, by name.
BULK_ACTIONS = {
    "cancel": admin_pb.BULK_ACTION_KIND_CANCEL,
    "retry": admin_pb.BULK_ACTION_KIND_RETRY,
    "resolve_discard": admin_pb.BULK_ACTION_KIND_RESOLVE_DISCARD,
}


class bulk_calls:
    @staticmethod
    def start(
        action: str,
        *,
        workflow: str | None = None,
        status: str | Iterable[str] | None = None,
        created_after: dt.datetime | None = None,
        created_before: dt.datetime | None = None,
        key: str | None = None,
        run_id_prefix: str | None = None,
        workflow_prefix: str | None = None,
        key_prefix: str | None = None,
        tags: Mapping[str, str] | None = None,
        reason: str = "",
        dry_run: bool = False,
        confirm_all: bool = False,
    ) -> Call[BulkStarted]:
        if action not in BULK_ACTIONS:
            raise InvalidArgument(
                f"unknown bulk action {action!r}; expected one of {', '.join(BULK_ACTIONS)}"
            )
        run_filter = wf_pb.ListRunsRequest()
        prefixes = {
            "run_id_prefix": run_id_prefix,
            "workflow_prefix": workflow_prefix,
            "key_prefix": key_prefix,
        }
        _set_run_filters(run_filter, workflow, status, created_after, created_before, key, prefixes)
        _set_tags(tags, run_filter.tags)
        req = admin_pb.StartBulkActionRequest(
            action=BULK_ACTIONS[action],
            filter=run_filter,
            reason=reason,
            dry_run=dry_run,
            confirm_all=confirm_all,
        )
        return Call("admin", "StartBulkAction", req, BulkStarted.from_proto)

    @staticmethod
    def get(job_id: str) -> Call[BulkAction]:
        req = admin_pb.GetBulkActionRequest(job_id=job_id)
        return Call("admin", "GetBulkAction", req, lambda r: BulkAction.from_proto(r.job))

    @staticmethod
    def list(page_size: int | None = None, page_token: str = "") -> Call[BulkPage]:
        req = admin_pb.ListBulkActionsRequest(page_size=page_size or 0, page_token=page_token)

        def parse(r: admin_pb.ListBulkActionsResponse) -> BulkPage:
            return BulkPage(tuple(BulkAction.from_proto(j) for j in r.jobs), r.next_page_token)

        return Call("admin", "ListBulkActions", req, parse)

    @staticmethod
    def cancel(job_id: str) -> Call[BulkAction]:
        req = admin_pb.CancelBulkActionRequest(job_id=job_id)
        return Call("admin", "CancelBulkAction", req, lambda r: BulkAction.from_proto(r.job))
