"""Running handlers: sync ones each in a daemon thread of their own (idle threads are
reused), async ones on a second event loop in its own thread. Either way the outcome
is handed to its step on the worker's loop (:class:`~._common.Ending`); neither a
CPU-bound handler nor a blocking async one can starve the worker's loop (its
heartbeats)."""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from pyclient.actions import Action
from pyclient.context import Context, bind, set_current
from pyclient.worker._common import Ending, HandlerTimeout
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

    def start(self, action: Action, ctx: Context, budget: float, run: Ending) -> AsyncCall | None:
        """Start the handler: a thread for a sync one, the handler loop for an async one.
        Its outcome is given to ``run`` on the worker's loop.

        Returns, for an async one, what cancels it (a sync handler cannot be
        interrupted: it watches ctx.should_stop instead).
        """
        if action.is_async:
            assert self.handler_loop is not None
            return AsyncCall(action, ctx, budget, run, self.handler_loop)
        # In an empty context, as in a new thread: no context variable set by the
        # handler that ran before in the same thread.
        self.threads.run(contextvars.Context().run, call_sync, action, ctx, run, self.inbox)
        return None

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
    """An async handler running on the handler loop; its outcome is given to its step
    (:class:`Ending`) on the worker's loop.

    The handler starts eagerly: its coroutine runs at once, on the handler loop, in a
    context of its own, and only one that awaits something unfinished becomes a task
    (:func:`_resumed`); most handlers end without one, for the price of a call.
    """

    __slots__ = ("aborted", "budget", "handlers", "results", "run", "task", "timed_out")

    def __init__(
        self,
        action: Action,
        ctx: Context,
        budget: float,
        run: Ending,
        handlers: HandlerLoop,
    ):
        self.handlers = handlers
        self.results = handlers.outbox
        self.run = run
        self.budget = budget
        self.task: asyncio.Task[Any] | None = None
        self.timed_out = self.aborted = False
        self.handlers.inbox.post(self._start, action, ctx)

    def abort(self) -> None:
        """Give up on the handler's outcome and cancel it, unless it has ended (on the
        worker's loop): its step goes on at once without waiting for it."""
        if self.aborted or self.run.ended:
            return
        self.aborted = True
        self.run.drop()
        self.cancel()

    def cancel(self) -> None:
        """Cancel the handler (on the worker's loop); its outcome, if any, still counts."""
        self.handlers.inbox.post(self._cancel)

    def time_out(self) -> None:
        """Cancel the handler, which then fails with HandlerTimeout (on the worker's loop)."""
        if not self.run.ended:
            self.timed_out = True
            self.cancel()

    def _start(self, action: Action, ctx: Context) -> None:
        # The handler's coroutine runs in a context of its own, where ctx is current.
        context = contextvars.Context()
        context.run(set_current, ctx)
        try:
            coro = action.fn(*action.arguments(ctx)) if action.takes_input else action.fn(ctx)
            yielded = context.run(coro.send, None)
        except StopIteration as stop:
            self.results.post(self.run.settle, stop.value, None)
            return
        except BaseException as exc:  # reported as the step's failure, whatever it is
            self.results.post(self.run.settle, None, exc)
            return
        self.task = self.handlers.loop.create_task(self._resumed(coro, yielded), context=context)
        self.task.add_done_callback(self._done)

    async def _resumed(self, coro: Coroutine[Any, Any, Any], first: Any) -> Any:
        """The rest of the handler, once it suspended: only a task can be cancelled."""
        try:
            return await _Resumed(coro, first)
        except asyncio.CancelledError:
            if self.timed_out:
                raise HandlerTimeout(
                    f"the handler ran past its timeout of {self.budget:g}s"
                ) from None
            raise

    def _cancel(self) -> None:
        if self.task is not None:  # else it ended when it started
            self.task.cancel()

    def _done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():  # by itself: the worker's cancels end the step first
            cancelled = asyncio.CancelledError("the handler was cancelled")
            self.results.post(self.run.settle, None, cancelled)
        elif (error := task.exception()) is not None:
            self.results.post(self.run.settle, None, error)
        else:
            self.results.post(self.run.settle, task.result(), None)


class _Resumed:
    """The rest of a coroutine that has already run up to its first suspension and
    yielded ``first`` (a future it waits for): awaited by a task, it hands that task
    what the coroutine yields and gives the coroutine what the task sends or throws,
    as ``yield from`` would. Cancelling the task throws CancelledError into the
    coroutine."""

    __slots__ = ("coro", "first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any):
        self.coro = coro
        self.first = first

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self.coro, self.first
        self.first = None
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


def call_sync(action: Action, ctx: Context, run: Ending, results: Mailbox) -> None:
    """Run a sync handler in a handler thread; the outcome goes to ``run`` by ``results``."""
    thread = threading.current_thread()
    thread.name = f"cyclone-{ctx.node}-{ctx.attempt}"
    bind(ctx)
    try:
        result = action.fn(*action.arguments(ctx))
    except BaseException as exc:  # reported as the step's failure, whatever it is
        results.post(run.settle, None, exc)
    else:
        results.post(run.settle, result, None)
    finally:
        thread.name = "cyclone-handler"
