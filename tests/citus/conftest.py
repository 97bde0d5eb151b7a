"""The Citus suite: Cyclone on a coordinator and two workers (docs/scaling.md).

Collected only when CYCLONE_TEST_CITUS is set (tests/citus.sh, a part of `make test-all`,
sets it). The session's cluster is CYCLONE_CITUS_URL when given (a superuser URL of a
coordinator with workers added), else a local cluster that this session starts with
tests/citus/cluster.sh and stops at the end. One database for the session, migrated
(and so distributed) once; each test starts from empty tables.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from service.migrate import migrate

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "citus" / "cluster.sh"

if not os.environ.get("CYCLONE_TEST_CITUS"):
    collect_ignore_glob = ["test_*.py"]


def _free_port_block(count: int) -> int:
    import random
    import socket

    for _ in range(50):
        base = random.randrange(21000, 39000)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of ports for the Citus cluster")


def start_cluster(work: Path, workers: int) -> tuple[str, int]:
    """Start a coordinator and ``workers`` workers under ``work`` (cluster.sh) on free
    ports: the coordinator's URL (database cyclone) and port (worker i on port + i)."""
    port = _free_port_block(workers + 1)
    started = subprocess.run(
        ["bash", str(CLUSTER), "start", str(work), str(port), str(workers), "cyclone"],
        capture_output=True,
        text=True,
    )
    if started.returncode:
        pytest.fail(f"{CLUSTER.name} start failed:\n{started.stdout}{started.stderr}")
    return f"postgresql://postgres@127.0.0.1:{port}/cyclone", port


@pytest.fixture(scope="session")
def citus_url() -> Iterator[str]:
    """A superuser URL of a Citus coordinator with two workers, database cyclone."""
    given = os.environ.get("CYCLONE_CITUS_URL")
    if given:
        yield given
        return
    work = Path(tempfile.mkdtemp(prefix="cyclone-citus."))
    try:
        url, port = start_cluster(work, workers=2)
        # Tests kill processes, never this cluster: durability only costs time here.
        for p in range(port, port + 3):
            with psycopg.connect(url.replace(str(port), str(p)), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET fsync = off")
                conn.execute("ALTER SYSTEM SET synchronous_commit = off")
                conn.execute("SELECT pg_reload_conf()")
        yield url
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def citus_database(citus_url: str) -> str:
    """citus_url, migrated with --citus on: every run-level table distributed."""
    migrate(citus_url, citus="on")
    return citus_url


# Run-level tables are emptied before each test (deleting the runs deletes their rows of
# the other tables); the reference tables are put back.
_RESET = """
DELETE FROM cyclone.runs;
DELETE FROM cyclone.submit_keys;
DELETE FROM cyclone.action_claims;
DELETE FROM cyclone.action_rates;
DELETE FROM cyclone.schedules;
DELETE FROM cyclone.pauses;
DELETE FROM cyclone.pause_log;
DELETE FROM cyclone.bulk_actions;
DELETE FROM cyclone.workflow_deadlines;
UPDATE cyclone.clock SET offset_by = '0';
DO $$
DECLARE
    t record;
BEGIN
    -- Business tables a test made (a worker's completion transaction writes them).
    FOR t IN SELECT tablename FROM pg_tables WHERE schemaname = 'public' LOOP
        EXECUTE format('DROP TABLE public.%I CASCADE', t.tablename);
    END LOOP;
END;
$$;
"""


@pytest.fixture
def database_url(citus_database: str) -> str:
    with psycopg.connect(citus_database, autocommit=True) as conn:
        conn.execute(_RESET)
    return citus_database


# server_factory and cyclone_server are tests/conftest.py's: they start servers on
# database_url, which is the cluster's here.
