"""Wiring only: the gRPC server, its servicers, health and reflection, the metrics
endpoint, and the background tasks (LISTEN dispatcher, recovery sweep, retention,
reports of worker activity, schedule firing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from cyclone.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    schedule_service_pb2,
    schedule_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)
from service import config, errors, gate, schedules, tls
from service.activity import ActionActivity, Handouts
from service.config import Settings
from service.db import Database
from service.metrics import Metrics
from service.notify import Dispatcher
from service.reflection import DocumentedReflectionServicer
from service.servicers import AdminServicer, WorkerServicer, WorkflowServicer
from service.waits import EventNodes

log = logging.getLogger("cyclone")

#: Seconds between reports of worker activity to cyclone.action_claims (Explain).
ACTIVITY_REPORT_S = 5.0
#: The name a transition makes ready when it leaves a release in progress
#: (cyclone._settle): no action can have it (the prefix cyclone. is reserved).
RELEASE = "cyclone.release"
#: Runs with a release in progress read at a time by the release loop.
RELEASE_BATCH = 100

SERVICE_NAMES = (
    workflow_service_pb2.DESCRIPTOR.services_by_name["WorkflowService"].full_name,
    worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
    schedule_service_pb2.DESCRIPTOR.services_by_name["ScheduleService"].full_name,
)


def add_health_and_reflection(server: grpc.aio.Server) -> health.aio.HealthServicer:
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        DocumentedReflectionServicer(names), server
    )
    return health_servicer


class CycloneServer:
    """A running Cyclone server process: gRPC, the database, background tasks."""

    def __init__(self, settings: Settings, database_url: str) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.dispatcher = Dispatcher(database_url)
        self.db = Database(
            database_url,
            pool_size=settings.pool_size,
            statement_timeout_ms=settings.statement_timeout_ms,
            on_ready=self.dispatcher.publish,
            on_acquire=self.metrics.pool_wait.observe,
        )
        self.metrics.watch_pool(self.db.pool_status, settings.pool_size)
        self.activity = ActionActivity()
        self.handouts = Handouts()
        options = [
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self.interceptors = [self.metrics.interceptor(), *gate.interceptors(settings)]
        self.grpc = grpc.aio.server(options=options, interceptors=self.interceptors)
        self.worker = WorkerServicer(
            self.db, self.dispatcher, settings, self.metrics, self.activity, self.handouts
        )
        workflow_service_pb2_grpc.add_WorkflowServiceServicer_to_server(
            WorkflowServicer(self.db, settings, self.metrics, self.report_activity),
            self.grpc,
        )
        worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(self.worker, self.grpc)
        admin_service_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(self.db, settings), self.grpc
        )
        schedule_service_pb2_grpc.add_ScheduleServiceServicer_to_server(
            schedules.ScheduleServicer(self.db, settings), self.grpc
        )
        self.health = add_health_and_reflection(self.grpc)
        self.port = tls.listen(self.grpc, settings)
        self.metrics_port: int | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.dispatcher.start()
        self.metrics.watch_database(self.db.workers.metrics_gauges, asyncio.get_running_loop())
        listen = config.metrics_listen(self.settings)
        self.metrics_port = self.metrics.serve(listen)
        if self.metrics_port is not None:
            host = listen.rpartition(":")[0]
            log.info("metrics on http://%s:%d/metrics", host, self.metrics_port)
        # Jitter keeps several servers from sweeping (or purging) in lockstep.
        loops = [
            ("sweep", self.sweep, self.settings.sweep_interval_s, 0.5),
            ("report of worker activity", self.report_activity, ACTIVITY_REPORT_S, 0.0),
            ("schedule firing", self.fire_schedules, self.settings.schedule_interval_s, 0.5),
        ]
        s = self.settings
        if s.retention_s or s.retention_failed_s or s.key_retention_s:
            loops.append(("retention pass", self.purge, self.settings.retention_interval_s, 0.5))
        for what, job, interval, jitter in loops:
            self._tasks.append(
                asyncio.create_task(_every(interval, jitter, job, what), name=f"cyclone-{what}")
            )
        self._tasks.append(
            asyncio.create_task(
                EventNodes(self.db, self.dispatcher, self.settings).run(),
                name="cyclone-event-nodes",
            )
        )
        self._tasks.append(asyncio.create_task(self.releases(), name="cyclone-releases"))
        await self.grpc.start()
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, release waiting claims, let in-flight calls finish."""
        grace = self.settings.grace_s if grace is None else grace
        # The metrics endpoint takes up to half a second to stop; the rest goes meanwhile.
        metrics_closed = asyncio.ensure_future(asyncio.to_thread(self.metrics.close))
        await self.health.enter_graceful_shutdown()
        self.worker.stopping.set()
        self.dispatcher.wake_all()  # waiting claims answer now
        await self.grpc.stop(grace)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.dispatcher.stop()
        await metrics_closed
        await self.db.close()

    async def wait(self) -> None:
        await self.grpc.wait_for_termination()

    async def sweep(self) -> int:
        """Reclaim expired leases once; returns how many."""
        reclaimed = await self.db.retention.sweep(self.settings.sweep_batch)
        for step in reclaimed:
            self.metrics.lease_expiries.labels(step.action).inc()
            extra = {"run_id": str(step.run_id), "node": step.node, "attempt": step.attempt}
            if step.status == "discarded":
                self.metrics.discarded.labels("lease_expired").inc()
                log.error(
                    "step %s/%s discarded: the lease of worker %s expired at attempt %d, its last",
                    step.run_id,
                    step.node,
                    step.worker_id,
                    step.attempt,
                    extra=extra,
                )
            else:
                log.warning(
                    "step %s/%s available again: the lease of worker %s expired at "
                    "attempt %d with no outcome",
                    step.run_id,
                    step.node,
                    step.worker_id,
                    step.attempt,
                    extra=extra,
                )
        if reclaimed:
            log.info("sweep reclaimed %d expired lease(s)", len(reclaimed))
        return len(reclaimed)

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

    async def fire_schedules(self) -> int:
        """Fire the due schedules once (service.schedules); returns how many runs the
        firings submitted."""
        return await schedules.fire_due(self.db, self.metrics, self.settings)

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
        """Write what this server saw of workers since the last report (for Explain),
        and forget the handouts whose outcome can no longer come."""
        self.handouts.prune()
        await self.db.workers.action_claims_note(self.activity.take())


async def _every(
    interval: float, jitter: float, job: Callable[[], Awaitable[object]], what: str
) -> None:
    """Run ``job`` every ``interval`` seconds (± ``jitter`` of it) until cancelled."""
    while True:
        await asyncio.sleep(interval * random.uniform(1 - jitter, 1 + jitter))
        try:
            await job()
        except errors.CycloneError as exc:
            log.warning("%s failed: %s", what, exc)
        except Exception:
            log.exception("%s failed", what)
