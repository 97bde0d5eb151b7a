"""The worker: claims steps of the actions it serves, runs their handlers, reports outcomes.

    worker = Worker("127.0.0.1:50051", concurrency=8)

    @worker.action("charge", timeout=30)
    def charge(ctx, order: Order) -> dict: ...

    worker.run()   # until SIGTERM or SIGINT

How it runs. An asyncio control loop does all the talking to the server: long-poll
claims sized to the free handler slots, heartbeats for each held step (every third
of the lease), completions. Sync handlers run each in a thread of their own (idle
threads are reused) and async handlers on a second event loop in its own thread, so
neither a CPU-bound handler nor a blocking async one can starve the heartbeats.

Outcomes. A return value is the step's output. An exception is a retryable failure
carrying its type, message and traceback; NonRetryableError discards the step,
RetryAfter(seconds) sets the delay of the retry. When the handler used
``ctx.completion_tx()``, success is committed by ``cyclone.step_complete`` in that
transaction instead of the Complete RPC.

Timeouts. A step's time budget ends at the node's deadline, or earlier at the
action's own ``timeout``. An async handler is cancelled there and the step fails with
HandlerTimeout. A sync handler cannot be stopped from outside: ``ctx.should_stop`` is
set, its heartbeats stop, and its lease lapses so that another attempt can start; if it
returns later its outcome is still sent and the server decides whether it counts.
For an action marked ``unsafe_to_repeat`` no second attempt may start: a handler that
did not finish (timed out, given up on, or cut off by shutdown) is reported with
``effect_uncertain`` and its run is blocked until an operator resolves it.

Losing the step. A heartbeat answered ABORTED sets ``ctx.lease_lost``; one that says
the run was cancelled sets ``ctx.cancelled``. Both set ``ctx.should_stop``, cancel an
async handler, and drop the outcome (the server would refuse it).

Shutdown. SIGTERM or SIGINT (or :meth:`Worker.stop`) stops claiming and waits up to
``shutdown_grace`` seconds for the handlers in flight; a second signal stops waiting.
Handlers still running then are abandoned: their leases lapse and the steps run again
elsewhere. Server unavailable: claims, heartbeats and completions retry with
exponential backoff while the channel reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
import logging
import math
import os
import queue
import random
import secrets
import signal
import socket
import threading
import traceback
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import grpc

from cyclone.jsonvalue import dumps, from_value, json_value, to_value
from cyclone.v1 import worker_service_pb2 as pb
from cyclone.v1 import worker_service_pb2_grpc as pb_grpc
from pyclient.actions import Action
from pyclient.client import call_metadata, default_address
from pyclient.completion import CompletionTx, open_pool
from pyclient.context import Context, StepControl, bind
from pyclient.errors import (
    CycloneError,
    InvalidArgument,
    LeaseLost,
    NonRetryableError,
    PermissionDenied,
    RetryAfter,
    Unauthenticated,
    Unavailable,
    error_for_code,
    from_rpc_error,
)
from pyclient.models import RunStatus, UpstreamFailure, time_field, value_field
from pyclient.workflow import duration

log = logging.getLogger("pyclient.worker")

#: Deadline of heartbeat-free calls (Complete).
RPC_TIMEOUT = 10.0
#: Most outcomes sent in one CompleteMany (the server accepts up to 1,000).
MAX_COMPLETIONS = 500

#: Granularity of a step's timers (first heartbeat, time limits), in seconds.
ALARM_GRAIN = 0.01
#: A handler thread left idle this long ends.
IDLE_THREAD_SECONDS = 60.0

#: Errors of configuration: retrying the claim would only repeat them.
_FATAL = (InvalidArgument, Unauthenticated, PermissionDenied)


class HandlerTimeout(Exception):
    """The handler ran past its timeout and was cancelled."""


class _StepLog(logging.LoggerAdapter):
    """Prefixes every message with run, node and attempt, and adds them as extras."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        e = self.extra or {}
        kwargs["extra"] = {**e, **kwargs.get("extra", {})}
        return f"run={e['run_id']} node={e['node']} attempt={e['attempt']}: {msg}", kwargs


class Worker:
    """Serves actions: ``concurrency`` handler slots, leases of ``lease`` seconds.

    ``database_url`` gives the worker its own psycopg pool for ``ctx.completion_tx()``.
    ``claim_wait`` is the long-poll of each claim; ``shutdown_grace`` how long a stop
    waits for handlers in flight; ``reconnect_max_delay`` caps the backoff while the
    server is unavailable.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        worker_id: str | None = None,
        concurrency: int = 4,
        database_url: str | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        lease: float = 30.0,
        claim_wait: float = 10.0,
        shutdown_grace: float = 30.0,
        reconnect_max_delay: float = 10.0,
    ):
        if concurrency < 1:
            raise InvalidArgument(f"concurrency must be at least 1, got {concurrency}")
        if not 1.0 <= lease <= 600.0:
            raise InvalidArgument(f"lease must be between 1s and 600s, got {lease:g}s")
        if not 0.0 <= claim_wait <= 60.0:
            raise InvalidArgument(f"claim_wait must be between 0s and 60s, got {claim_wait:g}s")
        self.address = address or default_address()
        self.worker_id = worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        )
        self.concurrency = concurrency
        self.database_url = database_url
        self.lease = lease
        self.claim_wait = claim_wait
        self.shutdown_grace = shutdown_grace
        self.reconnect_max_delay = reconnect_max_delay
        self._token = token
        self._credentials = credentials
        self._actions: dict[str, Action] = {}
        self._stop_requests = 0
        self._runtime: _Runtime | None = None
        self._lock = threading.Lock()

    @property
    def actions(self) -> dict[str, Action]:
        return dict(self._actions)

    def action(
        self,
        name: str | None = None,
        *,
        timeout: float | None = None,
        unsafe_to_repeat: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering a handler for ``name`` (default: the function's name).

        ``timeout`` (seconds) caps each call below the node's own timeout.
        ``unsafe_to_repeat``: the effect must not happen twice; a step of this action
        that lost its lease with no outcome blocks its run until an operator resolves
        it, instead of running again.
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(
                name or fn.__name__, fn, timeout=timeout, unsafe_to_repeat=unsafe_to_repeat
            )
            return fn

        return register

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        timeout: float | None = None,
        unsafe_to_repeat: bool = False,
    ) -> Action:
        """Register ``fn`` for ``name``; see :meth:`action`."""
        if name in self._actions:
            raise InvalidArgument(f"action {name!r} is registered twice")
        action = Action.of(name, fn, timeout=timeout, unsafe_to_repeat=unsafe_to_repeat)
        self._actions[name] = action
        return action

    def run(self, *, handle_signals: bool = True) -> None:
        """Serve until stopped: by SIGTERM/SIGINT (in the main thread) or :meth:`stop`."""
        asyncio.run(self.run_async(handle_signals=handle_signals))

    async def run_async(self, *, handle_signals: bool = False) -> None:
        """:meth:`run` on the running event loop."""
        if not self._actions:
            raise InvalidArgument("the worker serves no action: register one first")
        runtime = _Runtime(self, asyncio.get_running_loop())
        with self._lock:
            self._runtime = runtime
            for _ in range(self._stop_requests):
                runtime.request_stop()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        handle_signals = handle_signals and threading.current_thread() is threading.main_thread()
        if handle_signals:
            for sig in signals:
                loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await runtime.serve()
        finally:
            if handle_signals:
                for sig in signals:
                    loop.remove_signal_handler(sig)
            with self._lock:
                self._runtime = None

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("worker %s: %s received", self.worker_id, sig.name)
        self.stop()

    def stop(self) -> None:
        """Stop claiming and finish the handlers in flight; a second call stops waiting.

        Safe to call from any thread, also before :meth:`run`.
        """
        with self._lock:
            self._stop_requests += 1
            runtime = self._runtime
        if runtime is not None:
            runtime.loop.call_soon_threadsafe(runtime.request_stop)


class _Alarms:
    """Calls due at a time on the worker's loop, one loop timer for all that fall due
    in the same ALARM_GRAIN: the steps of a claim, due together, share one timer
    instead of making and cancelling one each. An alarm rings up to a grain late,
    never early.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._due: dict[int, dict[_Alarm, None]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def at(self, when: float, fn: Callable[[], None]) -> _Alarm:
        """Call ``fn`` at ``when`` (loop time), unless the alarm is cancelled first."""
        alarm = _Alarm(self, math.ceil(when / ALARM_GRAIN), fn)
        alarms = self._due.get(alarm.grain)
        if alarms is None:
            alarms = self._due[alarm.grain] = {}
            self._timers[alarm.grain] = self.loop.call_at(
                alarm.grain * ALARM_GRAIN, self._ring, alarm.grain
            )
        alarms[alarm] = None
        return alarm

    def _remove(self, alarm: _Alarm) -> None:
        alarms = self._due[alarm.grain]
        del alarms[alarm]
        if not alarms and alarm.grain in self._timers:  # (else _ring is at it)
            del self._due[alarm.grain]
            self._timers.pop(alarm.grain).cancel()

    def _ring(self, grain: int) -> None:
        del self._timers[grain]
        alarms = self._due[grain]
        while alarms:  # one by one: an alarm may cancel another of the same grain
            alarm = next(iter(alarms))
            del alarms[alarm]
            fn, alarm.fn = alarm.fn, None
            if fn is not None:
                _call(fn)
        del self._due[grain]


class _Alarm:
    """One alarm of :class:`_Alarms`. Like an asyncio.TimerHandle it forgets its call
    once rung or cancelled: an owner that keeps its alarm is then no longer in a
    reference cycle with it, and is freed as soon as it is dropped."""

    __slots__ = ("alarms", "fn", "grain")

    def __init__(self, alarms: _Alarms, grain: int, fn: Callable[[], None]):
        self.alarms = alarms
        self.grain = grain
        self.fn: Callable[[], None] | None = fn

    def cancel(self) -> None:
        if self.fn is not None:  # else rung, or cancelled before
            self.fn = None
            self.alarms._remove(self)


class _Mailbox:
    """Calls handed to an event loop from other threads, run there in order.

    ``loop.call_soon_threadsafe`` wakes the loop through its self-pipe on every call;
    here one wake-up runs every call posted until the loop gets to them, so a claim's
    worth of handlers that end together cost the loop one wake-up, not one each.

    When every call comes from one other event loop (``sender``), the wake-up is sent
    at the end of that loop's turn: sent at once, it would let the receiving thread
    take the GIL and run the first call alone, and the steps of one claim would go
    separate ways (each to its own CompleteMany, freeing slots one at a time).
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sender: asyncio.AbstractEventLoop | None = None
    ):
        self.loop = loop
        self.sender = sender
        self._calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._lock = threading.Lock()

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self._calls.append((fn, args))
            if len(self._calls) > 1:
                return  # the wake-up for the first is on its way
        if self.sender is None:
            self._wake()
        else:
            self.sender.call_soon(self._wake)

    def _wake(self) -> None:
        # A closed loop has nobody left to tell (a handler abandoned at shutdown).
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
        for fn, args in calls:
            _call(fn, *args)


def _call(fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)``, logging a failure: it must not keep the calls after it from being made."""
    try:
        fn(*args)
    except Exception:
        log.exception("%r failed", fn)


class _Threads:
    """Daemon threads for sync handlers, one handler at a time each.

    A handler goes to an idle thread if there is one, else to a new thread, never to
    a thread that is busy: a stuck handler delays no other. Threads left idle for
    IDLE_THREAD_SECONDS end. Daemon threads never hold up the process's exit, which
    is why this is not a concurrent.futures.ThreadPoolExecutor (it joins its threads
    at exit, however long an abandoned handler runs).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        # Threads waiting for a job, less the jobs queued for them.
        self._idle = 0
        self._closed = False
        self._lock = threading.Lock()

    def run(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._jobs.put((fn, args))
                return
        threading.Thread(
            target=self._serve, args=((fn, args),), name="cyclone-handler", daemon=True
        ).start()

    def close(self) -> None:
        """Idle threads end now, busy ones when their handler returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._jobs.put(None)

    def _serve(self, job: tuple[Callable[..., Any], tuple[Any, ...]] | None) -> None:
        while job is not None:
            fn, args = job
            job = None
            fn(*args)
            del fn, args  # an idle thread holds on to nothing of the step it ran
            job = self._next()

    def _next(self) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
        with self._lock:
            if self._closed:
                return None
            self._idle += 1
        while True:
            try:
                return self._jobs.get(timeout=IDLE_THREAD_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # more threads wait than jobs: this one may go
                        self._idle -= 1
                        return None


class _HandlerLoop:
    """An event loop in a thread of its own, for async handlers."""

    def __init__(self, worker_loop: asyncio.AbstractEventLoop):
        self.loop = asyncio.new_event_loop()
        #: Handlers to start and to cancel, from the worker's loop.
        self.inbox = _Mailbox(self.loop, sender=worker_loop)
        #: Their outcomes, to the worker's loop.
        self.outbox = _Mailbox(worker_loop, sender=self.loop)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="cyclone-async-handlers", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class _Runtime:
    """One run of a worker: channel, handler slots, in-flight steps."""

    def __init__(self, worker: Worker, loop: asyncio.AbstractEventLoop):
        self.w = worker
        self.loop = loop
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        #: Set when the claim loop should look again: a slot freed, a report answered.
        self.look_again = asyncio.Event()
        self.inflight: set[asyncio.Task[None]] = set()
        self.metadata = call_metadata(worker._token, None)
        self.channel: grpc.aio.Channel | None = None
        self.stub: Any = None
        self.pool: Any = None
        self.handler_loop: _HandlerLoop | None = None
        self.threads = _Threads()
        #: Handler outcomes and heartbeat requests, from the handlers' threads.
        self.inbox = _Mailbox(loop)
        self.alarms = _Alarms(loop)
        self.outbox: list[tuple[pb.CompleteRequest, asyncio.Future[pb.CompleteResult]]] = []
        self.flusher: asyncio.Task[None] | None = None
        #: CompleteMany calls answered (or failed) so far, and the one whose answer
        #: the claim loop waits for before it claims (see _more_slots_coming).
        self.reports = 0
        self.awaited_report: int | None = None

    def request_stop(self) -> None:
        if self.stopping.is_set():
            self.forced.set()
        self.stopping.set()

    async def serve(self) -> None:
        w = self.w
        # Reconnect as eagerly as the claim loop retries, not after gRPC's default backoff.
        options = [
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", max(100, int(w.reconnect_max_delay * 1000))),
        ]
        self.channel = (
            grpc.aio.secure_channel(w.address, w._credentials, options=options)
            if w._credentials
            else grpc.aio.insecure_channel(w.address, options=options)
        )
        self.stub = pb_grpc.WorkerServiceStub(self.channel)
        if w.database_url:
            self.pool = await asyncio.to_thread(open_pool, w.database_url, w.concurrency)
        if any(a.is_async for a in w._actions.values()):
            self.handler_loop = _HandlerLoop(self.loop)
        log.info(
            "worker %s: serving %s on %s with %d slots",
            w.worker_id,
            ", ".join(sorted(w._actions)),
            w.address,
            w.concurrency,
        )
        try:
            await self._claim_loop()
        finally:
            await self._drain()
            await self.channel.close()
            self.threads.close()
            if self.handler_loop is not None:
                self.handler_loop.close()
            if self.pool is not None:
                await asyncio.to_thread(self.pool.close)
            log.info("worker %s: stopped", w.worker_id)

    # -- claiming -------------------------------------------------------------

    def _claim_request(self, free: int) -> pb.ClaimRequest:
        w = self.w
        return pb.ClaimRequest(
            worker_id=w.worker_id,
            actions=[
                pb.ActionSpec(name=a.name, unsafe_to_repeat=a.unsafe_to_repeat)
                for a in sorted(w._actions.values(), key=lambda a: a.name)
            ],
            max_steps=free,
            wait=duration(w.claim_wait),
            lease=duration(w.lease),
        )

    async def _until_stopping(self, aw: Any, timeout: float | None = None) -> Any:
        """Await ``aw`` unless a stop comes first (then cancel it and return None)."""
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.stopping.wait())
        done, _ = await asyncio.wait({task, stop}, timeout=timeout, return_when="FIRST_COMPLETED")
        stop.cancel()
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
            await task
        return None

    async def _claim_loop(self) -> None:
        delay = 0.0
        while not self.stopping.is_set():
            free = self.w.concurrency - len(self.inflight)
            if free <= 0 or self._more_slots_coming():
                self.look_again.clear()
                await self._until_stopping(self.look_again.wait())
                continue
            call = self.stub.Claim(
                self._claim_request(free),
                timeout=self.w.claim_wait + 10.0,
                metadata=self.metadata,
            )
            try:
                response = await self._until_stopping(call)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if isinstance(err, _FATAL):
                    log.error("worker %s: claim refused: %s", self.w.worker_id, err)
                    raise err from None
                delay = min(max(delay * 2, 0.1), self.w.reconnect_max_delay)
                log.warning(
                    "worker %s: claim failed (%s); retrying in %.1fs",
                    self.w.worker_id,
                    err,
                    delay,
                )
                await self._until_stopping(asyncio.sleep(delay * random.uniform(0.5, 1.0)))
                continue
            if response is None:
                call.cancel()
                break
            if delay:
                log.info("worker %s: connected to %s again", self.w.worker_id, self.w.address)
            delay = 0.0
            for step in response.steps:
                task = asyncio.create_task(self._run_step(step))
                self.inflight.add(task)
                task.add_done_callback(self._release)

    def _more_slots_coming(self) -> bool:
        """Whether to wait before claiming for the free slots: the CompleteMany on its
        way will free more when answered.

        Claims (and the CompleteMany calls after them) then stay large instead of
        splitting into ever smaller ones as outcomes trickle in. Only the report on
        its way when the slots were found free is waited for: a slot freed while
        handlers keep finishing waits one round trip at the most.
        """
        if self.flusher is not None and not self.flusher.done():
            if self.awaited_report is None:
                self.awaited_report = self.reports + 1
            if self.reports < self.awaited_report:
                return True
        self.awaited_report = None
        return False

    def _release(self, task: asyncio.Task[None]) -> None:
        self.inflight.discard(task)
        self.look_again.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("worker %s: step task crashed", self.w.worker_id, exc_info=task.exception())

    async def _drain(self) -> None:
        if not self.inflight:
            return
        grace = self.w.shutdown_grace
        log.info(
            "worker %s: waiting up to %gs for %d handler(s)",
            self.w.worker_id,
            grace,
            len(self.inflight),
        )
        everything = asyncio.ensure_future(asyncio.wait(set(self.inflight)))
        forced = asyncio.ensure_future(self.forced.wait())
        await asyncio.wait({everything, forced}, timeout=grace, return_when="FIRST_COMPLETED")
        everything.cancel()
        forced.cancel()
        left = set(self.inflight)
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

    # -- one step -------------------------------------------------------------

    async def _run_step(self, step: pb.ClaimedStep) -> None:
        slog = _StepLog(log, {"run_id": step.run_id, "node": step.node, "attempt": step.attempt})
        action = self.w._actions.get(step.action)
        if action is None:  # the server only hands out the actions we named
            slog.error("no handler for action %r", step.action)
            return
        tx = (
            CompletionTx(self.pool, step.run_id, step.node, step.lease_token)
            if self.pool is not None
            else None
        )
        lease_end, deadline = time_field(step, "lease_expires_at"), time_field(step, "deadline")
        control = StepControl(lease_expires_at=lease_end, completion_tx=tx)
        ctx = Context(
            run_id=step.run_id,
            node=step.node,
            action=step.action,
            workflow=step.workflow,
            attempt=step.attempt,
            max_attempts=step.max_attempts,
            input=value_field(step, "input"),
            run_input=value_field(step, "run_input"),
            upstream=MappingProxyType({k: from_value(v) for k, v in step.upstream_outputs.items()}),
            deadline=deadline,
            progress=value_field(step, "progress"),
            effect_uncertain=step.effect_uncertain,
            worker_id=self.w.worker_id,
            upstream_failures=tuple(map(UpstreamFailure.from_proto, step.upstream_failures)),
            _control=control,
        )
        budget = self._budget(lease_end, deadline, action)
        slog.info("running %s (budget %.1fs)", action.name, budget)
        watch = _Watch(self, step, control, slog, budget, action)
        handler, watch.call = self._start(action, ctx, budget)
        try:
            output, error = await handler
        except asyncio.CancelledError:
            if not control.is_stopped:
                # The worker itself is being cancelled (shutdown past its grace).
                if action.unsafe_to_repeat:
                    await self._abandon(step, "WorkerStopped", "the worker stopped", slog)
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
        uncertain = action.unsafe_to_repeat and isinstance(error, HandlerTimeout)
        await self._report(step, control, output, error, slog, uncertain=uncertain)

    async def _abandon(self, step: pb.ClaimedStep, kind: str, why: str, slog: _StepLog) -> None:
        """Say that the handler of an unsafe action stopped without an outcome: its
        effect may have happened, so the server blocks the run (EffectUncertain) rather
        than let another attempt repeat it."""
        request = pb.CompleteRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            failure=pb.Failure(type=kind, message=why, effect_uncertain=True),
        )
        try:
            await self.stub.Complete(request, timeout=RPC_TIMEOUT, metadata=self.metadata)
        except grpc.RpcError as exc:
            slog.warning(
                "unsafe handler stopped without an outcome (%s), not reported: %s; its "
                "lease will lapse and the next claim blocks the run",
                why,
                from_rpc_error(exc),
            )
        else:
            slog.warning(
                "unsafe handler stopped without an outcome (%s): its run is blocked until "
                "an operator resolves it",
                why,
            )

    def _budget(
        self, lease_end: dt.datetime | None, deadline: dt.datetime | None, action: Action
    ) -> float:
        """Seconds the handler may run: to the node's deadline, or the action's timeout.

        Worked out from the server's own timestamps where possible (lease expiry and
        deadline are read on one clock), so clock skew between hosts does not matter.
        """
        budget = math.inf
        if deadline is not None and lease_end is not None and lease_end < deadline:
            budget = (deadline - lease_end).total_seconds() + self.w.lease
        elif deadline is not None:
            budget = min(self.w.lease, (deadline - dt.datetime.now(dt.UTC)).total_seconds())
        if action.timeout is not None:
            budget = min(budget, action.timeout)
        return max(budget, 0.0)

    def _start(
        self, action: Action, ctx: Context, budget: float
    ) -> tuple[asyncio.Future[_Outcome], _AsyncCall | None]:
        """Start the handler: a thread for a sync one, the handler loop for an async one.

        Returns its outcome, and for an async one what cancels it (a sync handler
        cannot be interrupted: it watches ctx.should_stop instead).
        """
        outcome: asyncio.Future[_Outcome] = self.loop.create_future()
        if action.is_async:
            return outcome, _AsyncCall(action, ctx, budget, outcome, self)
        # In an empty context, as in a new thread: no context variable set by the
        # handler that ran before in the same thread.
        self.threads.run(contextvars.Context().run, _call_sync, action, ctx, outcome, self.inbox)
        return outcome, None

    async def _report(
        self,
        step: pb.ClaimedStep,
        control: StepControl,
        output: Any,
        error: BaseException | None,
        slog: _StepLog,
        *,
        uncertain: bool = False,
    ) -> None:
        tx = control.completion_tx
        if control.is_cancelled or control.is_lease_lost:
            why = "the run was cancelled" if control.is_cancelled else "the lease was lost"
            slog.info("outcome not reported: %s", why)
            if tx is not None:
                await asyncio.to_thread(tx.rollback)
            return
        output_json = None
        if error is None:
            try:
                output_json = dumps(output)
            except (TypeError, ValueError) as exc:
                error = NonRetryableError(f"the handler's output is not JSON: {exc}")
        request = pb.CompleteRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token
        )
        if error is None and tx is not None and tx.opened:
            try:
                await asyncio.to_thread(tx.commit, output_json)
            except LeaseLost as exc:
                slog.warning("completion refused, effects rolled back: %s", exc.message)
                return
            except Exception as exc:
                slog.warning("completion transaction failed: %r", exc)
                error = exc
            else:
                slog.info("completed in the completion transaction")
                return
        if error is None:
            assert output_json is not None
            request.output.CopyFrom(json_value(output_json))
        else:
            if tx is not None:
                await asyncio.to_thread(tx.rollback)
            await self._deliver_progress(step, control, slog)
            request.failure.CopyFrom(_failure(error))
            # An unsafe handler cut off at its time limit may have had its effect.
            request.failure.effect_uncertain = uncertain
            slog.warning("failed: %s: %s", request.failure.type, request.failure.message)
        await self._complete(request, slog)

    async def _deliver_progress(
        self, step: pb.ClaimedStep, control: StepControl, slog: _StepLog
    ) -> None:
        """Before a failure is reported, store the progress the handler recorded last
        if no heartbeat has yet: the next attempt resumes from it."""
        pending, progress = control.undelivered_progress()
        if not pending:
            return
        request = pb.HeartbeatRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            lease=duration(self.w.lease),
        )
        try:
            request.progress.CopyFrom(to_value(progress))
            await self.stub.Heartbeat(request, timeout=RPC_TIMEOUT, metadata=self.metadata)
        except (TypeError, ValueError) as exc:
            slog.warning("progress is not JSON, not sent: %s", exc)
        except grpc.RpcError as exc:
            slog.warning("last progress not stored: %s", from_rpc_error(exc))

    async def _complete(self, request: pb.CompleteRequest, slog: _StepLog) -> None:
        """Report one outcome. Outcomes that finish while a report is on its way are
        sent together in the next CompleteMany: one round trip and one commit."""
        future: asyncio.Future[pb.CompleteResult] = self.loop.create_future()
        self.outbox.append((request, future))
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush())
        try:
            result = await future
        except CycloneError as err:
            slog.error("completion not delivered: %s", err)
            return
        if result.HasField("error"):
            err = error_for_code(result.error.code, result.error.message)
            level = logging.WARNING if isinstance(err, LeaseLost) else logging.ERROR
            slog.log(level, "completion refused: %s", err)
        elif request.HasField("output") and slog.isEnabledFor(logging.INFO):
            slog.info("completed; the run is %s", _run_status(result.response.run_status))

    async def _flush(self) -> None:
        while self.outbox:
            batch = self.outbox[:MAX_COMPLETIONS]
            del self.outbox[:MAX_COMPLETIONS]
            request = pb.CompleteManyRequest(completions=[r for r, _ in batch])
            delay, give_up = 0.1, self.loop.time() + self.w.lease
            while True:
                try:
                    reply = await self.stub.CompleteMany(
                        request, timeout=RPC_TIMEOUT, metadata=self.metadata
                    )
                except grpc.RpcError as exc:
                    self._answered()
                    err = from_rpc_error(exc)
                    if isinstance(err, Unavailable) and self.loop.time() < give_up:
                        log.warning("complete failed (%s); retrying in %.1fs", err, delay)
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, self.w.reconnect_max_delay)
                        continue
                    for _, future in batch:
                        future.set_exception(err)
                    break
                self._answered()
                for (_, future), result in zip(batch, reply.results, strict=True):
                    future.set_result(result)
                break

    def _answered(self) -> None:
        self.reports += 1
        self.look_again.set()


class _Watch:
    """Watches over one running step: heartbeats every third of the lease (and at once
    when the handler asks, ``ctx.heartbeat()``), and ends the handler's time at its
    budget: an async handler is cancelled there and, a second later if it ignores
    that, given up on, as a sync handler is at once (its heartbeats stop so that its
    lease lapses, and ctx.should_stop is set).

    Most steps end before any of this is due, so a step has one alarm, for whichever
    is due first; the task that heartbeats starts when the first heartbeat is due or
    the handler asks for one.
    """

    def __init__(
        self,
        runtime: _Runtime,
        step: pb.ClaimedStep,
        control: StepControl,
        slog: _StepLog,
        budget: float,
        action: Action,
    ):
        is_async = action.is_async
        self.unsafe = action.unsafe_to_repeat
        #: Given up on and reported uncertain (an unsafe action): its outcome is void.
        self.abandoned = False
        self.rt = runtime
        self.step = step
        self.control = control
        self.slog = slog
        self.budget = budget
        #: The async handler, once started.
        self.call: _AsyncCall | None = None
        self.interval = runtime.w.lease / 3
        now = runtime.loop.time()
        self.beat_at = now + self.interval
        self.time_out_at = now + budget if is_async else math.inf
        self.give_up_at = now + budget + (1.0 if is_async else 0.0)
        self.alarm: _Alarm | None = None
        self.alarm_at = math.inf
        self.task: asyncio.Task[None] | None = None
        self.abandoning: asyncio.Task[None] | None = None
        self.wake: asyncio.Event | None = None
        self.stopped = False
        control.on_heartbeat = self.request
        self._arm()

    def request(self) -> None:
        """Heartbeat now (from any thread)."""
        self.rt.inbox.post(self._requested)

    def abort(self) -> None:
        """Cancel the handler if it is async and has not ended."""
        if self.call is not None:
            self.call.abort()

    def stop(self) -> None:
        """No more heartbeats, nor time limits: the step is over or given up on."""
        self.stopped = True
        if self.alarm is not None:
            self.alarm.cancel()
        self.control.on_heartbeat = None  # (a reference cycle, broken)
        if self.task is not None:
            self.task.cancel()

    def _arm(self) -> None:
        self.alarm_at = min(self.beat_at, self.time_out_at, self.give_up_at)
        if self.alarm_at != math.inf:
            self.alarm = self.rt.alarms.at(self.alarm_at, self._ring)

    def _ring(self) -> None:
        due, self.alarm = self.alarm_at, None
        if self.give_up_at <= due:
            self.stop()
            self.control.stop()
            if self.unsafe:
                # Another attempt would repeat an effect that may have happened.
                self.abandoned = True
                why = f"the handler ran past its time limit of {self.budget:g}s"
                self.abandoning = self.rt.loop.create_task(
                    self.rt._abandon(self.step, "HandlerTimeout", why, self.slog)
                )
                return
            self.slog.warning(
                "handler ran past its %.1fs budget; heartbeats stop so its lease "
                "lapses and another attempt can start",
                self.budget,
            )
            return
        if self.time_out_at <= due:
            self.time_out_at = math.inf
            if self.call is not None:
                self.call.time_out()
        if self.beat_at <= due:
            self._start()
        self._arm()

    def _requested(self) -> None:
        if self.stopped:
            return
        if self.wake is not None:
            self.wake.set()
            return
        if self.alarm is not None:
            self.alarm.cancel()
        self._start()
        self._arm()

    def _start(self) -> None:
        self.beat_at = math.inf  # the task heartbeats from now on
        self.wake = asyncio.Event()
        self.task = self.rt.loop.create_task(self._run(self.wake))

    async def _run(self, wake: asyncio.Event) -> None:
        while True:
            wake.clear()
            if not await self._beat():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.interval)

    async def _beat(self) -> bool:
        """One heartbeat; False when the step is lost (lease lost, run cancelled)."""
        rt, step, control, slog = self.rt, self.step, self.control, self.slog
        request = pb.HeartbeatRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            lease=duration(rt.w.lease),
        )
        has_progress, progress = control.take_progress()
        if has_progress:
            try:
                request.progress.CopyFrom(to_value(progress))
            except (TypeError, ValueError) as exc:
                slog.warning("progress is not JSON, not sent: %s", exc)
        try:
            response = await rt.stub.Heartbeat(
                request, timeout=max(self.interval, 1.0), metadata=rt.metadata
            )
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if isinstance(err, LeaseLost):
                slog.warning("lease lost: %s", err.message)
                control.lose_lease()
                self.abort()
                return False
            slog.warning("heartbeat failed: %s", err)
            return True
        control.lease_expires_at = time_field(response, "lease_expires_at")
        if has_progress:
            control.progress_delivered()
        if response.cancelled:
            slog.info("run cancelled; stopping the handler")
            control.cancel()
            self.abort()
            return False
        return True


class _AsyncCall:
    """An async handler running on the handler loop; its outcome settles on the
    worker's loop."""

    def __init__(
        self,
        action: Action,
        ctx: Context,
        budget: float,
        outcome: asyncio.Future[_Outcome],
        rt: _Runtime,
    ):
        assert rt.handler_loop is not None
        self.handlers = rt.handler_loop
        self.results = rt.handler_loop.outbox
        self.outcome = outcome
        self.budget = budget
        self.task: asyncio.Task[Any] | None = None
        self.timed_out = self.aborted = False
        self.handlers.inbox.post(self._start, action, ctx)

    def abort(self) -> None:
        """Cancel the handler unless it has ended (on the worker's loop)."""
        if self.aborted or (self.outcome.done() and not self.outcome.cancelled()):
            return
        self.aborted = True
        self.outcome.cancel()
        self.handlers.inbox.post(self._cancel)

    def time_out(self) -> None:
        """Cancel the handler, which then fails with HandlerTimeout (on the worker's loop)."""
        if not self.outcome.done():
            self.timed_out = True
            self.handlers.inbox.post(self._cancel)

    def _start(self, action: Action, ctx: Context) -> None:
        self.task = self.handlers.loop.create_task(self._call(action, ctx))
        self.task.add_done_callback(self._done)

    async def _call(self, action: Action, ctx: Context) -> Any:
        bind(ctx)  # this task runs in a context of its own
        try:
            return await action.fn(*action.arguments(ctx))
        except asyncio.CancelledError:
            if self.timed_out:
                raise HandlerTimeout(
                    f"the handler ran past its timeout of {self.budget:g}s"
                ) from None
            raise

    def _cancel(self) -> None:
        assert self.task is not None
        self.task.cancel()

    def _done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self.results.post(self.outcome.cancel)
        elif (error := task.exception()) is not None:
            self.results.post(_settle, self.outcome, None, error)
        else:
            self.results.post(_settle, self.outcome, task.result(), None)


#: What a handler ended with: its return value, or the exception it raised.
_Outcome = tuple[Any, BaseException | None]


def _settle(outcome: asyncio.Future[_Outcome], value: Any, error: BaseException | None) -> None:
    if not outcome.done():  # else given up on: aborted, or the worker is stopping
        outcome.set_result((value, error))


def _run_status(number: int) -> str:
    return str(RunStatus.from_proto(number)) if number else "unknown"


def _failure(error: BaseException) -> pb.Failure:
    failure = pb.Failure(
        message=str(error) or type(error).__name__,
        type=type(error).__qualname__,
        details="".join(traceback.format_exception(error)),
        non_retryable=isinstance(error, NonRetryableError),
    )
    if isinstance(error, RetryAfter):
        failure.retry_after.CopyFrom(duration(error.seconds))
    return failure


def _call_sync(
    action: Action, ctx: Context, outcome: asyncio.Future[_Outcome], results: _Mailbox
) -> None:
    """Run a sync handler in a handler thread; the outcome goes to ``results``."""
    thread = threading.current_thread()
    thread.name = f"cyclone-{ctx.node}-{ctx.attempt}"
    bind(ctx)
    try:
        result = action.fn(*action.arguments(ctx))
    except BaseException as exc:  # reported as the step's failure, whatever it is
        results.post(_settle, outcome, None, exc)
    else:
        results.post(_settle, outcome, result, None)
    finally:
        thread.name = "cyclone-handler"
