"""Versioned schema migrations, applied at start and by `cyclone-server --migrate-only`.

The engine's current definition is ``service/schema/*.sql`` (one file per concern,
applied in name order); migrations are the files ``service/migrations/NNNN_name.sql``,
the way a live database gets there, applied in order, each in its own transaction.
An empty database is created from the schema files in one transaction, with every
shipped migration recorded as applied (tests/test_schema.py proves that both paths
give the same database). A transaction-level advisory lock serialises servers that
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


def schema_files() -> list[tuple[str, str]]:
    """The engine's current definition: (file name, SQL) of service/schema/, in order."""
    found = [
        (entry.name, entry.read_text())
        for entry in resources.files("service.schema").iterdir()
        if entry.name.endswith(".sql")
    ]
    return sorted(found)


def _create_from_schema(conn: psycopg.Connection) -> list[int]:
    """In the caller's transaction (locked, bootstrapped, no version recorded): create the
    engine from the schema files and record every shipped migration as applied."""
    for name, sql in schema_files():
        log.debug("applying schema file %s", name)
        conn.execute(sql)
    versions = []
    for migration in available():
        conn.execute(
            "INSERT INTO cyclone.schema_migrations (version, name) VALUES (%s, %s)",
            (migration.version, migration.name),
        )
        versions.append(migration.version)
    return versions


def _is_empty(conn: psycopg.Connection) -> bool:
    """No migration recorded yet (the caller has run _BOOTSTRAP)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM cyclone.schema_migrations)").fetchone()
    return row is not None and not row[0]


def apply_schema(database_url: str) -> list[int]:
    """Create the engine in an empty database from service/schema/, in one transaction,
    recording every shipped migration as applied; return those versions. Refuses a
    database where a migration is already recorded (use migrate())."""
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(_BOOTSTRAP)
        if not _is_empty(conn):
            raise RuntimeError("the database already has migrations applied: use migrate()")
        versions = _create_from_schema(conn)
        conn.execute(_PRIVATE)
    return versions


def migrate(database_url: str, *, from_schema: bool = True) -> list[int]:
    """Apply the migrations this database lacks; return the versions applied.

    An empty database is created from service/schema/ instead (all versions at once),
    unless from_schema is false: then every migration runs, as on a live database.
    """
    applied_now: list[int] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        if from_schema:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                conn.execute(_BOOTSTRAP)
                if _is_empty(conn):
                    log.info("creating the engine from service/schema")
                    applied_now = _create_from_schema(conn)
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
