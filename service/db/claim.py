"""Steps: the claim (plain, or Citus's behind the same seam), handing back
undelivered claims, heartbeats, due times and the listing of running steps."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from service import errors
from service.db.completion import logs_items
from service.db.pool import Pool, Repository
from service.db.records import ClaimedStep, Outcome, Ready, StepErrorJson, StepJson
from service.db.shards import ShardedClaim

#: Added to the seconds since a claim that step_next_due is given. The claim's clock
#: started on the database a little after the caller measured, and this call's a little
#: after too, by a delay that may differ (a connection to wait for): the slack keeps
#: a step that came due just after the claim from passing for one due before it. The
#: price: a step held back (a full key, a lock) within this long of coming due makes
#: the caller claim again once or twice more.
NEXT_DUE_SLACK_S = 0.01
#: On a sharded database with a node down: how soon a waiting claim looks again.
NODE_DOWN_RECHECK_S = 1.0


class StepListed(NamedTuple):
    """steps_list: a step across runs, with its run's workflow and its errors."""

    at: datetime
    run_id: uuid.UUID
    workflow: str
    step: StepJson
    errors: list[StepErrorJson]


class NextDue(NamedTuple):
    """step_next_due"""

    seconds: float | None


class Attempt(NamedTuple):
    """step_attempt"""

    attempt: int


class Heartbeat(NamedTuple):
    """step_heartbeat"""

    lease_expires_at: datetime
    cancelled: bool


class Claim(Protocol):
    """How steps are claimed: one claim's statements, for a worker."""

    async def claim(
        self,
        worker_id: str,
        actions: list[str],
        unsafe: list[str],
        limit: int,
        lease_s: float,
        flow: Mapping[str, list[Any]],
        build_id: str | None,
        shard_node: str | None,
    ) -> list[ClaimedStep]: ...


class PlainClaim(Repository):
    """A claim on a plain database: one call of step_claim."""

    async def claim(
        self,
        worker_id: str,
        actions: list[str],
        unsafe: list[str],
        limit: int,
        lease_s: float,
        flow: Mapping[str, list[Any]],
        build_id: str | None,
        shard_node: str | None,
    ) -> list[ClaimedStep]:
        if shard_node is not None:
            raise errors.InvalidArgument(
                f"shard_node {shard_node!r}: the database is not distributed (Citus), so "
                "no node holds a part of the runs; leave shard_node empty"
            )
        return await self._all(
            "step_claim",
            ClaimedStep,
            worker_id=worker_id,
            actions=actions,
            unsafe=unsafe,
            limit=limit,
            lease_s=lease_s,
            build_id=build_id,
            **flow,
        )


class Steps(Repository):
    """Claims, hand-backs, heartbeats and reads of steps."""

    def __init__(self, pool: Pool) -> None:
        super().__init__(pool)
        #: The claim for this database (Database.start chooses it; else the first
        #: claim does).
        self.claim: Claim | None = None

    def choose(self, sharded: bool) -> None:
        """Claim as a sharded (Citus) database needs, or as a plain one does."""
        self.claim = ShardedClaim(self.pool) if sharded else PlainClaim(self.pool)

    async def step_claim(
        self,
        *,
        worker_id: str,
        actions: list[str],
        unsafe: list[str],
        limit: int,
        lease_s: float,
        rates: Mapping[str, tuple[int, float]] | None = None,
        build_id: str | None = None,
        shard_node: str | None = None,
    ) -> list[ClaimedStep]:
        """rates: the actions the worker declares rate limited, with (count, period_s);
        build_id: the worker's build (None: it declared none); shard_node: on Citus,
        the node whose shards' runs are taken (None: any)."""
        rated = list((rates or {}).items())
        flow: dict[str, list[Any]] = {
            "rate_actions": [a for a, _ in rated],
            "rate_counts": [c for _, (c, _) in rated],
            "rate_periods": [p for _, (_, p) in rated],
        }
        if self.claim is None:
            self.choose(await self.is_sharded())
            assert self.claim is not None
        return await self.claim.claim(
            worker_id, actions, unsafe, limit, lease_s, flow, build_id, shard_node
        )

    async def steps_release(self, claimed: Sequence[ClaimedStep]) -> int:
        """Hand back claimed steps that never reached their worker."""
        rows = await self._all(
            "steps_release",
            Ready,
            run_ids=[r.run_id for r in claimed],
            nodes=[r.node for r in claimed],
            tokens=[r.lease_token for r in claimed],
            uncertain=[r.effect_uncertain for r in claimed],
        )
        return len(rows)

    async def step_next_due(self, actions: list[str], since: float) -> float | None:
        """Seconds until a claim of ``actions`` may find work (NULL: none known), for a
        claim made ``since`` seconds ago (time.monotonic() before it was sent) that took
        nothing: a step that came due after it is due now (negative)."""
        sharded = await self.is_sharded()
        name = "step_next_due_sharded" if sharded else "step_next_due"
        since += NEXT_DUE_SLACK_S
        try:
            row = await self._one(name, NextDue, actions=actions, since=since)
        except errors.Unavailable:
            if not sharded:
                raise
            # A node is down and the read across shards fails: the claim, which reads
            # the shards that are up one by one, looks again soon.
            return NODE_DOWN_RECHECK_S
        return None if row is None or row.seconds is None else float(row.seconds)

    async def step_attempt(self, run_id: str, node: str) -> int | None:
        row = await self._one("step_attempt", Attempt, run_id=run_id, node=node)
        return None if row is None else int(row.attempt)

    async def step_heartbeat(
        self,
        run_id: str,
        node: str,
        lease_token: str,
        *,
        lease_s: float,
        progress_json: str | None,
        logs_json: str | None = None,
    ) -> Heartbeat:
        """``logs_json``: the handler's log lines (a JSON array), stored with it."""
        key = {"run_id": run_id, "node": node, "lease_token": lease_token}
        if logs_json is None:  # one call: on the node of the run's shard
            [row] = await self._all_on(
                self.pool.shard_for(run_id),
                "step_heartbeat",
                Heartbeat,
                **key,
                lease_s=lease_s,
                progress=progress_json,
            )
            return row
        logs = logs_items([Outcome(run_id, node, lease_token, logs_json=logs_json)])
        [row] = await self._logged(
            "step_heartbeat", Heartbeat, logs, **key, lease_s=lease_s, progress=progress_json
        )
        return row

    async def steps_list(
        self,
        *,
        kind: str,
        lease_expired: bool,
        worker_id: str | None,
        action: str | None,
        after: tuple[datetime, uuid.UUID, str] | None,
        limit: int,
    ) -> list[StepListed]:
        return await self._all(
            "steps_list",
            StepListed,
            kind=kind,
            lease_expired=lease_expired,
            worker_id=worker_id,
            action=action,
            after_at=after[0] if after else None,
            after_run_id=str(after[1]) if after else None,
            after_node=after[2] if after else None,
            limit=limit,
        )
