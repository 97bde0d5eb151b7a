"""Live readers of output streams (ReadStream): woken when their run stores chunks or
finishes, without a query of their own while they wait.

A reader watches its run here before it reads, then reads what is stored and waits on
its event. The event is set when:

- the run stored chunks: cyclone.stream_emit notifies ``cyclone_stream`` with the run
  id (heard on the server's LISTEN connection, service.engine.notify), and EmitChunks
  answered by this server says so at once;
- the run may have finished: one statement per server every ``--stream-recheck``
  seconds asks which of the watched runs are still open (runs_open), for all of its
  readers at once; the readers of the others are woken and read their last chunks;
- notifications may have been missed (the LISTEN connection was made again), or the
  server is stopping: every reader is woken.

So a thousand readers cost a thousand waiting coroutines and one statement a second,
not a thousand polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator

from service import errors
from service.db import Database

log = logging.getLogger("cyclone")


class StreamHub:
    """The live readers of this server, by run."""

    def __init__(self, db: Database, recheck_s: float) -> None:
        self.db = db
        self.recheck_s = recheck_s
        self._readers: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        #: Set when the server stops: readers end after sending what is stored.
        self.stopping = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._recheck(), name="cyclone-stream-recheck")

    async def stop(self) -> None:
        self.stopping = True
        self.wake_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def readers(self) -> int:
        return sum(len(events) for events in self._readers.values())

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever the run (canonical text) may have stored chunks or
        finished. Watch before reading, so that nothing stored meanwhile is missed."""
        event = asyncio.Event()
        self._readers[run_id].add(event)
        try:
            yield event
        finally:
            events = self._readers.get(run_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._readers[run_id]

    def stored(self, run_id: str | None) -> None:
        """The run stored chunks (None: any run may have)."""
        if run_id is None:
            self.wake_all()
            return
        for event in self._readers.get(run_id, ()):
            event.set()

    def wake_all(self) -> None:
        for events in self._readers.values():
            for event in events:
                event.set()

    async def _recheck(self) -> None:
        while True:
            await asyncio.sleep(self.recheck_s)
            if not self._readers:
                continue
            watched = list(self._readers)
            try:
                still_open = await self.db.streams.open_runs(watched)
            except errors.CycloneError as exc:
                log.warning("stream readers' runs not looked at: %s", exc)
                continue
            for run_id in watched:
                if run_id not in still_open:
                    self.stored(run_id)
