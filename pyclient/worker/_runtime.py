"""One run of a worker: opens the channel (and the completion pool), wires the
session, producer, executor, watch and completer together, runs each claimed step
through them (:meth:`Runtime.run_step`), and shuts down."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from cyclone.jsonvalue import from_value
from cyclone.v1 import worker_service_pb2 as pb
from cyclone.v1 import worker_service_pb2_grpc as pb_grpc
from pyclient.client import call_metadata
from pyclient.completion import CompletionTx, open_pool
from pyclient.context import StepControl, claimed_context
from pyclient.durable._errors import Suspended
from pyclient.durable._replay import Replay
from pyclient.models import StepCall, UpstreamFailure, timestamp_datetime, value_field
from pyclient.worker import _logs as step_logs
from pyclient.worker._common import StepLog, log
from pyclient.worker._completer import Completer
from pyclient.worker._executor import Executor
from pyclient.worker._journal import GrpcJournal
from pyclient.worker._mailbox import Mailbox
from pyclient.worker._producer import Producer
from pyclient.worker._session import Session
from pyclient.worker._timers import Alarms
from pyclient.worker._watch import Watch, WatchPolicy

if TYPE_CHECKING:
    from pyclient.worker import Worker

#: The upstream outputs of a step that has none (most).
NO_UPSTREAM: MappingProxyType[str, Any] = MappingProxyType({})


def seconds(ts: Timestamp) -> float:
    """A Timestamp as seconds since the epoch."""
    return ts.seconds + ts.nanos * 1e-9


class Runtime:
    """One run of a worker: channel, handler slots, in-flight steps."""

    def __init__(self, worker: Worker, loop: asyncio.AbstractEventLoop):
        self.w = worker
        self.loop = loop
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        self.metadata = call_metadata(worker._token, None)
        self.channel: grpc.aio.Channel | None = None
        self.stub: Any = None
        self.pool: Any = None
        self.policy = WatchPolicy(worker.lease)
        #: Handler outcomes and heartbeat requests, from the handlers' threads.
        self.inbox = Mailbox(loop)
        self.alarms = Alarms(loop)
        self.producer = Producer(self)
        self.completer = Completer(self, self.producer.freed)
        self.session = Session(self)
        self.executor: Executor | None = None
        self._last_time: tuple[tuple[int, int], dt.datetime] = (
            (0, 0),
            timestamp_datetime(Timestamp()),
        )
        # Reconnect as eagerly as the claim loop retries, not after gRPC's default backoff.
        self.channel_options = [
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", max(100, int(worker.reconnect_max_delay * 1000))),
        ]

    def _datetime(self, ts: Timestamp) -> dt.datetime:
        """``ts`` as a datetime; the steps of a claim share their deadline, made once."""
        key = (ts.seconds, ts.nanos)
        if key != self._last_time[0]:
            self._last_time = (key, timestamp_datetime(ts))
        return self._last_time[1]

    def request_stop(self) -> None:
        if self.stopping.is_set():
            self.forced.set()
        self.stopping.set()

    async def serve(self) -> None:
        w = self.w
        options = self.channel_options
        self.channel = (
            grpc.aio.secure_channel(w.address, w._credentials, options=options)
            if w._credentials
            else grpc.aio.insecure_channel(w.address, options=options)
        )
        self.stub = pb_grpc.WorkerServiceStub(self.channel)
        if w.database_url:
            self.pool = await asyncio.to_thread(open_pool, w.database_url, w.concurrency)
        self.executor = Executor(
            self.loop, self.inbox, any_async=any(a.is_async for a in w._actions.values())
        )
        log.info(
            "worker %s: serving %s on %s with %d slots",
            w.worker_id,
            ", ".join(sorted(w._actions)),
            w.address,
            w.concurrency,
        )
        try:
            with step_logs.capturing():
                # On Work streams; with Claim and CompleteMany on a server without them.
                # Either returns once nothing more can be handed out (the last stream
                # has ended): the drain below then sees every step handed out.
                if not await self.session.serve():
                    await self.producer.claim_loop()
        finally:
            await self._drain()
            await self.channel.close()
            self.executor.close()
            if self.pool is not None:
                await asyncio.to_thread(self.pool.close)
            log.info("worker %s: stopped", w.worker_id)

    async def _drain(self) -> None:
        """Wait up to the shutdown grace (or a second stop) for the handlers in flight
        and then for their outcomes' answers; abandon the handlers still running."""
        give_up = self.loop.time() + self.w.shutdown_grace
        inflight = self.producer.inflight
        if inflight:
            await self._until_forced(asyncio.wait(set(inflight)), give_up, len(inflight))
            left = set(inflight)
            if left:
                log.warning(
                    "worker %s: abandoning %d handler(s); their leases will lapse and the "
                    "steps run again",
                    self.w.worker_id,
                    len(left),
                )
                for task in left:
                    task.cancel()
                await asyncio.gather(*left, return_exceptions=True)
        if self.completer.holding and not self.forced.is_set():
            await self._until_forced(self.completer.settled(), give_up)

    async def _until_forced(self, aw: Any, give_up: float, handlers: int = 0) -> None:
        """Await ``aw`` until ``give_up`` (loop time) or a second stop."""
        if handlers:
            log.info(
                "worker %s: waiting up to %gs for %d handler(s)",
                self.w.worker_id,
                max(give_up - self.loop.time(), 0.0),
                handlers,
            )
        waited = asyncio.ensure_future(aw)
        forced = asyncio.ensure_future(self.forced.wait())
        await asyncio.wait(
            {waited, forced},
            timeout=max(give_up - self.loop.time(), 0.0),
            return_when="FIRST_COMPLETED",
        )
        waited.cancel()
        forced.cancel()

    async def run_step(self, step: pb.ClaimedStep) -> None:
        """One claimed step, start to end: its context, its handler under watch, its
        outcome reported."""
        slog = StepLog(log, {"run_id": step.run_id, "node": step.node, "attempt": step.attempt})
        action = self.w._actions.get(step.action)
        if action is None:  # the server only hands out the actions we named
            slog.error("no handler for action %r", step.action)
            return
        tx = (
            CompletionTx(self.pool, step.run_id, step.node, step.lease_token)
            if self.pool is not None
            else None
        )
        control = StepControl(completion_tx=tx)
        lease_end = deadline = None
        if step.HasField("lease_expires_at"):
            control.lease_until(step.lease_expires_at)
            lease_end = seconds(step.lease_expires_at)
        deadline_at = None
        if step.HasField("deadline"):
            deadline = seconds(step.deadline)
            deadline_at = self._datetime(step.deadline)
        replay = (
            Replay(
                map(StepCall.from_proto, step.journal),
                GrpcJournal(self, step, control),
                is_async=action.is_async,
            )
            if action.durable
            else None
        )
        ctx = claimed_context(
            run_id=step.run_id,
            node=step.node,
            action=step.action,
            workflow=step.workflow,
            attempt=step.attempt,
            max_attempts=step.max_attempts,
            input=value_field(step, "input"),
            run_input=value_field(step, "run_input"),
            upstream=MappingProxyType({k: from_value(v) for k, v in step.upstream_outputs.items()})
            if step.upstream_outputs
            else NO_UPSTREAM,
            deadline=deadline_at,
            progress=value_field(step, "progress"),
            effect_uncertain=step.effect_uncertain,
            worker_id=self.w.worker_id,
            upstream_failures=tuple(map(UpstreamFailure.from_proto, step.upstream_failures))
            if step.upstream_failures
            else (),
            control=control,
            durable=replay,
        )
        policy = self.policy
        budget = policy.budget(lease_end, deadline, action)
        if log.isEnabledFor(logging.INFO):
            slog.info("running %s (budget %.1fs)", action.name, budget)
        watch = Watch(self, step, control, slog, budget, action)
        assert self.executor is not None
        handler, watch.call = self.executor.start(action, ctx, budget)
        try:
            output, error = await handler
        except asyncio.CancelledError:
            if not control.is_stopped:
                # The worker itself is being cancelled (shutdown past its grace).
                if policy.abandons(action):
                    await self.completer.abandon(step, "WorkerStopped", "the worker stopped", slog)
                raise
            output, error = None, None
        finally:
            watch.stop()
            control.stop()
            watch.abort()
        if watch.abandoned:
            slog.warning("late outcome not reported: the step was reported uncertain")
            if control.completion_tx is not None:
                await asyncio.to_thread(control.completion_tx.rollback)
            return
        if replay is not None:
            if replay.stopped is not None:
                self._stopped_body(step, replay, slog)
                if control.completion_tx is not None:
                    await asyncio.to_thread(control.completion_tx.rollback)
                return
            if replay.failure is not None:  # whatever the body made of it
                output, error = None, replay.failure
        uncertain = policy.uncertain_failure(action, error)
        await self.completer.report(step, control, output, error, slog, uncertain=uncertain)

    @staticmethod
    def _stopped_body(step: pb.ClaimedStep, replay: Replay, slog: StepLog) -> None:
        """A durable function stopped: no outcome is reported. Blocked on an unsafe
        call, its node is already uncertain on the server: say what to do."""
        if isinstance(replay.stopped, Suspended):
            slog.info("%s; slot freed", replay.stopped)
            return
        call = replay.uncertain
        if call is None:
            slog.warning("durable function stopped, outcome not reported: %s", replay.stopped)
            return
        slog.warning(
            "run blocked on step call %r (%s): it is unsafe to repeat and attempt %d "
            "started it without recording an outcome, so its effect may have happened. "
            "Check the outside world, then resolve it: cyclone resolve %s %s "
            "--result JSON (it happened) | --error MESSAGE (it happened and failed) | "
            "--discard (it did not happen)",
            call.step_id,
            call.function,
            call.attempt,
            step.run_id,
            call.step_id,
        )
