"""Workers and activity: the running steps by worker, what servers saw of the
workers serving each action, and the database's gauges."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from service.db.pool import Repository
from service.db.records import NoRows


class WorkerAction(NamedTuple):
    """workers_running: one worker's running steps of one action."""

    worker_id: str
    action: str
    running: int
    last_heartbeat_at: datetime | None
    lease_expired: int


class ActionSeenRow(NamedTuple):
    """actions_activity: what the servers saw of one action's workers (nothing when no
    Claim named it), and its ready steps (up to 10,000)."""

    action: str
    polled_at: datetime | None
    polled_by: str | None
    claimed_at: datetime | None
    claimed_by: str | None
    ready_count: int


class UnhealthyWorker(NamedTuple):
    """workers_unhealthy: a worker whose lease lapsed, since when and why."""

    worker_id: str
    unhealthy_since: datetime
    reason: str


class WorkerGone(NamedTuple):
    """worker_alive: the mark removed."""

    worker_id: str


class GaugeRow(NamedTuple):
    """metrics_gauges: one gauge reading (part: runs, available or running)."""

    part: str
    label: str
    n: int
    age_s: float | None
    extra: int


@dataclass(frozen=True, slots=True)
class ActionSeen:
    """What a server saw of the workers serving one action: seconds since a Claim
    last named it and by whom, and since one last got a step of it (None: not since)."""

    action: str
    polled_ago: float
    polled_by: str
    claimed_ago: float | None = None
    claimed_by: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerSeen:
    """A worker a server saw ask for work: the actions it serves, its build (None:
    none declared), seconds since."""

    worker_id: str
    actions: list[str]
    build_id: str | None
    seen_ago: float


class SeenWorker(NamedTuple):
    """workers_seen_list: a worker that asked for work, what it serves, when last."""

    worker_id: str
    actions: list[str]
    build_id: str | None
    seen_at: datetime


#: A worker not seen for this long is forgotten (workers_seen_note).
FORGET_WORKER_S = 86_400.0


class Workers(Repository):
    """What servers saw of workers, and the database's gauges."""

    async def workers_list(self) -> tuple[list[WorkerAction], list[ActionSeenRow]]:
        """The running steps by worker and action, and every action's activity."""
        running = await self._all("workers_running", WorkerAction)
        return running, await self._all("actions_activity", ActionSeenRow)

    async def workers_unhealthy(self) -> list[UnhealthyWorker]:
        """The workers marked unhealthy (a lease of theirs lapsed)."""
        return await self._all("workers_unhealthy", UnhealthyWorker)

    async def worker_alive(self, worker_id: str) -> bool:
        """The worker showed it is alive: clear its unhealthy mark; whether it had one."""
        return bool(await self._all("worker_alive", WorkerGone, worker_id=worker_id))

    async def action_claims_note(self, seen: Sequence[ActionSeen]) -> None:
        """Record what this server saw of the workers serving each action."""
        if not seen:
            return
        await self._all(
            "action_claims_note",
            NoRows,
            actions=[a.action for a in seen],
            polled_ago=[a.polled_ago for a in seen],
            polled_by=[a.polled_by for a in seen],
            claimed_ago=[a.claimed_ago for a in seen],
            claimed_by=[a.claimed_by for a in seen],
        )

    async def workers_seen_note(self, seen: Sequence[WorkerSeen]) -> None:
        """Record the workers this server saw ask for work; forget those not seen for
        :data:`FORGET_WORKER_S`."""
        if not seen:
            return
        await self._all(
            "workers_seen_note",
            NoRows,
            worker_ids=[w.worker_id for w in seen],
            actions=[json.dumps(w.actions) for w in seen],
            build_ids=[w.build_id for w in seen],
            seen_ago=[w.seen_ago for w in seen],
        )
        await self._all("workers_seen_forget", NoRows, forget_s=FORGET_WORKER_S)

    async def workers_seen_list(self) -> list[SeenWorker]:
        """The workers seen asking for work, latest first (at most 1000)."""
        return await self._all("workers_seen_list", SeenWorker)

    async def metrics_gauges(self) -> list[GaugeRow]:
        return await self._all("metrics_gauges", GaugeRow)
