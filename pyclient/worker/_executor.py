"""Running handlers: sync ones each in a daemon thread of their own (idle threads are
reused), async ones on a second event loop in its own thread. Either way the outcome
settles a future on the worker's loop; neither a CPU-bound handler nor a blocking
async one can starve the worker's loop (its heartbeats)."""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

from pyclient.actions import Action
from pyclient.context import Context, bind
from pyclient.worker._common import HandlerTimeout, Outcome
from pyclient.worker._mailbox import Mailbox

#: A handler thread left idle this long ends.
IDLE_THREAD_SECONDS = 60.0

_Job = tuple[Callable[..., Any], tuple[Any, ...]]


class Executor:
    """Starts handlers; owns the threads and the handler loop, and closes them."""

    def __init__(self, loop: asyncio.AbstractEventLoop, inbox: Mailbox, *, any_async: bool):
        self.loop = loop
        #: Where sync handlers post their outcomes (the worker loop's mailbox).
        self.inbox = inbox
        self.threads = Threads()
        self.handler_loop = HandlerLoop(loop) if any_async else None

    def start(
        self, action: Action, ctx: Context, budget: float
    ) -> tuple[asyncio.Future[Outcome], AsyncCall | None]:
        """Start the handler: a thread for a sync one, the handler loop for an async one.

        Returns its outcome, and for an async one what cancels it (a sync handler
        cannot be interrupted: it watches ctx.should_stop instead).
        """
        outcome: asyncio.Future[Outcome] = self.loop.create_future()
        if action.is_async:
            assert self.handler_loop is not None
            return outcome, AsyncCall(action, ctx, budget, outcome, self.handler_loop)
        # In an empty context, as in a new thread: no context variable set by the
        # handler that ran before in the same thread.
        self.threads.run(contextvars.Context().run, call_sync, action, ctx, outcome, self.inbox)
        return outcome, None

    def close(self) -> None:
        self.threads.close()
        if self.handler_loop is not None:
            self.handler_loop.close()


class Threads:
    """Daemon threads for sync handlers, one handler at a time each.

    A handler goes to an idle thread if there is one, else to a new thread, never to
    a thread that is busy: a stuck handler delays no other. Threads left idle for
    IDLE_THREAD_SECONDS end. Daemon threads never hold up the process's exit, which
    is why this is not a concurrent.futures.ThreadPoolExecutor (it joins its threads
    at exit, however long an abandoned handler runs).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
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

    def _serve(self, job: _Job | None) -> None:
        while job is not None:
            fn, args = job
            job = None
            fn(*args)
            del fn, args  # an idle thread holds on to nothing of the step it ran
            job = self._next()

    def _next(self) -> _Job | None:
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


class HandlerLoop:
    """An event loop in a thread of its own, for async handlers."""

    def __init__(self, worker_loop: asyncio.AbstractEventLoop):
        self.loop = asyncio.new_event_loop()
        #: Handlers to start and to cancel, from the worker's loop.
        self.inbox = Mailbox(self.loop, sender=worker_loop)
        #: Their outcomes, to the worker's loop.
        self.outbox = Mailbox(worker_loop, sender=self.loop)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="cyclone-async-handlers", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class AsyncCall:
    """An async handler running on the handler loop; its outcome settles on the
    worker's loop."""

    __slots__ = ("aborted", "budget", "handlers", "outcome", "results", "task", "timed_out")

    def __init__(
        self,
        action: Action,
        ctx: Context,
        budget: float,
        outcome: asyncio.Future[Outcome],
        handlers: HandlerLoop,
    ):
        self.handlers = handlers
        self.results = handlers.outbox
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
            self.results.post(settle, self.outcome, None, error)
        else:
            self.results.post(settle, self.outcome, task.result(), None)


def settle(outcome: asyncio.Future[Outcome], value: Any, error: BaseException | None) -> None:
    if not outcome.done():  # else given up on: aborted, or the worker is stopping
        outcome.set_result((value, error))


def call_sync(
    action: Action, ctx: Context, outcome: asyncio.Future[Outcome], results: Mailbox
) -> None:
    """Run a sync handler in a handler thread; the outcome goes to ``results``."""
    thread = threading.current_thread()
    thread.name = f"cyclone-{ctx.node}-{ctx.attempt}"
    bind(ctx)
    try:
        result = action.fn(*action.arguments(ctx))
    except BaseException as exc:  # reported as the step's failure, whatever it is
        results.post(settle, outcome, None, exc)
    else:
        results.post(settle, outcome, result, None)
    finally:
        thread.name = "cyclone-handler"
