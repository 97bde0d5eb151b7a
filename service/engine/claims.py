"""The claim loop: claims made for a worker (a Claim's long poll, or a Work stream's
claims as its credit allows), the steps handed back when the caller went away, the
bookkeeping of steps handed out, and the wait for work to become ready."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from service import errors
from service.config import Settings
from service.db import Database
from service.db.records import ClaimedStep
from service.engine.activity import ActionActivity, Handouts
from service.engine.notify import Dispatcher
from service.metrics import Metrics

log = logging.getLogger("cyclone")


class Claimer(NamedTuple):
    """Who claims, and what: a Claim's (or a Work stream's) worker and actions, checked."""

    worker_id: str
    actions: list[str]
    #: The actions the worker marks unsafe_to_repeat.
    unsafe: list[str]
    #: The actions it declares rate limited: (count, period_s).
    rates: dict[str, tuple[int, float]]
    lease_s: float
    #: The build it declares (ClaimRequest.build_id); None: none.
    build_id: str | None = None
    #: On Citus, the node whose shards' runs it takes (ClaimRequest.shard_node);
    #: None: any.
    shard_node: str | None = None


#: How often a worker's build is recorded again (ListBuilds' "workers seen") while it
#: keeps claiming with it.
BUILD_SEEN_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class Claims:
    """Claims for the workers of one server."""

    db: Database
    dispatcher: Dispatcher
    settings: Settings
    metrics: Metrics
    activity: ActionActivity
    handouts: Handouts
    #: Set when the server stops: waiting claims answer at once.
    stopping: asyncio.Event
    #: When each (build, worker) was last recorded (time.monotonic()).
    builds_seen: dict[tuple[str, str], float] = field(default_factory=dict)

    async def take(
        self, who: Claimer, limit: int, heard: bool = False
    ) -> tuple[list[ClaimedStep], list[ClaimedStep]]:
        """One claim for ``who``: the steps handed out, and those that blocked their run
        instead (unsafe to repeat, their lease lost). ``heard``: the worker sent a
        message since its last claim, so it is alive: a claim that finds nothing then
        clears its unhealthy mark, if it has one, and claims again (a marked worker is
        handed nothing; the mark costs a claim that finds steps no statement)."""
        worker_id, actions, unsafe, rates, lease, build_id, shard_node = who
        self.activity.polled(actions, worker_id, build_id)
        if build_id is not None:
            await self.build_seen(build_id, worker_id)
        terms = (unsafe, limit, lease, rates, build_id, shard_node)
        rows = await self.claim(worker_id, actions, *terms)
        if not rows and heard and await self.alive(worker_id):
            rows = await self.claim(worker_id, actions, *terms)
        blocked = [r for r in rows if self.blocked(r)]
        steps = [r for r in rows if not r.blocked]
        if steps:
            self.handed_out(steps, lease)
            self.activity.claimed({r.action for r in steps}, worker_id)
        return steps, blocked

    async def alive(self, worker_id: str) -> bool:
        """The worker showed it is alive: clear its unhealthy mark (a lease of it lapsed
        with no outcome); whether it had one."""
        try:
            if not await self.db.workers.worker_alive(worker_id):
                return False
        except errors.Unavailable:
            if not await self.db.pool.is_sharded():
                raise
            # On Citus the mark is in a reference table, a copy on every node, which
            # cannot be written while a node is down: it stays until the node is back.
            return False
        log.info("worker %s reported again: it is no longer marked unhealthy", worker_id)
        return True

    async def waiting(
        self, who: Claimer, limit: int, wait: float
    ) -> tuple[list[ClaimedStep], list[ClaimedStep]]:
        """A Claim's long poll: :meth:`take` until it finds a step (handed out or
        blocked), ``wait`` seconds run out, or the server stops."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        waiting = False
        heard = True  # the Claim itself: the first take may clear an unhealthy mark
        try:
            while True:
                with self.dispatcher.subscribe(who.actions) as ready:
                    claimed_at = time.monotonic()
                    steps, blocked = await self.take(who, limit, heard)
                    heard = False
                    remaining = deadline - loop.time()
                    if steps or blocked or remaining <= 0 or self.stopping.is_set():
                        return steps, blocked
                    if not waiting:
                        waiting = True
                        self.metrics.waiting_claims.inc()
                    due = await self.db.steps.step_next_due(
                        who.actions, time.monotonic() - claimed_at
                    )
                    # The wake-up is the notification; the timeout only covers backoffs
                    # coming due, and is a safety net (--claim-recheck) should a
                    # notification ever be missed.
                    recheck = self.settings.claim_recheck_s
                    timeout = min(remaining, recheck if due is None else max(due, 0.001))
                    # Awaited directly, not through a task: a wake-up resumes this claim
                    # in one turn of the event loop. A stopping server wakes every waiter.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(timeout):
                            await ready.wait()
        finally:
            if waiting:
                self.metrics.waiting_claims.dec()

    async def build_seen(self, build_id: str, worker_id: str) -> None:
        """Record a worker's build, at most every BUILD_SEEN_EVERY_S per worker."""
        key = (build_id, worker_id)
        at = time.monotonic()
        last = self.builds_seen.get(key)
        if last is not None and at - last < BUILD_SEEN_EVERY_S:
            return
        if len(self.builds_seen) > 10_000:
            self.builds_seen.clear()
        self.builds_seen[key] = at
        if await self.db.builds.build_seen(build_id, worker_id):
            log.warning(
                "worker %s declares build %s, which is retired: it is handed no step; "
                "stop it, or deploy it with a build in service",
                worker_id,
                build_id,
            )

    async def claim(
        self,
        worker_id: str,
        actions: list[str],
        unsafe: list[str],
        limit: int,
        lease: float,
        rates: Mapping[str, tuple[int, float]],
        build_id: str | None = None,
        shard_node: str | None = None,
    ) -> Sequence[ClaimedStep]:
        """Claim, and if the caller goes away meanwhile, hand the steps back at once
        rather than leave them leased to nobody until the lease runs out."""
        claim = asyncio.ensure_future(
            self.db.steps.step_claim(
                worker_id=worker_id,
                actions=actions,
                unsafe=unsafe,
                limit=limit,
                lease_s=lease,
                rates=rates,
                build_id=build_id,
                shard_node=shard_node,
            )
        )
        try:
            return await asyncio.shield(claim)
        except asyncio.CancelledError:
            rows = [r for r in await claim if not r.blocked]
            if rows:
                released = await asyncio.shield(self.db.steps.steps_release(rows))
                log.info("claim cancelled by its caller: %d step(s) handed back", released)
                for r in rows:
                    log.info(
                        "step %s/%s handed back: the caller of its claim went away, so "
                        "attempt %d did not start",
                        r.run_id,
                        r.node,
                        r.attempt,
                        extra={"run_id": str(r.run_id), "node": r.node, "attempt": r.attempt},
                    )
            raise

    def handed_out(self, rows: Sequence[ClaimedStep], lease: float) -> None:
        """Note the steps handed out (their outcomes are timed and logged with their
        attempt) and count them."""
        debug = log.isEnabledFor(logging.DEBUG)
        now = time.monotonic()
        add = self.handouts.add
        # One claim's steps mostly share their action and lease times: the lifetime
        # (datetime arithmetic) and the action's metrics are looked up once per value.
        lifetimes: dict[tuple[Any, Any], float] = {}
        actions: dict[str, Any] = {}
        claimed: dict[str, int] = {}
        for r in rows:
            times = (r.deadline_at, r.lease_expires_at)
            lifetime = lifetimes.get(times)
            if lifetime is None:
                lifetime = lifetimes[times] = (
                    r.deadline_at - r.lease_expires_at
                ).total_seconds() + lease
            action = r.action
            add(r.lease_token, action, r.attempt, lifetime, now)
            per_action = actions.get(action)
            if per_action is None:
                per_action = actions[action] = self.metrics.action(action)
                claimed[action] = 0
            claimed[action] += 1
            per_action.claim_wait.observe(r.waited_s)
            if debug:
                log.debug(
                    "claimed %s/%s attempt %d",
                    r.run_id,
                    r.node,
                    r.attempt,
                    extra={"run_id": r.run_id, "node": r.node, "attempt": r.attempt},
                )
        for action, n in claimed.items():
            actions[action].claimed.inc(n)
        if self.handouts.spans is not None:
            self.traced(rows)

    def traced(self, rows: Sequence[ClaimedStep]) -> None:
        """A span in its run's trace for each step handed out of a run that has one."""
        spans, handouts = self.handouts.spans, self.handouts
        assert spans is not None
        for r in rows:
            traceparent = r.traceparent
            if traceparent:
                spans.claimed(traceparent, r.run_id, r.node, r.action, r.attempt)
                handouts.trace(r.lease_token, traceparent)

    def blocked(self, row: ClaimedStep) -> bool:
        if row.blocked:
            self.metrics.blocked.labels(row.action).inc()
        return log_blocked(row)

    async def wait_for_work(
        self,
        who: Claimer,
        ready: asyncio.Event,
        reading: asyncio.Future[Any],
        claimed_at: float | None,
    ) -> None:
        """Wait for the next request of a Work stream, and while the worker has credit
        left, for a step to become ready (a notification, or a backoff coming due).
        ``claimed_at``: time.monotonic() before the claim that left credit unused
        (None: no credit)."""
        if claimed_at is None:
            ready.clear()
            if not reading.done():
                await ready.wait()  # set by the request's arrival (and by notifications)
            return
        due = await self.db.steps.step_next_due(who.actions, time.monotonic() - claimed_at)
        recheck = self.settings.claim_recheck_s
        timeout = recheck if due is None else min(recheck, max(due, 0.001))
        self.metrics.waiting_claims.inc()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await ready.wait()
        finally:
            self.metrics.waiting_claims.dec()


def log_blocked(row: ClaimedStep) -> bool:
    if row.blocked:
        log.warning(
            "run %s blocked: node %s (action %s) lost its lease at attempt %d with no "
            "outcome and is unsafe to repeat; resolve it with `cyclone resolve %s %s`",
            row.run_id,
            row.node,
            row.action,
            row.attempt,
            row.run_id,
            row.node,
            extra={"run_id": str(row.run_id), "node": row.node, "attempt": row.attempt},
        )
    return bool(row.blocked)
