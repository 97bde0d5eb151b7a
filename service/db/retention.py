"""Recovery and retention: the sweep of expired leases, releases in progress,
and the purges of finished runs and old SubmitOnce keys."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import NamedTuple

from service.db.pool import Repository
from service.db.records import Deleted


class Pending(NamedTuple):
    """releases_pending: a run with a release in progress."""

    run_id: uuid.UUID


class Continued(NamedTuple):
    """release_continue: whether dependents are left to count, and the actions made
    claimable."""

    more: bool
    ready: str | None


class Swept(NamedTuple):
    """sweep: a step whose lease expired, and the status it was left in."""

    run_id: uuid.UUID
    node: str
    action: str
    attempt: int
    worker_id: str | None
    status: str
    #: The lease lapsed before the step's deadline: its worker was lost.
    lost: bool
    ready: str | None


class DeadlineFired(NamedTuple):
    """run_deadlines_fire: a run cancelled at its deadline."""

    run_id: uuid.UUID
    deadline: datetime
    ready: str | None


class Retention(Repository):
    """The sweep, the releases in progress and the purges."""

    async def releases_pending(self, limit: int = 100) -> list[uuid.UUID]:
        """The runs with a release in progress, oldest first."""
        return [r.run_id for r in await self._all("releases_pending", Pending, limit=limit)]

    async def release_continue(self, run_id: uuid.UUID) -> bool:
        """Count the next chunk of a run's release in progress, in a transaction of its
        own; whether any is left."""
        row = await self._one("release_continue", Continued, run_id=str(run_id))
        return bool(row and row.more)

    async def sweep(self, limit: int = 1000, max_recoveries: int = 10) -> list[Swept]:
        """Reclaim expired leases; one row per step. A step that lost its worker more
        than ``max_recoveries`` times is discarded."""
        return await self._all("sweep", Swept, limit=limit, max_recoveries=max_recoveries)

    async def run_deadlines_fire(self, limit: int = 1000) -> list[DeadlineFired]:
        """Cancel up to ``limit`` running runs past their deadline; one row per run."""
        return await self._all("run_deadlines_fire", DeadlineFired, limit=limit)

    async def submit_keys_purge(self, *, age_s: float, limit: int) -> int:
        """Forget up to ``limit`` SubmitOnce keys older than ``age_s`` whose run is gone."""
        name = "submit_keys_purge_sharded" if await self.is_sharded() else "submit_keys_purge"
        row = await self._one(name, Deleted, age_s=age_s, limit=limit)
        assert row is not None
        return int(row.deleted)

    async def runs_purge(self, *, age_s: float, failed: bool, limit: int) -> int:
        """Delete up to ``limit`` runs finished more than ``age_s`` ago (runs_purge,
        service/schema/80_retention.sql)."""
        name = "runs_purge_sharded" if await self.is_sharded() else "runs_purge"
        row = await self._one(name, Deleted, age_s=age_s, failed=failed, limit=limit)
        return int(row.deleted) if row else 0
