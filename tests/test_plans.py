"""Plans that do not depend on luck: every hot-path function reaches the
rows of cyclone.steps, cyclone.runs and cyclone.step_calls through an index or a key,
however many finished rows those tables hold and whether or not they have been analyzed.

Each hot-path function is called, several times so that PL/pgSQL's generic plans are
exercised too, on a database whose steps table holds tens of thousands of finished
rows, once with fresh statistics and once with none. Two witnesses, on every version:

- the executor's own counters (``pg_stat_xact_user_tables.seq_scan`` read inside the
  call's transaction): no sequential scan of steps or runs was started;
- where the server has ``auto_explain`` (Debian's packages do; the embedded server does
  not), every statement's plan, nested ones included: no Seq Scan node on steps or runs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cyclone.v1 import worker_service_pb2
from tests.helpers import node, submit, workflow

HISTORY_RUNS = 15_000  # two steps each: 30,000 finished step rows
BACKLOG = 20_000  # steps backing off, of the action the test claims
HOT = (
    "step_claim",
    "step_complete",
    "step_complete_many",
    "step_fail",
    "step_heartbeat",
    "sweep_steps",
    "runs_purge",
    "_runs_close",
    "step_call_begin",
    "_step_call_end",
    "step_next_due",
    "step_report_many",
    "step_wait",
)
WATCHED = ("steps", "runs", "step_calls")
#: The sweep's index of held leases: a walk of it reads every running step, so only the
#: sweep may use it; a held step is found by its key.
LEASED = "steps_leased_idx"


def _fill_history(
    conn: psycopg.Connection, history: int = HISTORY_RUNS, backlog: int = BACKLOG
) -> None:
    """Finished runs made by SQL, not the API: old enough for retention to delete some;
    one in fifty failed with a discarded node and its error."""
    conn.execute(
        """
        INSERT INTO cyclone.runs (run_id, workflow, status, input, error, steps_total,
                                  steps_open, created_at, updated_at, finished_at)
        SELECT gen_random_uuid(), 'history',
               CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'completed' END, '{}',
               CASE WHEN g %% 50 = 0 THEN '{"kind": "StepDiscarded"}'::jsonb END,
               2, 0, t, t, t
          FROM generate_series(1, %(n)s) g,
               LATERAL (SELECT now() - interval '30 days' + g * interval '1 second') x(t)
        """,
        {"n": history},
    )
    # Tags on every run (a common one) and on one in a thousand (a rare one).
    conn.execute(
        """
        UPDATE cyclone.runs SET tags = jsonb_build_object('env', 'prod')
            || CASE WHEN extract(epoch FROM created_at)::bigint % 1000 = 0
                    THEN '{"batch": "b1"}'::jsonb ELSE '{}' END
         WHERE workflow = 'history'
        """
    )
    conn.execute(
        """
        INSERT INTO cyclone.run_tags (run_id, key, value, created_at)
        SELECT r.run_id, t.key, t.value, r.created_at
          FROM cyclone.runs r, jsonb_each_text(r.tags) t WHERE r.workflow = 'history'
        """
    )
    conn.execute(
        """
        INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule,
                                   depends_on, dependents, deps_open, deps_failed, attempt,
                                   max_attempts, attempt_budget, initial_backoff, max_backoff,
                                   backoff_multiplier, timeout, input, output, lease_token,
                                   finished_at)
        SELECT r.run_id, n.node, n.pos, 'one',
               CASE WHEN r.status = 'failed' AND n.node = 'b' THEN 'discarded'
                    ELSE 'completed' END,
               'all_success', n.deps, n.dependents, 0, 0, 1, 3, 3, '1s', '60s', 2, '5m',
               NULL,
               CASE WHEN r.status = 'failed' AND n.node = 'b' THEN NULL
                    ELSE '{"ok": true}'::jsonb END,
               gen_random_uuid(), r.finished_at
          FROM cyclone.runs r,
               (VALUES ('a', 0, '{}'::text[], '{b}'::text[]),
                       ('b', 1, '{a}'::text[], '{}'::text[])) n(node, pos, deps, dependents)
         WHERE r.workflow = 'history'
        """
    )
    # A backlog of steps of the action the test claims, as during a large submit (when
    # autovacuum analyzes), so that the claim's generic plan expects many rows; they
    # are backing off for a day, so the test's claims do not take them.
    conn.execute(
        """
        WITH r AS (
            INSERT INTO cyclone.runs (run_id, workflow, status, input, steps_total,
                                      steps_open, created_at, updated_at)
            SELECT gen_random_uuid(), 'backlog', 'running', '{}', 1, 1, now(), now()
              FROM generate_series(1, %(n)s)
            RETURNING run_id)
        INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule,
                                   depends_on, dependents, deps_open, max_attempts,
                                   attempt_budget, initial_backoff, max_backoff,
                                   backoff_multiplier, timeout, available_at)
        SELECT r.run_id, 'a', 0, 'one', 'available', 'all_success', '{}', '{}', 0, 3, 3,
               '1s', '60s', 2, '5m', now() + interval '1 day'
          FROM r
        """,
        {"n": backlog},
    )
    conn.execute(
        """
        INSERT INTO cyclone.step_errors (run_id, node, attempt, kind, type, message, retryable, at)
        SELECT s.run_id, s.node, 1, 'handler', 'RuntimeError', 'old failure', false,
               s.finished_at
          FROM cyclone.steps s WHERE s.status = 'discarded'
        """
    )
    # The journals of durable functions that ran: three step calls per first node.
    conn.execute(
        """
        INSERT INTO cyclone.step_calls (run_id, node, step_id, seq, function, status, unsafe,
                                        output, attempt, started_at, finished_at)
        SELECT s.run_id, s.node, 'call' || i, i, 'f', 'succeeded', i = 2, '1', 1,
               s.finished_at, s.finished_at
          FROM cyclone.steps s, generate_series(1, 3) i
         WHERE s.node = 'a' AND s.status = 'completed'
        """
    )


def _node(name: str, action: str, deps: tuple[str, ...] = (), **extra: Any) -> dict:
    return {
        "name": name,
        "position": 0,
        "action": action,
        "depends_on": list(deps),
        "dependents": [],
        "trigger_rule": "all_success",
        "max_attempts": 3,
        "initial_backoff_s": 0.0,
        "max_backoff_s": 1.0,
        "backoff_multiplier": 2.0,
        "timeout_s": 300.0,
        "input": None,
        "priority": None,
        "concurrency_key": None,
        "concurrency_limit": None,
        **extra,
    }


def _submit(conn: psycopg.Connection, nodes: list[dict]) -> str:
    for i, n in enumerate(nodes):
        n["position"] = i
        n["dependents"] = [m["name"] for m in nodes if n["name"] in m["depends_on"]]
    run_id = str(uuid.uuid4())
    conn.execute(
        "SELECT cyclone.run_submit(%s, 'live', NULL, '{}', %s)", (run_id, json.dumps(nodes))
    )
    return run_id


class Session:
    """One connection that calls the hot-path functions and records, per function, the
    sequential scans its transactions started and (with auto_explain) the plans."""

    def __init__(self, url: str):
        self.conn = psycopg.connect(url, autocommit=True)
        self.plans: list[tuple[str, dict]] = []
        self.seq_scans: list[tuple[str, str, int]] = []
        self.leased_walks: list[str] = []
        self.called: set[str] = set()
        self._current = ""
        try:
            self.conn.execute("LOAD 'auto_explain'")
            self.explained = True
        except psycopg.errors.UndefinedFile:
            self.explained = False
        if self.explained:
            for setting in (
                "auto_explain.log_min_duration = 0",
                "auto_explain.log_nested_statements = on",
                "auto_explain.log_format = json",
                "client_min_messages = log",
            ):
                self.conn.execute(f"SET {setting}")
            self.conn.add_notice_handler(self._notice)

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" in text and self._current:
            self.plans.append((self._current, json.loads(text.split("plan:", 1)[1])))

    def call(self, function: str, sql: str, *params: Any) -> list[tuple]:
        """Run one statement in its own transaction, as the server does, and count the
        sequential scans it started on steps and runs before it commits."""
        with self.conn.transaction():
            before = self._scans()
            self._current = function
            rows = self.conn.execute(sql, params).fetchall()
            self._current = ""
            after = self._scans()
        self.called.add(function)
        self.seq_scans += [
            (function, t, after[t] - before[t]) for t in WATCHED if after[t] > before[t]
        ]
        if function != "sweep_steps" and after.get(LEASED, 0) > before.get(LEASED, 0):
            self.leased_walks.append(function)
        return rows

    def _scans(self) -> dict[str, int]:
        """Sequential scans this backend started on each watched table, and walks of the
        sweep's index of held leases, that it has not yet reported (the counters of the
        current transaction, and maybe of a few before)."""
        rows = self.conn.execute(
            "SELECT relname, seq_scan FROM pg_stat_xact_user_tables"
            " WHERE schemaname = 'cyclone' AND relname = ANY (%s)"
            " UNION ALL SELECT %s, pg_stat_get_xact_numscans(%s::regclass)",
            (list(WATCHED), LEASED, f"cyclone.{LEASED}"),
        ).fetchall()
        return {name: n for name, n in rows}

    def claim(self, action: str, unsafe: tuple[str, ...] = (), lease_s: float = 60) -> list:
        return self.call(
            "step_claim",
            "SELECT run_id, node, lease_token, upstream FROM cyclone.step_claim("
            "'plan-test', %s, %s, 10, make_interval(secs => %s))",
            [action],
            list(unsafe),
            lease_s,
        )

    def complete(self, step: tuple) -> None:
        self.call(
            "step_complete",
            "SELECT * FROM cyclone.step_complete(%s, %s, %s, '1')",
            step[0],
            step[1],
            step[2],
        )

    def complete_many(self, steps: list[tuple]) -> None:
        items = [
            {"i": i, "run_id": str(s[0]), "node": s[1], "lease_token": str(s[2]), "output": 1}
            for i, s in enumerate(steps)
        ]
        self.call(
            "step_complete_many",
            "SELECT * FROM cyclone.step_complete_many(%s)",
            json.dumps(items),
        )

    def fail(self, step: tuple, retryable: bool) -> None:
        self.call(
            "step_fail",
            "SELECT * FROM cyclone.step_fail(%s, %s, %s, 'RuntimeError', 'boom', '', %s,"
            " interval '0')",
            step[0],
            step[1],
            step[2],
            retryable,
        )

    def begin(self, step: tuple, step_id: str, unsafe: bool) -> str:
        [(decision,)] = self.call(
            "step_call_begin",
            "SELECT decision FROM cyclone.step_call_begin(%s, %s, %s, %s, 1, 'f', %s)",
            step[0],
            step[1],
            step[2],
            step_id,
            unsafe,
        )
        return str(decision)

    def end(self, step: tuple, step_id: str, failed: bool = False) -> None:
        self.call(
            "_step_call_end",
            "SELECT * FROM cyclone._step_call_end(%s, %s, %s, %s, 1, 'f', false, %s, %s)",
            step[0],
            step[1],
            step[2],
            step_id,
            None if failed else "1",
            '{"type": "E", "message": "m", "details": ""}' if failed else None,
        )

    def report(self, ends: list[dict], begins: list[dict], items: list[dict]) -> list[tuple]:
        """CompleteMany as the SDK sends it: step calls ended, begun, nodes completed."""
        rows = self.call(
            "step_report_many",
            "SELECT kind, i, decision, error_state FROM cyclone.step_report_many(%s, %s, %s, true)",
            json.dumps(ends),
            json.dumps(begins),
            json.dumps(items),
        )
        assert [r[3] for r in rows] == [None] * len(rows), rows
        return rows

    def sleep(self, step: tuple, seconds: float) -> str:
        [(decision,)] = self.call(
            "step_wait",
            "SELECT decision FROM cyclone.step_wait(%s, %s, %s, 'sleep', 1, 'cyclone.sleep',"
            " cyclone.now() + make_interval(secs => %s), NULL, NULL, NULL)",
            step[0],
            step[1],
            step[2],
            seconds,
        )
        return str(decision)

    def close(self) -> None:
        self.conn.close()


def _round(s: Session, live: psycopg.Connection, i: int) -> None:
    """Every hot path once: claims, a heartbeat, single and batched completions (of runs
    with and without dependents), a retryable failure and a final one that fails its
    run through a cleanup node, a lease reclaimed by the sweep, an uncertain step that
    blocks its run, and both retention policies."""
    for _ in range(4):
        _submit(live, [_node("a", "one")])
    _submit(live, [_node("a", "chain"), _node("b", "chain", ("a",))])
    _submit(
        live,
        [
            _node("x", "boom", max_attempts=2),
            _node("undo", "undo", ("x",), trigger_rule="one_failed"),
        ],
    )
    _submit(live, [_node("u", "unsafe")])
    _submit(live, [_node("slow", "slow", max_attempts=1)])

    ones = s.claim("one")
    assert len(ones) == 4
    s.call(
        "step_heartbeat",
        "SELECT * FROM cyclone.step_heartbeat(%s, %s, %s, interval '60s', '{\"p\": 1}')",
        ones[0][0],
        ones[0][1],
        ones[0][2],
    )
    s.complete(ones[0])
    s.complete_many(ones[1:])

    [a] = s.claim("chain")
    s.complete_many([a])  # a completion with a dependent: the graph walk
    [b] = s.claim("chain")
    s.complete(b)

    [x] = s.claim("boom")
    s.fail(x, retryable=True)
    [x] = s.claim("boom")
    s.fail(x, retryable=False)  # discarded: undo becomes ready
    [undo] = s.claim("undo")
    s.complete(undo)  # the run closes failed: _runs_close looks for its discarded step

    # A durable function: step calls, a failed attempt (its trailing failure trimmed),
    # and the claim of its retry with the journal.
    _submit(live, [_node("d", "durable")])
    [d] = s.claim("durable")
    assert s.begin(d, "charge", unsafe=True) == "run"
    s.end(d, "charge")
    assert s.begin(d, "lookup", unsafe=False) == "run"
    s.end(d, "lookup", failed=True)
    s.fail(d, retryable=True)
    [d] = s.claim("durable")
    assert s.begin(d, "charge", unsafe=True) == "recorded"
    s.complete(d)

    # The same through CompleteMany's batches: an unsafe call begun, ended with the
    # next one begun, then the last ends with the node's completion.
    _submit(live, [_node("e", "batched")])
    [e] = s.claim("batched")
    key = {"run_id": str(e[0]), "node": e[1], "lease_token": str(e[2])}

    def call(step_id: str, seq: int, unsafe: bool = True, **outcome: Any) -> dict:
        return {"i": seq, **key, "step_id": step_id, "seq": seq, "function": "f",
                "unsafe": unsafe, **outcome}  # fmt: skip

    [(_, _, decision, _)] = s.report([], [call("pay", 1)], [])
    assert decision == "run"
    s.report([call("pay", 1, output=1)], [call("ship", 2)], [])
    s.report([call("ship", 2, output=1), call("note", 3, False, output=1)], [], [{"i": 0, **key}])

    # A durable sleep: the node gives up its lease, and is claimed again once it wakes.
    _submit(live, [_node("z", "sleeper")])
    [z] = s.claim("sleeper")
    assert s.sleep(z, 5) == "suspended"

    # Flow control: a concurrency key (one of two admitted), a rate-limited action,
    # priorities, and the waiting claim's next look.
    for _ in range(2):
        _submit(live, [_node("k", "keyed", concurrency_key="plan-key", concurrency_limit=1)])
    _submit(live, [_node("r", "rated", priority=5)])
    [keyed] = s.claim("keyed")
    assert s.claim("keyed") == []
    s.complete(keyed)
    [rated] = s.call(
        "step_claim",
        "SELECT run_id, node, lease_token FROM cyclone.step_claim('plan-test', %s, '{}', 10,"
        " interval '60s', %s, %s, ARRAY[interval '1 hour'])",
        ["rated"],
        ["rated"],
        [1000],
    )
    s.complete(rated)
    [keyed] = s.claim("keyed")
    s.complete(keyed)
    s.call("step_next_due", "SELECT cyclone.step_next_due(%s)", ["one", "keyed", "rated"])

    s.claim("unsafe", unsafe=("unsafe",), lease_s=1)
    s.claim("slow", lease_s=1)
    live.execute("UPDATE cyclone.clock SET offset_by = offset_by + interval '10 s'")
    s.call("sweep_steps", "SELECT * FROM cyclone.sweep_steps(100)")
    # Its leases lapsed, so the worker was marked unhealthy; its next Claim clears the
    # mark (the server's worker_alive) before it claims.
    live.execute("DELETE FROM cyclone.worker_health WHERE worker_id = 'plan-test'")
    # The lease of the unsafe step expired with no outcome: its run blocks.
    [blocked] = s.claim("unsafe", unsafe=("unsafe",))
    assert blocked[2] is None
    [z] = s.claim("sleeper")
    assert s.sleep(z, 5) == "ready"
    s.complete(z)

    s.call("runs_purge", "SELECT cyclone.runs_purge(interval '20 days', false, 50)")
    s.call("runs_purge", "SELECT cyclone.runs_purge(interval '20 days', true, 5)")
    s.call(
        "_runs_close",
        "SELECT * FROM cyclone._runs_close(%s, %s, now())",
        [x[0], a[0]],
        [0, 0],
    )


def _seq_scans_in(plan: dict) -> Iterator[str]:
    if plan.get("Node Type") == "Seq Scan" and plan.get("Relation Name") in WATCHED:
        yield plan["Relation Name"]
    for child in plan.get("Plans", ()):
        yield from _seq_scans_in(child)


@pytest.mark.parametrize("statistics", ["none", "fresh", "small"])
def test_hot_paths_never_scan_steps_or_runs_whole(database_url, statistics):
    with psycopg.connect(database_url, autocommit=True) as live:
        if statistics == "none":
            # Autovacuum must not analyze the tables behind the test's back.
            for table in ("runs", "steps", "step_errors", "step_calls"):
                live.execute(f"ALTER TABLE cyclone.{table} SET (autovacuum_enabled = off)")
        if statistics == "small":
            _fill_history(live, 1500, 1000)
        else:
            _fill_history(live)
        if statistics in ("fresh", "small"):
            live.execute(
                "ANALYZE cyclone.runs, cyclone.steps, cyclone.step_errors, cyclone.step_calls"
            )
        else:
            analyzed = live.execute(
                "SELECT count(*) FROM pg_stat_user_tables WHERE schemaname = 'cyclone'"
                " AND relname IN ('runs', 'steps', 'step_calls')"
                " AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)"
            ).fetchone()
            assert analyzed == (0,)

        session = Session(database_url)
        try:
            # Past five calls PL/pgSQL may switch a statement to its generic plan.
            for i in range(7):
                _round(session, live, i)
        finally:
            session.close()

    assert session.called == set(HOT)
    planned = [
        (function, table, plan["Query Text"].strip()[:400])
        for function, plan in session.plans
        for table in _seq_scans_in(plan["Plan"])
    ]
    assert (session.seq_scans, planned) == ([], []), (
        f"with {statistics} statistics, sequential scans of steps or runs, as counted "
        f"(function, table, scans): {sorted(set(session.seq_scans))}; in the plans "
        f"(function, table, statement): {sorted(set(planned))}"
    )
    if session.explained:
        assert {f for f, _ in session.plans} >= set(HOT) - {"_runs_close"}
    walking = sorted(
        {
            (function, plan["Query Text"].strip()[:300])
            for function, plan in session.plans
            if LEASED in json.dumps(plan["Plan"])
        }
    )
    assert sorted(set(session.leased_walks)) == [], (
        f"with {statistics} statistics, these walked {LEASED} (every running step) to "
        f"find a held step instead of using its key; the statements (with auto_explain): "
        f"{walking}"
    )


def test_a_claim_naming_an_action_twice_hands_each_step_out_once(cyclone_server):
    """The claim joins the rows it updated back to the rows it picked: an action named
    twice must not pick, or return, a step twice."""
    for _ in range(3):
        submit(cyclone_server, workflow("w", node("a")))
    request = worker_service_pb2.ClaimRequest(
        worker_id="w",
        actions=[worker_service_pb2.ActionSpec(name="work")] * 2,
        max_steps=10,
    )
    steps = cyclone_server.workers.Claim(request).steps
    assert sorted(s.run_id for s in steps) == sorted({s.run_id for s in steps})
    assert len(steps) == 3
    assert cyclone_server.sql("SELECT sum(attempt) FROM cyclone.steps") == [(3,)]


#: The console's reads (service/db/runs.sql and claim.sql), each with the parameters of one
#: filter the console or an operator uses; unset parameters are NULL.
CONSOLE_READS: list[tuple[str, dict[str, Any]]] = [
    ("runs_list", {}),
    ("runs_list", {"workflow": "history"}),
    ("runs_list", {"statuses": ["failed"]}),
    ("runs_list", {"key": "k-1"}),
    ("runs_list", {"key_like": "k-1%"}),
    ("runs_list", {"workflows": ["history", "other"]}),
    (
        "runs_list",
        {
            "run_id_lo": "01900000-0000-0000-0000-000000000000",
            "run_id_hi": "0190ffff-ffff-ffff-ffff-ffffffffffff",
        },
    ),
    (
        "runs_list_newer",
        {"after_created": "-infinity", "after_run_id": "00000000-0000-0000-0000-000000000000"},
    ),
    ("runs_workflows", {"prefix": "hist"}),
    ("runs_count", {}),
    ("runs_count", {"workflow": "history"}),
    ("runs_count", {"created_after": "-infinity", "created_before": "infinity"}),
    ("runs_count", {"key": "k-1"}),
    ("runs_count", {"key_like": "k-%", "workflows": ["history"]}),
    ("runs_list_tagged", {"tags": '{"env": "prod"}', "tag_key": "env", "tag_value": "prod"}),
    (
        "runs_list_tagged",
        {
            "tags": '{"env": "prod", "batch": "b1"}',
            "tag_key": "batch",
            "tag_value": "b1",
            "statuses": ["failed"],
            "workflow": "history",
        },
    ),
    (
        "runs_list_tagged_newer",
        {
            "tags": '{"env": "prod", "batch": "b1"}',
            "tag_key": "batch",
            "tag_value": "b1",
            "after_created": "-infinity",
            "after_run_id": "00000000-0000-0000-0000-000000000000",
        },
    ),
    (
        "runs_count_tag_whole",
        {"tags": '{"env": "prod", "batch": "b1"}', "tag_key": "batch", "tag_value": "b1"},
    ),
    # (The count of the common tag is left out: at this size a sequential scan of the
    # few runs is a fair plan for it.)
    (
        "runs_count_tagged",
        {
            "tags": '{"env": "prod", "batch": "b1"}',
            "tag_key": "batch",
            "tag_value": "b1",
            "created_after": "-infinity",
        },
    ),
    ("steps_list", {"kind": "running"}),
    ("steps_list", {"kind": "running", "lease_expired": True, "worker_id": "w"}),
    ("steps_list", {"kind": "backing_off", "action": "one"}),
    ("steps_list", {"kind": "ready", "action": "one"}),
    ("workers_seen_list", {}),
    ("workers_running", {}),
    ("actions_activity", {}),
]


@pytest.mark.parametrize("statistics", ["none", "fresh"])
def test_the_console_reads_never_scan_steps_or_runs_whole(database_url, statistics):
    """CountRuns, ListRuns (with its key filter), ListSteps and ListWorkers, planned as
    the server plans them (with their values: service.db.pool.UNPREPARED), on tens of
    thousands of finished runs and a backlog of 20,000 ready steps: no sequential scan
    of runs or steps in any plan, with fresh statistics or none."""
    from sqlalchemy.dialects import postgresql

    from service.db.pool import UNPREPARED, Q

    everything = ["running", "completed", "failed", "blocked", "cancelled"]
    dialect = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
    with psycopg.connect(database_url, autocommit=True) as live:
        if statistics == "none":
            for table in ("runs", "steps", "run_tags"):
                live.execute(f"ALTER TABLE cyclone.{table} SET (autovacuum_enabled = off)")
        _fill_history(live)
        if statistics == "fresh":
            live.execute("ANALYZE cyclone.runs, cyclone.steps, cyclone.run_tags")
        scanned = []
        for name, given in CONSOLE_READS:
            prepared = (
                "workers_running",
                "actions_activity",
                "runs_workflows",
                "workers_seen_list",
            )
            assert name in UNPREPARED or name in prepared
            compiled = Q[name].compile(dialect=dialect)
            params = {**compiled.params, "limit": 1001, "lease_expired": False, **given}
            if name.startswith("runs_count") and params["statuses"] is None:
                params["statuses"] = everything
            sql = str(compiled)
            [(plan,)] = live.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchall()
            scanned += [(name, str(given), t) for t in _seq_scans_in(plan[0]["Plan"])]
    assert scanned == [], f"with {statistics} statistics: {scanned}"
