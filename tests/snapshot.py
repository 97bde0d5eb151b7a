"""The database's content as a comparable value: hostile and refused calls must leave
it byte for byte as it was."""

from __future__ import annotations

from typing import Any

#: Written by the server's own background report of what it saw of workers (for
#: Explain and ListWorkers), on its own schedule; not state that a call may or may not
#: change.
NOT_STATE = ("action_claims", "workers_seen")

_TABLES = (
    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'cyclone' "
    "AND table_type = 'BASE TABLE' AND NOT table_name = ANY(%s) ORDER BY 1"
)


def database_snapshot(server: Any) -> dict[str, tuple[int, str]]:
    """{table: (row count, md5 of every row's text, in order)} for every Cyclone table,
    read in one statement."""
    tables = [t for (t,) in server.sql(_TABLES, list(NOT_STATE))]
    assert {"runs", "steps", "step_errors", "audit"} <= set(tables)
    query = " UNION ALL ".join(
        f"SELECT '{t}', count(*), "
        f"md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM cyclone.{t} t"
        for t in tables
    )
    return {table: (count, digest) for table, count, digest in server.sql(query)}
