"""Each claimed step's life in a worker run: its context (and, for a durable function,
its replay), its handler run under watch, its outcome reported (:class:`StepRun`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from cyclone.v1 import worker_service_pb2 as pb
from pyclient import _tracing
from pyclient.actions import Action
from pyclient.completion import CompletionTx
from pyclient.context import StepControl
from pyclient.durable._calls import Limits
from pyclient.durable._errors import Suspended
from pyclient.durable._replay import Replay
from pyclient.models import StepCall
from pyclient.worker._common import StepLog, log
from pyclient.worker._completer import Completer
from pyclient.worker._config import WorkerConfig, worker_limits
from pyclient.worker._context import claimed
from pyclient.worker._executor import AsyncCall, Executor
from pyclient.worker._journal import GrpcJournal, Journaling
from pyclient.worker._messages import BodyMessages
from pyclient.worker._streams import StepStreams
from pyclient.worker._watch import Times, Watch, Watching


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
        #: The queries and updates of the bodies running here.
        self.messages = BodyMessages(journaling)
        self.policy = watching.policy
        #: What step calls are checked against: the server's limits once announced.
        self.limits: Limits = worker_limits(config)
        #: Step spans' tracer: None without OpenTelemetry or a tracer provider.
        self.tracer = _tracing.step_tracer()

    def start(self, step: pb.ClaimedStep, release: Callable[[StepRun], None]) -> StepRun | None:
        """Start one claimed step: its context, its handler under watch. What runs it
        from then on is the returned :class:`StepRun`, which calls ``release`` once its
        outcome is reported (or dropped).

        The worker's hottest path, one call per step: what it needs is read inline."""
        action = self.config.actions.get(step.action)
        if action is None:  # the server only hands out the actions we named
            StepLog(log, step).error("no handler for action %r", step.action)
            return None
        pool = self.pool
        tx = (
            CompletionTx(pool, step.run_id, step.node, step.lease_token)
            if pool is not None
            else None
        )
        lease_end = deadline = None
        if step.HasField("lease_expires_at"):
            ts = step.lease_expires_at
            control = StepControl(completion_tx=tx, lease_timestamp=ts)
            lease_end = ts.seconds + ts.nanos * 1e-9
        else:
            control = StepControl(completion_tx=tx)
        control.streams = StepStreams(self.journaling, step)
        if step.HasField("deadline"):
            ts = step.deadline
            deadline = ts.seconds + ts.nanos * 1e-9
        replay = None
        if action.durable:
            journal = GrpcJournal(self.journaling, step, control)
            journal.messages = self.messages
            replay = Replay(
                map(StepCall.from_proto, step.journal),
                journal,
                is_async=action.is_async,
                limits=self.limits,
            )
            self.messages.add(step, replay.handlers)
        ctx = claimed(step, self.config.worker_id, control, replay)
        policy = self.policy
        budget = policy.budget(lease_end, deadline, action)
        slog = StepLog(log, step)
        if self.tracer is None or not step.traceparent:
            run = StepRun(self, step, action, control, replay, release, slog)
        else:
            run = TracedStepRun(self, step, action, control, replay, release, slog)
            action = _tracing.in_span(action, run.span)  # the handler's current span
        if log.isEnabledFor(logging.INFO):
            slog.info("running %s (budget %.1fs)", action.name, budget)
        run.budget = budget
        watching = self.watching
        run.times = times = policy.times(watching.loop.time(), budget, action.is_async)
        # One alarm, for whatever is due first; the step's Watch is made only if it
        # rings or the handler asks for a heartbeat (most steps end before either).
        run.alarm_at = at = min(times)
        if at != math.inf:
            watching.alarms.add(run, at)
            run.armed = True
        control.on_heartbeat = run.heartbeat
        handler_loop = self.executor.handler_loop
        if action.is_async and handler_loop is not None:  # as Executor.start, inline
            run.call = AsyncCall(action, ctx, budget, run, handler_loop)
        else:
            run.call = self.executor.start(action, ctx, budget, run)
        return run


class StepRun:
    """One claimed step from its handler's start on (:meth:`StepRunner.start`): the
    handler's outcome comes to :meth:`settle` (or :meth:`drop`) on the worker's loop and
    is reported; the step's slot is released then, or once the report's transaction
    or round trip is done when it needs one. No task is made for a step whose report
    needs neither (most): its whole life is a few calls on the worker's loop."""

    __slots__ = (
        "action",
        "alarm_at",
        "armed",
        "budget",
        "call",
        "control",
        "ended",
        "finishing",
        "grain",
        "release",
        "replay",
        "runner",
        "slog",
        "step",
        "times",
        "watch",
    )

    def __init__(
        self,
        runner: StepRunner,
        step: pb.ClaimedStep,
        action: Action,
        control: StepControl,
        replay: Replay | None,
        release: Callable[[StepRun], None],
        slog: StepLog,
    ):
        self.runner = runner
        self.step = step
        self.action = action
        self.control = control
        self.replay = replay
        self.release = release
        #: The step's watch, once made (:meth:`_watched`).
        self.watch: Watch | None = None
        #: The async handler (None for a sync one).
        self.call: AsyncCall | None = None
        #: The handler's time budget, and when its first heartbeat, cancel and give-up
        #: fall due (WatchPolicy.times); the first of them is this step's alarm, set
        #: in the worker's alarms (at ``grain``) until it rings or the step ends.
        self.budget = 0.0
        self.times: Times = (math.inf, math.inf, math.inf)
        self.alarm_at = math.inf
        self.armed = False
        self.grain = 0
        #: The handler's outcome came (or was given up on): later ones are ignored.
        self.ended = False
        #: The task finishing the report, when it needs one.
        self.finishing: asyncio.Task[None] | None = None
        self.slog = slog

    # -- the watch, made when first needed

    def ring(self) -> None:
        """The step's alarm is due (on the worker's loop): its watch takes over."""
        self.armed = False
        self._watched().ring()

    def heartbeat(self) -> None:
        """``ctx.heartbeat()`` (from any thread): heartbeat now."""
        self.runner.watching.inbox.post(self._heartbeat)

    def _heartbeat(self) -> None:
        if not self.ended:
            self._watched().requested()

    def _watched(self) -> Watch:
        watch = self.watch
        if watch is None:
            if self.armed:
                self.armed = False
                self.runner.watching.alarms.remove(self)
            watch = self.watch = Watch(
                self.runner.watching,
                self.step,
                self.control,
                self.slog,
                self.budget,
                self.action,
                self.times,
                self.alarm_at,
            )
            watch.call = self.call
        return watch

    # -- the outcome

    def settle(self, output: Any, error: BaseException | None) -> None:
        """The handler ended with ``output`` or ``error``."""
        if self.ended:
            return
        self.ended = True
        if self.replay is not None:
            self.runner.messages.remove(self.step, self.replay.handlers)
        # As _over(), without the call.
        if self.armed:
            self.armed = False
            self.runner.watching.alarms.remove(self)
        self.call = None  # (a reference cycle, broken)
        control = self.control
        control.on_heartbeat = None  # (another)
        watch = self.watch
        if watch is not None:
            watch.stop()
            watch.call = None
            if watch.abandoned:
                control.stop()
                self.slog.warning("late outcome not reported: the step was reported uncertain")
                self._then(_roll_back(control) if self._has_tx() else None)
                return
        control.stop()
        rest = self._report(output, error)
        if rest is None:
            self.release(self)
        else:
            self._then(rest)

    def drop(self) -> None:
        """The handler's outcome is given up on (a lost lease, a cancelled run)."""
        self.settle(None, None)

    async def stop(self) -> None:
        """The worker stops past its grace with this step unfinished: cancel its
        handler, or the report it is finishing. An unsafe handler cut off is reported
        uncertain: another attempt could repeat its effect."""
        if self.ended:
            if self.finishing is not None:
                self.finishing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.finishing
            return
        self.ended = True
        if self.replay is not None:
            self.runner.messages.remove(self.step, self.replay.handlers)
        call = self.call
        self._over()
        if call is not None:
            call.cancel()
        await self._abandoned("WorkerStopped", "the worker stopped")
        self.release(self)

    def _over(self) -> None:
        """No more heartbeats nor time limits; ctx.should_stop is set."""
        if self.armed:
            self.armed = False
            self.runner.watching.alarms.remove(self)
        self.call = None  # (a reference cycle, broken)
        self.control.on_heartbeat = None  # (another)
        watch = self.watch
        if watch is not None:
            watch.stop()
            watch.call = None
        self.control.stop()

    def _has_tx(self) -> bool:
        return self.control.completion_tx is not None

    def _then(self, rest: Coroutine[Any, Any, None] | None) -> None:
        """Release the slot now, or once ``rest`` (what finishes the report) is done."""
        if rest is None:
            self.release(self)
            return
        self.finishing = asyncio.ensure_future(rest)
        self.finishing.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.finishing = None
        if not task.cancelled() and task.exception() is not None:
            self.slog.error("reporting the outcome failed", exc_info=task.exception())
        self.release(self)

    async def _abandoned(self, kind: str, why: str) -> None:
        if self.runner.policy.abandons(self.action):
            await self.runner.completer.abandon(self.step, kind, why, self.slog)

    def _report(self, output: Any, error: BaseException | None) -> Coroutine[Any, Any, None] | None:
        replay, step, control = self.replay, self.step, self.control
        if replay is not None:
            if replay.stopped is not None:
                _stopped_body(step, replay, self.slog)
                return _roll_back(control) if self._has_tx() else None
            if replay.failure is not None:  # whatever the body made of it
                output, error = None, replay.failure
        runner = self.runner
        uncertain = error is not None and runner.policy.uncertain_failure(self.action, error)
        return runner.completer.report(step, control, output, error, self.slog, uncertain=uncertain)


class TracedStepRun(StepRun):
    """A step of a traced run: its handler's span, a child of the run's trace context,
    from its start until its outcome (docs/tracing.md)."""

    __slots__ = ("span",)

    def __init__(self, runner: StepRunner, step: pb.ClaimedStep, *rest: Any) -> None:
        super().__init__(runner, step, *rest)
        self.span = _tracing.step_span(runner.tracer, step, runner.config.worker_id)

    def settle(self, output: Any, error: BaseException | None) -> None:
        if not self.ended:
            if error is None:
                _tracing.end_step_span(self.span, "completed")
            elif isinstance(error, Suspended):  # a durable function waits, not a failure
                _tracing.end_step_span(self.span, "suspended")
            else:
                _tracing.end_step_span(self.span, "failed", error)
        super().settle(output, error)

    def drop(self) -> None:
        if not self.ended:
            _tracing.end_step_span(self.span, "dropped")
        StepRun.settle(self, None, None)

    async def stop(self) -> None:
        if not self.ended:
            _tracing.end_step_span(self.span, "stopped")
        await super().stop()


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
