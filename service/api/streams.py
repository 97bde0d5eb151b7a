"""Output streams over gRPC: EmitChunks (WorkerService), ReadStream and ListStreams
(WorkflowService). docs/streams.md describes them; service/schema/56_streams.sql
stores the chunks; service.engine.streams wakes the live readers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from cyclone.dag import excerpt
from cyclone.v1 import worker_service_pb2 as worker_pb
from cyclone.v1 import workflow_service_pb2 as workflow_pb
from service import errors
from service.api import convert
from service.api.ids import uuid_text
from service.api.validate import Context, node_name, step_call_name
from service.config import Settings
from service.db import Database
from service.engine.streams import StreamHub

#: Most chunks one EmitChunks may carry.
MAX_CHUNKS_PER_CALL = 1000
#: Chunks a reader reads per statement.
READ_BATCH = 500
#: The statuses of a finished run: it stores no more chunks.
FINISHED = frozenset({"completed", "failed", "cancelled"})


def stream_name(value: str, what: str = "stream") -> str:
    """A stream's name: 1 to 200 printable characters."""
    return step_call_name(value, what)


def _chunk_item(i: int, chunk: worker_pb.ChunkToEmit, max_bytes: int) -> dict[str, object]:
    where = f"chunks[{i}]"
    stream = stream_name(chunk.stream, f"{where}.stream")
    step_id = step_call_name(chunk.step_id, f"{where}.step_id") if chunk.step_id else ""
    if chunk.seq < 1:
        raise errors.InvalidArgument(f"{where}.seq must be 1 or more, got {chunk.seq}")
    kind = chunk.WhichOneof("data")
    if kind is None:
        raise errors.InvalidArgument(f"{where} has neither text nor json")
    data: str = getattr(chunk, kind)
    size = len(data.encode())
    if size > max_bytes:
        raise errors.ResourceExhausted(
            f"{where} of stream {excerpt(stream)} is {size} bytes; the limit is {max_bytes} "
            "(--max-stream-chunk-bytes)"
        )
    if kind == "text":
        if "\x00" in data:
            raise errors.InvalidArgument(f"{where}.text contains a NUL character")
    else:
        try:
            json.loads(data)
        except ValueError:
            raise errors.InvalidArgument(f"{where}.json is not JSON text") from None
    return {"stream": stream, "step_id": step_id, "seq": chunk.seq, "data": data,
            "json": kind == "json"}  # fmt: skip


async def emit_chunks(
    db: Database, hub: StreamHub, settings: Settings, request: worker_pb.EmitChunksRequest
) -> worker_pb.EmitChunksResponse:
    """EmitChunks: checked, stored under the lease, and told to this server's readers."""
    run_id = uuid_text(request.run_id)
    node = node_name(request.node)
    token = uuid_text(request.lease_token, "lease_token")
    if len(request.chunks) > MAX_CHUNKS_PER_CALL:
        raise errors.InvalidArgument(
            f"{len(request.chunks)} chunks in one call; the limit is {MAX_CHUNKS_PER_CALL}"
        )
    if not request.chunks:
        return worker_pb.EmitChunksResponse()
    items = [
        _chunk_item(i, chunk, settings.max_stream_chunk_bytes)
        for i, chunk in enumerate(request.chunks)
    ]
    rows = await db.streams.emit(
        run_id,
        node,
        token,
        json.dumps(items),
        max_bytes=settings.max_stream_bytes_per_run,
        max_chunks=settings.max_stream_chunks_per_run,
    )
    if not all(r.duplicate for r in rows):
        hub.stored(run_id)
    return worker_pb.EmitChunksResponse(
        offsets=[r.pos for r in rows], duplicate=[r.duplicate for r in rows]
    )


async def read_stream(
    db: Database, hub: StreamHub, request: workflow_pb.ReadStreamRequest, context: Context
) -> AsyncIterator[workflow_pb.ReadStreamResponse]:
    """ReadStream: what is stored from the offset, then, unless no_wait, each new chunk
    as it is stored, until the run is finished and all of it was sent."""
    run_id = uuid_text(request.run_id)
    stream = stream_name(request.stream)
    if request.from_offset < 0:
        raise errors.InvalidArgument(f"from_offset must be 0 or more, got {request.from_offset}")
    offset = request.from_offset
    with hub.watch(run_id) as news:
        while True:
            news.clear()
            rows = await db.streams.read(run_id, stream, offset, READ_BATCH)
            if not rows:
                raise errors.NotFound(f"run {run_id} not found")
            sent = 0
            for row in rows:
                if row.pos is None:
                    break
                chunk = workflow_pb.ReadStreamResponse(
                    offset=row.pos,
                    node=row.node,
                    step_id=row.step_id,
                    attempt=row.attempt,
                    emitted_at=convert.timestamp(row.at),
                )
                if row.json:
                    chunk.json = row.data or ""
                else:
                    chunk.text = row.data or ""
                yield chunk
                offset = row.pos + 1
                sent += 1
            if sent == READ_BATCH:
                continue  # more may be stored already
            if request.no_wait or rows[0].status in FINISHED:
                return
            if hub.stopping:
                raise errors.Unavailable(
                    f"the server is stopping: read again from offset {offset} (another "
                    "server, or this one once it is back)"
                )
            await news.wait()


async def list_streams(
    db: Database, request: workflow_pb.ListStreamsRequest
) -> workflow_pb.ListStreamsResponse:
    run_id = uuid_text(request.run_id)
    rows = await db.streams.of_run(run_id)
    if rows is None:
        raise errors.NotFound(f"run {run_id} not found")
    return workflow_pb.ListStreamsResponse(
        streams=[
            workflow_pb.StreamSummary(
                name=r.stream or "",
                chunks=r.chunks or 0,
                bytes=r.bytes or 0,
                last_emitted_at=convert.timestamp(r.last_at),
            )
            for r in rows
        ]
    )
