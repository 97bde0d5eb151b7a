"""The server's upkeep, each pass run in a loop by the wiring: the recovery sweep of
expired leases, the cancel of runs past their deadline, the release loop (a wide
fan-out's dependents released in chunks), retention, the reports of worker activity
(for Explain), and the bulk actions' jobs (service.engine.bulk)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass

from service import errors
from service.config import Settings
from service.db import Database
from service.engine.activity import ActionActivity, Handouts
from service.engine.bulk import BulkWorker
from service.engine.notify import Dispatcher
from service.metrics import Metrics

log = logging.getLogger("cyclone")

#: The name a transition makes ready when it leaves a release in progress
#: (cyclone._settle): no action can have it (the prefix cyclone. is reserved).
RELEASE = "cyclone.release"
#: Runs with a release in progress read at a time by the release loop.
RELEASE_BATCH = 100


@dataclass(frozen=True, slots=True)
class Upkeep:
    """The background passes of one server."""

    db: Database
    dispatcher: Dispatcher
    settings: Settings
    metrics: Metrics
    activity: ActionActivity
    handouts: Handouts

    async def sweep(self) -> int:
        """Reclaim expired leases once, and on a sharded database deliver the parent
        wakes still owed; returns how many leases."""
        reclaimed = await self.db.retention.sweep(
            self.settings.sweep_batch, self.settings.max_recoveries
        )
        for step in reclaimed:
            self.metrics.lease_expiries.labels(step.action).inc()
            extra = {"run_id": str(step.run_id), "node": step.node, "attempt": step.attempt}
            if step.status == "discarded":
                self.metrics.discarded.labels("worker_lost" if step.lost else "lease_expired").inc()
                log.error(
                    "step %s/%s discarded: the lease of worker %s expired at attempt %d, %s",
                    step.run_id,
                    step.node,
                    step.worker_id,
                    step.attempt,
                    "past the recovery budget (--max-recoveries)" if step.lost else "its last",
                    extra=extra,
                )
            else:
                log.warning(
                    "step %s/%s %s: %s at attempt %d with no outcome",
                    step.run_id,
                    step.node,
                    "held by its run's pause" if step.status == "pending" else "available again",
                    f"worker {step.worker_id} was lost (its lease lapsed)"
                    if step.lost
                    else f"the lease of worker {step.worker_id} ran to the step's timeout",
                    step.attempt,
                    extra=extra,
                )
            if step.lost:
                log.warning(
                    "worker %s marked unhealthy: it is handed no step until it reports again",
                    step.worker_id,
                    extra=extra,
                )
        if reclaimed:
            log.info("sweep reclaimed %d expired lease(s)", len(reclaimed))
        if await self.db.pool.is_sharded():
            # Parent wakes that child runs finished on a worker node still owe (a crash
            # or an unreachable node came between their commit and the wake).
            delivered = await self.db.shard_reports.wakes_owed(self.settings.sweep_batch)
            if delivered:
                log.info("sweep delivered %d parent wake(s) owed by child runs", delivered)
        return len(reclaimed)

    async def fire_deadlines(self) -> int:
        """Cancel the running runs whose deadline has passed, a batch per transaction,
        until none is due (run_deadlines_fire: each run once, whatever other servers do
        meanwhile); returns how many."""
        total = 0
        while True:
            fired = await self.db.retention.run_deadlines_fire(self.settings.sweep_batch)
            for run in fired:
                self.metrics.deadlines_exceeded.inc()
                log.warning(
                    "run %s cancelled: deadline exceeded at %s",
                    run.run_id,
                    run.deadline.isoformat(),
                    extra={"run_id": str(run.run_id)},
                )
            total += len(fired)
            if len(fired) < self.settings.sweep_batch:
                return total
            await asyncio.sleep(0)  # let the calls in progress have the loop

    async def releases(self) -> None:
        """Until cancelled: continue each release in progress (cyclone.releases: the
        dependents of a wide fan-out's root, counted 1,000 per transaction), a chunk per
        transaction, so that the run's claims and completions go on between chunks; then
        sleep until a transition starts one (it makes the name RELEASE ready, here or on
        another server) or a sweep interval has passed (a release that a stopped server
        left half way). Several servers may continue one run: each chunk takes the run's
        lock and reads where the last one stopped."""
        while True:
            with self.dispatcher.subscribe([RELEASE]) as woken:
                pending: list[uuid.UUID] = []
                try:
                    pending = await self.db.retention.releases_pending(RELEASE_BATCH)
                except errors.CycloneError as exc:
                    log.warning("the releases in progress could not be read: %s", exc)
                # One run whose release fails is tried again at the next pass; the
                # others go on meanwhile.
                failed = 0
                for run_id in pending:
                    try:
                        while await self.db.retention.release_continue(run_id):
                            pass
                    except Exception as exc:
                        failed += 1
                        log.error(
                            "the release of run %s failed: %s",
                            run_id,
                            exc,
                            exc_info=not isinstance(exc, errors.CycloneError),
                            extra={"run_id": str(run_id)},
                        )
                if len(pending) == RELEASE_BATCH and not failed:
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.sweep_interval_s):
                        await woken.wait()

    async def bulk_actions(self) -> None:
        """Until cancelled: take the bulk actions nobody works on and work them through,
        a batch per transaction, at most --bulk-rate runs a second."""
        await BulkWorker(self.db, self.dispatcher, self.settings, self.metrics).run()

    async def purge(self) -> int:
        """One retention pass: delete runs past their age, a batch per statement, until
        none is left; returns how many. Each batch skips what others hold locked."""
        total = 0
        policies = (
            ("finished", self.settings.retention_s),
            ("failed", self.settings.retention_failed_s),
        )
        for policy, age in policies:
            if not age:
                continue
            while True:
                deleted = await self.db.retention.runs_purge(
                    age_s=age, failed=policy == "failed", limit=self.settings.retention_batch
                )
                self.metrics.retention_deleted.labels(policy).inc(deleted)
                total += deleted
                if deleted < self.settings.retention_batch:
                    break
                await asyncio.sleep(0)  # let the calls in progress have the loop
        if total:
            log.info("retention deleted %d run(s)", total)
        keys = 0
        while self.settings.key_retention_s:
            deleted = await self.db.retention.submit_keys_purge(
                age_s=self.settings.key_retention_s, limit=self.settings.retention_batch
            )
            self.metrics.retention_deleted.labels("keys").inc(deleted)
            keys += deleted
            if deleted < self.settings.retention_batch:
                break
            await asyncio.sleep(0)
        if keys:
            log.info("retention forgot %d SubmitOnce key(s)", keys)
        return total

    async def report_activity(self) -> None:
        """Write what this server saw of workers since the last report (for Explain and
        ListWorkers), and forget the handouts whose outcome can no longer come."""
        self.handouts.prune()
        await self.db.workers.action_claims_note(self.activity.take())
        await self.db.workers.workers_seen_note(self.activity.take_workers())
