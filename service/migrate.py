"""Versioned schema migrations, applied at start and by `cyclone-server --migrate-only`.

Migrations are the files ``service/migrations/NNNN_name.sql``, applied in order, each
in its own transaction. A transaction-level advisory lock serialises servers that
start at once: the second waits, then finds the versions already recorded.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from importlib import resources

import psycopg

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same for every Cyclone server.
_LOCK_KEY = 0x6379636C6F6E65  # "cyclone"

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS cyclone;
CREATE TABLE IF NOT EXISTS cyclone.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""

# Every function a migration creates is executable by PUBLIC, and 0005's per-schema
# default privilege cannot take that back (a per-schema REVOKE only undoes a per-schema
# GRANT). So after each migrate: no Cyclone function is for PUBLIC; cyclone_worker
# keeps the one it was granted by name (step_complete).
_PRIVATE = "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA cyclone FROM PUBLIC"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """Every migration shipped with the server, in version order."""
    found = []
    for entry in resources.files("service.migrations").iterdir():
        if entry.name.endswith(".sql"):
            version, _, rest = entry.name.partition("_")
            found.append(Migration(int(version), rest.removesuffix(".sql"), entry.read_text()))
    found.sort(key=lambda m: m.version)
    for before, after in itertools.pairwise(found):
        if before.version == after.version:
            # Two files with one number: the second would be skipped silently.
            raise RuntimeError(
                f"migrations {before.version:04d}_{before.name} and "
                f"{after.version:04d}_{after.name} share a version number"
            )
    return found


def migrate(database_url: str) -> list[int]:
    """Apply the migrations this database lacks; return the versions applied."""
    applied_now = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        for migration in available():
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                conn.execute(_BOOTSTRAP)
                done = conn.execute(
                    "SELECT 1 FROM cyclone.schema_migrations WHERE version = %s",
                    (migration.version,),
                ).fetchone()
                if done:
                    continue
                log.info("applying migration %04d_%s", migration.version, migration.name)
                conn.execute(migration.sql)
                conn.execute(
                    "INSERT INTO cyclone.schema_migrations (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
                applied_now.append(migration.version)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            conn.execute(_PRIVATE)
    return applied_now
