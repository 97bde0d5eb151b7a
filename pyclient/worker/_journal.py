"""The journal backend of durable functions in the worker: Begin and End of step
calls, sent on the worker's channel.

The channel belongs to the worker's loop, so every call is made there: a sync body
(in its handler thread) waits for the answer, an async body (on the handler loop)
awaits it; neither blocks the worker's loop. A call the server cannot take now
(UNAVAILABLE) is retried for up to a lease, as completions are (both are idempotent
for one attempt: a repeated Begin answers RUN again, a repeated End is a duplicate).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from cyclone.v1 import types_pb2
from cyclone.v1 import worker_service_pb2 as pb
from pyclient.completion import CompletionTx, record_step_call
from pyclient.context import StepControl
from pyclient.durable._replay import BodyStopped, Call, Decision, Outcome
from pyclient.errors import CycloneError, Unavailable, from_rpc_error
from pyclient.models import StepCall, StepCallError
from pyclient.worker._common import RPC_TIMEOUT
from pyclient.worker._retry import Backoff

if TYPE_CHECKING:
    from pyclient.worker._runtime import Runtime

T = TypeVar("T")
R = TypeVar("R", pb.BeginStepCallRequest, pb.EndStepCallRequest)

_DECISIONS = {
    pb.STEP_CALL_DECISION_RUN: Decision.RUN,
    pb.STEP_CALL_DECISION_RECORDED: Decision.RECORDED,
    pb.STEP_CALL_DECISION_UNCERTAIN: Decision.UNCERTAIN,
}


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
        return self._wait(self._begin(call))

    async def begin_async(self, call: Call) -> tuple[Decision, StepCall | None]:
        return await self._bridge(self._begin(call))

    def end(self, call: Call, outcome: Outcome) -> None:
        self._wait(self._end(call, outcome))

    async def end_async(self, call: Call, outcome: Outcome) -> None:
        await self._bridge(self._end(call, outcome))

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

    # -- on the worker's loop

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

    async def _begin(self, call: Call) -> tuple[Decision, StepCall | None]:
        request = self._request(pb.BeginStepCallRequest, call)
        response = await self._send(self.rt.stub.BeginStepCall, request)
        decision = _DECISIONS.get(response.decision)
        if decision is None:
            raise CycloneError(f"BeginStepCall answered an unknown decision {response.decision}")
        entry = StepCall.from_proto(response.call) if response.HasField("call") else None
        return decision, entry

    async def _end(self, call: Call, outcome: Outcome) -> None:
        request = self._request(pb.EndStepCallRequest, call)
        if isinstance(outcome, StepCallError):
            request.error.CopyFrom(
                types_pb2.StepCallError(
                    type=outcome.type, message=outcome.message, details=outcome.details
                )
            )
        else:
            request.output.CopyFrom(outcome)
        await self._send(self.rt.stub.EndStepCall, request)

    async def _send(self, method: Any, request: Any) -> Any:
        rt = self.rt
        backoff = Backoff(rt.w.reconnect_max_delay, window=rt.policy.lease)
        give_up = rt.loop.time() + backoff.window
        while True:
            try:
                return await method(request, timeout=RPC_TIMEOUT, metadata=rt.metadata)
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if (
                    isinstance(err, Unavailable)
                    and rt.loop.time() < give_up
                    and not self.control.is_stopped
                ):
                    await asyncio.sleep(backoff.next())
                    continue
                raise err from None

    # -- from the body

    def _wait(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the worker's loop and wait for it (a sync body's thread)."""
        try:
            return concurrent_call(work, self.rt.loop).result()
        except concurrent.futures.CancelledError:
            raise BodyStopped("the worker stopped") from None

    async def _bridge(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the worker's loop and await it (an async body's loop)."""
        return await asyncio.wrap_future(concurrent_call(work, self.rt.loop))


def concurrent_call(
    work: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop
) -> concurrent.futures.Future[T]:
    if loop.is_closed():
        work.close()
        raise BodyStopped("the worker stopped")
    return asyncio.run_coroutine_threadsafe(work, loop)
