"""Mailbox: calls handed to an event loop from other threads, with one wake-up for
all that arrive together (handler outcomes to the worker's loop, async handlers to
the handler loop)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from pyclient.worker._common import log


class Mailbox:
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
            try:  # as _common.call(), without its call: once per step each way
                fn(*args)
            except Exception:
                log.exception("%r failed", fn)
