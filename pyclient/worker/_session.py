"""The worker's session with the server on one Work stream (WorkerService.Work): its
claims and its completion reports, one message each way per batch, instead of a
long-poll Claim and a CompleteMany call for each.

The stream. It opens with the worker's id, the actions it serves (with their
unsafe_to_repeat marks and rate limits, read once for the stream), its lease, and its
free slots as credit. The server hands out steps as they become ready, never more
than the credit left; the reader (:meth:`Session._read`) starts each as a claim's
(:meth:`Producer.start`) and logs the runs a claim blocked. The completer's reports
(completions with the step call ends before them, what its CompleteMany carries) go
on the stream (:meth:`Session.report`); each is answered by one response, in the
order sent, which also carries the steps claimed with the credit granted so far.
Step call begins stay on CompleteMany: bodies wait for them, and they must not wait
behind a claim. Heartbeats stay on Heartbeat.

Credit. The worker never holds more than ``concurrency`` steps. A slot is taken by a
step running (``Producer.inflight``), by an outcome queued or on its way
(``Completer.holding``), or by credit granted and not yet used (``outstanding``); the
completions on their way whose slots were already granted again (``pregranted``) do
not count twice. A report of N completions grants N more (and whatever else is free)
in the same request, so its answer comes back with the next steps; a slot freed
without a report (a durable body suspended, a lease lost, an outcome dropped or
committed in the completion transaction) is granted at the end of the loop's turn, in
a request of its own (:meth:`Session.regrant`).

Failure. When the stream ends before a report is answered (an error, a server
stopping, a report not answered in RPC_TIMEOUT), the report goes by CompleteMany with
its retries (:meth:`Completer._send`): a completion sent twice is answered
duplicate = true. The stream is opened again at once after a clean end that did work,
otherwise after the claims' backoff (:mod:`._retry`); InvalidArgument (unless a
report was on its way: then it is the report's, and CompleteMany says so),
Unauthenticated and PermissionDenied stop the worker as a refused claim does. A
server that answers UNIMPLEMENTED (an older server) is claimed from with Claim and
CompleteMany for the rest of the run (:meth:`Producer.claim_loop`). A stream that
hands out nothing for IDLE_S is closed and opened again, so that a connection gone
silent (or a server behind a balancer that has others) is found out.

Stop. No more credit is granted; the stream is half-closed at once: the server answers
the reports it read, hands out nothing more, and ends it. The steps it sent before it
saw the end run like the others in flight, and :meth:`Session.serve` returns only when
the stream has ended, so the run's drain waits for them too. Reports made after the
half-close go by CompleteMany.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from cyclone.v1 import worker_service_pb2 as pb
from pyclient.errors import CycloneError, InvalidArgument, Unavailable, from_rpc_error
from pyclient.worker._common import RPC_TIMEOUT, log, log_blocked
from pyclient.worker._producer import FATAL
from pyclient.worker._retry import Backoff
from pyclient.workflow import duration

if TYPE_CHECKING:
    from pyclient.worker._completer import Completer
    from pyclient.worker._config import Server, WorkerConfig
    from pyclient.worker._producer import Producer

#: Most credit one request may grant (WorkRequest.credit).
MAX_GRANT = 1000
#: Most credit a stream may hold unused.
MAX_CREDIT = 10_000
#: How often (seconds) an open stream is looked at: a report not answered within
#: RPC_TIMEOUT cuts it off, and so does a half-close not ended within RPC_TIMEOUT.
WATCH_INTERVAL = 2.5
#: A stream that receives nothing for this long (seconds) is closed and opened again.
IDLE_S = 60.0


class _Report:
    """A report on its way: where its answer goes (None: it was not answered on the
    stream), the completions whose slots it granted again, and when it left."""

    __slots__ = ("answer", "pregranted", "sent_at")

    def __init__(
        self,
        answer: asyncio.Future[pb.CompleteManyResponse | None],
        pregranted: int,
        sent_at: float,
    ):
        self.answer = answer
        self.pregranted = pregranted
        self.sent_at = sent_at


class _Ended:
    """How one stream ended."""

    __slots__ = ("code", "error", "recycled", "reported", "responses")

    def __init__(self) -> None:
        #: The status it ended with, when not OK; the SDK's error for it.
        self.code: grpc.StatusCode | None = None
        self.error: CycloneError | None = None
        #: Responses received on it.
        self.responses = 0
        #: A report was on its way when it ended.
        self.reported = False
        #: The worker closed it because it was idle.
        self.recycled = False


class Session:
    """The Work streams of one worker run, one at a time."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        server: Server,
        loop: asyncio.AbstractEventLoop,
        stopping: asyncio.Event,
        forced: asyncio.Event,
        producer: Producer,
        completer: Completer,
        on_limits: Callable[[pb.ServerLimits], None] | None = None,
    ):
        self.w = config
        #: Called with the server's limits, which a stream's first response carries.
        self.on_limits = on_limits
        self.server = server
        self.loop = loop
        #: Set by a stop: streams are closed; set again (``forced``): not waited for.
        self.stopping = stopping
        self.forced = forced
        self.producer = producer
        self.completer = completer
        #: The stream reports and credit are written on; None while no stream is open,
        #: and from its half-close on.
        self.call: Any = None
        #: The reports on their way on the stream, oldest first.
        self.pending: collections.deque[_Report] = collections.deque()
        #: Credit granted on the stream and not yet used by steps received.
        self.outstanding = 0
        #: Completions on their way on the stream whose slots were granted again.
        self.pregranted = 0
        #: Writes on the stream, one at a time (a grant is worked out as it is written).
        self.lock = asyncio.Lock()
        self.backoff = Backoff(self.w.reconnect_max_delay, jitter=True)
        self.last_read = 0.0
        self.closed_at = 0.0
        self._regranting = False
        self._granter: asyncio.Task[None] | None = None

    def available(self) -> int:
        """Slots neither taken nor granted: what may be granted now."""
        return (
            self.w.concurrency
            - len(self.producer.inflight)
            - (self.completer.holding - self.pregranted)
            - self.outstanding
        )

    # -- the streams

    async def serve(self) -> bool:
        """Claim on Work streams until the worker stops (the last stream ended);
        False when the server does not offer Work: claim with Claim instead."""
        w = self.w
        backoff = self.backoff
        while not self.stopping.is_set():
            ended = await self._stream()
            if self.stopping.is_set():
                break
            if ended.error is None:
                # The server stopping ends its streams (OK): open another, at once if
                # this one did any work (a server still stopping refuses it).
                if ended.responses or ended.recycled:
                    continue
                delay = backoff.next()
            elif ended.code == grpc.StatusCode.UNIMPLEMENTED:
                log.info(
                    "worker %s: the server offers no Work stream (an older server); "
                    "claiming with Claim and reporting with CompleteMany instead",
                    w.worker_id,
                )
                return False
            elif isinstance(ended.error, FATAL) and not (
                isinstance(ended.error, InvalidArgument) and ended.reported
            ):
                log.error("worker %s: claim refused: %s", w.worker_id, ended.error)
                raise ended.error
            else:
                delay = backoff.next()
                log.warning(
                    "worker %s: work stream failed (%s); opening another in %.1fs",
                    w.worker_id,
                    ended.error,
                    backoff.delay,
                )
            await self.producer.until_stopping(asyncio.sleep(delay))
        return True

    async def _stream(self) -> _Ended:
        """One stream, from its open to its end."""
        ended = _Ended()
        call = self.server.stub.Work(metadata=self.server.metadata)
        reader: asyncio.Task[None] | None = None
        try:
            async with self.lock:
                self.outstanding = self.pregranted = 0
                opening = pb.WorkRequest(
                    open=pb.WorkOpen(
                        worker_id=self.w.worker_id,
                        actions=self.producer.actions(),
                        lease=duration(self.w.lease),
                        build_id=self.w.build_id,
                        shard_node=self.w.shard_node,
                    ),
                    credit=self._grant(),
                )
                if await self._write(call, opening):
                    self.call = call
            self.last_read = self.loop.time()
            self.regrant()  # past the most one request may grant
            reader = asyncio.create_task(self._read(call, ended))
            await self._tend(call, reader, ended)
        finally:
            if self.call is call:
                self.call = None
            if reader is None or not reader.done():
                call.cancel()  # its reader (if any) ends: the reports pending fail over
            if reader is not None and not reader.done():
                await asyncio.wait({reader})
        return ended

    async def _tend(self, call: Any, reader: asyncio.Task[None], ended: _Ended) -> None:
        """Until the stream ends: close it on stop, and look at it every WATCH_INTERVAL."""
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            while not reader.done():
                if self.stopping.is_set():
                    await self._close(call)
                    # The server answers what it read and ends the stream.
                    forced = asyncio.ensure_future(self.forced.wait())
                    await asyncio.wait(
                        {reader, forced}, timeout=RPC_TIMEOUT, return_when="FIRST_COMPLETED"
                    )
                    forced.cancel()
                    return
                await asyncio.wait(
                    {reader, stop}, timeout=WATCH_INTERVAL, return_when="FIRST_COMPLETED"
                )
                if not reader.done():
                    await self._watch(call, ended)
        finally:
            stop.cancel()

    async def _watch(self, call: Any, ended: _Ended) -> None:
        """Cut off a stream whose report (or end) is overdue; close an idle one."""
        now = self.loop.time()
        if self.pending and now - self.pending[0].sent_at > RPC_TIMEOUT:
            log.warning(
                "worker %s: a report on the work stream was not answered in %gs; "
                "sending it with CompleteMany, and opening another stream",
                self.w.worker_id,
                RPC_TIMEOUT,
            )
            call.cancel()
        elif self.call is not call:
            if now - self.closed_at > RPC_TIMEOUT:
                call.cancel()  # half-closed, and still not ended
        elif not self.pending and now - self.last_read > IDLE_S:
            ended.recycled = True
            await self._close(call)

    async def _close(self, call: Any) -> None:
        """Half-close the stream: nothing more is written on it."""
        async with self.lock:
            if self.call is not call:
                return
            self.call = None
            self.closed_at = self.loop.time()
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await call.done_writing()

    async def _read(self, call: Any, ended: _Ended) -> None:
        """Read the stream to its end: start the steps handed out, answer the reports."""
        start = self.producer.start
        pending = self.pending
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return
                ended.responses += 1
                self.last_read = self.loop.time()
                if self.backoff.retrying:
                    log.info("worker %s: connected to %s again", self.w.worker_id, self.w.address)
                    self.backoff.reset()
                if response.HasField("limits") and self.on_limits is not None:
                    self.on_limits(response.limits)
                for blocked in response.blocked:
                    log_blocked(self.w.worker_id, blocked)
                steps = response.steps
                if steps:
                    self.outstanding -= len(steps)
                    for step in steps:
                        start(step)
                if response.HasField("report"):
                    report = pending.popleft()
                    self.pregranted -= report.pregranted
                    if not report.answer.done():  # (its sender may have been cancelled)
                        report.answer.set_result(response.report)
        except grpc.RpcError as exc:
            ended.code = exc.code()
            ended.error = from_rpc_error(exc)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # The worker cut the call off (call.cancel()).
            ended.code = grpc.StatusCode.CANCELLED
            ended.error = Unavailable("the work stream was cut off")
        except Exception as exc:  # a bug: said, and the stream opened again
            log.exception("worker %s: the work stream's reader failed", self.w.worker_id)
            ended.code = grpc.StatusCode.INTERNAL
            ended.error = CycloneError(f"the work stream's reader failed: {exc!r}")
            call.cancel()
        finally:
            self._ended(call, ended)

    def _ended(self, call: Any, ended: _Ended) -> None:
        """The stream is over: its credit with it, and the reports it did not answer
        go by CompleteMany."""
        if self.call is call:
            self.call = None
        ended.reported = bool(self.pending)
        self.outstanding = self.pregranted = 0
        pending, self.pending = self.pending, collections.deque()
        for report in pending:
            if not report.answer.done():
                report.answer.set_result(None)

    async def _write(self, call: Any, request: pb.WorkRequest) -> bool:
        """Write ``request`` (under the lock); False when the stream is broken (then it
        is cut off: its reader ends, and fails over what is pending)."""
        try:
            await call.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
        else:
            return True
        call.cancel()
        return False

    # -- reports and credit

    async def report(self, request: pb.CompleteManyRequest) -> pb.CompleteManyResponse | None:
        """Send a report on the stream, granting the slots its completions free (and
        any others free); its answer, or None when it must go by CompleteMany (no
        stream open, or the stream ended before answering it)."""
        call = self.call
        if call is None:
            return None
        async with self.lock:
            if self.call is not call:
                return None
            freed = len(request.completions)
            grant = self._grant(freed)
            pregranted = min(freed, grant)
            report = _Report(self.loop.create_future(), pregranted, self.loop.time())
            self.pending.append(report)
            self.pregranted += pregranted
            await self._write(call, pb.WorkRequest(credit=grant, report=request))
        return await report.answer

    def _grant(self, freed: int = 0) -> int:
        """Credit to grant now (under the lock), counted as outstanding: what is free,
        and the slots of ``freed`` completions a report carries (still counted taken
        until it is answered)."""
        if self.stopping.is_set():
            return 0
        grant = min(freed + max(self.available(), 0), MAX_GRANT, MAX_CREDIT - self.outstanding)
        if grant <= 0:
            return 0
        self.outstanding += grant
        return grant

    def regrant(self) -> None:
        """A slot may have come free: grant it at the end of this turn of the loop
        (the reports made in the turn grant theirs themselves)."""
        if self.call is None or self._regranting:
            return
        self._regranting = True
        self.loop.call_soon(self._regrant)

    def _regrant(self) -> None:
        self._regranting = False
        if self.call is None or self.available() <= 0 or self.stopping.is_set():
            return
        if self._granter is None or self._granter.done():
            self._granter = asyncio.create_task(self._send_credit())

    async def _send_credit(self) -> None:
        """Grant what is free, in requests of credit alone."""
        async with self.lock:
            while (call := self.call) is not None:
                grant = self._grant()
                if not grant or not await self._write(call, pb.WorkRequest(credit=grant)):
                    return
