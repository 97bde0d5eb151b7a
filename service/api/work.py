"""The Work stream's message protocol: credit, claims as the credit allows, and
reports answered in order (WorkerService.Work in the protos)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from google.protobuf import duration_pb2

from cyclone.v1 import (
    worker_service_pb2 as worker_pb,
)
from service import errors
from service.api import wire
from service.api.build import rare_parts
from service.api.status import stream_rpc
from service.api.validate import (
    MAX_ERROR_TEXT,
    MAX_STEP_CALL_NAME,
    MAX_STEP_CALLS,
    Context,
)
from service.config import Settings
from service.db import Database
from service.db.records import ClaimedStep
from service.engine.claims import Claimer, Claims
from service.engine.notify import Dispatcher
from service.metrics import Metrics

#: The most credit a Work stream may hold unused.
MAX_WORK_CREDIT = 10_000

_WORK_REPORT = wire.field_tag(worker_pb.WorkResponse, "report")


def _credit(held: int, granted: int) -> int:
    """A Work stream's credit after a request grants ``granted`` more."""
    if not 0 <= granted <= 1000:
        raise errors.InvalidArgument(f"credit must be between 0 and 1000, got {granted}")
    if held + granted > MAX_WORK_CREDIT:
        raise errors.InvalidArgument(
            f"credit unused would be {held + granted}; the limit is {MAX_WORK_CREDIT}"
        )
    return held + granted


def _work_answer(report: bytes) -> bytes:
    """WorkResponse.report, serialized, from a serialized CompleteManyResponse."""
    return wire.length_delimited(_WORK_REPORT, report)


def _limits(settings: Settings) -> bytes:
    """WorkResponse.limits, serialized: what the first response of a stream carries."""
    limits = worker_pb.ServerLimits(
        max_payload_bytes=settings.max_payload_bytes,
        max_step_calls=MAX_STEP_CALLS,
        max_error_text=MAX_ERROR_TEXT,
        max_step_call_name=MAX_STEP_CALL_NAME,
    )
    return worker_pb.WorkResponse(limits=limits).SerializeToString()


class WorkStream:
    """WorkerService.Work (a base of WorkerServicer)."""

    db: Database
    claims: Claims
    metrics: Metrics
    settings: Settings
    dispatcher: Dispatcher
    # WorkerServicer's: a report applied and answered, and who claims what.
    _report: Callable[[worker_pb.CompleteManyRequest], Awaitable[bytes]]
    _claimer: Callable[
        [str, Sequence[worker_pb.ActionSpec], duration_pb2.Duration | None, str, str], Claimer
    ]

    @stream_rpc
    async def Work(
        self, requests: AsyncIterator[worker_pb.WorkRequest], context: Context
    ) -> AsyncIterator[bytes]:
        """A worker's session: claims made as the credit allows, reports answered in
        order (WorkerService.Work in the protos). Yields serialized WorkResponses."""
        stream = aiter(requests)
        request = await anext(stream, None)
        if request is None:
            return
        who = self._opened(request)
        credit = 0
        # A message came since the last claim: the worker is alive (Claims.take).
        heard = True
        # Put before the first response: the server's limits, which the worker adopts.
        first = _limits(self.settings)
        reading: asyncio.Future[worker_pb.WorkRequest | None] | None = None
        self.metrics.work_streams.inc()
        try:
            with self.dispatcher.subscribe(who.actions) as ready:
                while True:
                    answer: bytes | None = None
                    if request is not None:
                        if reading is not None and request.HasField("open"):
                            raise errors.InvalidArgument(
                                "open may be set only in the first message of a Work stream"
                            )
                        credit = _credit(credit, request.credit)
                        if request.HasField("report"):
                            answer = await self._work_report(request.report)
                        request = None
                        # The next request is read meanwhile; its arrival wakes the wait.
                        reading = asyncio.ensure_future(anext(stream, None))
                        reading.add_done_callback(lambda _: ready.set())
                    assert reading is not None
                    if self.claims.stopping.is_set():
                        if answer is not None:
                            yield first + _work_answer(answer)
                        return
                    steps = b""
                    full = False
                    claimed_at = None
                    if credit > 0:
                        # Cleared, and the time taken, before the claim: neither a
                        # wake-up nor a step coming due while it runs is lost.
                        ready.clear()
                        claimed_at = time.monotonic()
                        limit = min(credit, self.settings.max_claim_batch)
                        try:
                            steps, handed = await self._work_claim(who, limit, heard)
                            heard = False
                        except Exception:
                            if answer is not None:  # applied: its answer goes first
                                yield first + _work_answer(answer)
                            raise
                        credit -= handed
                        full = handed == limit
                    if answer is not None:
                        yield first + steps + _work_answer(answer)
                        first = b""
                    elif steps:
                        yield first + steps
                        first = b""
                    if full and credit > 0:
                        continue  # as many as asked: more may be ready
                    if not reading.done():
                        since = claimed_at if credit > 0 else None
                        await self._work_wait(who, ready, reading, since)
                    if reading.done():
                        request = reading.result()
                        if request is None:
                            return  # the worker closed its side: the session is over
                        heard = True
        finally:
            self.metrics.work_streams.dec()
            if reading is not None and not reading.done():
                reading.cancel()

    def _opened(self, request: worker_pb.WorkRequest) -> Claimer:
        """Who claims on a Work stream, from its first message (which must open it)."""
        if not request.HasField("open"):
            raise errors.InvalidArgument("the first message of a Work stream must set open")
        opened = request.open
        return self._claimer(
            opened.worker_id,
            opened.actions,
            opened.lease if opened.HasField("lease") else None,
            opened.build_id,
            opened.shard_node,
        )

    async def _work_report(self, report: worker_pb.CompleteManyRequest) -> bytes:
        """A report of a Work stream applied: its answer, serialized."""
        started = time.perf_counter()
        try:
            return await self._report(report)
        finally:
            self.metrics.work_report_s.inc(time.perf_counter() - started)

    async def _work_wait(
        self,
        who: Claimer,
        ready: asyncio.Event,
        reading: asyncio.Future[worker_pb.WorkRequest | None],
        claimed_at: float | None,
    ) -> None:
        """Claims.wait_for_work, its time counted: on the worker while it has no credit
        left (``claimed_at`` None), idle while it has."""
        started = time.perf_counter()
        try:
            await self.claims.wait_for_work(who, ready, reading, claimed_at)
        finally:
            spent = time.perf_counter() - started
            m = self.metrics
            (m.work_worker_s if claimed_at is None else m.work_idle_s).inc(spent)

    async def _work_claim(self, who: Claimer, limit: int, heard: bool) -> tuple[bytes, int]:
        """One claim of a Work stream: the serialized steps and blocked runs of a
        WorkResponse, and how many steps it hands out. ``heard``: a message of the
        worker came since the last claim (Claims.take)."""
        started = time.perf_counter()
        try:
            steps, blocked = await self.claims.take(who, limit, heard)
        finally:
            self.metrics.work_claim_s.inc(time.perf_counter() - started)
        out = b""
        if steps:
            out = wire.work_steps(steps, rare_parts)
        if blocked:
            response = worker_pb.WorkResponse(blocked=await self._blocked_steps(blocked))
            out += response.SerializeToString()
        return out, len(steps)

    async def _blocked_steps(self, rows: Sequence[ClaimedStep]) -> list[worker_pb.BlockedStep]:
        """What a claim blocked, with the reason each run's error gives, for its worker."""
        if not rows:
            return []
        run_errors = await self.db.runs.runs_errors([r.run_id for r in rows])
        found = []
        for r in rows:
            error = run_errors.get(r.run_id) or {}
            found.append(
                worker_pb.BlockedStep(
                    run_id=r.run_id,
                    node=r.node,
                    attempt=r.attempt,
                    action=r.action,
                    step_id=error.get("step_id") or "",
                    reason=error.get("message") or "EffectUncertain",
                )
            )
        return found
