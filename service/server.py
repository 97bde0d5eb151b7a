"""Wiring only: the gRPC server, the api wing's servicers, health and reflection, the metrics
endpoint, and the background tasks (LISTEN dispatcher, recovery sweep, retention,
reports of worker activity, schedule firing)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
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
from service import config, errors, tls, tracing
from service.api import gate
from service.api.admin import AdminServicer
from service.api.reflection import DocumentedReflectionServicer
from service.api.schedule import ScheduleServicer, keyed
from service.api.worker import WorkerServicer
from service.api.workflow import WorkflowServicer
from service.config import Settings
from service.db import Database
from service.engine.activity import ActionActivity, Handouts
from service.engine.notify import Dispatcher
from service.engine.recovery import Upkeep
from service.engine.schedules import fire_due
from service.engine.streams import StreamHub
from service.engine.waits import EventNodes
from service.ingress import HttpIngress
from service.metrics import Metrics

log = logging.getLogger("cyclone")

#: Seconds between reports of worker activity to cyclone.action_claims (Explain).
ACTIVITY_REPORT_S = 5.0

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
            route_shards=settings.citus_route == "on",
        )
        self.metrics.watch_pool(self.db.pool_status, settings.pool_size)
        #: Live readers of output streams, woken by cyclone_stream notifications.
        self.streams = StreamHub(self.db, settings.stream_recheck_s)
        self.dispatcher.on_stream = self.streams.stored
        self.activity = ActionActivity()
        self.handouts = Handouts()
        #: OpenTelemetry spans, when --tracing is on (None: no tracing code runs).
        self.tracing = tracing.start(settings.tracing)
        if self.tracing is not None:
            self.handouts.spans = self.tracing.steps()
        self.upkeep = Upkeep(
            self.db, self.dispatcher, settings, self.metrics, self.activity, self.handouts
        )
        #: The nodes the firing pass stores for a schedule whose keys are not evaluated.
        self.keyed = keyed(settings)
        options = [
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self.interceptors = [self.metrics.interceptor(), *gate.interceptors(settings)]
        if self.tracing is not None:
            # Imported only now: it needs OpenTelemetry. Innermost: behind the gate,
            # requests are decoded (their run and node read).
            from service.api.tracing import Interceptor

            self.interceptors.append(Interceptor(self.tracing.tracer))
        self.grpc = grpc.aio.server(options=options, interceptors=self.interceptors)
        self.worker = WorkerServicer(
            self.db,
            self.dispatcher,
            settings,
            self.metrics,
            self.activity,
            self.handouts,
            self.streams,
        )
        workflow_service_pb2_grpc.add_WorkflowServiceServicer_to_server(
            WorkflowServicer(self.db, settings, self.metrics, self.report_activity, self.streams),
            self.grpc,
        )
        worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(self.worker, self.grpc)
        admin_service_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(self.db, settings), self.grpc
        )
        schedule_service_pb2_grpc.add_ScheduleServiceServicer_to_server(
            ScheduleServicer(self.db, settings), self.grpc
        )
        self.health = add_health_and_reflection(self.grpc)
        self.port = tls.listen(self.grpc, settings)
        self.metrics_port: int | None = None
        #: Where /metrics is served, once started (None when off or unavailable).
        self.metrics_url: str | None = None
        #: The HTTP ingress (approvals' URLs, webhooks), when --http-listen is set.
        self.http = HttpIngress(self.db, settings, self.metrics.http_requests)
        #: Where it is served, once started (None when off).
        self.http_url: str | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        # Whether the database is sharded decides how steps are claimed: asked once.
        await self.db.start()
        self.dispatcher.start()
        self.streams.start()
        self.metrics.watch_database(self.db.workers.metrics_gauges, asyncio.get_running_loop())
        listen = config.metrics_listen(self.settings)
        self.metrics_port = self.metrics.serve(listen)
        if self.metrics_port is not None:
            host = listen.rpartition(":")[0] or "127.0.0.1"
            self.metrics_url = f"http://{host}:{self.metrics_port}/metrics"
            log.info("metrics on %s", self.metrics_url)
        http_listen = config.http_listen(self.settings)
        if http_listen is not None:
            port = self.http.start(http_listen, asyncio.get_running_loop())
            host = http_listen.rpartition(":")[0] or "127.0.0.1"
            scheme = "https" if self.settings.tls_cert else "http"
            self.http_url = f"{scheme}://{host}:{port}"
            self.worker.callback_base = self.settings.public_url or self.http_url
            log.info("HTTP ingress on %s", self.http_url)
        # Jitter keeps several servers from sweeping (or purging) in lockstep.
        loops = [
            ("sweep", self.sweep, self.settings.sweep_interval_s, 0.5),
            ("report of worker activity", self.report_activity, ACTIVITY_REPORT_S, 0.0),
            ("schedule firing", self.fire_schedules, self.settings.schedule_interval_s, 0.5),
            ("deadline firing", self.fire_deadlines, self.settings.deadline_interval_s, 0.5),
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
        self._tasks.append(
            asyncio.create_task(self.upkeep.bulk_actions(), name="cyclone-bulk-actions")
        )
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
        self.streams.stopping = True
        self.streams.wake_all()  # live stream readers end
        await self.grpc.stop(grace)
        await asyncio.to_thread(self.http.close)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.dispatcher.stop()
        await self.streams.stop()
        await metrics_closed
        await self.db.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)

    async def wait(self) -> None:
        await self.grpc.wait_for_termination()

    async def sweep(self) -> int:
        """Reclaim expired leases once; returns how many (service.engine.recovery)."""
        return await self.upkeep.sweep()

    async def releases(self) -> None:
        """Until cancelled: continue each release in progress."""
        await self.upkeep.releases()

    async def fire_schedules(self) -> int:
        """Fire the due schedules once (service.engine.schedules); returns how many runs
        the firings submitted."""
        return await fire_due(self.db, self.metrics, self.keyed)

    async def fire_deadlines(self) -> int:
        """Cancel the runs past their deadline once; returns how many."""
        return await self.upkeep.fire_deadlines()

    async def purge(self) -> int:
        """One retention pass; returns how many runs it deleted."""
        return await self.upkeep.purge()

    async def report_activity(self) -> None:
        """Write what this server saw of workers since the last report (for Explain)."""
        await self.upkeep.report_activity()


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
