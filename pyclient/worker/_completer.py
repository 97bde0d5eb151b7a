"""Reporting outcomes: a handler's return value or exception becomes a Complete
request, sent with the others that end meanwhile (and with the ends of durable
functions' step calls) in one report on the worker's Work stream (:mod:`._session`),
or in one CompleteMany when no stream is open or the stream ended before answering
(retried under :mod:`._retry` while the server is unavailable), or, when the handler
used ``ctx.completion_tx()``, committed by ``cyclone.step_complete`` in that
transaction. Step call begins go by CompleteMany, beside the reports: bodies wait for
them, and they must not wait behind a claim.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from google.protobuf import struct_pb2

from cyclone.jsonvalue import dumps, json_value, to_value
from cyclone.v1 import worker_service_pb2 as pb
from pyclient.context import LOST, StepControl
from pyclient.durable._calls import MAX_PAYLOAD_BYTES
from pyclient.durable._errors import StepFailed
from pyclient.errors import (
    CycloneError,
    LeaseLost,
    NonRetryableError,
    OutputNotJson,
    OutputTooLarge,
    RetryAfter,
    Unavailable,
    error_for_code,
    from_rpc_error,
)
from pyclient.models import RunStatus
from pyclient.worker import _logs as step_logs
from pyclient.worker._common import RPC_TIMEOUT, StepLog, log, no_nul
from pyclient.worker._retry import Backoff
from pyclient.workflow import duration

if TYPE_CHECKING:
    from pyclient.worker._config import Server
    from pyclient.worker._watch import WatchPolicy

#: Sends a report on the Work stream: its answer, or None when the stream could not
#: answer it (none open, or it ended first).
SendOnStream = Callable[[pb.CompleteManyRequest], Awaitable[pb.CompleteManyResponse | None]]


class Answer(Protocol):
    """Where a begin's or an end's answer goes: a concurrent future (a sync body waits
    on it in its thread) or an asyncio future of the handler loop behind its mailbox."""

    def set_result(self, value: Any) -> None: ...

    def set_exception(self, error: BaseException) -> None: ...


ClaimedStep = pb.ClaimedStep
NULL = struct_pb2.NULL_VALUE

#: Most outcomes sent in one CompleteMany (the server accepts up to 1,000).
MAX_COMPLETIONS = 500

#: Batches of begins in flight at once: while one is at the server, the bodies
#: answered by the other run their calls.
BEGIN_BATCHES = 2


class Completer:
    """Sends the outcomes of one worker's steps.

    Outcomes that finish while a report is on its way are sent together in the next:
    one round trip and one commit. ``on_answered`` is called whenever a report is
    answered (or fails): the freed slots may be claimed for, or granted as credit.
    ``send_on_stream`` sends a report on the Work stream; a report it does not answer
    goes by CompleteMany, retried for up to a lease while the server is unavailable
    (backoff capped at ``reconnect_max_delay``).
    """

    def __init__(
        self,
        *,
        server: Server,
        loop: asyncio.AbstractEventLoop,
        policy: WatchPolicy,
        reconnect_max_delay: float,
        send_on_stream: SendOnStream,
        on_answered: Callable[[], None],
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    ):
        self.max_payload_bytes = max_payload_bytes
        self.server = server
        self.loop = loop
        self.policy = policy
        self.reconnect_max_delay = reconnect_max_delay
        self.send_on_stream = send_on_stream
        self.on_answered = on_answered
        #: Outcomes to send: a Complete request, or for a step that succeeded with a
        #: null output and logged nothing (most), the step itself (its Complete is
        #: written straight into the next CompleteMany).
        self.outbox: list[tuple[pb.CompleteRequest | pb.ClaimedStep, StepLog]] = []
        #: Outcomes queued or on their way: each keeps its step's handler slot taken
        #: until its CompleteMany is answered (the producer counts them).
        self.holding = 0
        #: Ends of step calls, sent first in the next CompleteMany, each with where its
        #: answer goes (its body's next step call waits for it), None when nobody waits.
        self.ends: list[tuple[pb.EndStepCallRequest, Answer | None]] = []
        #: Begins of step calls, sent with the next CompleteMany; their callers wait.
        self.begins: list[tuple[pb.BeginStepCallRequest, Answer]] = []
        #: Ends queued, taken into a batch and answered so far (answered counts only
        #: the ends whose every predecessor is answered too: a batch of begins carrying
        #: ends and a batch of completions may be answered out of order), and who waits
        #: for which count answered.
        self.ends_queued = self.ends_taken = self.ends_answered = 0
        #: Batches answered ahead of an earlier one: their first end's number, and size.
        self.answered_ahead: dict[int, int] = {}
        self.end_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.flusher: asyncio.Task[None] | None = None
        self.begin_flushers: set[asyncio.Task[None]] = set()
        #: One per batch of begins in flight that carries ends, answered with it.
        self.carrying: set[asyncio.Future[None]] = set()
        #: CompleteMany calls answered (or failed) so far.
        self.reports = 0
        #: Tasks of this worker's other calls (Wait), kept until they end.
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def sending(self) -> bool:
        """A CompleteMany is on its way (or about to be)."""
        return self.flusher is not None and not self.flusher.done()

    def report(
        self,
        step: pb.ClaimedStep,
        control: StepControl,
        output: Any,
        error: BaseException | None,
        slog: StepLog,
        *,
        uncertain: bool = False,
    ) -> Coroutine[Any, Any, None] | None:
        """Report what the handler ended with (``uncertain``: an unsafe handler cut off
        at its time limit, which may have had its effect).

        Most outcomes are queued for the next report at once (None is returned); one
        that needs a round trip or a thread first (its completion transaction to
        commit or roll back, the last progress to deliver before a failure) returns
        the coroutine that reports it, for the caller to run.
        """
        tx = control.completion_tx
        opened = tx is not None and tx.opened
        lost = control.raised & LOST
        if output is None and error is None and not opened and not lost:
            lines = control.log_lines
            if lines is None or not lines.pending():
                # What most handlers end with: queued as it is, no request made yet.
                self.outbox.append((step, slog))
                self.holding += 1
                flusher = self.flusher
                if flusher is None or flusher.done():
                    self.flusher = asyncio.create_task(self._flush())
                return None
        if lost:
            why = "the run was cancelled" if control.is_cancelled else "the lease was lost"
            slog.info("outcome not reported: %s", why)
            return _rolled_back(control) if opened else None
        output_json = None
        value = None
        if error is None:
            try:
                output_json = dumps(output)
            except (TypeError, ValueError) as exc:
                error = OutputNotJson(f"the handler's output is not JSON: {exc}")
            else:
                value, error = self._sized(output_json)
        request = pb.CompleteRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token
        )
        lines = step_logs.take(control)  # what the handler logged (._logs)
        if lines:
            request.logs.extend(lines)
        if error is None and opened:
            assert output_json is not None
            return self._commit(step, control, request, output_json, slog)
        if error is not None:
            if opened or control.undelivered_progress()[0]:
                return self._fail(step, control, request, error, uncertain, slog)
            self._failure(request, error, uncertain, slog)
        elif value is None:  # what most handlers return: null
            request.output.null_value = struct_pb2.NULL_VALUE
        else:
            request.output.CopyFrom(value)
        self._complete(request, slog)
        return None

    async def _commit(
        self,
        step: pb.ClaimedStep,
        control: StepControl,
        request: pb.CompleteRequest,
        output_json: str,
        slog: StepLog,
    ) -> None:
        """Complete the step in the handler's completion transaction; a commit that
        fails for another reason than a lost lease is reported as the step's failure."""
        tx = control.completion_tx
        assert tx is not None
        if request.logs:
            beat = self.policy.heartbeat_request(step)
            await step_logs.send_by_heartbeat(self.server, beat, request, slog)
        await self.ends_sent()
        try:
            await asyncio.to_thread(tx.commit, output_json)
        except LeaseLost as exc:
            slog.warning("completion refused, effects rolled back: %s", exc.message)
            return
        except Exception as exc:
            slog.warning("completion transaction failed: %r", exc)
            await self._fail(step, control, request, exc, False, slog)
        else:
            slog.info("completed in the completion transaction")

    async def _fail(
        self,
        step: pb.ClaimedStep,
        control: StepControl,
        request: pb.CompleteRequest,
        error: BaseException,
        uncertain: bool,
        slog: StepLog,
    ) -> None:
        """Report a failure after rolling back the handler's transaction and storing
        its last progress."""
        await _rolled_back(control)
        await self._deliver_progress(step, control, slog)
        self._failure(request, error, uncertain, slog)
        self._complete(request, slog)

    @staticmethod
    def _failure(
        request: pb.CompleteRequest, error: BaseException, uncertain: bool, slog: StepLog
    ) -> None:
        request.failure.CopyFrom(failure(error))
        request.failure.effect_uncertain = uncertain
        slog.warning("failed: %s: %s", request.failure.type, request.failure.message)

    def _sized(self, output_json: str) -> tuple[struct_pb2.Value | None, OutputTooLarge | None]:
        """The output as sent (None for null), or the error that fails the node when it
        is larger than the server takes: checked here, so that the server never
        refuses it (which would leave the node to its lease, and the cause unseen)."""
        if output_json == "null":
            return None, None
        value = json_value(output_json)
        if (size := value.ByteSize()) <= self.max_payload_bytes:
            return value, None
        return None, OutputTooLarge(
            f"the handler returned {size} bytes; the limit of an output is "
            f"{self.max_payload_bytes} bytes. Keep a large value outside: store it "
            "elsewhere (a bucket, a table) and return a reference to it"
        )

    async def abandon(self, step: pb.ClaimedStep, kind: str, why: str, slog: StepLog) -> None:
        """Say that the handler of an unsafe action stopped without an outcome: its
        effect may have happened, so the server blocks the run (EffectUncertain) rather
        than let another attempt repeat it."""
        server = self.server
        request = pb.CompleteRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            failure=pb.Failure(type=kind, message=why, effect_uncertain=True),
        )
        try:
            await server.stub.Complete(request, timeout=RPC_TIMEOUT, metadata=server.metadata)
        except grpc.RpcError as exc:
            slog.warning(
                "unsafe handler stopped without an outcome (%s), not reported: %s; its "
                "lease will lapse and the next claim blocks the run",
                why,
                from_rpc_error(exc),
            )
        else:
            slog.warning(
                "unsafe handler stopped without an outcome (%s): its run is blocked until "
                "an operator resolves it",
                why,
            )

    async def _deliver_progress(
        self, step: pb.ClaimedStep, control: StepControl, slog: StepLog
    ) -> None:
        """Before a failure is reported, store the progress the handler recorded last
        if no heartbeat has yet: the next attempt resumes from it."""
        pending, progress = control.undelivered_progress()
        if not pending:
            return
        server = self.server
        request = self.policy.heartbeat_request(step)
        try:
            request.progress.CopyFrom(to_value(progress))
            await server.stub.Heartbeat(request, timeout=RPC_TIMEOUT, metadata=server.metadata)
        except (TypeError, ValueError) as exc:
            slog.warning("progress is not JSON, not sent: %s", exc)
        except grpc.RpcError as exc:
            slog.warning("last progress not stored: %s", from_rpc_error(exc))

    def begin_soon(self, request: pb.BeginStepCallRequest, answer: Answer) -> None:
        """Begin a step call with the next CompleteMany (on the worker's loop); its
        caller waits for ``answer`` (the response, or the SDK's error)."""
        self.begins.append((request, answer))
        if len(self.begin_flushers) < BEGIN_BATCHES:
            flusher = asyncio.create_task(self._flush_begins())
            self.begin_flushers.add(flusher)
            flusher.add_done_callback(self.begin_flushers.discard)

    def end_later(self, request: pb.EndStepCallRequest, answer: Answer | None = None) -> None:
        """Record a step call's end with the next CompleteMany (on the worker's loop).
        ``answer`` is settled when it is recorded (None, its result) or refused (the
        SDK's error); without one, a refusal (a lost lease) is only logged."""
        self.ends.append((request, answer))
        self.ends_queued += 1
        # A body's next begin is usually posted in the same turn as this end: looking
        # again at the end of the turn lets the batch of begins carry the end (one
        # transaction for both) rather than send it alone.
        self.loop.call_soon(self._kick_unless_begins)

    def _kick_unless_begins(self) -> None:
        """Send the queued ends now, unless a batch of begins will carry them."""
        if self.ends and not self.begins:
            self._kick()

    async def ends_sent(self, upto: int | None = None) -> None:
        """Wait until the ends queued so far (the first ``upto``) are answered (or given
        up on): a node completed in its own transaction goes after its journal."""
        target = self.ends_queued if upto is None else upto
        if self.ends_answered >= target:
            return
        waiter: asyncio.Future[None] = self.loop.create_future()
        self.end_waiters.append((target, waiter))
        self._kick()
        await waiter

    def _ends_answered(self, first: int, n: int) -> None:
        """The batch of ``n`` ends numbered from ``first`` is answered."""
        if not n:
            # A batch without ends has the number of the next batch that has some:
            # counted, it could overwrite that batch's count and hold every later end
            # (and every begin waiting for them) unanswered for good.
            return
        self.answered_ahead[first] = n
        while self.ends_answered in self.answered_ahead:
            self.ends_answered += self.answered_ahead.pop(self.ends_answered)
        waiting = []
        for target, waiter in self.end_waiters:
            if target <= self.ends_answered:
                waiter.set_result(None)
            else:
                waiting.append((target, waiter))
        self.end_waiters = waiting

    def keep(self, task: asyncio.Task[None]) -> None:
        """Hold on to ``task`` until it ends (the loop keeps only weak references)."""
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _kick(self) -> None:
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush())

    def _complete(self, request: pb.CompleteRequest, slog: StepLog) -> None:
        """Report one outcome, in the next CompleteMany. Its step is over here, but
        its slot stays taken (``holding``) until the answer, which is logged then."""
        self.outbox.append((request, slog))
        self.holding += 1
        self._kick()

    @staticmethod
    def _log_result(
        done: pb.CompleteRequest | pb.ClaimedStep,
        slog: StepLog,
        result: pb.CompleteResult | CycloneError,
    ) -> None:
        if isinstance(result, CycloneError):
            slog.error("completion not delivered: %s", result)
        elif result.HasField("error"):
            refusal = error_for_code(result.error.code, result.error.message)
            level = logging.WARNING if isinstance(refusal, LeaseLost) else logging.ERROR
            slog.log(level, "completion refused: %s", refusal)
        elif (isinstance(done, pb.ClaimedStep) or done.HasField("output")) and slog.isEnabledFor(
            logging.INFO
        ):
            slog.info("completed; the run is %s", run_status(result.response.run_status))

    async def settled(self) -> None:
        """Wait until every outcome queued is answered (or given up on)."""
        while self.sending:
            assert self.flusher is not None
            await asyncio.wait({self.flusher})

    async def _flush(self) -> None:
        """Send completions and step call ends, a batch at a time, in order: a node's
        ends go before (or with) its completion."""
        while self.outbox or self.ends:
            first, ends = self.take_ends()
            # Ends left queued past this batch may be those of its completions' nodes:
            # the completions wait for the next batch, after them.
            batch = [] if self.ends else self.outbox[:MAX_COMPLETIONS]
            del self.outbox[: len(batch)]
            if batch and self.carrying:
                # Ends that left with batches of begins land before these completions.
                await asyncio.wait(list(self.carrying))
            request = pb.CompleteManyRequest(step_call_ends=[e for e, _ in ends], brief=True)
            _add_completions(request, batch)
            try:
                reply = await self._send(request, stream=True)
            finally:
                self.holding -= len(batch)
            self._ended(first, ends, reply)
            if isinstance(reply, CycloneError):
                for done, slog in batch:
                    self._log_result(done, slog, reply)
            else:
                info = log.isEnabledFor(logging.INFO)
                for (done, slog), result in zip(batch, reply.results, strict=True):
                    if info or result.HasField("error"):
                        self._log_result(done, slog, result)

    async def _flush_begins(self) -> None:
        """Send step call begins in batches (up to BEGIN_BATCHES at once), beside the
        batches of completions: a begin is waited for and depends on nothing queued
        before it. The ends queued
        meanwhile go with it (one transaction for a body's end of one unsafe call and
        begin of the next), and completions wait for them."""
        while self.begins:
            begins = self.begins[:MAX_COMPLETIONS]
            del self.begins[:MAX_COMPLETIONS]
            first, ends = self.take_ends()
            # The ends queued before these begins, this batch's or others in flight:
            # recorded before any of the calls begun here runs, so that a worker killed
            # in an unsafe call never leaves an earlier call unrecorded behind it.
            before = self.ends_queued
            carried: asyncio.Future[None] | None = None
            if ends:
                carried = self.loop.create_future()
                self.carrying.add(carried)
            request = pb.CompleteManyRequest(
                step_call_begins=[r for r, _ in begins],
                step_call_ends=[e for e, _ in ends],
                brief=True,
            )
            try:
                reply = await self._send(request)
            finally:
                if carried is not None:
                    carried.set_result(None)
                    self.carrying.discard(carried)
            self._ended(first, ends, reply)
            await self.ends_sent(before)
            if isinstance(reply, CycloneError):
                for _, answer in begins:
                    answer.set_exception(reply)
                continue
            for (_, answer), begun in zip(begins, reply.step_call_begin_results, strict=True):
                if begun.HasField("error"):
                    answer.set_exception(error_for_code(begun.error.code, begun.error.message))
                else:
                    answer.set_result(begun.response)

    def take_ends(self) -> tuple[int, list[tuple[pb.EndStepCallRequest, Answer | None]]]:
        """The next batch of ends, and the number of its first."""
        first = self.ends_taken
        ends = self.ends[:MAX_COMPLETIONS]
        del self.ends[:MAX_COMPLETIONS]
        self.ends_taken += len(ends)
        return first, ends

    def _ended(
        self,
        first: int,
        ends: list[tuple[pb.EndStepCallRequest, Answer | None]],
        reply: pb.CompleteManyResponse | CycloneError,
    ) -> None:
        """Settle the answers of a batch's step call ends, and log those it did not
        record."""
        if isinstance(reply, CycloneError):
            if ends:
                log.warning("%d step call ends not recorded: %s", len(ends), reply)
            for _, answer in ends:
                if answer is not None:
                    answer.set_exception(reply)
        else:
            for (end, answer), ended in zip(ends, reply.step_call_end_results, strict=True):
                if not ended.HasField("error"):
                    if answer is not None:
                        answer.set_result(None)
                    continue
                refusal = error_for_code(ended.error.code, ended.error.message)
                level = logging.INFO if isinstance(refusal, LeaseLost) else logging.WARNING
                log.log(level, "step call %r not recorded: %s", end.step_id, refusal)
                if answer is not None:
                    answer.set_exception(refusal)
        self._ends_answered(first, len(ends))

    async def _send(
        self, request: pb.CompleteManyRequest, *, stream: bool = False
    ) -> pb.CompleteManyResponse | CycloneError:
        """One CompleteMany, retried while the server is unavailable (for up to a
        lease); the SDK's error when it cannot be sent. ``stream``: as a report on the
        Work stream when one is open (:mod:`._session`), and by CompleteMany only when
        the stream ends before answering it (a completion sent twice is answered
        duplicate = true)."""
        server = self.server
        if stream:
            answer = await self.send_on_stream(request)
            if answer is not None:
                self._answered()
                return answer
        backoff = Backoff(self.reconnect_max_delay, window=self.policy.lease)
        give_up = self.loop.time() + backoff.window
        while True:
            try:
                reply: pb.CompleteManyResponse = await server.stub.CompleteMany(
                    request, timeout=RPC_TIMEOUT, metadata=server.metadata
                )
            except grpc.RpcError as exc:
                self._answered()
                err = from_rpc_error(exc)
                if isinstance(err, Unavailable) and self.loop.time() < give_up:
                    delay = backoff.next()
                    log.warning("complete failed (%s); retrying in %.1fs", err, delay)
                    await asyncio.sleep(delay)
                    continue
                return err
            self._answered()
            return reply

    def _answered(self) -> None:
        self.reports += 1
        self.on_answered()


def _add_completions(
    request: pb.CompleteManyRequest, batch: list[tuple[pb.CompleteRequest | pb.ClaimedStep, Any]]
) -> None:
    """Write the batch's outcomes into ``request``: a step queued as it is completes
    with a null output."""
    completions = request.completions
    add, append = completions.add, completions.append
    for done, _ in batch:
        if isinstance(done, ClaimedStep):
            completion = add(run_id=done.run_id, node=done.node, lease_token=done.lease_token)
            completion.output.null_value = NULL
        else:
            append(done)


async def _rolled_back(control: StepControl) -> None:
    """Undo the writes of the step's completion transaction, if it has one."""
    if control.completion_tx is not None:
        await asyncio.to_thread(control.completion_tx.rollback)


def run_status(number: int) -> str:
    return str(RunStatus.from_proto(number)) if number else "unknown"


def failure(error: BaseException) -> pb.Failure:
    """The Failure reported for a handler's exception. A step call's failure that the
    body let through is reported as what the step raised."""
    if isinstance(error, StepFailed):
        result = pb.Failure(
            message=error.message or error.type_name,
            type=error.type_name,
            details=f"raised by step call {error.step_id!r}:\n{error.details}",
            non_retryable=error.non_retryable,
        )
        error = error.__cause__ or error  # the original, for its retry_after
    else:
        result = pb.Failure(
            message=str(error) or type(error).__name__,
            type=type(error).__qualname__,
            details="".join(traceback.format_exception(error)),
            non_retryable=isinstance(error, NonRetryableError),
        )
    if isinstance(error, RetryAfter):
        result.retry_after.CopyFrom(duration(error.seconds))
    result.message, result.type, result.details = map(
        no_nul, (result.message, result.type, result.details)
    )
    return result
