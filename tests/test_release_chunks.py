"""A release in chunks: a node that becomes final alone with more than 1,000 dependents
(a wide fan-out's root) is counted at the first 1,000 in its own transaction, the rest
1,000 per transaction by cyclone.release_continue, which every server runs as soon as
that commits, and at its start for a release that a stopped server left half way.
Nothing is counted twice or skipped: not when a Retry recounts the run from the graph
in the middle of a release, not when the run is cancelled, not when two servers
continue one release at once.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg

from tests.helpers import claim, complete, get_run, run_status, statuses
from tests.test_fan_out import NODE_DEFAULTS, _claim_all, _complete_many, _counts

CHUNK = 1000
WIDTH = 2_500


def _fan(width: int, extra: list[dict[str, Any]] | None = None) -> str:
    """Node JSON for run_submit: a root, ``width`` leaves depending on it, a join of
    every leaf; then ``extra`` nodes (listed last in the root's dependents when they
    depend on it)."""
    leaves = [f"leaf{i}" for i in range(width)]
    extra = extra or []
    nodes: list[dict[str, Any]] = [
        {
            "name": "root",
            "depends_on": [],
            "dependents": leaves + [n["name"] for n in extra if "root" in n["depends_on"]],
        }
    ]
    nodes += [{"name": n, "depends_on": ["root"], "dependents": ["join"]} for n in leaves]
    nodes.append({"name": "join", "depends_on": leaves, "dependents": []})
    nodes += extra
    return json.dumps([{**NODE_DEFAULTS, **n, "position": i} for i, n in enumerate(nodes)])


def _submit(conn: psycopg.Connection, nodes: str) -> str:
    run_id = str(uuid.uuid4())
    conn.execute("SELECT cyclone.run_submit(%s, 'wide', NULL, NULL, %s)", (run_id, nodes))
    return run_id


def _claimed(server_factory: Any, action: str = "fan", n: int = 10) -> list:
    """Steps claimed through a server that stops right after: a release that their
    outcome then starts from SQL stays in cyclone.releases, since no server's loop
    runs, for the test to continue by hand (release_continue). (The claim from SQL is
    step_claim, which a Citus database does not use.)"""
    server = server_factory()
    steps = claim(server, action, n=n)
    server.stop()
    return steps


def _outcome(
    conn: psycopg.Connection, run_id: str, node: str, token: Any, broke: bool = False
) -> tuple:
    """The step's completion, or its failure for good (``broke``), from SQL, as the
    server applies one outcome: (step status, run status)."""
    if broke:
        return conn.execute(
            "SELECT step_status, run_status FROM cyclone.step_fail(%s, %s, %s, 'Broke',"
            " 'broke', NULL, false, NULL)",
            (run_id, node, str(token)),
        ).fetchone()
    return conn.execute(
        "SELECT step_status, run_status FROM cyclone._step_complete(%s, %s, %s, NULL)",
        (run_id, node, str(token)),
    ).fetchone()


def _continue_all(conn: psycopg.Connection, run_id: str) -> int:
    """release_continue until it answers false; returns how many calls that took."""
    calls = 0
    while True:
        calls += 1
        [(more,)] = conn.execute("SELECT cyclone.release_continue(%s)", (run_id,)).fetchall()
        if not more:
            return calls


def test_the_root_releases_its_first_chunk_and_the_rest_follow_a_chunk_a_call(
    server_factory, database_url
):
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = _submit(conn, _fan(WIDTH))
        [root] = _claimed(server_factory)
        assert root.node == "root"
        assert _outcome(conn, run_id, "root", root.lease_token) == ("completed", "running")
        assert _counts(conn, run_id) == {
            "completed:0": 1,
            "available:0": CHUNK,
            "pending:1": WIDTH - CHUNK,
            f"pending:{WIDTH}": 1,
        }
        # The first chunk is the root's first 1,000 dependents, in their order.
        ready = {
            n
            for (n,) in conn.execute(
                "SELECT node FROM cyclone.steps WHERE run_id = %s AND status = 'available'",
                (run_id,),
            )
        }
        assert ready == {f"leaf{i}" for i in range(CHUNK)}
        assert conn.execute("SELECT node, next FROM cyclone.releases").fetchall() == [
            ("root", CHUNK + 1)
        ]
        [(more,)] = conn.execute("SELECT cyclone.release_continue(%s)", (run_id,)).fetchall()
        assert more is True
        assert _counts(conn, run_id)["available:0"] == 2 * CHUNK
        assert _continue_all(conn, run_id) == 1  # the last 500
        assert _counts(conn, run_id) == {
            "completed:0": 1,
            "available:0": WIDTH,
            f"pending:{WIDTH}": 1,
        }
        assert conn.execute("SELECT count(*) FROM cyclone.releases").fetchone() == (0,)
        # Nothing left: a further call counts nothing again.
        [(more,)] = conn.execute("SELECT cyclone.release_continue(%s)", (run_id,)).fetchall()
        assert more is False
        assert _counts(conn, run_id)["available:0"] == WIDTH


def test_a_discarded_roots_skips_are_counted_at_the_join_chunk_by_chunk(
    server_factory, database_url
):
    """A root discarded: its all_success leaves are skipped 1,000 at a time, each chunk
    a wave that counts its skips at the join; the last chunk skips the join, and the
    run fails, closed by the count, once every leaf is final."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = _submit(conn, _fan(WIDTH))
        [root] = _claimed(server_factory)
        assert _outcome(conn, run_id, "root", root.lease_token, broke=True) == (
            "discarded",
            "running",
        )
        assert _counts(conn, run_id) == {
            "discarded:0": 1,
            "skipped:0": CHUNK,
            "pending:1": WIDTH - CHUNK,
            f"pending:{WIDTH - CHUNK}": 1,
        }
        assert conn.execute(
            "SELECT deps_failed FROM cyclone.steps WHERE run_id = %s AND node = 'join'", (run_id,)
        ).fetchone() == (CHUNK,)
        assert _continue_all(conn, run_id) == 2
        assert _counts(conn, run_id) == {"discarded:0": 1, "skipped:0": WIDTH + 1}
        status, open_ = conn.execute(
            "SELECT status, steps_open FROM cyclone.runs WHERE run_id = %s", (run_id,)
        ).fetchone()
    assert (status, open_) == ("failed", 0)


def test_retry_in_the_middle_of_a_release_counts_each_upstream_once(server_factory, database_url):
    """A node below the root and below a discarded node x, in the root's second chunk.
    Retry(x) counts x's downstream from the graph: the root's release is finished first,
    so the root is counted there once. Had the chunk come after Retry's count, it would
    have counted the root a second time and released the node while x was open again."""
    late = {"name": "late", "depends_on": ["root", "x"], "dependents": []}
    x = {"name": "x", "action": "x", "depends_on": [], "dependents": ["late"], "max_attempts": 1}
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = _submit(conn, _fan(1500, [late, x]))
        [x_step] = _claimed(server_factory, "x")
        assert _outcome(conn, run_id, "x", x_step.lease_token, broke=True)[0] == "discarded"
        [root] = _claimed(server_factory)
        assert _outcome(conn, run_id, "root", root.lease_token)[0] == "completed"
        # late is root's dependent 1,501: in the second chunk, not counted yet.
        assert conn.execute(
            "SELECT status, deps_open, deps_failed FROM cyclone.steps"
            " WHERE run_id = %s AND node = 'late'",
            (run_id,),
        ).fetchone() == ("pending", 1, 1)
        conn.execute("SELECT cyclone.step_retry(%s, '{x}', 'test', 'again')", (run_id,))
        assert _continue_all(conn, run_id) == 1  # nothing left to count
        late_now = conn.execute(
            "SELECT status, deps_open, deps_failed FROM cyclone.steps"
            " WHERE run_id = %s AND node = 'late'",
            (run_id,),
        ).fetchone()
        assert late_now == ("pending", 1, 0)  # waits for x, and only for x
        assert conn.execute("SELECT count(*) FROM cyclone.releases").fetchone() == (0,)
        assert _counts(conn, run_id)["available:0"] == 1500 + 1  # the leaves and x
        [x_step] = _claimed(server_factory, "x")
        assert _outcome(conn, run_id, "x", x_step.lease_token)[0] == "completed"
        assert conn.execute(
            "SELECT status FROM cyclone.steps WHERE run_id = %s AND node = 'late'", (run_id,)
        ).fetchone() == ("available",)


def test_a_cancelled_run_drops_its_release(server_factory, database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = _submit(conn, _fan(WIDTH))
        [root] = _claimed(server_factory)
        _outcome(conn, run_id, "root", root.lease_token)
        conn.execute("SELECT cyclone.run_cancel(%s, 'test', 'enough')", (run_id,))
        [(more,)] = conn.execute("SELECT cyclone.release_continue(%s)", (run_id,)).fetchall()
        assert more is False
        assert conn.execute("SELECT count(*) FROM cyclone.releases").fetchone() == (0,)
        assert _counts(conn, run_id) == {
            "completed:0": 1,
            "cancelled:0": CHUNK,
            "cancelled:1": WIDTH - CHUNK,
            f"cancelled:{WIDTH}": 1,
        }


def test_two_continuers_at_once_count_each_chunk_once(server_factory, database_url):
    """Two servers woken for one release: each chunk takes the run's lock and reads
    where the last stopped, so the two never count one chunk twice."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = _submit(conn, _fan(10 * CHUNK))
        [root] = _claimed(server_factory)
        _outcome(conn, run_id, "root", root.lease_token)
    calls: list[int] = []
    errors: list[BaseException] = []

    def go() -> None:
        try:
            with psycopg.connect(database_url, autocommit=True) as c:
                calls.append(_continue_all(c, run_id))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    # Nine chunks were left: nine calls counted one each, and each thread's last call
    # answered false, one of them the call that counted the last chunk.
    assert sum(calls) == 10, calls
    with psycopg.connect(database_url) as conn:
        assert _counts(conn, run_id) == {
            "completed:0": 1,
            "available:0": 10 * CHUNK,
            f"pending:{10 * CHUNK}": 1,
        }


def _wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _limits(width: int) -> dict[str, int]:
    return {"max_nodes": width + 10, "max_dependents": width + 10, "max_dependencies": width + 10}


def test_a_server_continues_the_release_its_completion_started(server_factory, database_url):
    """Through the server: the root's Complete answers after its first chunk; the
    server's release loop, woken by it, counts the rest without any other call, and
    every leaf is claimed once."""
    server = server_factory(**_limits(WIDTH))
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = _submit(conn, _fan(WIDTH))
    [root] = claim(server, "fan")
    complete(server, root, {"root": True})
    with psycopg.connect(database_url, autocommit=True) as conn:
        _wait_for(lambda: conn.execute("SELECT count(*) FROM cyclone.releases").fetchone()[0] == 0)
    claimed = _claim_all(server, "fan", WIDTH)
    assert sorted(s.node for s in claimed) == sorted(f"leaf{i}" for i in range(WIDTH))
    assert claim(server, "fan") == []
    assert all(dict(s.upstream_outputs) for s in claimed)
    assert statuses(get_run(server, run_id))["join"] == "pending"


def test_a_server_starting_finishes_a_release_left_half_way(server_factory, database_url):
    """A release whose continuer stopped (here: the root completed from SQL while no
    server runs): a server that starts counts the rest, and the run then runs through
    to the end."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        run_id = _submit(conn, _fan(WIDTH))
        [root] = _claimed(server_factory)
        _outcome(conn, run_id, "root", root.lease_token)
        assert conn.execute("SELECT count(*) FROM cyclone.releases").fetchone() == (1,)
    server = server_factory(**_limits(WIDTH))
    with psycopg.connect(database_url, autocommit=True) as conn:
        _wait_for(lambda: conn.execute("SELECT count(*) FROM cyclone.releases").fetchone()[0] == 0)
        assert _counts(conn, run_id)["available:0"] == WIDTH
    while leaves := claim(server, "fan", n=1000):
        _complete_many(server, leaves, {s.node: None for s in leaves})
    run = get_run(server, run_id)
    assert run_status(run) == "completed"
    assert set(statuses(run).values()) == {"completed"}


def test_a_release_that_fails_holds_up_no_other_and_is_tried_again(server_factory, database_url):
    """Two runs with a release in progress, the first of which cannot be counted (a
    trigger refuses its steps' updates): the server's loop finishes the second, and
    the first once it can be counted, at a later pass."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        bad = _submit(conn, _fan(WIDTH))
        good = _submit(conn, _fan(WIDTH))
        roots = {s.run_id: s for s in _claimed(server_factory)}
        for run_id in (bad, good):  # bad's release is the older
            _outcome(conn, run_id, "root", roots[run_id].lease_token)
        conn.execute(
            "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF NEW.run_id = '" + bad + "' THEN RAISE EXCEPTION 'refused by the test';"
            " END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse BEFORE UPDATE ON cyclone.steps"
            " FOR EACH ROW EXECUTE FUNCTION public.refuse()"
        )

        def left() -> list[str]:
            return [str(r) for (r,) in conn.execute("SELECT run_id FROM cyclone.releases")]

        server_factory(sweep_interval_s=0.2)
        _wait_for(lambda: left() == [bad])
        assert _counts(conn, good)["available:0"] == WIDTH
        assert _counts(conn, bad)["available:0"] == CHUNK
        conn.execute("DROP TRIGGER refuse ON cyclone.steps")
        _wait_for(lambda: left() == [])
        assert _counts(conn, bad)["available:0"] == WIDTH
