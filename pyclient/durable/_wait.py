"""Waiting inside a durable function without holding a worker: :func:`sleep`,
:func:`sleep_until` and :func:`wait_for_event`.

Each wait is a call of the node's journal (function ``cyclone.sleep`` or
``cyclone.event``), numbered like a step call when it is made. The server answers it
at once when the wait is over (the sleep has ended, the event is there, its timeout
has passed); otherwise the node gives up its lease and its worker slot, the body stops
here (:class:`~pyclient.durable._replay.Suspended`), and the node is claimed again at
the wake time or as soon as the event is sent. The body then replays from the top,
every recorded call returning from the journal, up to this wait, which now returns.

In a sync body each call blocks (it returns the value); in an async body it returns an
awaitable, as an async step does. Outside a durable function :func:`sleep` simply
sleeps (awaitable when called from a coroutine function).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import sys
import time
from typing import Any

from pyclient.context import active
from pyclient.durable._calls import Until, WaitFn
from pyclient.durable._replay import Replay, replay_of
from pyclient.errors import InvalidArgument, OutsideHandler

#: The step ids of sleeps: "sleep", "sleep#2", ...
_SLEEP = WaitFn("sleep", "cyclone.sleep")
#: Longest event name.
MAX_EVENT_NAME = 200


def _replay() -> Replay | None:
    # Inside a step call, a wait is a plain wait of that call (it is not journaled).
    return replay_of(active())


def _wait(replay: Replay, fn: WaitFn, step_id: str | None, until: Until) -> Any:
    call, entry = replay.open(fn, step_id)
    if replay.is_async:
        return replay.wait_async(call, entry, until)
    return replay.wait(call, entry, until)


def sleep(seconds: float, *, step_id: str | None = None) -> Any:
    """Sleep ``seconds`` durably: inside a durable function the node gives up its
    worker slot and resumes at the wake time, which the first call fixes (a replay
    keeps it). Step ids ``sleep``, ``sleep#2``... unless ``step_id`` names it.

        @worker.workflow("reminder")
        def reminder(ctx, user):
            send_mail(user, "welcome")
            sleep(3 * 86400)
            send_mail(user, "how is it going?")

    In an async body, ``await sleep(...)``. Outside a durable function (and inside a
    step call) it is ``time.sleep``, or ``asyncio.sleep`` when called from a coroutine
    function."""
    if not isinstance(seconds, int | float) or seconds != seconds or seconds < 0:
        raise InvalidArgument(f"sleep takes a number of seconds >= 0, got {seconds!r}")
    replay = _replay()
    if replay is None:
        # A plain sleep: awaitable when the caller is a coroutine function, else it
        # blocks (a sync step called from an async body, too).
        if sys._getframe(1).f_code.co_flags & inspect.CO_COROUTINE:
            return asyncio.sleep(seconds)
        time.sleep(seconds)
        return None
    wake_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)
    return _wait(replay, _SLEEP, step_id, Until(wake_at=wake_at))


def sleep_until(when: dt.datetime, *, step_id: str | None = None) -> Any:
    """Sleep durably until ``when`` (an aware datetime), as :func:`sleep` does."""
    if not isinstance(when, dt.datetime) or when.tzinfo is None:
        raise InvalidArgument(f"sleep_until takes an aware datetime, got {when!r}")
    replay = _replay()
    if replay is None:
        delay = max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())
        if sys._getframe(1).f_code.co_flags & inspect.CO_COROUTINE:
            return asyncio.sleep(delay)
        time.sleep(delay)
        return None
    return _wait(replay, _SLEEP, step_id, Until(wake_at=when.astimezone(dt.UTC)))


def wait_for_event(name: str, timeout: float | None = None, *, step_id: str | None = None) -> Any:
    """Wait for the event ``name`` sent to this run (``client.send_event``) and return
    its payload. An event sent before the wait counts; each event is consumed by one
    wait, the oldest first. With ``timeout`` (seconds, counted from the first call: a
    replay keeps the deadline) it raises :class:`EventTimeout` when no event came; the
    timeout is recorded, so a replay raises it again and an ``except`` block's steps
    run once. Step ids ``event:<name>``, ``event:<name>#2``... unless ``step_id``
    names it. Only inside a durable function (OutsideHandler elsewhere).

        try:
            approval = wait_for_event("approved", timeout=86400)
        except EventTimeout:
            cancel_order(order_id)        # a step: runs once
    """
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_EVENT_NAME or not name.isprintable():
        raise InvalidArgument(f"an event name must be 1-200 printable characters, got {name!r}")
    if timeout is not None and not 0.001 <= timeout <= 366 * 86400:
        raise InvalidArgument(f"an event timeout must be 1ms to 366 days, got {timeout!r}")
    replay = _replay()
    if replay is None:
        raise OutsideHandler("wait_for_event() waits inside a durable function only")
    fn = WaitFn(f"event:{name}"[: MAX_EVENT_NAME - 7], "cyclone.event")
    return _wait(replay, fn, step_id, Until(event=name, timeout=timeout))
