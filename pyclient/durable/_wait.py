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
from collections.abc import Callable
from dataclasses import dataclass
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


#: The function of an approval call (CreateApproval), and the base of its step ids:
#: "approval", "approval#2"...; its wait is "<step id>.wait" (function cyclone.event).
APPROVAL_FUNCTION = "cyclone.approval"
_APPROVAL_WAIT = ".wait"


@dataclass(frozen=True, slots=True)
class Approval:
    """An approval a durable function asks for, as its ``send`` callback gets it:
    ``url`` (POST a JSON decision to it once), the bare ``token``, the approval's
    ``approval_id`` and when the token expires (``expires_at``, an aware datetime)."""

    approval_id: str
    url: str
    token: str
    expires_at: dt.datetime


@dataclass(frozen=True, slots=True)
class _ApprovalCall:
    """The approval call as the replay engine runs a step: CreateApproval, then the
    body's ``send`` with the Approval."""

    fn: Callable[[], Any]
    name: str = "approval"
    function: str = APPROVAL_FUNCTION
    is_async: bool = False
    unsafe_to_repeat: bool = False
    on_args_change: str = "allow"

    @property
    def runner(self) -> Callable[[], Any]:
        return self.fn


def wait_for_approval(
    send: Callable[[Approval], Any],
    *,
    timeout: float | None = None,
    title: str = "",
    step_id: str | None = None,
) -> Any:
    """Ask a person for a decision through a one-time URL, and wait for it without a
    worker slot; returns the JSON the decision carried (``{"approved": true,
    "comment": ...}`` from the console, or whatever was POSTed to the URL).

    ``send(approval)`` hands the URL out (a mail, a chat message): it runs once, as a
    step does, when the approval is created (again only if its attempt is lost before
    its outcome is recorded: the approval then gets a new token and the old one stops
    working); steps called inside it are plain calls. A replay neither creates the
    approval nor sends it again. The token is valid for ``timeout`` seconds (the
    server's ``--approval-timeout``, 7 days, by default); when it expires with no
    decision, :class:`EventTimeout` is raised, as for ``wait_for_event``. ``title`` is
    what the console shows. Step ids ``approval``, ``approval#2``... (the wait:
    ``approval.wait``) unless ``step_id`` names it. In an async body, ``await
    wait_for_approval(...)``; ``send`` may then be a coroutine function. Only in a
    durable function run by a worker whose server has an HTTP listener
    (``--http-listen``).

        @worker.workflow("refund")
        def refund(ctx, claim):
            decision = wait_for_approval(
                lambda approval: mail(claim["manager"], approval.url),
                timeout=2 * 86400,
                title=f"refund {claim['amount']} to {claim['customer']}",
            )
            if decision.get("approved"):
                pay_back(claim)
    """
    _check_approval(send, timeout, title, step_id)
    ctx = active()
    replay = _replay()
    if ctx is None or replay is None:
        raise OutsideHandler("wait_for_approval() waits inside a durable function only")
    method = "create_approval_async" if replay.is_async else "create_approval"
    create = getattr(replay.backend, method, None)
    if replay.is_async:
        return _approval_async(replay, ctx, send, create, (title, timeout), step_id)

    def ask() -> dict[str, Any]:
        if create is None:
            raise _no_server()
        approval, asked = _made(create(call_id, title, timeout))
        if approval is not None:
            send(approval)
        return asked

    spec = _ApprovalCall(ask)
    call_id = step_id if step_id is not None else replay.name_call(spec)
    asked = replay.call(ctx, spec, call_id, (), {})
    return _wait(replay, _APPROVAL_WAIT_FN, call_id + _APPROVAL_WAIT, _until(asked))


def _check_approval(send: Any, timeout: float | None, title: Any, step_id: str | None) -> None:
    """wait_for_approval's arguments, checked before anything is journaled."""
    if not callable(send):
        raise InvalidArgument(f"wait_for_approval takes a send callable, got {send!r}")
    if timeout is not None and not 1 <= timeout <= 366 * 86400:
        raise InvalidArgument(f"an approval timeout must be 1s to 366 days, got {timeout!r}")
    if not isinstance(title, str) or len(title) > 1000:
        raise InvalidArgument("an approval's title must be a string of at most 1000 characters")
    if step_id is not None and len(step_id) > MAX_EVENT_NAME - len(_APPROVAL_WAIT):
        raise InvalidArgument("an approval's step id must be at most 195 characters")


def _made(reply: Any) -> tuple[Approval | None, dict[str, Any]]:
    """CreateApproval's answer: the Approval to send (None when it is decided already)
    and what the approval call records (never the token)."""
    expires_at = reply.expires_at.ToDatetime(tzinfo=dt.UTC)
    approval = (
        None if reply.decided else Approval(reply.approval_id, reply.url, reply.token, expires_at)
    )
    asked = {
        "approval_id": reply.approval_id,
        "event": reply.event,
        "expires_at": expires_at.isoformat(),
    }
    return approval, asked


def _no_server() -> OutsideHandler:
    """A recorded approval call replays anywhere; making one needs a server."""
    return OutsideHandler("wait_for_approval() needs a worker connected to a Cyclone server")


def _approval_async(
    replay: Replay,
    ctx: Any,
    send: Callable[[Approval], Any],
    create: Any,
    asked_for: tuple[str, float | None],
    step_id: str | None,
) -> Any:
    """wait_for_approval in an async body: both calls are numbered now, when the body
    calls, as async step calls are; the awaitable makes them."""
    title, timeout = asked_for

    async def ask() -> dict[str, Any]:
        if create is None:
            raise _no_server()
        approval, asked = _made(await create(call_id, title, timeout))
        if approval is not None:
            sent = send(approval)
            if inspect.isawaitable(sent):
                await sent
        return asked

    spec = _ApprovalCall(ask, is_async=True)
    call_id = step_id if step_id is not None else replay.name_call(spec)
    call, entry = replay.open(spec, call_id)
    waiting = replay.open(_APPROVAL_WAIT_FN, call_id + _APPROVAL_WAIT)
    return _approved_async(replay, ctx, spec, call, entry, waiting)


#: The wait of an approval call: for the event the approval names.
_APPROVAL_WAIT_FN = WaitFn("approval", "cyclone.event")


def _until(asked: Any) -> Until:
    """The wait of a recorded approval call: its event, until its expiry."""
    if not isinstance(asked, dict) or not isinstance(asked.get("event"), str):
        raise InvalidArgument(f"the approval call is recorded as {asked!r}, not as an approval")
    expires_at = dt.datetime.fromisoformat(asked["expires_at"])
    left = (expires_at - dt.datetime.now(dt.UTC)).total_seconds()
    return Until(event=asked["event"], timeout=min(max(left, 0.001), 366 * 86400))


async def _approved_async(
    replay: Replay, ctx: Any, spec: _ApprovalCall, call: Any, entry: Any, waiting: Any
) -> Any:
    asked = await replay.call_async(ctx, spec, call, entry, (), {})
    wait_call, wait_entry = waiting
    return await replay.wait_async(wait_call, wait_entry, _until(asked))
