"""Output streams: the chunks handlers emit (EmitChunks) and their readers (ReadStream,
ListStreams, the live readers' watch of their runs)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from service.db.pool import Repository


class Emitted(NamedTuple):
    """stream_emit: one chunk of the call, in order."""

    stream: str
    pos: int
    duplicate: bool


class ChunkRow(NamedTuple):
    """stream_read: the run's status, and a chunk (None columns when there is none)."""

    status: str
    pos: int | None
    node: str | None
    step_id: str | None
    attempt: int | None
    at: datetime | None
    data: str | None
    json: bool | None


class StreamRow(NamedTuple):
    """streams_list (None columns: the run has no stream)"""

    stream: str | None
    chunks: int | None
    bytes: int | None
    last_at: datetime | None


class OpenRun(NamedTuple):
    """runs_open"""

    run_id: str


class Streams(Repository):
    """The chunks of runs' output streams."""

    async def emit(
        self,
        run_id: str,
        node: str,
        lease_token: str,
        chunks: str,
        *,
        max_bytes: int,
        max_chunks: int,
    ) -> list[Emitted]:
        """Store ``chunks`` (stream_emit's JSON) for the holder of the node's lease."""
        return await self._all(
            "stream_emit",
            Emitted,
            run_id=run_id,
            node=node,
            lease_token=lease_token,
            chunks=chunks,
            max_bytes=max_bytes,
            max_chunks=max_chunks,
        )

    async def read(self, run_id: str, stream: str, from_pos: int, limit: int) -> list[ChunkRow]:
        """Up to ``limit`` chunks from ``from_pos`` with the run's status; [] when the run
        does not exist."""
        return await self._all(
            "stream_read", ChunkRow, run_id=run_id, stream=stream, from_pos=from_pos, limit=limit
        )

    async def of_run(self, run_id: str) -> list[StreamRow] | None:
        """The run's streams by name; None when the run does not exist."""
        rows = await self._all("streams_list", StreamRow, run_id=run_id)
        if not rows:
            return None
        return [r for r in rows if r.stream is not None]

    async def open_runs(self, run_ids: list[str]) -> set[str]:
        """The runs of ``run_ids`` that exist and are not finished."""
        rows = await self._all("runs_open", OpenRun, run_ids=run_ids)
        return {r.run_id for r in rows}
