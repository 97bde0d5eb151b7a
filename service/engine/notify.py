"""Wake-ups for long-polling claims, from Postgres LISTEN/NOTIFY.

A transition made by this server reports the actions it made claimable
(:meth:`Dispatcher.publish`): the claims waiting here are woken at once, and one
coalesced ``NOTIFY cyclone_ready, '<action>'`` per action tells the other servers,
sent from a connection that writes nothing, so it never holds up a commit (see
0003_deferred_notify.sql). Transitions made elsewhere (a worker's own completion
transaction) notify inline. Every server holds one LISTEN connection here.

The same connection hears ``cyclone_stream``, which cyclone.stream_emit notifies with
the run id when it stored chunks of an output stream: handed to ``on_stream`` (the
server's service.engine.streams.StreamHub), which wakes that run's live readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator

import psycopg

from service.db import channel

log = logging.getLogger(__name__)


class Dispatcher:
    """One LISTEN connection per server, fanned out to waiting claims by action."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._tasks: list[asyncio.Task[None]] = []
        self._outbox: set[str] = set()
        self._outbox_ready = asyncio.Event()
        self.connected = asyncio.Event()
        #: The backend of the connection that sends this server's notifications.
        self._own_pid: int | None = None
        #: Told the run id of each cyclone_stream notification; with None, when
        #: notifications may have been missed (the LISTEN connection was (re)made).
        self.on_stream: Callable[[str | None], None] | None = None

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen(), name="cyclone-listen"),
            asyncio.create_task(self._notify(), name="cyclone-notify"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.wake_all()

    def publish(self, actions: set[str]) -> None:
        """Steps of these actions became claimable through this server."""
        for action in actions:
            self.wake(action)
        self._outbox |= actions
        self._outbox_ready.set()

    @contextlib.contextmanager
    def subscribe(self, actions: list[str]) -> Iterator[asyncio.Event]:
        """An event set whenever a step of one of these actions may have become ready.

        Subscribe before looking for work, so that a notification sent between the
        look and the wait is not lost.
        """
        event = asyncio.Event()
        for action in actions:
            self._waiters[action].add(event)
        try:
            yield event
        finally:
            for action in actions:
                waiters = self._waiters.get(action)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[action]

    def wake(self, action: str) -> None:
        for event in self._waiters.get(action, ()):
            event.set()

    def wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def _reconnecting(
        self, what: str, session: Callable[[psycopg.AsyncConnection], Awaitable[None]]
    ) -> None:
        """Run ``session`` on a fresh connection, again after every loss, with backoff."""
        delay = 0.1
        while True:
            try:
                async with await channel.connect(self._url) as conn:
                    delay = 0.1
                    await session(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s connection lost (%s); reconnecting in %.1fs", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _notify(self) -> None:
        async def send(conn: psycopg.AsyncConnection) -> None:
            while True:
                await self._outbox_ready.wait()
                self._outbox_ready.clear()
                actions, self._outbox = self._outbox, set()
                self._own_pid = conn.info.backend_pid
                try:
                    await channel.announce(conn, actions)
                except BaseException:
                    # Not sent (the connection was lost, e.g. Postgres restarted, or
                    # the server is stopping): back in the outbox, for the next
                    # connection to send first.
                    self._outbox |= actions
                    self._outbox_ready.set()
                    raise

        await self._reconnecting("NOTIFY", send)

    async def _listen(self) -> None:
        async def receive(conn: psycopg.AsyncConnection) -> None:
            await channel.listen(conn)
            self.connected.set()
            try:
                # Anything may have become ready while we were not listening.
                self.wake_all()
                on_stream = self.on_stream
                if on_stream is not None:
                    on_stream(None)
                async for notify in conn.notifies():
                    if notify.channel == channel.STREAM_CHANNEL:
                        if on_stream is not None:
                            on_stream(notify.payload)
                    # Our own notifications: publish woke our claims already.
                    elif notify.pid != self._own_pid:
                        self.wake(notify.payload)
            finally:
                self.connected.clear()

        await self._reconnecting("LISTEN", receive)
