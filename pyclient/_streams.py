"""Output streams on the client side: what a chunk is (:class:`StreamChunk`), how a
chunk emitted by a handler goes on the wire (:func:`chunk_data`), and ReadStream and
ListStreams for Client and AsyncClient (docs/streams.md)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from cyclone.v1 import workflow_service_pb2 as wf
from pyclient._requests import Call
from pyclient.errors import from_rpc_error
from pyclient.models import timestamp_datetime

__all__ = ["StreamChunk", "StreamSummary", "chunk_data"]


def chunk_data(chunk: Any) -> tuple[str, str]:
    """``("text", chunk)`` for a str; ``("json", its JSON text)`` for any other JSON value
    (dict, list, number, bool, None). TypeError for what JSON cannot carry."""
    if isinstance(chunk, str):
        return "text", chunk
    try:
        return "json", json.dumps(chunk, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a stream chunk is a str or a JSON value: {exc}") from None


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
    def from_proto(cls, m: wf.StreamChunk) -> StreamChunk:
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


def read_sync(
    stub: Any, request: wf.ReadStreamRequest, metadata: Any, timeout: float | None
) -> Iterator[StreamChunk]:
    call = stub.ReadStream(request, metadata=metadata, timeout=timeout)
    try:
        for message in call:
            yield StreamChunk.from_proto(message)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    finally:
        call.cancel()  # a reader that stops early ends the call


async def read_async(
    stub: Any, request: wf.ReadStreamRequest, metadata: Any, timeout: float | None
) -> AsyncIterator[StreamChunk]:
    call = stub.ReadStream(request, metadata=metadata, timeout=timeout)
    try:
        async for message in call:
            yield StreamChunk.from_proto(message)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    finally:
        call.cancel()


def summaries(response: wf.ListStreamsResponse) -> list[StreamSummary]:
    return [StreamSummary.from_proto(s) for s in response.streams]


def list_call(run_id: str) -> Call[list[StreamSummary]]:
    """ListStreams, as Client and AsyncClient make it."""
    return Call("workflow", "ListStreams", wf.ListStreamsRequest(run_id=run_id), summaries)
