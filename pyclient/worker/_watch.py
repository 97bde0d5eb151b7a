"""Heartbeats and time limits of a running step, and the one policy that sets them.

Change the heartbeat here: :class:`WatchPolicy` says how often a step heartbeats, how
long its handler may run, and what happens when it runs past that; :class:`Watch`
carries it out for one step.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from cyclone.jsonvalue import to_value
from cyclone.v1 import worker_service_pb2 as pb
from pyclient.actions import Action
from pyclient.context import StepControl
from pyclient.errors import LeaseLost, from_rpc_error
from pyclient.worker import _logs as step_logs
from pyclient.worker._common import HandlerTimeout, StepLog
from pyclient.worker._executor import AsyncCall
from pyclient.workflow import duration

if TYPE_CHECKING:
    from pyclient.worker._config import Server
    from pyclient.worker._mailbox import Mailbox
    from pyclient.worker._timers import Alarms

#: When a step's first heartbeat is due, its handler cancelled, and given up on.
Times = tuple[float, float, float]

#: Reports that an unsafe step's handler stopped without an outcome (kind, why).
Abandon = Callable[[pb.ClaimedStep, str, str, StepLog], Coroutine[Any, Any, None]]


class WatchPolicy:
    """Heartbeats and time limits, for every step of one worker.

    - A step heartbeats every ``interval`` (a third of the lease), each heartbeat
      asking for a lease of ``lease`` seconds again; ``ctx.heartbeat()`` sends one at
      once. A heartbeat that fails for another reason than a lost lease is not
      retried: the next is due an interval later.
    - A handler's time budget (:meth:`budget`) ends at the node's deadline, or
      earlier at the action's own ``timeout``.
    - At its budget an async handler is cancelled (it fails with HandlerTimeout) and
      given up on ``cancel_grace`` seconds later if it ignores that; a sync handler,
      which cannot be stopped from outside, is given up on at once. Given up on, its
      heartbeats stop and ctx.should_stop is set, so its lease lapses and another
      attempt can start.
    - Unless the action is ``unsafe_to_repeat`` (:meth:`abandons`): then no
      other attempt may start, and a handler that did not finish (given up on, timed
      out, or cut off by the worker's shutdown) is reported with ``effect_uncertain``
      so the server blocks its run until an operator resolves it.
    """

    __slots__ = ("cancel_grace", "heartbeat_timeout", "interval", "lease")

    def __init__(self, lease: float, *, cancel_grace: float = 1.0):
        self.lease = lease
        self.interval = lease / 3
        #: Deadline of one heartbeat call.
        self.heartbeat_timeout = max(self.interval, 1.0)
        self.cancel_grace = cancel_grace

    def budget(self, lease_end: float | None, deadline: float | None, action: Action) -> float:
        """Seconds the handler may run: to the node's deadline, or the action's timeout.
        ``lease_end`` and ``deadline`` are the claim's, in seconds since the epoch.

        Worked out from the server's own timestamps where possible (lease expiry and
        deadline are read on one clock), so clock skew between hosts does not matter.
        """
        budget = math.inf
        if deadline is not None and lease_end is not None and lease_end < deadline:
            budget = deadline - lease_end + self.lease
        elif deadline is not None:
            budget = min(self.lease, deadline - time.time())
        if action.timeout is not None:
            budget = min(budget, action.timeout)
        return max(budget, 0.0)

    def times(self, now: float, budget: float, is_async: bool) -> Times:
        """When (loop time) a step started at ``now`` first heartbeats, when its handler
        is cancelled, and when it is given up on."""
        if is_async:
            return now + self.interval, now + budget, now + budget + self.cancel_grace
        return now + self.interval, math.inf, now + budget

    @staticmethod
    def abandons(action: Action) -> bool:
        """Whether a handler of ``action`` that stopped without an outcome (given up on
        at its time limit, or cut off by the worker's shutdown) is reported with
        effect_uncertain instead of left to lapse into another attempt."""
        return action.unsafe_to_repeat

    @staticmethod
    def uncertain_failure(action: Action, error: BaseException | None) -> bool:
        """Whether a handler's failure is reported with effect_uncertain: an unsafe
        handler cancelled (at its time limit, or by itself) may have had its effect."""
        return action.unsafe_to_repeat and isinstance(
            error, (HandlerTimeout, asyncio.CancelledError)
        )

    def heartbeat_request(self, step: pb.ClaimedStep) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            lease=duration(self.lease),
        )


@dataclass(frozen=True, slots=True)
class Watching:
    """What the watches of one worker run share: the policy, the server the heartbeats
    go to, the worker's loop with its inbox (heartbeats asked for from the handlers'
    threads) and alarms, and how an unsafe step given up on is reported."""

    policy: WatchPolicy
    server: Server
    loop: asyncio.AbstractEventLoop
    inbox: Mailbox
    alarms: Alarms
    abandon: Abandon


class Watch:
    """Watches over one running step under the worker's :class:`WatchPolicy`:
    heartbeats every interval (and at once when the handler asks, ``ctx.heartbeat()``),
    and ends the handler's time at its budget.

    Most steps end before any of this is due: a step sets one alarm, for whichever is
    due first, and its watch is made only when that rings or the handler asks for a
    heartbeat (:class:`~._runner.StepRun`). From then on the watch is its own entry in
    the worker's alarms; the task that heartbeats starts when the first heartbeat is
    due or the handler asks for one.
    """

    __slots__ = (
        "abandoned",
        "abandoning",
        "alarm_at",
        "armed",
        "beat_at",
        "budget",
        "call",
        "control",
        "give_up_at",
        "grain",
        "policy",
        "shared",
        "slog",
        "step",
        "stopped",
        "task",
        "time_out_at",
        "unsafe",
        "wake",
    )

    def __init__(
        self,
        shared: Watching,
        step: pb.ClaimedStep,
        control: StepControl,
        slog: StepLog,
        budget: float,
        action: Action,
        times: Times,
        alarm_at: float,
    ):
        """``times``: when the step's first heartbeat, cancel and give-up fall due
        (:meth:`WatchPolicy.times`); ``alarm_at``: the first of them, whose alarm its
        step set. The watch is armed by :meth:`ring` or :meth:`requested`."""
        policy = shared.policy
        self.policy = policy
        self.unsafe = policy.abandons(action)
        #: Given up on and reported uncertain (an unsafe action): its outcome is void.
        self.abandoned = False
        self.shared = shared
        self.step = step
        self.control = control
        self.slog = slog
        self.budget = budget
        #: The async handler, once started.
        self.call: AsyncCall | None = None
        self.beat_at, self.time_out_at, self.give_up_at = times
        #: Set for ``alarm_at`` in the worker's alarms (this watch is its own entry).
        self.armed = False
        self.grain = 0
        self.alarm_at = alarm_at
        self.task: asyncio.Task[None] | None = None
        self.abandoning: asyncio.Task[None] | None = None
        self.wake: asyncio.Event | None = None
        self.stopped = False

    def abort(self) -> None:
        """Cancel the handler if it is async and has not ended."""
        if self.call is not None:
            self.call.abort()

    def stop(self) -> None:
        """No more heartbeats, nor time limits: the step is over or given up on."""
        self.stopped = True
        if self.armed:
            self.armed = False
            self.shared.alarms.remove(self)
        self.control.on_heartbeat = None  # (a reference cycle, broken)
        if self.task is not None:
            self.task.cancel()

    def _arm(self) -> None:
        self.alarm_at = min(self.beat_at, self.time_out_at, self.give_up_at)
        if self.alarm_at != math.inf:
            self.shared.alarms.add(self, self.alarm_at)
            self.armed = True

    def ring(self) -> None:
        """The alarm is due (on the worker's loop)."""
        due, self.armed = self.alarm_at, False
        if self.give_up_at <= due:
            self.stop()
            self.control.stop()
            if self.unsafe:
                # Another attempt would repeat an effect that may have happened.
                self.abandoned = True
                why = f"the handler ran past its time limit of {self.budget:g}s"
                self.abandoning = self.shared.loop.create_task(
                    self.shared.abandon(self.step, "HandlerTimeout", why, self.slog)
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

    def requested(self) -> None:
        """Heartbeat now (on the worker's loop: ``ctx.heartbeat()`` posts it)."""
        if self.stopped:
            return
        if self.wake is not None:
            self.wake.set()
            return
        if self.armed:
            self.armed = False
            self.shared.alarms.remove(self)
        self._start()
        self._arm()

    def _start(self) -> None:
        self.beat_at = math.inf  # the task heartbeats from now on
        self.wake = asyncio.Event()
        self.task = self.shared.loop.create_task(self._run(self.wake))

    async def _run(self, wake: asyncio.Event) -> None:
        while True:
            wake.clear()
            if not await self._beat():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.policy.interval)

    async def _beat(self) -> bool:
        """One heartbeat; False when the step is lost (lease lost, run cancelled)."""
        server, step, control, slog = self.shared.server, self.step, self.control, self.slog
        request = self.policy.heartbeat_request(step)
        lines = step_logs.take(control)
        request.logs.extend(lines)
        has_progress, progress = control.take_progress()
        if has_progress:
            try:
                request.progress.CopyFrom(to_value(progress))
            except (TypeError, ValueError) as exc:
                slog.warning("progress is not JSON, not sent: %s", exc)
        try:
            response = await server.stub.Heartbeat(
                request, timeout=self.policy.heartbeat_timeout, metadata=server.metadata
            )
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if isinstance(err, LeaseLost):
                slog.warning("%s", err.message)  # the server says "lease lost: ..."
                control.lose_lease()
                self.abort()
                return False
            slog.warning("heartbeat failed: %s", err)
            step_logs.lines_of(control).give_back(lines)
            return True
        if response.HasField("lease_expires_at"):
            control.lease_until(response.lease_expires_at)
        else:
            control.lease_expires_at = None
        if has_progress:
            control.progress_delivered()
        if response.cancelled:
            slog.info("run cancelled; stopping the handler")
            control.cancel()
            self.abort()
            return False
        return True
