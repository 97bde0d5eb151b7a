"""Alarms: calls due at a time on the worker's loop, grouped so that the steps of one
claim, due together, share one loop timer (used by :mod:`._watch`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from pyclient.worker._common import call

#: Granularity of a step's timers (first heartbeat, time limits), in seconds.
ALARM_GRAIN = 0.01


class Alarms:
    """Calls due at a time on the worker's loop, one loop timer for all that fall due
    in the same ALARM_GRAIN: the steps of a claim, due together, share one timer
    instead of making and cancelling one each. An alarm rings up to a grain late,
    never early.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._due: dict[int, dict[Alarm, None]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def at(self, when: float, fn: Callable[[], None]) -> Alarm:
        """Call ``fn`` at ``when`` (loop time), unless the alarm is cancelled first."""
        alarm = Alarm(self, math.ceil(when / ALARM_GRAIN), fn)
        alarms = self._due.get(alarm.grain)
        if alarms is None:
            alarms = self._due[alarm.grain] = {}
            self._timers[alarm.grain] = self.loop.call_at(
                alarm.grain * ALARM_GRAIN, self._ring, alarm.grain
            )
        alarms[alarm] = None
        return alarm

    def _remove(self, alarm: Alarm) -> None:
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
                call(fn)
        del self._due[grain]


class Alarm:
    """One alarm of :class:`Alarms`. Like an asyncio.TimerHandle it forgets its call
    once rung or cancelled: an owner that keeps its alarm is then no longer in a
    reference cycle with it, and is freed as soon as it is dropped."""

    __slots__ = ("alarms", "fn", "grain")

    def __init__(self, alarms: Alarms, grain: int, fn: Callable[[], None]):
        self.alarms = alarms
        self.grain = grain
        self.fn: Callable[[], None] | None = fn

    def cancel(self) -> None:
        if self.fn is not None:  # else rung, or cancelled before
            self.fn = None
            self.alarms._remove(self)
