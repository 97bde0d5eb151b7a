"""Wide fan-outs: a root, thousands of leaves depending on it, and joins depending on
every leaf (as in the bench's fan scenario). The leaves complete in batches, from
two workers at once; each join is released once, after the last leaf, by its trigger
rule, with every leaf's output; and settling the root's wave costs time in proportion
to the fan-out, whatever statistics the planner has.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import psycopg
import pytest
from google.protobuf import json_format

from cyclone.v1 import worker_service_pb2
from tests.helpers import (
    claim,
    complete,
    fail,
    get_run,
    node,
    run_status,
    statuses,
    submit,
    value,
    workflow,
)

WIDTH = 2_000


def _wide_server(server_factory: Any, width: int) -> Any:
    """A server whose workflow limits admit a root, ``width`` leaves and a few joins
    (the defaults stop at 5,000 nodes and 1,000 dependents or dependencies)."""
    return server_factory(
        max_nodes=width + 10, max_dependents=width + 10, max_dependencies=width + 10
    )


def _submit_wide(server: Any, joins: dict[str, str], **leaf: Any) -> tuple[str, list[str]]:
    """Submits a root, WIDTH leaves depending on it (``leaf`` options) and one join per
    entry of ``joins`` (name: trigger rule, action = name) depending on every leaf;
    returns the run id and the leaves' names."""
    names = [f"leaf{i}" for i in range(WIDTH)]
    run_id = submit(
        server,
        workflow(
            "wide",
            node("root", "root"),
            *(node(n, "leaf", ["root"], **leaf) for n in names),
            *(node(j, j, names, rule=rule) for j, rule in joins.items()),
        ),
    )
    return run_id, names


def _complete_many(server: Any, steps: list, outputs: dict[str, Any]) -> None:
    request = worker_service_pb2.CompleteManyRequest(
        completions=[
            worker_service_pb2.CompleteRequest(
                run_id=s.run_id,
                node=s.node,
                lease_token=s.lease_token,
                output=value(outputs[s.node]),
            )
            for s in steps
        ]
    )
    reply = server.workers.CompleteMany(request)
    assert len(reply.results) == len(steps)
    assert [r.WhichOneof("result") for r in reply.results] == ["response"] * len(steps), reply


def _complete_from_two_workers(server: Any, steps: list, outputs: dict[str, Any]) -> None:
    """Complete ``steps`` in CompleteMany batches of 97, sent by two threads at once."""
    batches = [steps[i : i + 97] for i in range(0, len(steps), 97)]
    errors: list[BaseException] = []

    def send(mine: list) -> None:
        try:
            for batch in mine:
                _complete_many(server, batch, outputs)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=send, args=(batches[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and not any(t.is_alive() for t in threads), errors


def _claim_all(server: Any, action: str, count: int) -> list:
    """Claims of ``action`` until ``count`` steps are claimed: after the first 1,000,
    a wide root's dependents are released by the server's release loop, a chunk per
    transaction (tests/test_release_chunks.py)."""
    steps: list = []
    while len(steps) < count:
        got = claim(server, action, n=1000, wait=10)
        assert got, f"{len(steps)} of {count} claimed"
        steps += got
    assert len(steps) == count
    return steps


def test_a_wide_join_runs_once_after_every_leaf_with_their_outputs(server_factory):
    server = _wide_server(server_factory, WIDTH)
    run_id, names = _submit_wide(server, {"join": "all_success"})
    [root] = claim(server, "root")
    complete(server, root, {"root": True})
    outputs = {n: {"leaf": i} for i, n in enumerate(names)}
    done = 0
    while done < WIDTH:  # at most 1,000 a claim
        leaves = claim(server, "leaf", n=1000, wait=10)
        assert leaves, f"{done} of {WIDTH} leaves claimed"
        _complete_from_two_workers(server, leaves, outputs)
        done += len(leaves)
        if done < WIDTH:  # the join waits for the rest
            assert statuses(get_run(server, run_id))["join"] == "pending"
            assert claim(server, "join") == []
    assert done == WIDTH
    assert claim(server, "leaf") == []

    [joined] = claim(server, "join")
    assert claim(server, "join") == []
    assert joined.attempt == 1
    got = {k: json_format.MessageToDict(v) for k, v in joined.upstream_outputs.items()}
    assert got == {n: {"leaf": float(i)} for i, n in enumerate(names)}
    complete(server, joined, {"joined": WIDTH})
    run = get_run(server, run_id)
    assert run_status(run) == "completed"
    assert set(statuses(run).values()) == {"completed"}
    finished = {s.node: s.finished_at.ToDatetime() for s in run.steps}
    [started] = [s.started_at.ToDatetime() for s in run.steps if s.node == "join"]
    assert started >= max(finished[n] for n in names)


def test_a_failed_leaf_skips_the_all_success_join_and_runs_the_others(server_factory):
    """One leaf of a wide fan-out is discarded: the all_success join is skipped, the
    all_done and one_failed joins run once, after every leaf, told which leaf failed."""
    server = _wide_server(server_factory, WIDTH)
    joins = {"join": "all_success", "report": "all_done", "undo": "one_failed"}
    run_id, names = _submit_wide(server, joins, max_attempts=1)
    [root] = claim(server, "root")
    complete(server, root)
    leaves = _claim_all(server, "leaf", WIDTH)
    [bad] = [s for s in leaves if s.node == "leaf1234"]
    fail(server, bad, "leaf broke", non_retryable=True)
    good = [s for s in leaves if s.node != "leaf1234"]
    _complete_from_two_workers(server, good, {n: None for n in names})

    assert claim(server, "join") == []
    [report] = claim(server, "report")
    [undo] = claim(server, "undo")
    for step in (report, undo):
        assert [f.node for f in step.upstream_failures] == ["leaf1234"]
        assert len(step.upstream_outputs) == WIDTH - 1
        complete(server, step)
    run = get_run(server, run_id)
    assert statuses(run)["join"] == "skipped"
    assert statuses(run)["leaf1234"] == "discarded"
    assert run_status(run) == "failed"


SETTLE_WIDTH = 20_000


def _wide_nodes(width: int) -> str:
    leaves = [f"leaf{i}" for i in range(width)]
    nodes: list[dict[str, Any]] = [{"name": "root", "depends_on": [], "dependents": leaves}]
    nodes += [{"name": n, "depends_on": ["root"], "dependents": ["join"]} for n in leaves]
    nodes.append({"name": "join", "depends_on": leaves, "dependents": []})
    return json.dumps([{**NODE_DEFAULTS, **n, "position": i} for i, n in enumerate(nodes)])


#: Every setting run_submit's node JSON needs, for the nodes written here by hand.
NODE_DEFAULTS: dict[str, Any] = {
    "action": "fan",
    "trigger_rule": "all_success",
    "max_attempts": 3,
    "initial_backoff_s": 1.0,
    "max_backoff_s": 60.0,
    "backoff_multiplier": 2.0,
    "timeout_s": 300.0,
}


@pytest.mark.parametrize("statistics", ["none", "small runs"])
def test_completing_the_root_of_a_wide_fan_out_takes_linear_time(database_url, statistics):
    """The root's completion counts its wave at 20,000 dependents, 1,000 with the root
    and 1,000 per transaction after it (a release in chunks). With a join of the
    run's steps to the counts, a planner that expected few steps per run (none analyzed,
    or thousands of small runs analyzed) compared every pending step with every count:
    4 * 10^8 comparisons, minutes. By key, about a second; the statement timeout (20 s)
    leaves the margin of a loaded machine."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        if statistics == "none":
            conn.execute("ALTER TABLE cyclone.steps SET (autovacuum_enabled = off)")
            conn.execute("ALTER TABLE cyclone.runs SET (autovacuum_enabled = off)")
        else:
            small = json.dumps(json.loads(_wide_nodes(3)))
            # The ids made in a subquery: a call of gen_random_uuid() in the lateral
            # call's arguments is made once, and the one run is submitted 2,000 times.
            conn.execute(
                "SELECT count(*) FROM"
                " (SELECT gen_random_uuid() AS id FROM generate_series(1, 2000)) g,"
                " LATERAL cyclone.run_submit(g.id, 'small', NULL, NULL, %s)",
                (small,),
            )
            assert conn.execute("SELECT count(*) FROM cyclone.runs").fetchone() == (2000,)
            conn.execute("ANALYZE cyclone.runs, cyclone.steps")
        run_id = str(uuid.uuid4())
        conn.execute(
            "SELECT cyclone.run_submit(%s, 'wide', NULL, NULL, %s)",
            (run_id, _wide_nodes(SETTLE_WIDTH)),
        )
        conn.execute("UPDATE cyclone.steps SET action = 'other' WHERE run_id <> %s", (run_id,))
        [(node_name, token)] = conn.execute(
            "SELECT node, lease_token FROM cyclone.step_claim('t', '{fan}', '{}', 10, '1 min')"
        ).fetchall()
        assert node_name == "root"
        item = [{"i": 0, "run_id": run_id, "node": "root", "lease_token": str(token)}]
        with conn.transaction():
            conn.execute("SET LOCAL statement_timeout = '20s'")
            [row] = conn.execute(
                "SELECT step_status, error_state FROM cyclone.step_complete_many(%s)",
                (json.dumps(item),),
            ).fetchall()
        assert row == ("completed", None)
        # The release in chunks: the first 1,000 leaves with the root, then 1,000 a
        # transaction (release_continue, which the servers' release loop calls).
        assert _counts(conn, run_id) == {
            "completed:0": 1,
            "available:0": 1000,
            "pending:1": SETTLE_WIDTH - 1000,
            f"pending:{SETTLE_WIDTH}": 1,
        }
        chunks = 0
        while True:
            with conn.transaction():
                conn.execute("SET LOCAL statement_timeout = '20s'")
                [(more,)] = conn.execute(
                    "SELECT cyclone.release_continue(%s)", (run_id,)
                ).fetchall()
            chunks += 1
            if not more:
                break
        counts = _counts(conn, run_id)
        left = conn.execute("SELECT count(*) FROM cyclone.releases").fetchone()
    assert chunks == SETTLE_WIDTH // 1000 - 1
    assert counts == {"completed:0": 1, "available:0": SETTLE_WIDTH, f"pending:{SETTLE_WIDTH}": 1}
    assert left == (0,)


def _counts(conn: psycopg.Connection, run_id: str) -> dict[str, int]:
    """The run's steps counted by status and open upstream count ("pending:1": 19)."""
    return dict(
        conn.execute(
            "SELECT status || ':' || deps_open, count(*) FROM cyclone.steps"
            " WHERE run_id = %s GROUP BY 1",
            (run_id,),
        ).fetchall()
    )


CLAIM_WIDTH = 2_000


def test_a_claim_after_a_fan_out_is_released_reads_only_the_steps_it_takes(database_url):
    """A claim takes the steps it picked by their ctids. When it also named their status,
    a plan made while few steps were ready (statistics taken before a fan-out was
    released, as autovacuum would take them) read them back through the ready index
    instead, every ready row for each claim: in the fan bench 7,500 index entries per
    claim of 64. The plan stays cached for the connection until the next ANALYZE."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE cyclone.steps SET (autovacuum_enabled = off)")
        conn.execute("ALTER TABLE cyclone.runs SET (autovacuum_enabled = off)")
        claim = "SELECT node, lease_token FROM cyclone.step_claim('t', '{fan}', '{}', %s, '1 min')"
        run_id = str(uuid.uuid4())
        conn.execute(
            "SELECT cyclone.run_submit(%s, 'wide', NULL, NULL, %s)",
            (run_id, _wide_nodes(CLAIM_WIDTH)),
        )
        conn.execute("ANALYZE cyclone.runs, cyclone.steps")  # one step ready of 2,002
        [(root, token)] = conn.execute(claim, (10,)).fetchall()
        assert root == "root"
        item = [{"i": 0, "run_id": run_id, "node": "root", "lease_token": str(token)}]
        conn.execute("SELECT cyclone.step_complete_many(%s)", (json.dumps(item),))
        with conn.transaction():
            taken = conn.execute(claim, (10,)).fetchall()
            [entries] = conn.execute(
                "SELECT pg_stat_get_xact_tuples_returned('cyclone.steps_ready_idx'::regclass)"
            ).fetchone()
    assert len(taken) == 10
    # The walk reads the ten it takes and perhaps a few more; not the 2,000 ready.
    assert entries < 100, f"{entries} ready-index entries read to claim 10"


def test_a_fan_out_after_small_runs_is_claimed_and_completed_by_key(database_url):
    """After a history of small runs (analyzed: a run has a few steps), a claim of a
    wide fan-out's leaves reads the primary key for the steps it names, not for every
    step of the run. Written as node = ANY (depends_on), PostgreSQL 15 planned each
    claimed leaf's upstream lookup as a read of the run's steps by run_id filtered by
    the list: all 2,002 steps of the run for each leaf (docs/performance.md, "Wide
    fan-outs"). So did _settle's lookups when the leaves completed:
    the count of their dependents, and the count at the join."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        small = json.dumps(json.loads(_wide_nodes(3)))
        conn.execute(
            "SELECT count(*) FROM"
            " (SELECT gen_random_uuid() AS id FROM generate_series(1, 2000)) g,"
            " LATERAL cyclone.run_submit(g.id, 'small', NULL, NULL, %s)",
            (small,),
        )
        conn.execute("UPDATE cyclone.steps SET action = 'other'")
        conn.execute("ANALYZE cyclone.runs, cyclone.steps")
        assert conn.execute("SELECT count(*) FROM cyclone.runs").fetchone() == (2000,)
        run_id = str(uuid.uuid4())
        conn.execute(
            "SELECT cyclone.run_submit(%s, 'wide', NULL, NULL, %s)",
            (run_id, _wide_nodes(CLAIM_WIDTH)),
        )
        claim = (
            "SELECT run_id, node, lease_token FROM cyclone.step_claim('t', '{fan}', '{}', %s,"
            " '1 min')"
        )

        def items(rows: list) -> str:
            return json.dumps(
                [
                    {"i": i, "run_id": str(r), "node": n, "lease_token": str(t)}
                    for i, (r, n, t) in enumerate(rows)
                ]
            )

        [root] = conn.execute(claim, (10,)).fetchall()
        conn.execute("SELECT cyclone.step_complete_many(%s)", (items([root]),))
        while conn.execute("SELECT cyclone.release_continue(%s)", (run_id,)).fetchone()[0]:
            pass
        # The counters hold what this backend has not reported yet (earlier transactions
        # too): each statement's reads are the difference across it.
        read = "SELECT pg_stat_get_xact_tuples_returned('cyclone.steps_pkey'::regclass)"
        with conn.transaction():
            [before] = conn.execute(read).fetchone()
            leaves = conn.execute(claim, (64,)).fetchall()
            [claimed] = conn.execute(read).fetchone()
            done = conn.execute(
                "SELECT step_status FROM cyclone.step_complete_many(%s)", (items(leaves),)
            ).fetchall()
            [completed] = conn.execute(read).fetchone()
            completed -= claimed
            claimed -= before
        counts = _counts(conn, run_id)
    assert len(leaves) == 64 and done == [("completed",)] * 64
    assert counts[f"pending:{CLAIM_WIDTH - 64}"] == 1  # the join counted them
    # A few entries per step named (the leaf and its root): not 2,002 per leaf.
    assert claimed < 64 * 4, f"{claimed} primary key entries read to claim 64 leaves"
    # Each leaf twice by key (its update, its dependents), each time with the entries of
    # its earlier versions (released, claimed: not yet vacuumed), and the join once: not
    # the run's 2,002 steps twice (4,007 entries on PostgreSQL 15 before migration 0044).
    assert completed < 64 * 10, f"{completed} primary key entries read to complete 64 leaves"


def test_a_join_made_ready_while_its_run_is_blocked_is_held_until_resolve(cyclone_server):
    """The counting update releases a ready dependent only in a running run: leaves that
    complete while another node has blocked the run leave their join pending (held),
    and Resolve releases it."""
    from tests.test_blocked import _abandon, resolve

    leaves = [f"leaf{i}" for i in range(3)]
    run_id = submit(
        cyclone_server,
        workflow(
            "order",
            node("charge", action="charge"),
            *(node(n, "leaf") for n in leaves),
            node("join", "join", leaves),
        ),
    )
    held = claim(cyclone_server, "leaf")
    assert len(held) == 3
    [charge] = claim(cyclone_server, "charge", unsafe=("charge",))
    cyclone_server.workers.Complete(_abandon(cyclone_server, charge))
    assert run_status(get_run(cyclone_server, run_id)) == "blocked"
    _complete_many(cyclone_server, held, {n: n for n in leaves})
    run = get_run(cyclone_server, run_id)
    assert statuses(run)["join"] == "pending"
    assert claim(cyclone_server, "join") == []
    resolve(cyclone_server, run_id, discard=True)
    [joined] = claim(cyclone_server, "join")
    assert set(joined.upstream_outputs) == set(leaves)


def test_a_discarded_root_is_counted_once_at_each_dependent_by_its_rule(database_url):
    """A wave of one final is counted without a map of counts (_settle): each dependent
    of a root counts it once, and as failed when the root was discarded. So its
    all_success dependents are skipped, its all_done and one_failed ones run, and the
    skipped ones, a wave of several finals, are counted at the join by name."""
    rules = ["all_success", "all_done", "one_failed"]
    leaves = [f"leaf{i}" for i in range(30)]
    nodes: list[dict[str, Any]] = [{"name": "root", "depends_on": [], "dependents": leaves}]
    nodes += [
        {"name": n, "depends_on": ["root"], "dependents": ["join"], "trigger_rule": rules[i % 3]}
        for i, n in enumerate(leaves)
    ]
    nodes.append({"name": "join", "depends_on": leaves, "dependents": []})
    payload = json.dumps(
        [{**NODE_DEFAULTS, **n, "position": i, "max_attempts": 1} for i, n in enumerate(nodes)]
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = str(uuid.uuid4())
        conn.execute("SELECT cyclone.run_submit(%s, 'rules', NULL, NULL, %s)", (run_id, payload))
        [(root, token)] = conn.execute(
            "SELECT node, lease_token FROM cyclone.step_claim('t', '{fan}', '{}', 10, '1 min')"
        ).fetchall()
        assert root == "root"
        conn.execute(
            "SELECT cyclone.step_fail(%s, 'root', %s, 'Boom', 'no', NULL, false, NULL)",
            (run_id, token),
        )
        rows = conn.execute(
            "SELECT node, trigger_rule, status, deps_open, deps_failed FROM cyclone.steps"
            " WHERE run_id = %s AND node <> 'root'",
            (run_id,),
        ).fetchall()
    by_rule = {
        (rule, status, deps_open, deps_failed)
        for name, rule, status, deps_open, deps_failed in rows
        if name != "join"
    }
    assert by_rule == {
        ("all_success", "skipped", 0, 1),
        ("all_done", "available", 0, 1),
        ("one_failed", "available", 0, 1),
    }
    # The skipped leaves are a wave of their own, counted at the join (failed, ten).
    [join] = [r for r in rows if r[0] == "join"]
    assert join[2:] == ("pending", 20, 10)
