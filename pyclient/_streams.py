"""Output streams on the client side: what a chunk is (:class:`StreamChunk`), how a
chunk emitted by a handler goes on the wire (:func:`chunk_data`), and ReadStream and
ListStreams for Client and AsyncClient (docs/streams.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from cyclone.v1 import workflow_service_pb2 as wf
from pyclient._requests import Call
from pyclient.errors import CycloneError, DeadlineExceeded, Unavailable, from_rpc_error
from pyclient.models import timestamp_datetime

__all__ = [
    "MemoryStreams",
    "Sequencer",
    "StreamChunk",
    "StreamStore",
    "StreamSummary",
    "chunk_data",
]


def chunk_data(chunk: Any) -> tuple[str, str]:
    """``("text", chunk)`` for a str; ``("json", its JSON text)`` for any other JSON value
    (dict, list, number, bool, None). TypeError for what JSON cannot carry."""
    if isinstance(chunk, str):
        return "text", chunk
    try:
        return "json", json.dumps(chunk, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a stream chunk is a str or a JSON value: {exc}") from None


_SEQUENCE_LOCK = threading.Lock()


class Sequencer:
    """The identity of each chunk one attempt of a node emits: (stream, step_id, seq),
    seq counting the chunks of each (stream, step_id) from 1 in the order emitted. The
    same code emitting in the same order gets the same identities on every attempt."""

    # The worker makes one per claimed step, and most steps emit nothing: the counts
    # are made at the first emit, and every sequencer shares one lock (held for a
    # dictionary update).
    __slots__ = ("_seqs",)

    def __init__(self) -> None:
        self._seqs: dict[tuple[str, str], int] | None = None

    def identify(self, stream: str, chunk: Any, step_id: str) -> tuple[str, str, int]:
        """(kind, data, seq) of a chunk emitted now: kind "text" or "json"."""
        if not isinstance(stream, str) or not stream:
            raise ValueError("a stream's name is a non-empty str")
        kind, data = chunk_data(chunk)
        with _SEQUENCE_LOCK:
            seqs = self._seqs
            if seqs is None:
                seqs = self._seqs = {}
            seq = seqs[stream, step_id] = seqs.get((stream, step_id), 0) + 1
        return kind, data, seq


class StreamStore:
    """A run's output streams kept in memory as the server keeps them (pyclient.testing):
    the first chunk stored under an identity wins, a repeat is not stored again."""

    def __init__(self) -> None:
        #: The chunks of each stream, in order: the values emitted.
        self.streams: dict[str, list[Any]] = {}
        self._offsets: dict[tuple[str, str, str, int], int] = {}

    def store(self, node: str, stream: str, step_id: str, seq: int, kind: str, data: str) -> int:
        key = (node, stream, step_id, seq)
        found = self._offsets.get(key)
        if found is not None:
            return found
        chunks = self.streams.setdefault(stream, [])
        chunks.append(json.loads(data) if kind == "json" else data)
        self._offsets[key] = len(chunks) - 1
        return len(chunks) - 1


class MemoryStreams(Sequencer):
    """ctx.emit of one attempt under pyclient.testing: into a StreamStore."""

    __slots__ = ("node", "store")

    def __init__(self, store: StreamStore, node: str) -> None:
        super().__init__()
        self.store = store
        self.node = node

    def emit(self, stream: str, chunk: Any, step_id: str) -> int:
        kind, data, seq = self.identify(stream, chunk, step_id)
        return self.store.store(self.node, stream, step_id, seq, kind, data)

    async def emit_async(self, stream: str, chunk: Any, step_id: str) -> int:
        return self.emit(stream, chunk, step_id)

    def again(self) -> MemoryStreams:
        """The streams of the node's next attempt: the same store, counted anew."""
        return MemoryStreams(self.store, self.node)


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One chunk of a run's output stream."""

    #: Its place in the stream: 0 for the first.
    offset: int
    #: What was emitted: a str, or the JSON value (dict, list, number, bool, None).
    data: Any
    #: The node that emitted it, and the step call it was emitted in ("" for the body
    #: of a durable function or a plain handler).
    node: str
    step_id: str
    #: The node's attempt that stored it.
    attempt: int
    emitted_at: dt.datetime

    @classmethod
    def from_proto(cls, m: wf.ReadStreamResponse) -> StreamChunk:
        data: Any = json.loads(m.json) if m.WhichOneof("data") == "json" else m.text
        return cls(
            offset=m.offset,
            data=data,
            node=m.node,
            step_id=m.step_id,
            attempt=m.attempt,
            emitted_at=timestamp_datetime(m.emitted_at),
        )


@dataclass(frozen=True, slots=True)
class StreamSummary:
    """One output stream of a run (ListStreams)."""

    name: str
    #: How many chunks it holds: the offset the next one takes.
    chunks: int
    bytes: int
    last_emitted_at: dt.datetime | None

    @classmethod
    def from_proto(cls, m: wf.StreamSummary) -> StreamSummary:
        return cls(
            name=m.name,
            chunks=m.chunks,
            bytes=m.bytes,
            last_emitted_at=timestamp_datetime(m.last_emitted_at)
            if m.HasField("last_emitted_at")
            else None,
        )


def read_request(run_id: str, name: str, offset: int, wait: bool) -> wf.ReadStreamRequest:
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, got {offset}")
    return wf.ReadStreamRequest(run_id=run_id, stream=name, from_offset=offset, no_wait=not wait)


#: How long a reader tries to read again, from where it was, after its server became
#: unavailable (stopping, restarting, or the connection lost) without a chunk since.
RECONNECT_S = 30.0


def _pause(error: CycloneError, since: float) -> float | None:
    """The seconds to wait before reading again after ``error``, or None to give up:
    only an unavailable server is waited for (not a deadline passed), for RECONNECT_S
    after the last chunk read."""
    if not isinstance(error, Unavailable) or isinstance(error, DeadlineExceeded):
        return None
    waited = time.monotonic() - since
    if waited >= RECONNECT_S:
        return None
    return min(2.0, 0.1 + waited / 4)


def _from(request: wf.ReadStreamRequest, offset: int) -> wf.ReadStreamRequest:
    again = wf.ReadStreamRequest()
    again.CopyFrom(request)
    again.from_offset = offset
    return again


def read_sync(
    stub: Any, request: wf.ReadStreamRequest, metadata: Any, timeout: float | None
) -> Iterator[StreamChunk]:
    """ReadStream's chunks; read again from the next offset while the server is
    unavailable (for up to RECONNECT_S without a chunk)."""
    offset, since = request.from_offset, time.monotonic()
    give_up = None if timeout is None else since + timeout
    while True:
        left = None if give_up is None else max(0.0, give_up - time.monotonic())
        call = stub.ReadStream(_from(request, offset), metadata=metadata, timeout=left)
        try:
            for message in call:
                chunk = StreamChunk.from_proto(message)
                offset, since = chunk.offset + 1, time.monotonic()
                yield chunk
            return
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            pause = _pause(error, since)
            if pause is None:
                raise error from None
        finally:
            call.cancel()  # a reader that stops early ends the call
        time.sleep(pause)


async def read_async(
    stub: Any, request: wf.ReadStreamRequest, metadata: Any, timeout: float | None
) -> AsyncIterator[StreamChunk]:
    """read_sync on an asyncio channel."""
    offset, since = request.from_offset, time.monotonic()
    give_up = None if timeout is None else since + timeout
    while True:
        left = None if give_up is None else max(0.0, give_up - time.monotonic())
        call = stub.ReadStream(_from(request, offset), metadata=metadata, timeout=left)
        try:
            async for message in call:
                chunk = StreamChunk.from_proto(message)
                offset, since = chunk.offset + 1, time.monotonic()
                yield chunk
            return
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            pause = _pause(error, since)
            if pause is None:
                raise error from None
        finally:
            call.cancel()
        await asyncio.sleep(pause)


def summaries(response: wf.ListStreamsResponse) -> list[StreamSummary]:
    return [StreamSummary.from_proto(s) for s in response.streams]


def list_call(run_id: str) -> Call[list[StreamSummary]]:
    """ListStreams, as Client and AsyncClient make it."""
    return Call("workflow", "ListStreams", wf.ListStreamsRequest(run_id=run_id), summaries)
