"""The journal backend of durable functions in the worker: Begin and End of step
calls, sent to the server from where the body runs.

The end of a safe call is not waited for: it goes to the worker's loop, through the
mailbox its handler's outcome takes after it, and the completer sends it with the
other ends and completions of the moment in one CompleteMany (step_calls), before the
node's completion. Losing it in a crash only runs a safe call again. An unsafe call's
Begin and End are sent at once and waited for.

A sync body (in its handler thread) calls on a sync channel, an async body (on the
handler loop) on an aio channel of that loop: a step call never hops to the worker's
loop, which goes on heartbeating. Both channels are opened when first used
(:class:`Channels`). A call the server cannot take now (UNAVAILABLE) is retried for up
to a lease, as completions are (both are idempotent within an attempt: a repeated
Begin answers RUN again, a repeated End is a duplicate).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from cyclone.v1 import types_pb2
from cyclone.v1 import worker_service_pb2 as pb
from cyclone.v1 import worker_service_pb2_grpc as pb_grpc
from pyclient.completion import CompletionTx, record_step_call
from pyclient.context import StepControl
from pyclient.durable._replay import BodyStopped, Call, Decision, Outcome
from pyclient.errors import CycloneError, Unavailable, from_rpc_error
from pyclient.models import StepCall, StepCallError
from pyclient.worker._common import RPC_TIMEOUT
from pyclient.worker._retry import Backoff

if TYPE_CHECKING:
    from pyclient.worker._runtime import Runtime

R = TypeVar("R", pb.BeginStepCallRequest, pb.EndStepCallRequest)

_DECISIONS = {
    pb.STEP_CALL_DECISION_RUN: Decision.RUN,
    pb.STEP_CALL_DECISION_RECORDED: Decision.RECORDED,
    pb.STEP_CALL_DECISION_UNCERTAIN: Decision.UNCERTAIN,
}


class Channels:
    """The channels of step calls: a sync one for sync bodies, an aio one on the
    handler loop for async bodies; each opened when first needed."""

    def __init__(self, address: str, credentials: grpc.ChannelCredentials | None, options: Any):
        self._address, self._credentials, self._options = address, credentials, options
        self._lock = threading.Lock()
        self._sync: grpc.Channel | None = None
        self._aio: grpc.aio.Channel | None = None
        self._aio_loop: asyncio.AbstractEventLoop | None = None
        self.sync_stub: Any = None
        self.aio_stub: Any = None
        self.closed = False

    def sync(self) -> Any:
        """The sync stub (from any thread)."""
        with self._lock:
            if self.closed:
                raise BodyStopped("the worker stopped")
            if self._sync is None:
                self._sync = (
                    grpc.secure_channel(self._address, self._credentials, options=self._options)
                    if self._credentials
                    else grpc.insecure_channel(self._address, options=self._options)
                )
                self.sync_stub = pb_grpc.WorkerServiceStub(self._sync)
            return self.sync_stub

    def aio(self) -> Any:
        """The aio stub of the handler loop (called on it)."""
        if self.closed:
            raise BodyStopped("the worker stopped")
        if self._aio is None:
            self._aio_loop = asyncio.get_running_loop()
            self._aio = (
                grpc.aio.secure_channel(self._address, self._credentials, options=self._options)
                if self._credentials
                else grpc.aio.insecure_channel(self._address, options=self._options)
            )
            self.aio_stub = pb_grpc.WorkerServiceStub(self._aio)
        return self.aio_stub

    async def close(self) -> None:
        """Close both (from the worker's loop, before the handler loop stops)."""
        with self._lock:
            self.closed = True
        if self._sync is not None:
            self._sync.close()
        if self._aio is not None and self._aio_loop is not None:
            closing = asyncio.run_coroutine_threadsafe(self._aio.close(), self._aio_loop)
            # A handler loop held up by a blocking body gives up its channel unclosed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wrap_future(closing), RPC_TIMEOUT)


class GrpcJournal:
    """The journal of one claimed step (one attempt of a node), on the server."""

    def __init__(self, runtime: Runtime, step: pb.ClaimedStep, control: StepControl):
        self.rt = runtime
        self.step = step
        self.control = control

    def before_run(self, call: Call) -> None:
        """No step call starts once the node is lost or given up on."""
        control = self.control
        if control.is_cancelled:
            raise BodyStopped("the run was cancelled")
        if control.is_lease_lost:
            raise BodyStopped("the node's lease was lost")
        if control.is_stopped:
            raise BodyStopped("the worker gave up on this attempt (time limit or shutdown)")

    def begin(self, call: Call) -> tuple[Decision, StepCall | None]:
        request = self._request(pb.BeginStepCallRequest, call)
        return self._decision(self._send("BeginStepCall", request))

    async def begin_async(self, call: Call) -> tuple[Decision, StepCall | None]:
        request = self._request(pb.BeginStepCallRequest, call)
        return self._decision(await self._send_async("BeginStepCall", request))

    def end(self, call: Call, outcome: Outcome) -> None:
        request = self._end_request(call, outcome)
        if call.unsafe:
            self._send("EndStepCall", request)
        else:
            self.rt.inbox.post(self.rt.completer.end_later, request)

    async def end_async(self, call: Call, outcome: Outcome) -> None:
        request = self._end_request(call, outcome)
        if call.unsafe:
            await self._send_async("EndStepCall", request)
        else:
            handlers = self.rt.executor.handler_loop if self.rt.executor else None
            assert handlers is not None  # an async body runs on the handler loop
            handlers.outbox.post(self.rt.completer.end_later, request)

    def record(self, call: Call, conn: Any, output_json: str) -> None:
        step = self.step
        key = (step.run_id, step.node, step.lease_token, call.step_id, call.seq, call.function)
        record_step_call(conn, key, output_json)

    def transaction(self, call: Call) -> CompletionTx:
        if self.rt.pool is None:
            raise RuntimeError(
                "completion_tx() needs a database: create the Worker with database_url="
            )
        step = self.step
        return CompletionTx(
            self.rt.pool,
            step.run_id,
            step.node,
            step.lease_token,
            (call.step_id, call.seq, call.function),
        )

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
        )

    def _end_request(self, call: Call, outcome: Outcome) -> pb.EndStepCallRequest:
        request = self._request(pb.EndStepCallRequest, call)
        if isinstance(outcome, StepCallError):
            request.error.CopyFrom(
                types_pb2.StepCallError(
                    type=outcome.type, message=outcome.message, details=outcome.details
                )
            )
        else:
            request.output.CopyFrom(outcome)
        return request

    @staticmethod
    def _decision(response: pb.BeginStepCallResponse) -> tuple[Decision, StepCall | None]:
        decision = _DECISIONS.get(response.decision)
        if decision is None:
            raise CycloneError(f"BeginStepCall answered an unknown decision {response.decision}")
        entry = StepCall.from_proto(response.call) if response.HasField("call") else None
        return decision, entry

    # -- sending, retried while the server is unavailable

    def _send(self, method: str, request: Any) -> Any:
        rpc = getattr(self.rt.journal_channels.sync(), method)
        backoff = Backoff(self.rt.w.reconnect_max_delay, window=self.rt.policy.lease)
        give_up = time.monotonic() + backoff.window
        while True:
            try:
                return rpc(request, timeout=RPC_TIMEOUT, metadata=self.rt.metadata)
            except grpc.RpcError as exc:
                time.sleep(self._delay(exc, backoff, time.monotonic() < give_up))

    async def _send_async(self, method: str, request: Any) -> Any:
        rpc = getattr(self.rt.journal_channels.aio(), method)
        backoff = Backoff(self.rt.w.reconnect_max_delay, window=self.rt.policy.lease)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + backoff.window
        while True:
            try:
                return await rpc(request, timeout=RPC_TIMEOUT, metadata=self.rt.metadata)
            except grpc.RpcError as exc:
                await asyncio.sleep(self._delay(exc, backoff, loop.time() < give_up))

    def _delay(self, exc: grpc.RpcError, backoff: Backoff, in_time: bool) -> float:
        """How long to wait before trying again; the SDK's error when not to."""
        err = from_rpc_error(exc)
        if isinstance(err, Unavailable) and in_time and not self.control.is_stopped:
            return backoff.next()
        if self.rt.journal_channels.closed:
            raise BodyStopped("the worker stopped") from None
        raise err from None
