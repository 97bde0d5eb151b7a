"""The server's event loop: uvloop's when it is installed (the server extra installs
it), else asyncio's own; ``--event-loop`` chooses.

The server's Python per step is mostly the loop's own work around each message and
each statement (polling, callbacks, the psycopg waits), and uvloop does that work in
C: about a tenth less server CPU per step in ``make bench`` (docs/performance.md,
"The server"). Nothing else changes with the loop; the tests run the server
on the loop that ``auto`` picks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: The choices of --event-loop.
CHOICES = ("auto", "uvloop", "asyncio")


class Unavailable(Exception):
    """--event-loop uvloop on a system without uvloop."""


def factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the loop for ``choice`` (one of CHOICES)."""
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise Unavailable(
                "--event-loop uvloop: uvloop is not installed "
                "(pip install 'cyclone-workflows[server]', or use --event-loop asyncio)"
            ) from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which loop this is, for the start-up log line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
