"""The channel on which transitions announce the actions they made claimable: the
statements of the LISTEN connection and of the connection that sends this server's
notifications (service.engine.notify holds both).

A notification is heard only on the Postgres instance it was sent on. On Citus every
server listens and notifies on the coordinator, whichever node it is connected to
(docs/scaling.md, "Several servers, several nodes"), so that servers connected to
different nodes wake each other."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

log = logging.getLogger(__name__)

CHANNEL = "cyclone_ready"
#: The channel cyclone.stream_emit notifies, with the run id, when it stored chunks
#: (service.engine.streams wakes the live readers of that run).
STREAM_CHANNEL = "cyclone_stream"

# The coordinator of the Citus cluster this database is a worker node of (no row on a
# coordinator, or without Citus).
_COORDINATOR = """
SELECT n.nodename, n.nodeport
  FROM pg_catalog.pg_dist_node n, pg_catalog.pg_dist_local_group l
 WHERE n.groupid = 0 AND n.noderole = 'primary' AND l.groupid <> 0
"""
_WORKER_NODE = "SELECT groupid <> 0 FROM pg_catalog.pg_dist_local_group"


async def connect(database_url: str) -> psycopg.AsyncConnection[Any]:
    """A connection of its own, outside the pool, in autocommit mode: to the database
    of ``database_url``, or, when that is a worker node of a Citus cluster, to the same
    database on the cluster's coordinator (with the same user and options)."""
    conn = await psycopg.AsyncConnection.connect(database_url, autocommit=True)
    citus = await (
        await conn.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
    ).fetchone()
    if not (citus and citus[0]):
        return conn
    coordinator = await (await conn.execute(_COORDINATOR)).fetchone()
    if coordinator is None:
        worker = await (await conn.execute(_WORKER_NODE)).fetchone()
        if worker and worker[0]:
            log.warning(
                "this database is a Citus worker node and its cluster has no coordinator "
                "in pg_dist_node (citus_set_coordinator_host): wake-ups are heard only "
                "from servers on this node; others are found at each --claim-recheck"
            )
        return conn
    await conn.close()
    host, port = coordinator
    return await psycopg.AsyncConnection.connect(
        make_conninfo(database_url, host=host, port=port), autocommit=True
    )


async def listen(conn: psycopg.AsyncConnection[Any]) -> None:
    """Start hearing the channels on ``conn`` (conn.notifies() then yields each)."""
    await conn.execute(f"LISTEN {CHANNEL}")
    await conn.execute(f"LISTEN {STREAM_CHANNEL}")


async def announce(conn: psycopg.AsyncConnection[Any], actions: Iterable[str]) -> None:
    """One notification per action, in one statement."""
    await conn.execute(
        f"SELECT pg_notify('{CHANNEL}', a) FROM unnest(%s::text[]) a", (sorted(actions),)
    )
