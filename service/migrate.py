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


def migrate(
    database_url: str, *, from_schema: bool = True, citus: str = "auto", citus_shards: int = 0
) -> list[int]:
    """Apply the migrations this database lacks; return the versions applied.

    An empty database is created from service/schema/ instead (all versions at once),
    unless from_schema is false: then every migration runs, as on a live database.
    Then, on a Citus coordinator, the tables and functions are distributed
    (distribute(); citus: "auto" when the citus extension is installed in the database,
    "on" requires it, "off" never), the runs in citus_shards shards when they are
    distributed first (0: Citus's citus.shard_count). On a worker node of a Citus
    cluster, which takes no DDL, nothing is applied: the coordinator's server does that,
    and this one only checks that the schema is current (schema_is_current).
    """
    applied_now: list[int] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        if citus != "off" and has_citus(conn) and is_worker_node(conn):
            schema_is_current(conn)
            return []
        if citus != "off" and has_citus(conn):
            roles_on_every_node(conn)
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
        if citus != "off":
            if has_citus(conn):
                distribute(conn, citus_shards)
            elif citus == "on":
                raise RuntimeError(
                    "--citus on: the citus extension is not installed in this database "
                    "(CREATE EXTENSION citus on the coordinator, then add the workers)"
                )
    return applied_now


#: The roles the schema grants to (service/schema/90_roles.sql), created where missing.
_ROLES = ("cyclone_worker", "cyclone_client")
# Run on a worker: with propagation off there, a worker would pass the CREATE ROLE on to
# the other nodes, the coordinator among them, whose own command is waiting for it.
_CREATE_ROLE = """DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
        PERFORM set_config('citus.enable_create_role_propagation', 'off', true);
        CREATE ROLE {role} NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL;
END;
$$"""


def roles_on_every_node(conn: psycopg.Connection) -> None:
    """On a Citus coordinator: Cyclone's roles exist on every worker node before the
    schema grants to them. A role belongs to a node's instance, not to a database, and
    Citus creates it on the workers only when it is created in a Citus database: one
    made first by a plain database on the coordinator's instance (a single-Postgres
    Cyclone beside the Citus one, as `make bench --citus` has) exists on the
    coordinator alone, and the grants distributed with the functions then fail on the
    workers. Run on every migrate, so that a node added since gets them too. A role
    the coordinator lacks is left to the schema, whose CREATE ROLE Citus propagates."""
    for role in _ROLES:
        here = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if here is None:
            continue
        command = _CREATE_ROLE.format(role=role)
        rows = conn.execute(
            "SELECT nodename, nodeport, success, result FROM run_command_on_workers(%s)",
            (command,),
        ).fetchall()
        failed = [f"{host}:{port}: {result}" for host, port, ok, result in rows if not ok]
        if failed:
            raise RuntimeError(
                f"cannot create role {role} on every Citus worker ({'; '.join(failed)}): "
                f"create it there as a superuser (CREATE ROLE {role} NOLOGIN)"
            )


def is_worker_node(conn: psycopg.Connection) -> bool:
    """Whether this Citus database is a worker node of its cluster, not its coordinator
    (the caller checked has_citus)."""
    row = conn.execute("SELECT groupid <> 0 FROM pg_catalog.pg_dist_local_group").fetchone()
    return bool(row and row[0])


def schema_is_current(conn: psycopg.Connection) -> None:
    """On a Citus worker node: every shipped migration is recorded (schema_migrations
    is a reference table, a copy on every node), or a RuntimeError that says to start
    on the coordinator first."""
    shipped = [m.version for m in available()]
    exists = conn.execute("SELECT to_regclass('cyclone.schema_migrations') IS NOT NULL").fetchone()
    recorded: set[int] = set()
    if exists and exists[0]:
        recorded = {v for (v,) in conn.execute("SELECT version FROM cyclone.schema_migrations")}
    missing = [v for v in shipped if v not in recorded]
    if missing:
        raise RuntimeError(
            "this database is a worker node of a Citus cluster, where only the coordinator "
            f"applies migrations, and {len(missing)} of this server's are not applied (the "
            f"first is {missing[0]:04d}): start a server on the coordinator first, or run "
            "cyclone-server --migrate-only there"
        )


def has_citus(conn: psycopg.Connection) -> bool:
    """Whether the citus extension is installed in this database (a Citus coordinator)."""
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")
    found = row.fetchone()
    return bool(found and found[0])


# Citus: every table with a run_id is distributed by it, co-located with cyclone.runs, so
# that a run and all its rows live on one shard; the key table by its key's id, which
# is the run_id of the run the key made (submit_key_id). The tables referenced by others
# come first (builds: build_workers refers to it; webhooks: webhook_deliveries). Every
# other table of the schema is small and becomes a reference table (a copy on every
# node). docs/scaling.md.
_DISTRIBUTED_FIRST = ("runs", "steps", "builds", "webhooks")
_DISTRIBUTION_COLUMN = {"submit_keys": "key_id"}

# Transitions that never touch another shard are distributed by their p_run_id: a call
# SELECT ... FROM cyclone.f(run_id, ...) outside a transaction block is delegated whole
# to the node holding the run's shard. A completion there may finish a child run: the
# wake of its parent's node (another shard) is delivered after the commit
# (step_complete_shard, child_wakes). Those that cancel a tree of runs are not
# delegated: Citus runs a delegated function on one node only. They, and every other
# function, are created on every node without an argument; the coordinator then routes
# each of their statements to the run's shard (a single-shard transaction, or a
# distributed one for a parent).
_DELEGATED = {
    "run_submit",
    "step_heartbeat",
    "step_claim_run",
    "step_claim_shard",
    "step_complete_shard",
    "step_candidates_on",
    "child_wake",
    "child_wake_done",
    "step_call_begin",
    "_step_call_end",
    "step_call_record",
    "event_send",
}
_TABLES = """
SELECT c.relname,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = c.oid AND a.attname = 'run_id' AND NOT a.attisdropped),
       EXISTS (SELECT 1 FROM pg_dist_partition p WHERE p.logicalrelid = c.oid)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'cyclone' AND c.relkind IN ('r', 'p')
"""
_FUNCTIONS = """
SELECT p.oid::regprocedure::text, p.proname,
       o.objid IS NOT NULL, o.distribution_argument_index IS NOT NULL
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  LEFT JOIN pg_dist_object o ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid
 WHERE n.nspname = 'cyclone'
"""


def distribute(conn: psycopg.Connection, shards: int = 0) -> None:
    """On a Citus coordinator: distribute what is not distributed yet (idempotent, under
    the migration lock): run-level tables by run_id, co-located, in ``shards`` shards
    (0: citus.shard_count; the tables distributed already keep theirs); the other tables
    as reference tables; functions by their run argument."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        # Functions are created on the workers over the connections the tables' shards
        # were: one connection per node for the whole transaction.
        conn.execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
        if shards:
            conn.execute("SELECT set_config('citus.shard_count', %s, true)", (str(shards),))
        tables = conn.execute(_TABLES).fetchall()
        first = {name: i for i, name in enumerate(_DISTRIBUTED_FIRST)}
        order = sorted(tables, key=lambda t: (first.get(t[0], len(first)), t[0]))
        for name, has_run_id, done in order:
            if done:
                continue
            column = _DISTRIBUTION_COLUMN.get(name, "run_id" if has_run_id else None)
            if column is None:
                log.info("citus: cyclone.%s becomes a reference table", name)
                conn.execute("SELECT create_reference_table(%s)", (f"cyclone.{name}",))
            else:
                log.info("citus: cyclone.%s distributed by %s", name, column)
                conn.execute(
                    "SELECT create_distributed_table(%s, %s, colocate_with => %s)",
                    (f"cyclone.{name}", column, "none" if name == "runs" else "cyclone.runs"),
                )
        # The variants of functions Citus cannot plan in their set-based form.
        conn.execute(resources.files("service.sql").joinpath("citus.sql").read_text())
        # Citus creates on every node a function it can (one that depends on no local
        # table) when it is created: those are distributed already, without argument.
        for signature, name, done, by_argument in conn.execute(_FUNCTIONS).fetchall():
            by_run = name in _DELEGATED
            if by_argument or (done and not by_run):
                continue
            if by_run:
                conn.execute(
                    "SELECT create_distributed_function(%s, 'p_run_id',"
                    " colocate_with => 'cyclone.runs')",
                    (signature,),
                )
            else:
                conn.execute("SELECT create_distributed_function(%s)", (signature,))
