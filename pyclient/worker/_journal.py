"""The journal backend of durable functions in the worker: Begin and End of step
calls, sent to the server from where the body runs.

Begins and ends go to the worker's loop, through the mailbox its handler's outcome
takes after them, and the completer sends them with the other begins, ends and
completions of the moment in one CompleteMany, before the node's completion: one round
trip and one commit for many, committed durably. A Begin is waited for (an unsafe call
runs only once its STARTED entry is durable). An End is not waited for by the call
that made it: the body goes on at once, and its next step call waits in
``before_run``, before its function runs, until the node's earlier ends are
acknowledged (the window of one call: a crash runs again at most the call the body was
in, never one it moved past). The ends of many bodies still share one CompleteMany.
``@step(record="async")`` ends are waited for by nobody: a crash may run such a call
again after the body moved past it. The completer retries a batch the server cannot take now
(UNAVAILABLE) for up to a lease: both are idempotent within an attempt (a repeated
Begin answers RUN again, a repeated End is a duplicate).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf import struct_pb2

from cyclone.jsonvalue import parsed_value
from cyclone.v1 import types_pb2
from cyclone.v1 import worker_service_pb2 as pb
from pyclient.completion import CompletionTx, record_step_call
from pyclient.context import StepControl
from pyclient.durable._calls import Call, Decision, Outcome, Until, WaitDecision
from pyclient.durable._errors import BodyStopped
from pyclient.errors import CycloneError, Unavailable, from_rpc_error
from pyclient.models import StepCall, StepCallError
from pyclient.worker import _logs as step_logs
from pyclient.worker._common import RPC_TIMEOUT
from pyclient.worker._executor import HandlerLoop
from pyclient.worker._mailbox import Mailbox
from pyclient.worker._retry import Backoff

if TYPE_CHECKING:
    from pyclient.worker._completer import Answer, Completer
    from pyclient.worker._config import Server

R = TypeVar("R", pb.BeginStepCallRequest, pb.EndStepCallRequest)
T = TypeVar("T")

_DECISIONS = {
    pb.STEP_CALL_DECISION_RUN: Decision.RUN,
    pb.STEP_CALL_DECISION_RECORDED: Decision.RECORDED,
    pb.STEP_CALL_DECISION_UNCERTAIN: Decision.UNCERTAIN,
}


_WAIT_DECISIONS = {
    pb.WAIT_DECISION_READY: WaitDecision.READY,
    pb.WAIT_DECISION_SUSPENDED: WaitDecision.SUSPENDED,
}


@dataclass(frozen=True, slots=True)
class Journaling:
    """What the journals of one worker run share: the server and the worker's loop
    with its inbox (where sync bodies post), the completer that batches Begin and End,
    the handler loop of async bodies, the completion pool (None without a database),
    and how long calls are retried while the server is unavailable (up to ``lease``,
    backoff capped at ``reconnect_max_delay``)."""

    server: Server
    loop: asyncio.AbstractEventLoop
    inbox: Mailbox
    completer: Completer
    handler_loop: HandlerLoop | None
    pool: Any
    lease: float
    reconnect_max_delay: float


class GrpcJournal:
    """The journal of one claimed step (one attempt of a node), on the server."""

    def __init__(self, shared: Journaling, step: pb.ClaimedStep, control: StepControl):
        self.shared = shared
        self.step = step
        self.control = control
        #: The ends of this node's calls not acknowledged yet (a sync body's, an async
        #: body's): the next call's function waits for them.
        self._unrecorded: list[concurrent.futures.Future[None]] = []
        self._unrecorded_async: _Unrecorded | None = None
        #: The worker's queries and updates (pyclient.worker._messages.BodyMessages).
        self.messages: Any = None

    def before_run(self, call: Call) -> None:
        """The node's earlier ends are recorded (durably), then the function of
        ``call`` may run, unless the node is lost or given up on."""
        for recorded in list(self._unrecorded):
            try:
                recorded.result(timeout=self._patience)
            except concurrent.futures.TimeoutError:
                raise Unavailable("EndStepCall was not answered in time") from None
        self._unrecorded = [r for r in self._unrecorded if not r.done()]
        self._check()

    async def before_run_async(self, call: Call) -> None:
        if self._unrecorded_async is not None:
            await self._unrecorded_async.recorded()
        self._check()

    def _check(self) -> None:
        """No step call starts once the node is lost or given up on."""
        control = self.control
        if control.is_cancelled:
            raise BodyStopped("the run was cancelled")
        if control.is_lease_lost:
            raise BodyStopped("the node's lease was lost")
        if control.is_stopped:
            raise BodyStopped("the worker gave up on this attempt (time limit or shutdown)")

    def begin(self, call: Call) -> tuple[Decision, StepCall | None]:
        answer: concurrent.futures.Future[pb.BeginStepCallResponse] = concurrent.futures.Future()
        self._begin_soon(call, self.shared.inbox, answer)
        try:
            return self._decision(answer.result(timeout=self._patience))
        except concurrent.futures.TimeoutError:
            raise Unavailable("BeginStepCall was not answered in time") from None

    async def begin_async(self, call: Call) -> tuple[Decision, StepCall | None]:
        # Answered through the handler loop's mailbox: the answers of one batch wake
        # the handler loop once, not once per body.
        handlers = self._handlers()
        answer: asyncio.Future[pb.BeginStepCallResponse] = handlers.loop.create_future()
        self._begin_soon(call, handlers.outbox, _Posted(answer, handlers.inbox))
        return self._decision(await answer)

    def end(self, call: Call, outcome: Outcome) -> None:
        recorded: concurrent.futures.Future[None] | None = None
        if not call.record_async:
            recorded = concurrent.futures.Future()
            self._unrecorded.append(recorded)
        request = self._end_request(call, outcome)
        self.shared.inbox.post(self.shared.completer.end_later, request, recorded)

    async def end_async(self, call: Call, outcome: Outcome) -> None:
        handlers = self._handlers()
        answer: _Unrecorded | None = None
        if not call.record_async:
            answer = self._unrecorded_async
            if answer is None:
                answer = self._unrecorded_async = _Unrecorded(handlers.loop, handlers.inbox)
            answer.count += 1
        request = self._end_request(call, outcome)
        handlers.outbox.post(self.shared.completer.end_later, request, answer)

    def flush(self) -> None:
        answer: concurrent.futures.Future[None] = concurrent.futures.Future()
        # Through the mailbox the body's ends went through: they are queued first.
        self.shared.inbox.post(self._flush_soon, answer)
        try:
            answer.result(timeout=self._patience)
        except concurrent.futures.TimeoutError:
            raise Unavailable("the step calls' ends were not answered in time") from None

    async def flush_async(self) -> None:
        handlers = self._handlers()
        answer: asyncio.Future[None] = handlers.loop.create_future()
        handlers.outbox.post(self._flush_soon, _Posted(answer, handlers.inbox))
        await answer

    def _flush_soon(self, answer: concurrent.futures.Future[None] | _Posted) -> None:
        """On the worker's loop: settle ``answer`` once the ends queued so far are
        answered."""
        task = self.shared.loop.create_task(self._send_flush(answer))
        self.shared.completer.keep(task)

    async def _send_flush(self, answer: concurrent.futures.Future[None] | _Posted) -> None:
        try:
            await self.shared.completer.ends_sent()
        except BaseException as exc:
            answer.set_exception(exc)
        else:
            answer.set_result(None)

    def fetch_updates(self) -> None:
        """Before a wait is asked: the updates sent to the node, handed to its body."""
        if self.messages is None:
            return
        pending = asyncio.run_coroutine_threadsafe(
            self.messages.fetch(self.step.run_id, self.step.node), self.shared.loop
        )
        try:
            pending.result(timeout=self._patience)
        except concurrent.futures.TimeoutError:
            pending.cancel()

    async def fetch_updates_async(self) -> None:
        if self.messages is None:
            return
        pending = asyncio.run_coroutine_threadsafe(
            self.messages.fetch(self.step.run_id, self.step.node), self.shared.loop
        )
        await asyncio.wrap_future(pending)

    def wait(self, call: Call, until: Until) -> tuple[WaitDecision, StepCall]:
        answer: concurrent.futures.Future[pb.WaitResponse] = concurrent.futures.Future()
        # Through the mailbox the body's ends went through: they are queued first.
        self.shared.inbox.post(self._wait_soon, self._wait_request(call, until), answer)
        try:
            return self._waited(answer.result(timeout=self._patience))
        except concurrent.futures.TimeoutError:
            raise Unavailable("Wait was not answered in time") from None

    async def wait_async(self, call: Call, until: Until) -> tuple[WaitDecision, StepCall]:
        handlers = self._handlers()
        answer: asyncio.Future[pb.WaitResponse] = handlers.loop.create_future()
        handlers.outbox.post(
            self._wait_soon, self._wait_request(call, until), _Posted(answer, handlers.inbox)
        )
        return self._waited(await answer)

    def _wait_soon(self, request: pb.WaitRequest, answer: Answer) -> None:
        """On the worker's loop: send the Wait once the ends queued before it are
        recorded (the node gives up its lease with it: a later end would be refused,
        and its call run again on resume)."""
        task = self.shared.loop.create_task(self._send_wait(request, answer))
        self.shared.completer.keep(task)

    async def _send_wait(self, request: pb.WaitRequest, answer: Answer) -> None:
        """Wait, retried while the server is unavailable, for up to a lease (a Wait
        whose reply was lost and that suspended the node is refused when repeated: the
        lease is over, and the body stops as it would have)."""
        shared = self.shared
        try:
            await shared.completer.ends_sent()
            response = await _retried(shared, shared.server.stub.Wait, request)
        except BaseException as exc:
            # Not stored: the lines go with the node's next report instead.
            step_logs.lines_of(self.control).give_back(list(request.logs))
            answer.set_exception(exc)
        else:
            answer.set_result(response)

    def _wait_request(self, call: Call, until: Until) -> pb.WaitRequest:
        step = self.step
        request = pb.WaitRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id=call.step_id,
            seq=call.seq,
        )
        # What the body logged so far goes with the Wait: a node that suspends sends no
        # Complete, and its resume is another attempt.
        request.logs.extend(step_logs.take(self.control))
        if until.event is not None:
            request.event.name = until.event
            if until.timeout is not None:
                request.event.timeout.FromNanoseconds(int(until.timeout * 1e9))
        elif until.child_run_id is not None:
            request.child_run_id = until.child_run_id
        else:
            request.wake_at.FromDatetime(until.wake_at)
        return request

    @staticmethod
    def _waited(response: pb.WaitResponse) -> tuple[WaitDecision, StepCall]:
        decision = _WAIT_DECISIONS.get(response.decision)
        if decision is None:
            raise CycloneError(f"Wait answered an unknown decision {response.decision}")
        return decision, StepCall.from_proto(response.call)

    def _begin_soon(self, call: Call, mailbox: Mailbox, answer: Answer) -> None:
        """Post the call's Begin, through ``mailbox``, to the completer, which sends it
        with the next CompleteMany and settles ``answer``."""
        mailbox.post(
            self.shared.completer.begin_soon, self._request(pb.BeginStepCallRequest, call), answer
        )

    @property
    def _patience(self) -> float:
        # The completer retries an unavailable server for up to a lease.
        return self.shared.lease + RPC_TIMEOUT

    def _handlers(self) -> HandlerLoop:
        """The handler loop, where async bodies run."""
        handlers = self.shared.handler_loop
        assert handlers is not None
        return handlers

    def record(self, call: Call, conn: Any, output_json: str) -> None:
        step = self.step
        key = (step.run_id, step.node, step.lease_token, call.step_id, call.seq, call.function)
        record_step_call(conn, key, output_json, call.args_digest)

    def transaction(self, call: Call) -> CompletionTx:
        if self.shared.pool is None:
            raise RuntimeError(
                "completion_tx() needs a database: create the Worker with database_url="
            )
        step = self.step
        return CompletionTx(
            self.shared.pool,
            step.run_id,
            step.node,
            step.lease_token,
            (call.step_id, call.seq, call.function),
            args_digest=call.args_digest,
        )

    # -- child runs

    def start_child(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall:
        started = asyncio.run_coroutine_threadsafe(
            self._start_child(call, workflow, input), self.shared.loop
        )
        try:
            return started.result(timeout=self._patience)
        except concurrent.futures.TimeoutError:
            started.cancel()
            raise Unavailable("StartChild was not answered in time") from None

    async def start_child_async(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall:
        # The stub belongs to the worker's loop; an async body runs on the handler loop.
        started = asyncio.run_coroutine_threadsafe(
            self._start_child(call, workflow, input), self.shared.loop
        )
        return await asyncio.wrap_future(started)

    async def _start_child(
        self, call: Call, workflow: types_pb2.Workflow, input: struct_pb2.Value
    ) -> StepCall:
        """StartChild, on the worker's loop, retried while the server is unavailable
        (for up to a lease): it is idempotent by the step call."""
        shared, step = self.shared, self.step
        request = pb.StartChildRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id=call.step_id,
            seq=call.seq,
            workflow=workflow,
            input=input,
        )
        reply: pb.StartChildResponse = await _retried(
            shared, shared.server.stub.StartChild, request
        )
        return StepCall.from_proto(reply.call)

    # -- approvals

    def _approval_request(
        self, step_id: str, title: str, timeout: float | None
    ) -> pb.CreateApprovalRequest:
        step = self.step
        request = pb.CreateApprovalRequest(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id=step_id,
            title=title,
        )
        if timeout is not None:
            request.timeout.FromMilliseconds(round(timeout * 1000))
        return request

    def create_approval(
        self, step_id: str, title: str, timeout: float | None
    ) -> pb.CreateApprovalResponse:
        """CreateApproval for the approval call ``step_id`` (its token is answered
        here, once), retried while the server is unavailable: it is idempotent by the
        step call but for the token, which a repeat replaces."""
        request = self._approval_request(step_id, title, timeout)
        shared = self.shared
        made = asyncio.run_coroutine_threadsafe(
            _retried(shared, shared.server.stub.CreateApproval, request), shared.loop
        )
        try:
            reply: pb.CreateApprovalResponse = made.result(timeout=self._patience)
        except concurrent.futures.TimeoutError:
            made.cancel()
            raise Unavailable("CreateApproval was not answered in time") from None
        return reply

    async def create_approval_async(
        self, step_id: str, title: str, timeout: float | None
    ) -> pb.CreateApprovalResponse:
        # The stub belongs to the worker's loop; an async body runs on the handler loop.
        request = self._approval_request(step_id, title, timeout)
        shared = self.shared
        made = asyncio.run_coroutine_threadsafe(
            _retried(shared, shared.server.stub.CreateApproval, request), shared.loop
        )
        reply: pb.CreateApprovalResponse = await asyncio.wrap_future(made)
        return reply

    # -- requests and answers

    def _request(self, cls: type[R], call: Call) -> R:
        step = self.step
        return cls(
            run_id=step.run_id,
            node=step.node,
            lease_token=step.lease_token,
            step_id=call.step_id,
            seq=call.seq,
            function=call.function,
            unsafe_to_repeat=call.unsafe,
            args_digest=call.args_digest,
        )

    def _end_request(self, call: Call, outcome: Outcome) -> pb.EndStepCallRequest:
        request = self._request(pb.EndStepCallRequest, call)
        if isinstance(outcome, StepCallError):
            error = request.error
            error.type = outcome.type
            error.message = outcome.message
            error.details = outcome.details
            error.module = outcome.module
            if outcome.args is not None:
                error.args.CopyFrom(parsed_value(outcome.args))
            if outcome.attributes is not None:
                error.attributes.CopyFrom(parsed_value(outcome.attributes))
        else:
            request.output.CopyFrom(outcome)
        return request

    @staticmethod
    def _decision(response: pb.BeginStepCallResponse) -> tuple[Decision, StepCall | None]:
        decision = _DECISIONS.get(response.decision)
        if decision is None:
            raise CycloneError(f"BeginStepCall answered an unknown decision {response.decision}")
        # A RUN needs no entry (the body runs the call): not building it saves the
        # worker a quarter of its work per unsafe call.
        if decision is Decision.RUN or not response.HasField("call"):
            return decision, None
        return decision, StepCall.from_proto(response.call)


async def _retried(shared: Journaling, method: Callable[..., Awaitable[T]], request: Any) -> T:
    """``method(request)`` on the worker's loop, retried while the server is
    unavailable, for up to a lease (Wait and StartChild are idempotent within an
    attempt); the SDK's error otherwise."""
    backoff = Backoff(shared.reconnect_max_delay, window=shared.lease)
    give_up = shared.loop.time() + backoff.window
    while True:
        try:
            return await method(request, timeout=RPC_TIMEOUT, metadata=shared.server.metadata)
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if not isinstance(err, Unavailable) or shared.loop.time() >= give_up:
                raise err from None
            await asyncio.sleep(backoff.next())


class _Posted:
    """An answer settled from the worker's loop onto an asyncio future of another loop,
    through that loop's mailbox (the completer calls set_result or set_exception)."""

    def __init__(self, future: asyncio.Future[Any], mailbox: Mailbox):
        self.future, self.mailbox = future, mailbox

    def set_result(self, value: Any) -> None:
        self.mailbox.post(_settle, self.future, value, None)

    def set_exception(self, error: BaseException) -> None:
        self.mailbox.post(_settle, self.future, None, error)


class _Unrecorded:
    """The ends of an async body's calls that are not answered yet, counted: the
    answer the completer settles for each of them (on the worker's loop, through the
    handler loop's mailbox), and what the body's next call waits for. A refusal stays:
    every later call raises it (a refusal nobody waits for, when the body made no later
    call, is not an error)."""

    __slots__ = ("count", "error", "loop", "mailbox", "waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, mailbox: Mailbox):
        self.loop, self.mailbox = loop, mailbox
        self.count = 0
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None

    def set_result(self, value: Any) -> None:
        self.mailbox.post(self._answered, None)

    def set_exception(self, error: BaseException) -> None:
        self.mailbox.post(self._answered, error)

    def _answered(self, error: BaseException | None) -> None:
        """On the handler loop: one end answered."""
        self.count -= 1
        if error is not None and self.error is None:
            self.error = error
        if self.count == 0 and self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            if not waiter.done():  # the body was cancelled meanwhile
                waiter.set_result(None)

    async def recorded(self) -> None:
        """Return once every end counted is answered; raise the first refusal."""
        if self.count:
            self.waiter = self.loop.create_future()
            await self.waiter
        if self.error is not None:
            raise self.error


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # the body was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
