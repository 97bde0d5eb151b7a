"""A worker's or an application's own database login, as docs/exactly-once.md and
docs/submit-from-sql.md tell operators to make one."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg
from psycopg.conninfo import make_conninfo


@contextlib.contextmanager
def worker_login(database_url: str, postgres_url: str, *, writes: tuple[str, ...]) -> Iterator[str]:
    """A fresh login role, member of cyclone_worker, that may also SELECT and INSERT on
    the business tables ``writes``; yields its conninfo and drops it afterwards."""
    with login(database_url, postgres_url, member_of="cyclone_worker", writes=writes) as info:
        yield info


@contextlib.contextmanager
def login(
    database_url: str, postgres_url: str, *, member_of: str, writes: tuple[str, ...]
) -> Iterator[str]:
    """A fresh login role, member of ``member_of``, that may also SELECT and INSERT on
    the business tables ``writes``; yields its conninfo and drops it afterwards.

    Roles belong to the whole cluster, so the name is unique to the test.
    """
    role = f"cyclone_test_login_{uuid.uuid4().hex[:10]}"
    password = uuid.uuid4().hex
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}' IN ROLE {member_of}")
        for table in writes:
            conn.execute(f"GRANT SELECT, INSERT ON {table} TO {role}")
    try:
        yield make_conninfo(database_url, user=role, password=password)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")
