"""Builds: what workers declared (build_seen), the builds' sets for the claims on
Citus, and the operators' reads and actions (ListBuilds, ListBuildRuns,
SetBuildCompatible, RetireBuild, MoveBuild)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from service.db.pool import Repository


class Seen(NamedTuple):
    """build_seen"""

    retired: bool


class BuildSet(NamedTuple):
    """build_set: None when the build is retired."""

    builds: list[str] | None


class BuildRow(NamedTuple):
    """builds_list: a build, its set, its latest workers ({worker_id, seen_at}) and its
    unfinished nodes with a journal."""

    build_id: str
    created_at: datetime
    retired_at: datetime | None
    compatible: list[str]
    workers: list[dict[str, Any]]
    pinned_nodes: int
    pinned_runs: int


class BuildRunRow(NamedTuple):
    """build_runs: a run with unfinished nodes pinned to a build."""

    run_id: str
    workflow: str
    nodes: list[str]


class Ready(NamedTuple):
    """build_compatible: the actions of the ready nodes the set's workers may now take."""

    ready: str | None


class Retired(NamedTuple):
    """build_retire"""

    build_retire: Any


class Moved(NamedTuple):
    """build_move"""

    nodes: int
    runs: int
    ready: str | None


class Builds(Repository):
    """Builds declared by workers, and what operators do with them."""

    async def build_seen(self, build_id: str, worker_id: str) -> bool:
        """Record that a worker declared a build; returns whether it is retired."""
        [row] = await self._all("build_seen", Seen, build_id=build_id, worker_id=worker_id)
        return bool(row.retired)

    async def build_set(self, build_id: str) -> list[str] | None:
        row = await self._one("build_set", BuildSet, build_id=build_id)
        return None if row is None else row.builds

    async def builds_list(self, build_id: str | None = None) -> list[BuildRow]:
        return await self._all("builds_list", BuildRow, build_id=build_id)

    async def build_runs(self, build_id: str, limit: int) -> list[BuildRunRow]:
        return await self._all("build_runs", BuildRunRow, build_id=build_id, limit=limit)

    async def build_compatible(self, build_id: str, with_id: str) -> None:
        await self._all("build_compatible", Ready, build_id=build_id, with_id=with_id)

    async def build_retire(self, build_id: str) -> None:
        await self._all("build_retire", Retired, build_id=build_id)

    async def build_move(self, from_id: str, to_id: str, *, actor: str, reason: str) -> Moved:
        [row] = await self._all(
            "build_move", Moved, from_id=from_id, to_id=to_id, actor=actor, reason=reason
        )
        return row
