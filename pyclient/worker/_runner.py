"""Each claimed step's life in a worker run: its context (and, for a durable function,
its replay), its handler run under watch, its outcome reported."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from types import MappingProxyType
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from cyclone.jsonvalue import from_value
from cyclone.v1 import worker_service_pb2 as pb
from pyclient.actions import Action
from pyclient.completion import CompletionTx
from pyclient.context import Context, StepControl, claimed_context
from pyclient.durable._calls import Limits
from pyclient.durable._errors import Suspended
from pyclient.durable._replay import Replay
from pyclient.models import StepCall, UpstreamFailure, timestamp_datetime, value_field
from pyclient.worker._common import StepLog, log
from pyclient.worker._completer import Completer
from pyclient.worker._config import WorkerConfig, worker_limits
from pyclient.worker._executor import Executor
from pyclient.worker._journal import GrpcJournal, Journaling
from pyclient.worker._watch import Watch, Watching

#: The upstream outputs of a step that has none (most).
NO_UPSTREAM: MappingProxyType[str, Any] = MappingProxyType({})


def seconds(ts: Timestamp) -> float:
    """A Timestamp as seconds since the epoch."""
    return ts.seconds + ts.nanos * 1e-9


class StepRunner:
    """Runs the steps of one worker run (:meth:`run`): with the worker's settings, its
    executor, its completer, the completion pool (None without a database), and what
    every step's watch and journal share."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        executor: Executor,
        completer: Completer,
        pool: Any,
        watching: Watching,
        journaling: Journaling,
    ):
        self.config = config
        self.executor = executor
        self.completer = completer
        self.pool = pool
        self.watching = watching
        self.journaling = journaling
        self.policy = watching.policy
        #: What step calls are checked against: the server's limits once announced.
        self.limits: Limits = worker_limits(config)
        self._last_time: tuple[tuple[int, int], dt.datetime] = (
            (0, 0),
            timestamp_datetime(Timestamp()),
        )

    def _datetime(self, ts: Timestamp) -> dt.datetime:
        """``ts`` as a datetime; the steps of a claim share their deadline, made once."""
        key = (ts.seconds, ts.nanos)
        if key != self._last_time[0]:
            self._last_time = (key, timestamp_datetime(ts))
        return self._last_time[1]

    async def run(self, step: pb.ClaimedStep) -> None:
        """One claimed step, start to end: its context, its handler under watch, its
        outcome reported."""
        slog = StepLog(log, {"run_id": step.run_id, "node": step.node, "attempt": step.attempt})
        action = self.config.actions.get(step.action)
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
        if step.HasField("deadline"):
            deadline = seconds(step.deadline)
        replay = (
            Replay(
                map(StepCall.from_proto, step.journal),
                GrpcJournal(self.journaling, step, control),
                is_async=action.is_async,
                limits=self.limits,
            )
            if action.durable
            else None
        )
        ctx = self._context(step, control, replay)
        budget = self.policy.budget(lease_end, deadline, action)
        if log.isEnabledFor(logging.INFO):
            slog.info("running %s (budget %.1fs)", action.name, budget)
        ended = await self._handle(step, action, ctx, control, budget, slog)
        if ended is not None:
            await self._report(step, action, control, replay, ended, slog)

    def _context(
        self, step: pb.ClaimedStep, control: StepControl, replay: Replay | None
    ) -> Context:
        return claimed_context(
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
            deadline=self._datetime(step.deadline) if step.HasField("deadline") else None,
            progress=value_field(step, "progress"),
            effect_uncertain=step.effect_uncertain,
            worker_id=self.config.worker_id,
            upstream_failures=tuple(map(UpstreamFailure.from_proto, step.upstream_failures))
            if step.upstream_failures
            else (),
            control=control,
            durable=replay,
        )

    async def _handle(
        self,
        step: pb.ClaimedStep,
        action: Action,
        ctx: Context,
        control: StepControl,
        budget: float,
        slog: StepLog,
    ) -> tuple[Any, BaseException | None] | None:
        """Run the handler under watch: what it ended with (output, error), or None
        when its outcome is void (the step was reported uncertain)."""
        watch = Watch(self.watching, step, control, slog, budget, action)
        handler, watch.call = self.executor.start(action, ctx, budget)
        try:
            output, error = await handler
        except asyncio.CancelledError:
            if not control.is_stopped:
                # The worker itself is being cancelled (shutdown past its grace).
                if self.policy.abandons(action):
                    await self.completer.abandon(step, "WorkerStopped", "the worker stopped", slog)
                raise
            output, error = None, None
        finally:
            watch.stop()
            control.stop()
            watch.abort()
        if watch.abandoned:
            slog.warning("late outcome not reported: the step was reported uncertain")
            await _roll_back(control)
            return None
        return output, error

    async def _report(
        self,
        step: pb.ClaimedStep,
        action: Action,
        control: StepControl,
        replay: Replay | None,
        ended: tuple[Any, BaseException | None],
        slog: StepLog,
    ) -> None:
        output, error = ended
        if replay is not None:
            if replay.stopped is not None:
                _stopped_body(step, replay, slog)
                await _roll_back(control)
                return
            if replay.failure is not None:  # whatever the body made of it
                output, error = None, replay.failure
        uncertain = self.policy.uncertain_failure(action, error)
        await self.completer.report(step, control, output, error, slog, uncertain=uncertain)


async def _roll_back(control: StepControl) -> None:
    """Undo the writes of the step's completion transaction, if it has one."""
    if control.completion_tx is not None:
        await asyncio.to_thread(control.completion_tx.rollback)


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
