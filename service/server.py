"""Wiring only: the gRPC server, its servicers, health and reflection, and the
background tasks (LISTEN dispatcher, recovery sweep)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from cyclone.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)
from service import convert, errors
from service.config import Settings
from service.notify import Dispatcher
from service.reflection import DocumentedReflectionServicer
from service.servicers import AdminServicer, WorkerServicer, WorkflowServicer
from service.store import Store

log = logging.getLogger("cyclone")

SERVICE_NAMES = (
    workflow_service_pb2.DESCRIPTOR.services_by_name["WorkflowService"].full_name,
    worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
    admin_service_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
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
        convert.PayloadLimits.max_bytes = settings.max_payload_bytes
        convert.PayloadLimits.max_depth = settings.max_json_depth
        self.dispatcher = Dispatcher(database_url)
        self.store = Store(
            database_url,
            pool_size=settings.pool_size,
            statement_timeout_ms=settings.statement_timeout_ms,
            on_ready=self.dispatcher.publish,
        )
        options = [
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", settings.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self.grpc = grpc.aio.server(options=options)
        self.worker = WorkerServicer(self.store, self.dispatcher, settings)
        workflow_service_pb2_grpc.add_WorkflowServiceServicer_to_server(
            WorkflowServicer(self.store, settings), self.grpc
        )
        worker_service_pb2_grpc.add_WorkerServiceServicer_to_server(self.worker, self.grpc)
        admin_service_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(self.store), self.grpc
        )
        self.health = add_health_and_reflection(self.grpc)
        self.port = self.grpc.add_insecure_port(settings.listen)
        if self.port == 0:
            raise RuntimeError(f"cannot listen on {settings.listen}")
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.dispatcher.start()
        self._tasks.append(asyncio.create_task(self._sweep_loop(), name="cyclone-sweep"))
        await self.grpc.start()
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls, release waiting claims, let in-flight calls finish."""
        grace = self.settings.grace_s if grace is None else grace
        await self.health.enter_graceful_shutdown()
        self.worker.stopping.set()
        await self.grpc.stop(grace)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.dispatcher.stop()
        await self.store.close()

    async def wait(self) -> None:
        await self.grpc.wait_for_termination()

    async def _sweep_loop(self) -> None:
        interval = self.settings.sweep_interval_s
        while True:
            # Jitter keeps several servers from sweeping in lockstep.
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))
            try:
                reclaimed = await self.store.sweep(self.settings.sweep_batch)
            except errors.CycloneError as exc:
                log.warning("sweep failed: %s", exc)
                continue
            except Exception:
                log.exception("sweep failed")
                continue
            if reclaimed:
                log.info("sweep reclaimed %d expired lease(s)", reclaimed)
