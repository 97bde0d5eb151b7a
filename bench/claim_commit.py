"""What waiting for its WAL flush costs one claim: one-step claims (cyclone.step_claim,
limit 1), one at a time on an otherwise idle database, timed from the call to the
commit, in three ways taken in turn so that the machine's drift falls on each alike:

  async     the claim commits with synchronous_commit = off (its commit is not
            flushed when the call returns: a crash of Postgres may undo it)
  durable   the claim commits with synchronous_commit = on, as every claim does
  barrier   the claim commits with synchronous_commit = off, then a second connection
            commits a tiny transaction that writes one WAL record
            (pg_logical_emit_message) with synchronous_commit = on: its flush covers
            the claim's commit record, which comes before it in the WAL. Such a
            transaction could be shared by every claim waiting at that moment; for a
            claim alone it is one more round trip

Prints the p50, p90 and p99 of each in ms, and the same for the barrier's transaction
alone. The database "cyclone_claim_commit" is created afresh and dropped at the end, on
the embedded Postgres of this checkout (.cyclone/) unless --url names another (a
superuser URL: pg_logical_emit_message is a superuser's by default).

    .venv/bin/python bench/claim_commit.py --claims 500
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT), str(ROOT / "core")]
DATABASE = "cyclone_claim_commit"
CLAIM = "SELECT count(*) FROM cyclone.step_claim('w', '{m}', '{}', 1, '1 min')"
FLUSH = "SELECT pg_logical_emit_message(true, 'cyclone', '')"
WAYS = ("async", "durable", "barrier", "barrier alone")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claims", type=int, default=500, help="claims timed in each way")
    parser.add_argument("--url", help="a superuser URL (default: the embedded Postgres)")
    args = parser.parse_args()

    from uuid6 import uuid7

    from bench import admin_url, fresh_database
    from cyclone import dag
    from service.migrate import migrate
    from service.db.runs import nodes_json

    admin = admin_url(args.url)
    url = fresh_database(admin, DATABASE)
    migrate(url)
    nodes = nodes_json(dag.validate_workflow("claims", [dag.NodeSpec("only", "m")]))
    runs = 3 * args.claims + 1  # a ready step for each claim, and one to warm up with
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT count(s.created) FROM unnest(%s::uuid[]) AS r(id)"
            " CROSS JOIN LATERAL cyclone.run_submit(r.id, 'claims', NULL, NULL, %s::jsonb) s",
            ([uuid7() for _ in range(runs)], nodes),
        )
        conn.execute("VACUUM ANALYZE cyclone.steps")
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    with (
        psycopg.connect(url, autocommit=True) as claims,
        psycopg.connect(url, autocommit=True) as flushes,
    ):
        claims.execute(CLAIM)  # the plan is made once, outside the timings
        flushes.execute(FLUSH)
        for _ in range(args.claims):
            for way in WAYS:
                claims.execute(f"SET synchronous_commit = {'on' if way == 'durable' else 'off'}")
                start = time.perf_counter()
                if way != "barrier alone":
                    [(claimed,)] = claims.execute(CLAIM).fetchall()
                    assert claimed == 1, "no step left to claim"
                if way.startswith("barrier"):
                    flushes.execute(FLUSH)
                times[way].append((time.perf_counter() - start) * 1000)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
    for way, taken in times.items():
        taken.sort()
        p90, p99 = (taken[int(q * len(taken))] for q in (0.9, 0.99))
        print(f"{way:14s} p50 {statistics.median(taken):.3f}  p90 {p90:.3f}  p99 {p99:.3f} ms")


if __name__ == "__main__":
    main()
