"""What is Citus's own: how the schema is distributed, that a transition is a
single-shard transaction, claims that reach every shard, and the completion
transaction of a worker whose business table is co-located with the runs."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import grpc
import psycopg
import pytest

from service.db.runs import submit_key_id
from tests.helpers import (
    claim,
    complete,
    get_run,
    node,
    rpc_error,
    run_status,
    submit,
    value,
    workflow,
)

RUN_TABLES = {
    "runs": "run_id",
    "steps": "run_id",
    "step_errors": "run_id",
    "step_calls": "run_id",
    "audit": "run_id",
    "run_tags": "run_id",
    "events": "run_id",
    "step_logs": "run_id",
    "releases": "run_id",
    "child_wakes": "run_id",
    "submit_keys": "key_id",
    "stream_chunks": "run_id",
    "stream_usage": "run_id",
    "approvals": "run_id",
    "run_queries": "run_id",
    "query_state": "run_id",
    "run_updates": "run_id",
}
REFERENCE_TABLES = {
    "action_claims",
    "action_rates",
    "build_workers",
    "builds",
    "bulk_actions",
    "clock",
    "pause_log",
    "pauses",
    "schedules",
    "schema_migrations",
    "webhook_deliveries",
    "webhooks",
    "worker_health",
    "workers_seen",
    "workflow_deadlines",
}


def _node_of(server: Any, run_id: str) -> str:
    """host:port of the worker holding the run's shard."""
    [(where,)] = server.sql(
        "SELECT n.nodename || ':' || n.nodeport FROM pg_dist_placement p"
        " JOIN pg_dist_node n ON n.groupid = p.groupid"
        " WHERE p.shardid = get_shard_id_for_distribution_column('cyclone.runs', %s::uuid)",
        run_id,
    )
    return str(where)


def test_every_run_level_table_is_distributed_by_its_run_and_co_located(cyclone_server):
    rows = cyclone_server.sql(
        "SELECT table_name::text, citus_table_type, distribution_column, colocation_id"
        " FROM citus_tables WHERE table_name::text LIKE 'cyclone.%%'"
    )
    tables = {
        name.removeprefix("cyclone."): (kind, column, group) for name, kind, column, group in rows
    }
    distributed = {n: c for n, (k, c, _) in tables.items() if k == "distributed"}
    assert distributed == RUN_TABLES
    assert len({tables[n][2] for n in RUN_TABLES}) == 1, "one co-location group"
    assert {n for n, (k, _, _) in tables.items() if k == "reference"} == REFERENCE_TABLES
    # Every table with a run_id is distributed: a table added later cannot be forgotten.
    with_run_id = cyclone_server.sql(
        "SELECT table_name FROM information_schema.columns"
        " WHERE table_schema = 'cyclone' AND column_name = 'run_id'"
    )
    assert {t for (t,) in with_run_id} <= set(RUN_TABLES)


def test_transitions_of_one_run_are_distributed_by_it_and_the_others_everywhere(
    cyclone_server,
):
    rows = cyclone_server.sql(
        "SELECT p.proname, o.distribution_argument_index, o.colocationid, o.objid"
        " FROM pg_proc p LEFT JOIN pg_dist_object o"
        "   ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid"
        " WHERE p.pronamespace = 'cyclone'::regnamespace"
    )
    by_name = {name: (index, group) for name, index, group, _ in rows}
    assert [name for name, _, _, known in rows if known is None] == [], "on every node"
    [(runs_group,)] = cyclone_server.sql(
        "SELECT colocation_id FROM citus_tables WHERE table_name = 'cyclone.runs'::regclass"
    )
    delegated = ("run_submit", "step_heartbeat", "step_claim_run", "step_call_begin")
    for name in (*delegated, "step_complete_shard", "child_wake", "child_wake_done"):
        assert by_name[name] == (0, runs_group), name
    # Called alone (a worker's own completion transaction, Retry, Cancel, the sweep),
    # these may reach other runs' shards: they run on the coordinator, which routes each
    # statement (docs/scaling.md).
    for name in ("_step_complete", "step_fail", "step_retry", "run_cancel", "sweep_steps"):
        assert by_name[name][0] is None, name


def _remote_commands(server: Any, statement: str, *params: Any) -> list[str]:
    """The commands the coordinator sent to workers while running statement, in one
    transaction (citus.log_remote_commands)."""
    seen: list[str] = []
    with psycopg.connect(server.database_url) as conn:
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET client_min_messages = log")
        conn.execute("SET cyclone.defer_notify = on")
        conn.execute(statement, params)
        conn.commit()
    return [m for m in seen if m.startswith("issuing")]


def test_a_completion_is_a_single_shard_transaction(cyclone_server):
    """Every statement the server's Complete runs goes to the run's worker and names
    only shards of the run's shard group; the commit is one phase, on that worker."""
    run_id = submit(cyclone_server, workflow("w", node("a"), node("b", deps=["a"])))
    [a] = claim(cyclone_server)
    commands = _remote_commands(
        cyclone_server,
        "SELECT * FROM cyclone._step_complete(%s::uuid, %s, %s::uuid, %s::jsonb)",
        a.run_id,
        a.node,
        a.lease_token,
        json.dumps({"ok": 1}),
    )
    assert commands, "the coordinator sent nothing"
    shard = cyclone_server.sql(
        "SELECT get_shard_id_for_distribution_column('cyclone.runs', %s::uuid)", run_id
    )[0][0]
    # The run's shard of each table: same index in each co-located table's shard list.
    group = {
        s
        for (s,) in cyclone_server.sql(
            "SELECT s.shardid FROM pg_dist_shard s"
            " JOIN pg_dist_shard r ON r.logicalrelid = 'cyclone.runs'::regclass"
            "  AND r.shardid = %s AND s.shardminvalue = r.shardminvalue",
            shard,
        )
    }
    named = {int(n) for c in commands for n in re.findall(r"_(\d{6,})\b", c)}
    assert named and named <= group, (named, group)
    assert not [c for c in commands if "PREPARE TRANSACTION" in c], "no two-phase commit"
    assert run_status(get_run(cyclone_server, run_id)) == "running"
    [b] = claim(cyclone_server)
    assert b.node == "b"


def test_a_delegated_transition_call_is_planned_for_one_node(cyclone_server):
    """SELECT cyclone.f(run_id, ...) is delegated whole to the node of the run: the plan
    of a heartbeat is one task, on that node."""
    run_id = submit(cyclone_server, workflow("w", node("a")))
    [a] = claim(cyclone_server)
    [(plan,)] = cyclone_server.sql(
        "EXPLAIN (FORMAT JSON) SELECT cyclone.step_heartbeat(%s::uuid, %s, %s::uuid,"
        " interval '30 s', NULL)",
        a.run_id,
        a.node,
        a.lease_token,
    )
    text = json.dumps(plan)
    assert '"Task Count": 1' in text, text
    assert _node_of(cyclone_server, run_id).split(":")[1] in text


def test_runs_spread_over_both_workers_and_one_claim_takes_from_every_shard(cyclone_server):
    runs = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(16)]
    workers = {_node_of(cyclone_server, r) for r in runs}
    assert len(workers) == 2, workers
    steps = claim(cyclone_server, n=16)
    assert sorted(s.run_id for s in steps) == sorted(runs)
    # Oldest first across shards: the first claims take the first submitted runs.
    for s in steps:
        complete(cyclone_server, s, 1)
    more = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(6)]
    assert {s.run_id for s in claim(cyclone_server, n=3)} == set(more[:3])


def test_submit_once_keys_live_on_their_runs_shard(cyclone_server):
    from cyclone.v1 import workflow_service_pb2

    reply = cyclone_server.workflows.SubmitOnce(
        workflow_service_pb2.SubmitOnceRequest(workflow=workflow("pay", node("a")), key="k1")
    )
    assert uuid.UUID(reply.run_id) == submit_key_id("pay", "k1")
    [(key_shard, run_shard)] = cyclone_server.sql(
        "SELECT get_shard_id_for_distribution_column('cyclone.submit_keys', key_id),"
        "       get_shard_id_for_distribution_column('cyclone.runs', run_id)"
        "  FROM cyclone.submit_keys"
    )
    shard_index = cyclone_server.sql(
        "SELECT (SELECT shardminvalue FROM pg_dist_shard WHERE shardid = %s)"
        "     = (SELECT shardminvalue FROM pg_dist_shard WHERE shardid = %s)",
        key_shard,
        run_shard,
    )
    assert shard_index == [(True,)]


LEDGER = "CREATE TABLE ledger (run_id uuid NOT NULL, node text NOT NULL, amount integer)"
COMPLETE = "SELECT * FROM cyclone.step_complete(%s::uuid, %s, %s::uuid, %s::jsonb)"


def test_the_completion_transaction_of_a_worker_commits_its_write_once(cyclone_server):
    """A business table distributed by run_id beside the runs: the worker's write and
    step_complete commit together on the run's shard; the attempt whose lease was taken
    over is refused and its write rolls back (fencing)."""
    cyclone_server.sql(LEDGER)
    cyclone_server.sql(
        "SELECT create_distributed_table('ledger', 'run_id', colocate_with => 'cyclone.runs')"
    )
    run_id = submit(cyclone_server, workflow("w", node("pay", max_attempts=3)))
    [first] = claim(cyclone_server, lease=5)
    cyclone_server.advance_clock(10)
    assert cyclone_server.sweep() == 1
    [second] = claim(cyclone_server)
    assert second.attempt == 2
    url = cyclone_server.database_url
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO ledger VALUES (%s, %s, 10)", (run_id, "pay"))
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(COMPLETE, (run_id, "pay", first.lease_token, "1"))
        assert refused.value.sqlstate == "CY001"
        conn.rollback()
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO ledger VALUES (%s, %s, 20)", (run_id, "pay"))
        [row] = conn.execute(COMPLETE, (run_id, "pay", second.lease_token, "2")).fetchall()
        conn.commit()
    assert row[:2] == ("completed", "completed")
    assert cyclone_server.sql("SELECT amount FROM ledger") == [(20,)]
    error = rpc_error(complete, cyclone_server, first, 1)
    assert error.code() == grpc.StatusCode.ABORTED


def test_a_schedule_another_server_is_firing_is_passed_by_then_fired_once_it_dies(
    server_factory, database_url
):
    """tests/test_schedules.py's holder test as a server on Citus holds a schedule: its
    pass took the servers' turn (schedules_turn) before it locked the schedule and
    submitted the run. Another server's pass is not held up: it fires nothing and
    returns; once the holder's connection dies, the next pass fires the schedule once."""
    from service.db.pool import load_queries
    from tests.test_schedules import held_by_a_dying_server

    held_by_a_dying_server(server_factory, database_url, load_queries()["schedules_turn"].text)


def _shard_of(server: Any, run_id: str) -> int:
    [(shard,)] = server.sql(
        "SELECT get_shard_id_for_distribution_column('cyclone.runs', %s::uuid)", run_id
    )
    return int(shard)


def test_a_claim_takes_a_shards_runs_in_one_delegated_single_shard_call(cyclone_server):
    """The claim's second step, step_claim_shard, for two runs of one shard: planned as
    one task on that shard's node, and run there whole, in one single-shard transaction:
    the coordinator sends the worker the one call and no two-phase commit."""
    by_shard: dict[int, list[str]] = {}
    while not any(len(r) >= 2 for r in by_shard.values()):
        run_id = submit(cyclone_server, workflow("w", node("a")))
        by_shard.setdefault(_shard_of(cyclone_server, run_id), []).append(run_id)
        assert sum(map(len, by_shard.values())) < 200
    first, second = next(r for r in by_shard.values() if len(r) >= 2)[:2]
    call = (
        "SELECT * FROM cyclone.step_claim_shard(%s::uuid, ARRAY[%s, %s]::uuid[],"
        " ARRAY['a', 'a'], 'w', '{}', interval '30 s')"
    )
    [(plan,)] = cyclone_server.sql("EXPLAIN (FORMAT JSON) " + call, first, first, second)
    text = json.dumps(plan)
    assert '"Task Count": 1' in text, text
    assert _node_of(cyclone_server, first).split(":")[1] in text
    seen: list[str] = []
    with psycopg.connect(cyclone_server.database_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET client_min_messages = log")
        rows = conn.execute(call, (first, first, second)).fetchall()
    assert sorted(str(r[0]) for r in rows) == sorted([first, second])
    issued = [m for m in seen if m.startswith("issuing")]
    assert [m for m in issued if "step_claim_shard" in m], issued
    assert not [m for m in issued if "PREPARE TRANSACTION" in m], issued
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.steps WHERE status = 'running'") == [
        (2,)
    ]
    # In a transaction block the call is not delegated: it runs on the coordinator, on
    # the distributed tables, with the same result.
    third = submit(cyclone_server, workflow("w", node("a")))
    with psycopg.connect(cyclone_server.database_url) as conn:
        rows = conn.execute(call, (third, third, third)).fetchall()
    assert [str(r[0]) for r in rows] == [third]


def test_a_keys_limit_holds_for_runs_on_both_workers(cyclone_server):
    """Six runs of one key (limit 2) spread over both workers: a claim across shards takes
    two, the next none, and a completion frees one slot, wherever the runs live."""
    from tests.test_flow import _keyed

    runs = [submit(cyclone_server, workflow("w", _keyed("n", "k", 2))) for _ in range(6)]
    while len({_node_of(cyclone_server, r) for r in runs}) < 2:
        runs.append(submit(cyclone_server, workflow("w", _keyed("n", "k", 2))))
        assert len(runs) < 50
    taken = claim(cyclone_server, n=10)
    assert len(taken) == 2
    assert claim(cyclone_server, n=10) == []
    complete(cyclone_server, taken[0], 1)
    assert len(claim(cyclone_server, n=10)) == 1
    assert cyclone_server.sql(
        "SELECT count(*) FROM cyclone.steps WHERE status = 'running' AND concurrency_key = 'k'"
    ) == [(2,)]


def _runs_on_two_shards(server: Any, per_shard: int) -> list[list[str]]:
    """One-node runs submitted until two shards hold ``per_shard`` each: those runs."""
    by_shard: dict[int, list[str]] = {}
    while sum(len(r) >= per_shard for r in by_shard.values()) < 2:
        run_id = submit(server, workflow("w", node("a")))
        by_shard.setdefault(_shard_of(server, run_id), []).append(run_id)
        assert sum(map(len, by_shard.values())) < 400
    return [r[:per_shard] for r in by_shard.values() if len(r) >= per_shard][:2]


def test_a_batch_of_outcomes_is_applied_one_delegated_call_per_shard(cyclone_server):
    """step_complete_shard, the outcomes of one shard's runs, is planned as one task on
    that shard's node and runs there whole, one phase; CompleteMany over runs of two
    shards answers each outcome in order, refusals standing alone."""
    first, second = _runs_on_two_shards(cyclone_server, 2)
    steps = {s.run_id: s for s in claim(cyclone_server, n=50)}
    items = [
        {"i": i, "run_id": r, "node": "a", "lease_token": steps[r].lease_token, "output": i}
        for i, r in enumerate(first)
    ]
    call = "SELECT * FROM cyclone.step_complete_shard(%s::uuid, %s::jsonb, NULL)"
    [(plan,)] = cyclone_server.sql("EXPLAIN (FORMAT JSON) " + call, first[0], json.dumps(items))
    text = json.dumps(plan)
    assert '"Task Count": 1' in text, text
    assert _node_of(cyclone_server, first[0]).split(":")[1] in text
    seen: list[str] = []
    with psycopg.connect(cyclone_server.database_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
        conn.execute("SET citus.log_remote_commands = on")
        conn.execute("SET client_min_messages = log")
        rows = conn.execute(call, (first[0], json.dumps(items))).fetchall()
    assert sorted((r[0], r[1], r[2]) for r in rows) == [
        (0, "completed", "completed"),
        (1, "completed", "completed"),
    ]
    issued = [m for m in seen if m.startswith("issuing")]
    assert [m for m in issued if "step_complete_shard" in m], issued
    assert not [m for m in issued if "PREPARE TRANSACTION" in m], issued

    # Through the server: the other shard's runs, one lease lost, in one CompleteMany.
    from cyclone.v1 import worker_service_pb2

    stale = worker_service_pb2.CompleteRequest(
        run_id=second[0], node="a", lease_token=str(uuid.uuid4()), output=value("x")
    )
    good = worker_service_pb2.CompleteRequest(
        run_id=second[1], node="a", lease_token=steps[second[1]].lease_token, output=value("y")
    )
    reply = cyclone_server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(completions=[stale, good])
    )
    assert [r.WhichOneof("result") for r in reply.results] == ["error", "response"], reply
    assert run_status(get_run(cyclone_server, second[1])) == "completed"
    assert run_status(get_run(cyclone_server, second[0])) == "running"


def test_a_parent_wake_a_crash_left_owed_is_delivered_by_the_sweep(cyclone_server):
    """A child finished on its worker node owes its parent's node a wake, kept on the
    child's shard (child_wakes) until delivered. Applied without the server (as if it
    died at the commit), the wake waits for the sweep, which delivers it once."""
    from tests.test_children import resumed, waiting_parent

    parent_id, child_id = waiting_parent(cyclone_server)
    [kid] = claim(cyclone_server, "kid_work")
    item = {"i": 0, "run_id": kid.run_id, "node": kid.node, "lease_token": kid.lease_token}
    # A statement that names none of the function's columns is not delegated.
    [(_, woken)] = cyclone_server.sql(
        "SELECT i, current_setting('cyclone.woken', true)"
        "  FROM cyclone.step_complete_shard(%s::uuid, %s::jsonb, NULL)",
        kid.run_id,
        json.dumps([{**item, "output": 1}]),
    )
    assert woken == f"{parent_id}:{child_id}"
    assert cyclone_server.sql("SELECT run_id::text FROM cyclone.child_wakes") == [(child_id,)]
    assert claim(cyclone_server) == [], "the parent waits until the wake is delivered"
    cyclone_server.call(cyclone_server.server.sweep)
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.child_wakes") == [(0,)]
    assert resumed(cyclone_server, parent_id).run_id == parent_id
    cyclone_server.call(cyclone_server.server.sweep)
    assert claim(cyclone_server) == [], "delivered once"
