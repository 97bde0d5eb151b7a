"""The channel on which transitions announce the actions they made claimable: the
statements of the LISTEN connection and of the connection that sends this server's
notifications (service.engine.notify holds both)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

CHANNEL = "cyclone_ready"


async def connect(database_url: str) -> psycopg.AsyncConnection[Any]:
    """A connection of its own, outside the pool, in autocommit mode."""
    return await psycopg.AsyncConnection.connect(database_url, autocommit=True)


async def listen(conn: psycopg.AsyncConnection[Any]) -> None:
    """Start hearing the channel on ``conn`` (conn.notifies() then yields each)."""
    await conn.execute(f"LISTEN {CHANNEL}")


async def announce(conn: psycopg.AsyncConnection[Any], actions: Iterable[str]) -> None:
    """One notification per action, in one statement."""
    await conn.execute(
        f"SELECT pg_notify('{CHANNEL}', a) FROM unnest(%s::text[]) a", (sorted(actions),)
    )
