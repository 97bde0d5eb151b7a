"""cyclone.submit on a coordinator and two workers: the tests of one Postgres (imported
from tests/test_submit_sql.py, so that they cannot drift apart) run with the Citus
suite's fixtures, and what is Citus's own: a keyed run lives on its key's shard, and
runs without a key, whose ids are made in SQL, spread over both workers."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from service.db.runs import submit_key_id
from tests.submit_sql_cases import CASES, Case
from tests.test_submit_sql import (  # noqa: F401
    ORDER,
    refused_alike,
    sql_submit,
    test_a_committed_submit_is_claimed_by_a_waiting_worker_and_runs,
    test_a_rolled_back_submit_leaves_no_run_no_key_and_sends_no_notification,
    test_concurrent_submits_with_one_key_make_one_run,
    test_sql_and_grpc_store_the_same_steps,
    test_the_client_role_may_execute_submit_and_no_other_function,
    test_the_client_role_may_submit_and_do_nothing_else,
    test_the_same_key_twice_returns_the_same_run_not_created,
    with_orders,
)

#: The refusals, but those of workflows with thousands of nodes (the single Postgres's).
SMALL_CASES = [c for c in CASES if "many" not in c.name]


@pytest.mark.parametrize("case", SMALL_CASES, ids=[c.name for c in SMALL_CASES])
def test_submit_and_sql_submit_refuse_alike(cyclone_server: Any, app: str, case: Case) -> None:
    refused_alike(cyclone_server, app, case)


@pytest.fixture
def app(cyclone_server: Any) -> str:
    """The application's orders table, on the coordinator (a local table)."""
    return with_orders(cyclone_server.database_url)


@pytest.fixture
def postgres_url(citus_url: str) -> str:
    """The superuser URL that drops the test's login roles: the coordinator's."""
    return citus_url


def test_a_keyed_run_lives_on_its_keys_shard(cyclone_server: Any, app: str) -> None:
    with psycopg.connect(app) as conn:
        run_id, created = sql_submit(conn, ORDER, key="order-1")
    assert created and run_id == submit_key_id("order", "order-1")
    [(key_shard,)] = cyclone_server.sql(
        "SELECT get_shard_id_for_distribution_column('cyclone.submit_keys', key_id)"
        "  FROM cyclone.submit_keys"
    )
    [(run_shard,)] = cyclone_server.sql(
        "SELECT get_shard_id_for_distribution_column('cyclone.runs', run_id) FROM cyclone.runs"
    )
    # Co-located shards of two tables cover the same hash range.
    [(same,)] = cyclone_server.sql(
        "SELECT (SELECT shardminvalue FROM pg_dist_shard WHERE shardid = %s)"
        "     = (SELECT shardminvalue FROM pg_dist_shard WHERE shardid = %s)",
        key_shard,
        run_shard,
    )
    assert same is True


def test_runs_without_a_key_spread_over_both_workers(cyclone_server: Any, app: str) -> None:
    with psycopg.connect(app) as conn:
        run_ids = [sql_submit(conn, ORDER)[0] for _ in range(40)]
    assert all(uuid.UUID(str(r)).version == 7 for r in run_ids)
    nodes = cyclone_server.sql(
        "SELECT DISTINCT s.nodeport FROM cyclone.runs r, LATERAL ("
        "  SELECT p.nodeport FROM pg_dist_shard_placement p"
        "   WHERE p.shardid = get_shard_id_for_distribution_column('cyclone.runs', r.run_id)) s"
    )
    assert len(nodes) == 2
