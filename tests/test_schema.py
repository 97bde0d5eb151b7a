"""service/schema/ (the engine's current definition) and service/migrations/ (the way a
live database gets there) give the same database.

One database is built by running every migration, another from the schema files
(service.migrate.apply_schema); their catalogs are compared object by object: every
function by its definition (comments and layout aside) with its settings, volatility,
SECURITY DEFINER and grants; every table's columns, constraints and indexes; types;
sequences; privileges on tables and the schema; the rows the engine ships (the clock).
"""

from __future__ import annotations

import difflib
import re
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from service.migrate import apply_schema, available, migrate

HOW_TO = (
    "Changing the engine means editing service/schema/ AND adding a migration in "
    "service/migrations/ that takes a live database to the same state (CONTRIBUTING.md)."
)


def _with_database(url: str, database: str) -> str:
    return re.sub(r"(postgres(?:ql)?://[^/]*/)([^?]*)", rf"\g<1>{database}", url, count=1)


@pytest.fixture
def scratch_database(postgres_url: str) -> Iterator:
    """Makes empty databases on the session's Postgres; drops them at the end."""
    made = []

    def make() -> str:
        name = f"cyclone_test_schema_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return _with_database(postgres_url, name)

    yield make
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for name in made:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _strip_comments(sql: str) -> str:
    """sql without its -- and /* */ comments; string literals and quoted names kept."""
    out = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"":
            end = i + 1
            while end < n:
                if sql[end] == c:
                    if end + 1 < n and sql[end + 1] == c:  # '' or "" inside
                        end += 2
                        continue
                    break
                end += 1
            out.append(sql[i : end + 1])
            i = end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def normalize(sql: str) -> str:
    """A definition with comments, blank lines and runs of spaces removed, line by line."""
    lines = (" ".join(line.split()) for line in _strip_comments(sql).splitlines())
    return "\n".join(line for line in lines if line)


def catalog(url: str) -> dict[str, str]:
    """Every object of the cyclone schema that matters, by a readable key, as text."""
    objects: dict[str, str] = {}
    with psycopg.connect(url) as conn:

        def rows(sql: str) -> list[tuple]:
            return conn.execute(sql).fetchall()

        for key, definition, config, secdef, volatile, acl in rows(
            """SELECT format('function cyclone.%s(%s)', p.proname,
                             pg_get_function_identity_arguments(p.oid)),
                      pg_get_functiondef(p.oid), p.proconfig, p.prosecdef, p.provolatile,
                      p.proacl::text[]
                 FROM pg_proc p WHERE p.pronamespace = 'cyclone'::regnamespace"""
        ):
            objects[key] = (
                f"{normalize(definition)}\n-- proconfig={config} prosecdef={secdef} "
                f"provolatile={volatile}\n-- grants={sorted(acl or [])}"
            )
        for table, position, column, type_, default, notnull, identity, collation in rows(
            """SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
                      pg_get_expr(d.adbin, d.adrelid), a.attnotnull, a.attidentity,
                      co.collname
                 FROM pg_attribute a
                 JOIN pg_class c ON c.oid = a.attrelid
                 LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                 LEFT JOIN pg_collation co ON co.oid = a.attcollation
                WHERE c.relnamespace = 'cyclone'::regnamespace
                  AND c.relkind IN ('r', 'c', 'v', 'm', 'p')
                  AND a.attnum > 0 AND NOT a.attisdropped"""
        ):
            objects[f"column cyclone.{table}.{column}"] = (
                f"position {position}, {type_}, default {default}, "
                f"{'NOT NULL' if notnull else 'NULL'}, identity {identity!r}, "
                f"collation {collation}"
            )
        for relation, name, definition in rows(
            """SELECT coalesce(c.relname, t.typname), k.conname, pg_get_constraintdef(k.oid)
                 FROM pg_constraint k
                 LEFT JOIN pg_class c ON c.oid = k.conrelid
                 LEFT JOIN pg_type t ON t.oid = k.contypid
                WHERE k.connamespace = 'cyclone'::regnamespace"""
        ):
            objects[f"constraint {name} on cyclone.{relation}"] = definition
        for name, definition in rows(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'cyclone'"
        ):
            objects[f"index cyclone.{name}"] = definition
        for name, kind, relation_kind in rows(
            """SELECT t.typname, t.typtype, c.relkind FROM pg_type t
                 LEFT JOIN pg_class c ON c.oid = t.typrelid
                WHERE t.typnamespace = 'cyclone'::regnamespace AND t.typelem = 0"""
        ):
            objects[f"type cyclone.{name}"] = f"typtype {kind}, relkind {relation_kind}"
        for name, kind, acl in rows(
            """SELECT relname, relkind, relacl::text[] FROM pg_class
                WHERE relnamespace = 'cyclone'::regnamespace AND relkind IN ('r', 'S', 'v', 'p')"""
        ):
            objects[f"privileges on cyclone.{name}"] = f"relkind {kind}, {sorted(acl or [])}"
        for name, options in rows(
            """SELECT relname, reloptions FROM pg_class
                WHERE relnamespace = 'cyclone'::regnamespace AND reloptions IS NOT NULL"""
        ):
            objects[f"storage parameters of cyclone.{name}"] = str(sorted(options))
        for name, params in rows(
            """SELECT c.relname, row(s.seqtypid::regtype, s.seqstart, s.seqincrement,
                                      s.seqmax, s.seqmin, s.seqcache, s.seqcycle)::text
                 FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
                WHERE c.relnamespace = 'cyclone'::regnamespace"""
        ):
            objects[f"sequence cyclone.{name}"] = params
        for name, definition in rows(
            """SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
                 JOIN pg_class c ON c.oid = t.tgrelid
                WHERE c.relnamespace = 'cyclone'::regnamespace AND NOT t.tgisinternal"""
        ):
            objects[f"trigger {name}"] = definition
        for (acl,) in rows("SELECT nspacl::text[] FROM pg_namespace WHERE nspname = 'cyclone'"):
            objects["schema cyclone"] = f"grants {sorted(acl or [])}"
        for kind, acl in rows(
            """SELECT defaclobjtype, defaclacl::text[] FROM pg_default_acl
                WHERE defaclnamespace = 'cyclone'::regnamespace"""
        ):
            objects[f"default privileges on {kind}"] = str(sorted(acl))
        for (can_login,) in rows(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'cyclone_worker'"
        ):
            objects["role cyclone_worker"] = f"login {can_login}"
        objects["rows of cyclone.clock"] = str(rows("SELECT * FROM cyclone.clock"))
        objects["rows of cyclone.schema_migrations"] = str(
            rows("SELECT version, name FROM cyclone.schema_migrations ORDER BY version")
        )
    return objects


def differences(migrated: dict[str, str], schema: dict[str, str]) -> list[str]:
    """What differs between the two catalogs, each said so that one knows what to do."""
    found = []
    for key in sorted(schema.keys() - migrated.keys()):
        found.append(f"schema/ defines {key}, the migrations do not: add a migration")
    for key in sorted(migrated.keys() - schema.keys()):
        found.append(f"the migrations define {key}, schema/ does not: add it to service/schema/")
    for key in sorted(migrated.keys() & schema.keys()):
        if migrated[key] != schema[key]:
            diff = difflib.unified_diff(
                migrated[key].splitlines(),
                schema[key].splitlines(),
                "from the migrations",
                "from service/schema/",
                lineterm="",
            )
            found.append(f"{key} differs:\n" + "\n".join(diff))
    return found


@pytest.fixture
def both(scratch_database) -> tuple[str, str]:
    """(a database built by every migration, one built from service/schema/)."""
    migrated, from_schema = scratch_database(), scratch_database()
    migrate(migrated, from_schema=False)
    apply_schema(from_schema)
    return migrated, from_schema


def test_the_schema_files_and_the_migrations_build_the_same_database(both):
    migrated, schema = (catalog(url) for url in both)
    found = differences(migrated, schema)
    if found:
        pytest.fail("\n\n".join([*found, HOW_TO]), pytrace=False)
    # The comparison looked at the engine, not at an empty schema.
    assert any(key.startswith("function cyclone.step_claim(") for key in schema)
    assert "column cyclone.steps.attempt_budget" in schema


def test_a_function_changed_only_in_the_schema_is_reported_with_a_diff(both):
    migrated, schema = both
    with psycopg.connect(schema, autocommit=True) as conn:
        conn.execute(
            """CREATE OR REPLACE FUNCTION cyclone._backoff(
                   p_initial interval, p_max interval, p_multiplier float8, p_attempt integer,
                   p_jitter float8)
               RETURNS interval LANGUAGE sql VOLATILE AS $$ SELECT p_initial $$"""
        )
        conn.execute("CREATE FUNCTION cyclone.step_new() RETURNS void LANGUAGE sql AS $$ $$")
    found = differences(catalog(migrated), catalog(schema))
    assert len(found) == 2, found
    assert found[0] == (
        "schema/ defines function cyclone.step_new(), the migrations do not: add a migration"
    )
    assert found[1].startswith("function cyclone._backoff(")
    assert "\n-SELECT d * (1 - p_jitter / 2)\n" in found[1]
    assert "\n+AS $function$ SELECT p_initial $function$" in found[1]


def test_a_migration_missing_from_the_schema_is_reported(both):
    migrated, schema = both
    with psycopg.connect(migrated, autocommit=True) as conn:
        conn.execute("ALTER TABLE cyclone.runs ADD COLUMN drift_probe integer NOT NULL DEFAULT 0")
        conn.execute("CREATE INDEX runs_drift_probe_idx ON cyclone.runs (drift_probe)")
    found = differences(catalog(migrated), catalog(schema))
    assert any(
        "the migrations define column cyclone.runs.drift_probe, schema/ does not" in f
        for f in found
    ), found
    assert any("index cyclone.runs_drift_probe_idx" in f for f in found), found


def test_comments_and_layout_do_not_count_but_literals_do():
    assert normalize("SELECT 1 -- one\n\n  FROM   t /* x */") == "SELECT 1\nFROM t"
    assert normalize("SELECT '--not a comment', 'it''s'") == "SELECT '--not a comment', 'it''s'"


def test_an_empty_database_is_created_from_the_schema_with_every_version_recorded(
    scratch_database,
):
    url = scratch_database()
    versions = [m.version for m in available()]
    assert migrate(url) == versions
    assert migrate(url) == []
    with pytest.raises(RuntimeError, match="already has migrations"):
        apply_schema(url)
