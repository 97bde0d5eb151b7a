"""Bulk actions: the jobs that cancel, retry or resolve every run a filter matches,
started, claimed by a server, applied batch by batch, read, listed and cancelled."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from service import errors
from service.db.pool import Repository

#: The marks of the values JSON has no type for, in a stored query.
_TIME = "$time"
_UUID = "$uuid"


def query_json(query: dict[str, Any]) -> str:
    """A runs_list filter (:data:`service.db.runs.RUN_FILTERS`) as JSON: times and ids
    kept as such, whatever filters there are."""

    def tagged(value: Any) -> Any:
        if isinstance(value, datetime):
            return {_TIME: value.isoformat()}
        if isinstance(value, uuid.UUID):
            return {_UUID: str(value)}
        raise TypeError(f"a run filter cannot hold {type(value).__name__}")

    return json.dumps(query, default=tagged, sort_keys=True)


def query_of(stored: Any) -> dict[str, Any]:
    """The filter query_json stored, with its times and ids back."""

    def untagged(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {_TIME}:
                return datetime.fromisoformat(value[_TIME])
            if set(value) == {_UUID}:
                return uuid.UUID(value[_UUID])
            return {k: untagged(v) for k, v in value.items()}
        if isinstance(value, list):
            return [untagged(v) for v in value]
        return value

    data = json.loads(stored) if isinstance(stored, str | bytes) else stored
    result: dict[str, Any] = untagged(data)
    return result


class BulkJob(NamedTuple):
    """A row of cyclone.bulk_actions (with the actions a transition made ready)."""

    job_id: uuid.UUID
    action: str
    filter: Any
    query: Any
    reason: str
    actor: str
    state: str
    total: int
    total_at_least: bool
    touched: int
    skipped: int
    failed: int
    last_error: str | None
    cursor_at: datetime | None
    cursor_run: uuid.UUID | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    cancelled_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    ready: str | None


class Bulk(Repository):
    """Bulk actions' jobs."""

    async def bulk_start(
        self,
        *,
        action: str,
        filter_json: str,
        query: dict[str, Any],
        reason: str,
        actor: str,
        total: int,
        total_at_least: bool,
    ) -> BulkJob:
        row = await self._one(
            "bulk_start",
            BulkJob,
            job_id=str(uuid.uuid4()),
            action=action,
            filter=filter_json,
            query=query_json(query),
            reason=reason,
            actor=actor,
            total=total,
            total_at_least=total_at_least,
        )
        assert row is not None
        return row

    async def bulk_claim(self, owner: str, lease_s: float) -> BulkJob | None:
        """The lease of the oldest running job that nobody holds; None when none."""
        return await self._one("bulk_claim", BulkJob, owner=owner, lease_s=lease_s)

    async def bulk_apply(
        self,
        job: BulkJob,
        *,
        owner: str,
        lease_s: float,
        runs: Sequence[uuid.UUID],
        cursor: tuple[datetime, uuid.UUID] | None,
        done: bool,
    ) -> BulkJob:
        """Act on ``runs`` and move ``job``'s cursor to ``cursor`` in one transaction;
        returns the job after (unchanged when ``owner`` lost it or it was cancelled)."""
        row = await self._one(
            "bulk_apply",
            BulkJob,
            job_id=str(job.job_id),
            owner=owner,
            lease_s=lease_s,
            after_at=job.cursor_at,
            after_run=str(job.cursor_run) if job.cursor_run else None,
            runs=[str(r) for r in runs],
            cursor_at=cursor[0] if cursor else None,
            cursor_run=str(cursor[1]) if cursor else None,
            done=done,
        )
        if row is None:
            raise errors.NotFound(f"bulk action {job.job_id} not found")
        return row

    async def bulk_cancel(self, job_id: uuid.UUID, actor: str) -> BulkJob:
        row = await self._one("bulk_cancel", BulkJob, job_id=str(job_id), actor=actor)
        assert row is not None
        return row

    async def bulk_get(self, job_id: uuid.UUID) -> BulkJob:
        row = await self._one("bulk_get", BulkJob, job_id=str(job_id))
        if row is None:
            raise errors.NotFound(f"bulk action {job_id} not found")
        return row

    async def bulk_list(
        self, *, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[BulkJob]:
        """A page of jobs, newest first, older than ``after``."""
        return await self._all(
            "bulk_list",
            BulkJob,
            after_created=after[0] if after else None,
            after_job_id=str(after[1]) if after else None,
            limit=limit,
        )
