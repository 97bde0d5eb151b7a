"""The console serving in a thread of its own, for the tests that talk to it (through a
browser, tests/test_console.py, or plain HTTP, tests/test_console_html.py and
tests/test_console_sessions.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from console import serve
from console.sessions import Sessions


class ConsoleThread:
    """The console serving in a thread of its own, on its own event loop."""

    def __init__(
        self, address: str, credentials: Any = None, sessions: Sessions | None = None
    ) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._main(address, credentials, sessions),)
        )
        self._thread.start()
        assert self._ready.wait(30), "the console did not start"
        assert self.url, "the console failed to start"

    async def _main(self, address: str, credentials: Any, sessions: Sessions | None) -> None:
        self._loop = asyncio.get_running_loop()

        def started(url: str) -> None:
            self.url = url.rstrip("/")
            self._ready.set()

        self._task = asyncio.create_task(
            serve(
                address,
                "127.0.0.1:0",
                actor="console-test",
                credentials=credentials,
                started=started,
                sessions=sessions,
            )
        )
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        finally:
            self._ready.set()

    def stop(self) -> None:
        assert self._loop is not None and self._task is not None
        self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)
