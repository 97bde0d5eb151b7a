"""Claiming: the handler slots and their accounting, and the long-poll claims sized to
the free slots that a worker makes when its server offers no Work stream (see
:mod:`._session`, which claims otherwise). Each step handed out is started by
:meth:`~pyclient.worker._runner.StepRunner.start` (:meth:`Producer.start`) and holds its
slot until its outcome is reported."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from cyclone.v1 import worker_service_pb2 as pb
from pyclient.actions import Action
from pyclient.errors import InvalidArgument, PermissionDenied, Unauthenticated, from_rpc_error
from pyclient.worker._common import log, log_blocked
from pyclient.worker._retry import Backoff
from pyclient.workflow import duration

if TYPE_CHECKING:
    from pyclient.worker._completer import Completer
    from pyclient.worker._config import Server, WorkerConfig
    from pyclient.worker._runner import StepRun

#: Errors of configuration: retrying the claim would only repeat them.
FATAL = (InvalidArgument, Unauthenticated, PermissionDenied)


class Producer:
    """The handler slots of one worker run, and its claim loop (used when the server
    offers no Work stream). ``start_step`` starts a step handed out, which calls back
    once it no longer needs its slot;
    ``regrant`` grants freed slots as credit on the Work stream; the claim loop ends
    when ``stopping`` is set."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        server: Server,
        stopping: asyncio.Event,
        completer: Completer,
        start_step: Callable[[pb.ClaimedStep, Callable[[StepRun], None]], StepRun | None],
        regrant: Callable[[], None],
    ):
        self.w = config
        self.server = server
        self.stopping = stopping
        self.completer = completer
        self.start_step = start_step
        self.regrant = regrant
        #: Set when the claim loop should look again: a slot freed, a report answered
        #: (:meth:`freed`).
        self.look_again = asyncio.Event()
        #: The claim loop runs (it alone waits on look_again).
        self.claiming = False
        #: What each step calls once it no longer needs its slot (bound once).
        self._release_run = self._release
        #: The steps running (each takes a slot; so does each outcome not yet answered,
        #: Completer.holding).
        self.inflight: set[StepRun] = set()
        #: Set when the steps in flight are all over (:meth:`all_over`).
        self._all_over: asyncio.Future[None] | None = None
        #: The CompleteMany whose answer the claim loop waits for before it claims
        #: (see _more_slots_coming).
        self.awaited_report: int | None = None

    def actions(self) -> list[pb.ActionSpec]:
        """The actions served, as a claim (or a Work stream's open) names them."""
        return [_spec(a) for a in sorted(self.w.actions.values(), key=lambda a: a.name)]

    def claim_request(self, free: int) -> pb.ClaimRequest:
        w = self.w
        return pb.ClaimRequest(
            worker_id=w.worker_id,
            actions=self.actions(),
            max_steps=free,
            wait=duration(w.claim_wait),
            lease=duration(w.lease),
            build_id=w.build_id,
            shard_node=w.shard_node,
        )

    async def until_stopping(self, aw: Any, timeout: float | None = None) -> Any:
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

    async def claim_loop(self) -> None:
        w, server = self.w, self.server
        backoff = Backoff(w.reconnect_max_delay, jitter=True)
        self.claiming = True
        while not self.stopping.is_set():
            # A slot is taken by a step running, or reported and not yet answered.
            free = w.concurrency - len(self.inflight) - self.completer.holding
            if free <= 0 or self._more_slots_coming():
                self.look_again.clear()
                await self.until_stopping(self.look_again.wait())
                continue
            call = server.stub.Claim(
                self.claim_request(free),
                timeout=w.claim_wait + 10.0,
                metadata=server.metadata,
            )
            try:
                response = await self.until_stopping(call)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if isinstance(err, FATAL):
                    log.error("worker %s: claim refused: %s", w.worker_id, err)
                    raise err from None
                delay = backoff.next()
                log.warning(
                    "worker %s: claim failed (%s); retrying in %.1fs",
                    w.worker_id,
                    err,
                    backoff.delay,
                )
                await self.until_stopping(asyncio.sleep(delay))
                continue
            if response is None:
                call.cancel()
                break
            if backoff.retrying:
                log.info("worker %s: connected to %s again", w.worker_id, w.address)
            backoff.reset()
            for blocked in response.blocked:
                log_blocked(w.worker_id, blocked)
            for step in response.steps:
                self.start(step)

    def start(self, step: pb.ClaimedStep) -> None:
        """Start a step handed out (by a claim or on a Work stream); it holds its slot
        until it is over."""
        run = self.start_step(step, self._release_run)
        if run is not None:
            self.inflight.add(run)
        else:
            self.freed()

    async def all_over(self) -> None:
        """Wait until no step is in flight."""
        if self.inflight:
            if self._all_over is None or self._all_over.done():
                self._all_over = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._all_over)

    def freed(self) -> None:
        """A slot may have come free (a step ended, a report was answered): claim for
        it, or grant it as credit on the Work stream."""
        if self.claiming:
            self.look_again.set()
        self.regrant()

    def _more_slots_coming(self) -> bool:
        """Whether to wait before claiming for the free slots: the CompleteMany on its
        way will free more when answered.

        Claims (and the CompleteMany calls after them) then stay large instead of
        splitting into ever smaller ones as outcomes trickle in. Only the report on
        its way when the slots were found free is waited for: a slot freed while
        handlers keep finishing waits one round trip at the most.
        """
        completer = self.completer
        if completer.sending:
            if self.awaited_report is None:
                self.awaited_report = completer.reports + 1
            if completer.reports < self.awaited_report:
                return True
        self.awaited_report = None
        return False

    def _release(self, run: StepRun) -> None:
        inflight = self.inflight
        inflight.discard(run)
        if not inflight and self._all_over is not None and not self._all_over.done():
            self._all_over.set_result(None)
        # As freed(), without the call (once per step).
        if self.claiming:
            self.look_again.set()
        self.regrant()


def _spec(a: Action) -> pb.ActionSpec:
    """What a Claim says of an action: its name and the marks read from the code."""
    spec = pb.ActionSpec(name=a.name, unsafe_to_repeat=a.unsafe_to_repeat)
    if a.rate_limit is not None:
        spec.rate_limit.count = a.rate_limit.count
        spec.rate_limit.period.CopyFrom(duration(a.rate_limit.period))
    return spec
