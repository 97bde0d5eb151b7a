"""pyclient.testing for plain handlers: :func:`run`, :func:`run_twice`,
:class:`HandlerEnvironment` (see :mod:`pyclient.testing`)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone.jsonvalue import dumps
from pyclient._streams import MemoryStreams, StreamStore
from pyclient.actions import Action
from pyclient.context import Context, StepControl, bind, unbind
from pyclient.models import UpstreamFailure


class _GivenConnection:
    """A completion transaction that hands out the test's own connection, untouched."""

    def __init__(self, conn: Any):
        self._conn = conn

    def connection(self) -> Any:
        return self._conn


def make_context(
    *,
    run_id: str | None = None,
    node: str = "node",
    action: str | None = None,
    workflow: str = "test",
    attempt: int = 1,
    max_attempts: int = 3,
    input: Any = None,
    run_input: Any = None,
    upstream: Mapping[str, Any] | None = None,
    progress: Any = None,
    effect_uncertain: bool = False,
    upstream_failures: Sequence[UpstreamFailure] = (),
    completion_conn: Any = None,
    run_deadline: dt.datetime | None = None,
) -> Context:
    """A context for a handler under test; ``run_id`` defaults to a fresh UUID.

    ``upstream_failures`` is what a cleanup node would receive, e.g.
    ``[UpstreamFailure("charge", StepStatus.DISCARDED, StepError(...))]``.
    ``completion_conn`` (e.g. a psycopg connection of your test database) is what
    ``ctx.completion_tx()`` returns; this helper neither commits nor rolls it back.
    ``run_deadline`` is the run's deadline the handler reads (``ctx.run_deadline``).
    """
    given = _GivenConnection(completion_conn) if completion_conn is not None else None
    # Only its connection() is used outside the worker.
    control = StepControl(completion_tx=given)  # type: ignore[arg-type]
    control.streams = MemoryStreams(StreamStore(), node)
    return Context(
        run_id=run_id or str(uuid.uuid4()),
        node=node,
        action=action or node,
        workflow=workflow,
        attempt=attempt,
        max_attempts=max_attempts,
        input=input,
        run_input=run_input,
        upstream=upstream or {},
        progress=progress,
        effect_uncertain=effect_uncertain,
        upstream_failures=tuple(upstream_failures),
        worker_id="pyclient.testing",
        run_deadline=run_deadline,
        _control=control,
    )


def run(handler: Callable[..., Any], ctx: Context | None = None, **context: Any) -> Any:
    """Call ``handler`` as a worker would and return its output as it would be stored.

    Pass a context, or the fields of :func:`make_context` as keywords. Exceptions
    raised by the handler propagate; a non-JSON output raises TypeError or ValueError.
    """
    if ctx is None:
        ctx = make_context(**context)
    elif context:
        raise TypeError("pass either a context or context fields, not both")
    action = Action.of(ctx.action, handler)
    # Each call is an attempt of its own: its chunks are identified from the first.
    ctx._control.streams = _streams_again(ctx)
    token = bind(ctx)
    try:
        if action.is_async:
            result = asyncio.run(_await(action, ctx))
        else:
            result = action.fn(*action.arguments(ctx))
    finally:
        unbind(token)
    return json.loads(dumps(result))


async def _await(action: Action, ctx: Context) -> Any:
    bind(ctx)
    return await action.fn(*action.arguments(ctx))


_UNSET: Any = object()


@dataclass(frozen=True)
class RepeatReport:
    """Both calls of :func:`run_twice`: outputs, and state snapshots when asked for."""

    first_output: Any
    second_output: Any
    state_after_first: Any = _UNSET
    state_after_second: Any = _UNSET

    @property
    def same_output(self) -> bool:
        return bool(self.first_output == self.second_output)

    @property
    def same_state(self) -> bool:
        """The second call changed nothing the ``state`` function sees (True without one)."""
        return bool(self.state_after_first == self.state_after_second)

    @property
    def safe_to_repeat(self) -> bool:
        return self.same_state and self.same_output

    def assert_safe_to_repeat(self) -> None:
        """AssertionError saying what differed when the second call was not harmless."""
        problems = []
        if not self.same_state:
            problems.append(
                f"state after the first call: {self.state_after_first!r}\n"
                f"state after the second call: {self.state_after_second!r}"
            )
        if not self.same_output:
            problems.append(
                f"first output: {self.first_output!r}\nsecond output: {self.second_output!r}"
            )
        if problems:
            raise AssertionError(
                "the handler is not safe to repeat: a second call for the same node "
                "(same idempotency key) differs\n" + "\n".join(problems)
            )


def run_twice(
    handler: Callable[..., Any],
    ctx: Context | None = None,
    *,
    state: Callable[[], Any] | None = None,
    **context: Any,
) -> RepeatReport:
    """Call ``handler`` twice for the same node, as a reclaim after a crash would.

    The second call gets the same context with the next attempt number, so a handler
    that (wrongly) puts the attempt in its idempotency key shows up as unsafe.
    ``state`` returns a comparable snapshot of whatever the handler affects.
    """
    if ctx is None:
        ctx = make_context(**context)
    elif context:
        raise TypeError("pass either a context or context fields, not both")
    first = run(handler, ctx)
    after_first = state() if state else _UNSET
    retry = dataclasses.replace(ctx, attempt=ctx.attempt + 1, _control=_fresh_control(ctx))
    second = run(handler, retry)
    after_second = state() if state else _UNSET
    return RepeatReport(first, second, after_first, after_second)


def _fresh_control(ctx: Context) -> StepControl:
    """The control of the node's next attempt: the same completion transaction and
    streams (a retry's chunks are identified anew, as a worker's are)."""
    control = StepControl(completion_tx=ctx._control.completion_tx)
    control.streams = _streams_again(ctx)
    return control


def _streams_again(ctx: Context) -> Any:
    streams = ctx._control.streams
    return streams.again() if isinstance(streams, MemoryStreams) else streams


def emitted(ctx: Any) -> dict[str, list[Any]]:
    """What the handler of ``ctx`` (a context of :func:`make_context`, a
    :class:`HandlerEnvironment` or a DurableNode) emitted with ``ctx.emit``, by stream:
    each stream's chunks in order, as readers would get them (a chunk emitted again by a
    retry or a replay is there once)."""
    context = getattr(ctx, "ctx", ctx)
    streams = context._control.streams
    if not isinstance(streams, MemoryStreams):
        raise TypeError("emitted() reads the streams of a context made by pyclient.testing")
    return {name: list(chunks) for name, chunks in streams.store.streams.items()}


class HandlerEnvironment:
    """One handler's surroundings under test: the worker's side of its heartbeats,
    cancellation and lease.

    Build it from a context or the fields of :func:`make_context`; :attr:`ctx` is the
    context the handler gets. While :meth:`run` runs the handler:

    - every ``ctx.heartbeat(...)`` is counted in :attr:`heartbeats`, its progress
      (as it would be stored: JSON, else TypeError in the handler) appended to
      :attr:`progress`, then :attr:`on_heartbeat` is called with that progress (None
      when there was none), in the handler's thread;
    - :meth:`cancel` is what the worker does when a heartbeat says the run was
      cancelled (``ctx.cancelled`` and ``ctx.should_stop`` set, an async handler
      cancelled), :meth:`lose_lease` what it does when a heartbeat is refused
      (``ctx.lease_lost`` and ``ctx.should_stop``). Either may be called from
      ``on_heartbeat``, from another thread, or before :meth:`run`. The worker then
      drops the handler's outcome: :attr:`outcome_reported` says so.
    """

    def __init__(self, ctx: Context | None = None, **context: Any):
        if ctx is None:
            ctx = make_context(**context)
        elif context:
            raise TypeError("pass either a context or context fields, not both")
        self._control = StepControl(
            lease_expires_at=ctx._control.lease_expires_at,
            completion_tx=ctx._control.completion_tx,
            on_heartbeat=self._heartbeat,
        )
        self._control.streams = ctx._control.streams
        #: The context the handler gets.
        self.ctx: Context = dataclasses.replace(ctx, _control=self._control)
        #: How many times the handler called ``ctx.heartbeat()``.
        self.heartbeats = 0
        #: The progress values it recorded, in order.
        self.progress: list[Any] = []
        #: Called after each heartbeat is recorded, with its progress (or None).
        self.on_heartbeat: Callable[[Any], None] | None = None
        self._lock = threading.Lock()
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def outcome_reported(self) -> bool:
        """Whether a worker would report the handler's outcome: not after the run was
        cancelled or the lease lost (the server would refuse it)."""
        return not (self._control.is_cancelled or self._control.is_lease_lost)

    def cancel(self) -> None:
        """The run is cancelled: as a heartbeat answered ``cancelled`` makes it."""
        self._control.cancel()
        self._interrupt()

    def lose_lease(self) -> None:
        """This attempt loses its lease: as a heartbeat answered ABORTED makes it."""
        self._control.lose_lease()
        self._interrupt()

    def run(self, handler: Callable[..., Any]) -> Any:
        """Call ``handler`` as :func:`run` does and return its output.

        An async handler cancelled by :meth:`cancel` or :meth:`lose_lease` raises
        asyncio.CancelledError here, unless it catches it.
        """
        ctx = self.ctx
        action = Action.of(ctx.action, handler)
        token = bind(ctx)
        try:
            if action.is_async:
                result = asyncio.run(self._run_async(action, ctx))
            else:
                result = action.fn(*action.arguments(ctx))
        finally:
            unbind(token)
        return json.loads(dumps(result))

    async def _run_async(self, action: Action, ctx: Context) -> Any:
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.ensure_future(_await(action, ctx))
            if not self.outcome_reported:  # cancelled before the handler started
                self._task.cancel()
        try:
            return await self._task
        finally:
            with self._lock:
                self._task = self._loop = None

    def _interrupt(self) -> None:
        with self._lock:
            if self._task is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)

    def _heartbeat(self) -> None:
        has_progress, value = self._control.take_progress()
        progress = None
        if has_progress:
            try:
                progress = json.loads(dumps(value))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"progress is not JSON, a worker would not send it: {exc}") from exc
            self.progress.append(progress)
            self._control.progress_delivered()
        self.heartbeats += 1
        if self.on_heartbeat is not None:
            self.on_heartbeat(progress)


# -- durable functions ---------------------------------------------------------------
