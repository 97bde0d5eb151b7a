"""cyclone.submit: a run created in the application's own transaction commits or rolls
back with its writes; waiting claims are woken at commit; a key makes one run; the
cyclone_client role may call it and nothing else; every invalid workflow Submit refuses
is refused too, with SQLSTATE CY006, the same message, and nothing written."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import psycopg
import pytest
from psycopg.types.json import Jsonb

from cyclone.v1 import admin_service_pb2, types_pb2, workflow_service_pb2
from tests.helpers import claim, complete, get_run, seconds, table_counts, value
from tests.roles import login
from tests.submit_sql_cases import CASES, Case, as_proto

ORDER = {
    "name": "order",
    "nodes": [
        {"name": "charge", "action": "sql_charge", "timeout": 30},
        {"name": "receipt", "action": "sql_receipt", "depends_on": ["charge"]},
    ],
}

SUBMIT = """SELECT run_id, created FROM cyclone.submit(
    workflow => %(workflow)s, input => %(input)s, key => %(key)s, start_at => %(start_at)s,
    priority => %(priority)s, tags => %(tags)s, deadline => %(deadline)s)"""


def sql_submit(conn: psycopg.Connection, wf: Any, run_input: Any = None, **args: Any) -> tuple:
    """cyclone.submit in ``conn``'s transaction: (run_id, created)."""
    params = {
        "workflow": Jsonb(wf),
        "input": None if run_input is None else Jsonb(run_input),
        "key": args.get("key"),
        "start_at": args.get("start_at"),
        "priority": args.get("priority", 0),
        "tags": None if args.get("tags") is None else Jsonb(args["tags"]),
        "deadline": args.get("deadline"),
    }
    row = conn.execute(SUBMIT, params).fetchone()
    assert row is not None
    return row


def with_orders(database_url: str) -> str:
    """The application's database: its own orders table beside Cyclone's."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id text PRIMARY KEY, run_id uuid)")
    return database_url


@pytest.fixture
def app(cyclone_server: Any) -> str:
    return with_orders(cyclone_server.database_url)


def orders(url: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT id, run_id FROM orders ORDER BY id").fetchall()


# Commit and rollback -----------------------------------------------------------------


def test_a_committed_submit_is_claimed_by_a_waiting_worker_and_runs(cyclone_server, app):
    """The claim waits before the transaction commits; the server re-checks claims only
    hourly in tests, so only the notification sent at commit can wake it."""
    server = cyclone_server
    claimed: list[Any] = []
    waiting = threading.Thread(
        target=lambda: claimed.extend(claim(server, "sql_charge", wait=60)), daemon=True
    )
    waiting.start()
    with psycopg.connect(app) as conn:
        run_id, created = sql_submit(conn, ORDER, {"order_id": "o-1"})
        conn.execute("INSERT INTO orders VALUES ('o-1', %s)", (run_id,))
        # Not visible before the commit: neither the run nor the order.
        assert server.sql("SELECT count(*) FROM cyclone.runs") == [(0,)]
    waiting.join(90)
    assert created is True
    assert orders(app) == [("o-1", run_id)]
    [step] = claimed
    assert (step.run_id, step.node) == (str(run_id), "charge")
    complete(server, step, {"charged": True})
    [receipt] = claim(server, "sql_receipt")
    complete(server, receipt)
    assert types_pb2.RunStatus.Name(get_run(server, str(run_id)).status) == "RUN_STATUS_COMPLETED"
    assert server.sql("SELECT status, input FROM cyclone.runs") == [
        ("completed", {"order_id": "o-1"})
    ]


def _notifications_until_marker(listener: psycopg.Connection, url: str) -> list[str]:
    """The payloads on cyclone_ready up to a marker sent after everything before it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify('cyclone_ready', 'marker')")
    payloads = []
    for note in listener.notifies():
        if note.payload == "marker":
            break
        payloads.append(note.payload)
    return payloads


def test_a_rolled_back_submit_leaves_no_run_no_key_and_sends_no_notification(cyclone_server, app):
    with psycopg.connect(app, autocommit=True) as listener:
        listener.execute("LISTEN cyclone_ready")
        with psycopg.connect(app) as conn:
            sql_submit(conn, ORDER, {"order_id": "o-2"}, key="o-2")
            conn.execute("INSERT INTO orders VALUES ('o-2', NULL)")
            conn.rollback()
        assert _notifications_until_marker(listener, app) == []
        assert orders(app) == []
        assert set(table_counts(cyclone_server).values()) == {0}
        # The same submit, committed: the notification comes, once.
        with psycopg.connect(app) as conn:
            sql_submit(conn, ORDER, {"order_id": "o-2"}, key="o-2")
        assert _notifications_until_marker(listener, app) == ["sql_charge"]
    assert cyclone_server.sql("SELECT submit_key FROM cyclone.submit_keys") == [("o-2",)]


def test_a_run_that_starts_later_and_its_arguments_are_stored(cyclone_server, app):
    with psycopg.connect(app) as conn:
        run_id, _ = sql_submit(
            conn, ORDER, {"a": 1}, priority=7, tags={"team": "billing", "region": "eu/west"}
        )
    [row] = cyclone_server.sql(
        "SELECT workflow, priority, tags, input, steps_total FROM cyclone.runs WHERE run_id = %s",
        run_id,
    )
    assert row == ("order", 7, {"team": "billing", "region": "eu/west"}, {"a": 1}, 2)
    assert uuid.UUID(str(run_id)).version == 7
    steps = cyclone_server.sql(
        "SELECT node, status, max_attempts, timeout, dependents FROM cyclone.steps "
        "WHERE run_id = %s ORDER BY position",
        run_id,
    )
    assert [(s[0], s[1], s[2], s[3].total_seconds(), s[4]) for s in steps] == [
        ("charge", "available", 3, 30.0, ["receipt"]),
        ("receipt", "pending", 3, 300.0, []),
    ]


def test_a_deadline_is_stored_and_without_one_the_workflows_default_applies(cyclone_server, app):
    deadline = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=2)
    with psycopg.connect(app) as conn:
        given, _ = sql_submit(conn, ORDER, deadline=deadline)
    cyclone_server.admin.SetWorkflowDeadline(
        admin_service_pb2.SetWorkflowDeadlineRequest(workflow="order", deadline=seconds(600))
    )
    with psycopg.connect(app) as conn:
        before = conn.execute("SELECT now()").fetchone()[0]
        defaulted, _ = sql_submit(conn, ORDER)
        overridden, _ = sql_submit(conn, ORDER, deadline=deadline)
    deadlines = dict(
        cyclone_server.sql(
            "SELECT run_id, deadline FROM cyclone.runs WHERE run_id = ANY(%s)",
            [given, defaulted, overridden],
        )
    )
    assert deadlines[given] == deadline
    assert deadlines[overridden] == deadline
    # The workflow's default: ten minutes from the submit.
    assert 599 <= (deadlines[defaulted] - before).total_seconds() <= 3600
    assert get_run(cyclone_server, str(given)).deadline.ToDatetime(dt.UTC) == deadline


def test_sql_and_grpc_store_the_same_steps(cyclone_server, app):
    wf = {
        "name": "same",
        "nodes": [
            {"name": "a", "retry": {"max_attempts": 5, "initial_backoff": 2, "multiplier": 3}},
            {"name": "w", "event": "paid", "event_timeout": 60, "depends_on": ["a"]},
            {
                "name": "b",
                "depends_on": ["a", "w"],
                "trigger_rule": "all_done",
                "priority": 4,
                "concurrency": {"key": "c:{run.customer}/{node.shard}", "limit": 2},
                "input": {"shard": 3},
            },
        ],
    }
    request = workflow_service_pb2.SubmitRequest(workflow=as_proto(wf))
    request.input.CopyFrom(value({"customer": 42}))
    by_grpc = cyclone_server.workflows.Submit(request).run_id
    with psycopg.connect(app) as conn:
        by_sql, _ = sql_submit(conn, wf, {"customer": 42})
    columns = (
        "node, action, status, trigger_rule, depends_on, dependents, deps_open, max_attempts,"
        " initial_backoff, max_backoff, backoff_multiplier, timeout, input, priority,"
        " concurrency_key, concurrency_limit"
    )
    query = f"SELECT {columns} FROM cyclone.steps WHERE run_id = %s ORDER BY node"
    assert cyclone_server.sql(query, str(by_sql)) == cyclone_server.sql(query, by_grpc)
    assert ("b", "c:42/3") in cyclone_server.sql(
        "SELECT node, concurrency_key FROM cyclone.steps WHERE run_id = %s", str(by_sql)
    )


# Idempotency ---------------------------------------------------------------------------


def test_the_same_key_twice_returns_the_same_run_not_created(cyclone_server, app):
    with psycopg.connect(app) as conn:
        first = sql_submit(conn, ORDER, key="order-7")
    with psycopg.connect(app) as conn:
        second = sql_submit(conn, ORDER, key="order-7")
    assert first[1] is True and second == (first[0], False)
    # SubmitOnce with that key finds the same run.
    once = cyclone_server.workflows.SubmitOnce(
        workflow_service_pb2.SubmitOnceRequest(workflow=as_proto(ORDER), key="order-7")
    )
    assert (once.run_id, once.created) == (str(first[0]), False)
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.runs") == [(1,)]


def test_concurrent_submits_with_one_key_make_one_run(cyclone_server, app):
    callers = 8
    start = threading.Barrier(callers)

    def one() -> tuple:
        with psycopg.connect(app) as conn:
            start.wait()
            return sql_submit(conn, ORDER, key="order-8")

    with ThreadPoolExecutor(callers) as pool:
        results = list(pool.map(lambda _: one(), range(callers)))
    assert len({r[0] for r in results}) == 1
    assert sorted(r[1] for r in results) == [False] * (callers - 1) + [True]
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.runs") == [(1,)]
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.submit_keys") == [(1,)]


# The role ------------------------------------------------------------------------------


FORBIDDEN = [
    "SELECT count(*) FROM cyclone.runs",
    "SELECT count(*) FROM cyclone.submit_keys",
    "INSERT INTO cyclone.runs (run_id, workflow, status)"
    " VALUES (gen_random_uuid(), 'w', 'running')",
    "DELETE FROM cyclone.steps",
    "SELECT cyclone.submit_key_id('w', 'k')",
    "SELECT * FROM cyclone.run_submit(gen_random_uuid(), 'w', NULL, NULL, '[]')",
    "SELECT cyclone._submit_nodes('{}', NULL)",
    "SELECT * FROM cyclone.run_cancel(gen_random_uuid(), 'me', 'why')",
    "SELECT cyclone.step_complete(gen_random_uuid(), 'a', gen_random_uuid(), 'null')",
]


def test_the_client_role_may_submit_and_do_nothing_else(cyclone_server, app, postgres_url):
    with login(app, postgres_url, member_of="cyclone_client", writes=("orders",)) as info:
        with psycopg.connect(info) as conn:
            run_id, created = sql_submit(conn, ORDER, key="o-9")
            conn.execute("INSERT INTO orders VALUES ('o-9', %s)", (run_id,))
        assert created and orders(app) == [("o-9", run_id)]
        for statement in FORBIDDEN:
            with (
                psycopg.connect(info) as conn,
                pytest.raises(psycopg.errors.InsufficientPrivilege),
            ):
                conn.execute(statement)
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.runs") == [(1,)]


def test_the_client_role_may_execute_submit_and_no_other_function(cyclone_server):
    rows = cyclone_server.sql(
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'cyclone'"
        " AND has_function_privilege('cyclone_client', p.oid, 'EXECUTE') ORDER BY 1"
    )
    assert rows == [
        (
            "cyclone.submit(jsonb,jsonb,text,timestamp with time zone,integer,jsonb,"
            "timestamp with time zone)",
        )
    ]


# Refusals ------------------------------------------------------------------------------


def _grpc_refusal(server: Any, case: Case) -> grpc.RpcError:
    wf = as_proto(case.workflow)
    key = case.args.get("key")
    request: Any
    if key is not None:
        request = workflow_service_pb2.SubmitOnceRequest(workflow=wf, key=key)
    else:
        request = workflow_service_pb2.SubmitRequest(workflow=wf)
    request.priority = case.args.get("priority", 0)
    if "start_at" in case.args:
        request.start_at.FromDatetime(case.args["start_at"])
    if "deadline" in case.args:
        request.deadline.FromDatetime(case.args["deadline"])
    if case.run_input is not None:
        request.input.CopyFrom(value(case.run_input))
    call = server.workflows.SubmitOnce if key is not None else server.workflows.Submit
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    return info.value


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_submit_and_sql_submit_refuse_alike(cyclone_server, app, case: Case):
    refused_alike(cyclone_server, app, case)


def refused_alike(cyclone_server: Any, app: str, case: Case) -> None:
    """Submit and cyclone.submit refuse ``case`` with its message, and write nothing."""
    refused = _grpc_refusal(cyclone_server, case)
    assert refused.code().name == case.code
    assert case.message in (refused.details() or "")
    with psycopg.connect(app) as conn, pytest.raises(psycopg.Error) as info:
        sql_submit(conn, case.workflow, case.run_input, **case.args)
    assert info.value.sqlstate == "CY006"
    assert case.message in (info.value.diag.message_primary or "")
    assert set(table_counts(cyclone_server).values()) == {0}


SQL_ONLY = [
    ("not a mapping", ["a"], {}, "a workflow must be a mapping with 'name' and 'nodes'"),
    (
        "unknown field",
        {"name": "w", "nodes": [], "owner": "me"},
        {},
        "workflow: unknown field 'owner'; expected one of ['name', 'nodes']",
    ),
    ("no name", {"nodes": []}, {}, "the workflow needs a 'name' string"),
    ("nodes not a list", {"name": "w", "nodes": {}}, {}, "workflow 'w' needs a 'nodes' list"),
    (
        "node not a mapping",
        {"name": "w", "nodes": ["a"]},
        {},
        "node #1 must be a mapping with a 'name' string",
    ),
    (
        "unknown node field",
        {"name": "w", "nodes": [{"name": "a", "retries": 3}]},
        {},
        "node 'a': unknown field 'retries'",
    ),
    (
        "unknown retry field",
        {"name": "w", "nodes": [{"name": "a", "retry": {"max": 3}}]},
        {},
        "node 'a': retry: unknown field 'max'",
    ),
    (
        "depends_on not a list",
        {"name": "w", "nodes": [{"name": "a", "depends_on": "b"}]},
        {},
        "node 'a': 'depends_on' must be a list of node names",
    ),
    (
        "timeout not a number",
        {"name": "w", "nodes": [{"name": "a", "timeout": "30s"}]},
        {},
        "node 'a': 'timeout' must be a number of seconds",
    ),
    (
        "max_attempts not whole",
        {"name": "w", "nodes": [{"name": "a", "retry": {"max_attempts": 2.5}}]},
        {},
        "node 'a': retry 'max_attempts' must be a whole number",
    ),
    (
        "tags not an object",
        ORDER,
        {"tags": ["a"]},
        "tags must be a JSON object of key = value strings",
    ),
    (
        "17 tags",
        ORDER,
        {"tags": {f"t{i}": "v" for i in range(17)}},
        "tags: 17 tags; the limit is 16",
    ),
    (
        "bad tag key",
        ORDER,
        {"tags": {"a b": "v"}},
        "tag key 'a b' is invalid: use 1 to 64 letters, digits and . _ - / :",
    ),
    ("long tag key", ORDER, {"tags": {"k" * 65: "v"}}, "tag key "),
    ("empty tag key", ORDER, {"tags": {"": "v"}}, "tag key '' is invalid"),
    (
        "long tag value",
        ORDER,
        {"tags": {"k": "v" * 257}},
        "tag 'k': the value is 257 characters; the limit is 256",
    ),
    ("tag value not a string", ORDER, {"tags": {"k": 1}}, "tag 'k': the value must be a string"),
]


@pytest.mark.parametrize(
    "workflow, args, message", [c[1:] for c in SQL_ONLY], ids=[c[0] for c in SQL_ONLY]
)
def test_sql_submit_refuses_what_is_not_a_workflow_or_valid_tags(
    cyclone_server, app, workflow, args, message
):
    with psycopg.connect(app) as conn, pytest.raises(psycopg.Error) as info:
        sql_submit(conn, workflow, **args)
    assert info.value.sqlstate == "CY006"
    assert message in (info.value.diag.message_primary or "")
    assert set(table_counts(cyclone_server).values()) == {0}


def test_sixteen_tags_at_their_longest_are_taken(cyclone_server, app):
    tags = {f"{i:02d}" + "k" * 62: "v" * 256 for i in range(16)}
    with psycopg.connect(app) as conn:
        run_id, _ = sql_submit(conn, ORDER, tags=tags)
    assert cyclone_server.sql("SELECT tags FROM cyclone.runs WHERE run_id = %s", run_id) == [
        (tags,)
    ]


def test_nul_characters_are_refused_before_anything_is_written(cyclone_server, app):
    # Postgres refuses \u0000 in jsonb text (22P05) before cyclone.submit runs.
    with (
        psycopg.connect(app) as conn,
        pytest.raises(psycopg.errors.UntranslatableCharacter),
    ):
        conn.execute(
            "SELECT * FROM cyclone.submit(%s::jsonb)",
            ('{"name": "w", "nodes": [{"name": "a", "input": "a\\u0000b"}]}',),
        )
    # A text with NUL cannot be sent as a key at all.
    with psycopg.connect(app) as conn, pytest.raises(psycopg.DataError):
        sql_submit(conn, ORDER, key="a\x00b")
    assert set(table_counts(cyclone_server).values()) == {0}
