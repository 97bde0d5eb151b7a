"""``ctx.emit`` in the worker: the chunks of one claimed step, sent with EmitChunks
(docs/streams.md).

Each chunk is identified by (node, stream, step_id, seq): step_id is the step call it
was emitted in ("" for the body of a durable function or a plain handler), and seq
counts the chunks of that (stream, step_id) from 1 in this attempt. A durable body
replays its code in the same order on every attempt, and a step call that is replayed
from the journal does not run (so emits nothing), so an attempt that runs again after a
crash sends the identities the earlier one stored first: the server stores none of
them twice and answers duplicate, and the new chunks follow. An emit waits for the
server's answer (the chunk is stored when it returns), and is retried while the server
is unavailable, for up to a lease: a repeat of a stored chunk is a duplicate.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc

from cyclone.v1 import worker_service_pb2 as pb
from pyclient._streams import Sequencer
from pyclient.errors import StreamFull, Unavailable, from_rpc_error
from pyclient.worker._common import RPC_TIMEOUT
from pyclient.worker._retry import Backoff

if TYPE_CHECKING:
    from pyclient.worker._journal import Journaling


class StepStreams(Sequencer):
    """The output streams of one claimed step (an attempt of a node)."""

    __slots__ = ("shared", "step")

    def __init__(self, shared: Journaling, step: pb.ClaimedStep):
        self._seqs = None  # Sequencer.__init__, without its call (one per step)
        self.shared = shared
        self.step = step

    def _request(self, stream: str, chunk: Any, step_id: str) -> pb.EmitChunksRequest:
        kind, data, seq = self.identify(stream, chunk, step_id)
        step = self.step
        item = pb.ChunkToEmit(stream=stream, step_id=step_id, seq=seq)
        setattr(item, kind, data)
        return pb.EmitChunksRequest(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token, chunks=[item]
        )

    def emit(self, stream: str, chunk: Any, step_id: str) -> int:
        """Store one chunk; its offset in the stream. From a handler's thread."""
        request = self._request(stream, chunk, step_id)
        loop = self.shared.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            raise RuntimeError("in an async handler, use `await ctx.emit_async(...)`")
        future = asyncio.run_coroutine_threadsafe(self._send(request), loop)
        return future.result()

    async def emit_async(self, stream: str, chunk: Any, step_id: str) -> int:
        """emit, for an async handler (on the worker's loop or a handler loop)."""
        request = self._request(stream, chunk, step_id)
        loop = self.shared.loop
        if asyncio.get_running_loop() is loop:
            return await self._send(request)
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._send(request), loop)
        )

    async def _send(self, request: pb.EmitChunksRequest) -> int:
        """On the worker's loop: EmitChunks, retried while the server is unavailable."""
        shared = self.shared
        backoff = Backoff(shared.reconnect_max_delay, window=shared.lease)
        give_up = shared.loop.time() + backoff.window
        while True:
            try:
                response = await shared.server.stub.EmitChunks(
                    request, timeout=RPC_TIMEOUT, metadata=shared.server.metadata
                )
                return int(response.offsets[0])
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise StreamFull(exc.details(), code=exc.code()) from None
                err = from_rpc_error(exc)
                if not isinstance(err, Unavailable) or shared.loop.time() >= give_up:
                    raise err from None
                await asyncio.sleep(backoff.next())
