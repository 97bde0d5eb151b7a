"""Bulk actions' jobs, worked through by whichever server holds a job's lease: a batch
of the runs its filter matches (newest first, below its cursor, created before the
job), acted on and the cursor moved past them in one transaction (cyclone.bulk_apply),
at most --bulk-rate runs a second. A server stopped or killed mid-job leaves its lease
to lapse (--bulk-lease); another server, or the same one restarted, then goes on from
the cursor, so each run is taken once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from datetime import datetime

from service import errors
from service.config import Settings
from service.db import Database
from service.db.bulk import BulkJob, query_of
from service.engine.notify import Dispatcher
from service.metrics import Metrics

log = logging.getLogger("cyclone")

#: The name a new job makes ready (cyclone.bulk_start): no action can have it.
BULK = "cyclone.bulk"
#: Most runs one batch (one transaction) takes.
MAX_BATCH = 500


def batch_size(rate: int) -> int:
    """Runs per batch: about a second's worth at ``rate``, at most MAX_BATCH."""
    return max(1, min(MAX_BATCH, rate))


class BulkWorker:
    """This server's share of the bulk actions."""

    def __init__(
        self, db: Database, dispatcher: Dispatcher, settings: Settings, metrics: Metrics
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.settings = settings
        self.metrics = metrics
        #: Who holds a job's lease: this process, whatever its restarts reuse.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"

    async def run(self) -> None:
        """Until cancelled: take a job nobody holds and work it through; when there is
        none, sleep until one starts (here or on another server) or a sweep interval
        has passed (a lease that lapsed)."""
        while True:
            with self.dispatcher.subscribe([BULK]) as woken:
                worked = False
                try:
                    worked = await self.work_one()
                except errors.CycloneError as exc:
                    log.warning("bulk action failed, to be taken up again: %s", exc)
                except Exception:
                    log.exception("bulk action failed, to be taken up again")
                if worked:
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.sweep_interval_s):
                        await woken.wait()

    async def work_one(self) -> bool:
        """Take one job and work it until it is done, cancelled or lost; False when
        there was none to take."""
        lease = self.settings.bulk_lease_s
        job = await self.db.bulk.bulk_claim(self.owner, lease)
        if job is None:
            return False
        query = query_of(job.query)
        # A fixed snapshot: only the runs created before the job.
        bound: datetime | None = query.get("created_before")
        query["created_before"] = job.created_at if bound is None else min(bound, job.created_at)
        rate = max(1, self.settings.bulk_rate)
        size = batch_size(rate)
        loop = asyncio.get_running_loop()
        log.info("bulk action %s: working from %s", job.job_id, job.cursor_at or "the start")
        while job.state == "running" and job.lease_owner == self.owner:
            started = loop.time()
            after = (job.cursor_at, job.cursor_run) if job.cursor_at and job.cursor_run else None
            rows = await self.db.runs.runs_list(**query, after=after, limit=size)
            cursor = (rows[-1].created_at, rows[-1].run_id) if rows else after
            before = job
            job = await self.db.bulk.bulk_apply(
                job,
                owner=self.owner,
                lease_s=lease,
                runs=[r.run_id for r in rows],
                cursor=cursor,
                done=len(rows) < size,
            )
            self._count(before, job)
            await asyncio.sleep(max(0.0, len(rows) / rate - (loop.time() - started)))
        _log_end(job)
        if job.state in ("done", "cancelled"):
            self.metrics.bulk_finished.labels(job.state).inc()
        return True

    def _count(self, before: BulkJob, after: BulkJob) -> None:
        """The runs one batch worked, in cyclone_bulk_runs."""
        for outcome in ("touched", "skipped", "failed"):
            worked = getattr(after, outcome) - getattr(before, outcome)
            if worked > 0:
                self.metrics.bulk_runs.labels(after.action, outcome).inc(worked)


def _log_end(job: BulkJob) -> None:
    counts = f"{job.touched} touched, {job.skipped} skipped, {job.failed} failed"
    if job.state == "done":
        log.info("bulk action %s done: %s", job.job_id, counts)
    elif job.state == "cancelled":
        log.info("bulk action %s cancelled by %s: %s", job.job_id, job.cancelled_by, counts)
    else:
        log.info("bulk action %s: another server took it over at %s", job.job_id, counts)
