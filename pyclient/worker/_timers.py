"""Alarms: calls due at a time on the worker's loop, grouped so that the steps of one
claim, due together, share one loop timer (used by :mod:`._watch`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Protocol

from pyclient.worker._common import call

#: Granularity of a step's timers (first heartbeat, time limits), in seconds.
ALARM_GRAIN = 0.01


class Entry(Protocol):
    """What an alarm is set for: its grain (set by :meth:`Alarms.add`), rung once due."""

    grain: int

    def ring(self) -> None: ...


class Alarms:
    """Calls due at a time on the worker's loop, one loop timer for all that fall due
    in the same ALARM_GRAIN: the steps of a claim, due together, share one timer
    instead of making and cancelling one each. An alarm rings up to a grain late,
    never early.

    An entry is anything with a ``grain`` and a ``ring()`` (a step's watch is its own
    entry: :meth:`add`, :meth:`remove`), or a call (:meth:`at`, an :class:`Alarm`).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._due: dict[int, dict[Entry, None]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def at(self, when: float, fn: Callable[[], None]) -> Alarm:
        """Call ``fn`` at ``when`` (loop time), unless the alarm is cancelled first."""
        alarm = Alarm(self, fn)
        self.add(alarm, when)
        return alarm

    def add(self, entry: Entry, when: float) -> None:
        """Ring ``entry`` at ``when`` (loop time), unless it is removed first."""
        grain = entry.grain = math.ceil(when / ALARM_GRAIN)
        alarms = self._due.get(grain)
        if alarms is None:
            alarms = self._due[grain] = {}
            self._timers[grain] = self.loop.call_at(grain * ALARM_GRAIN, self._ring, grain)
        alarms[entry] = None

    def remove(self, entry: Entry) -> None:
        """Forget ``entry``, which was added and has not rung."""
        grain = entry.grain
        alarms = self._due[grain]
        del alarms[entry]
        if not alarms and grain in self._timers:  # (else _ring is at it)
            del self._due[grain]
            self._timers.pop(grain).cancel()

    def _ring(self, grain: int) -> None:
        del self._timers[grain]
        alarms = self._due[grain]
        while alarms:  # one by one: an entry may remove another of the same grain
            entry = next(iter(alarms))
            del alarms[entry]
            call(entry.ring)
        del self._due[grain]


class Alarm:
    """One call of :meth:`Alarms.at`. Like an asyncio.TimerHandle it forgets its call
    once rung or cancelled: an owner that keeps its alarm is then no longer in a
    reference cycle with it, and is freed as soon as it is dropped."""

    __slots__ = ("alarms", "fn", "grain")

    def __init__(self, alarms: Alarms, fn: Callable[[], None]):
        self.alarms = alarms
        self.grain = 0
        self.fn: Callable[[], None] | None = fn

    def ring(self) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn()

    def cancel(self) -> None:
        if self.fn is not None:  # else rung, or cancelled before
            self.fn = None
            self.alarms.remove(self)
