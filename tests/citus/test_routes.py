"""Calls sent where their shard lives: a server on Citus sends a claim's part of each
shard, a shard's outcomes and a heartbeat straight to the node that holds the shard,
over a pool of its own to each node (--citus-route, docs/scaling.md)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import psycopg

from cyclone.v1 import worker_service_pb2 as worker_pb
from cyclone.v1 import workflow_service_pb2 as wf_pb
from tests.conftest import TEST_SETTINGS, RunningServer
from tests.helpers import claim, complete, get_run, node, run_status, submit, value, workflow


def _placements(server: Any) -> dict[int, int]:
    """Each shard of the runs and the port of the node that holds it."""
    rows = server.sql(
        "SELECT s.shardid, n.nodeport FROM pg_dist_shard s"
        " JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid)"
        " WHERE s.logicalrelid = 'cyclone.runs'::regclass AND n.noderole = 'primary'"
    )
    return {shard: port for shard, port in rows}


def _node_port(pool: Any) -> int:
    return int(pool.engine.url.port)


def _drain(server: Any, runs: int = 12) -> list[str]:
    """Runs submitted, claimed, heartbeated and completed through ``server``; their ids."""
    ids = [submit(server, workflow("w", node("a"))) for _ in range(runs)]
    steps = claim(server, n=runs * 2)
    assert sorted(s.run_id for s in steps) == sorted(ids)
    for step in steps:
        answer = server.workers.Heartbeat(
            worker_pb.HeartbeatRequest(
                run_id=step.run_id, node=step.node, lease_token=step.lease_token
            )
        )
        assert answer.lease_expires_at.seconds > 0
    for step in steps:
        complete(server, step, step.run_id)
    for run_id in ids:
        assert run_status(get_run(server, run_id)) == "completed"
    return ids


def test_a_shards_calls_go_to_the_node_that_holds_it(cyclone_server: Any) -> None:
    """Every shard on a worker node is mapped to a pool of that node's, and a drain's
    claims, heartbeats and completions are sent over them."""
    pool = cyclone_server.server.db.pool
    placements = _placements(cyclone_server)
    assert {shard: _node_port(p) for shard, p in pool.nodes.items()} == placements
    assert len(set(placements.values())) == 2
    used = _checkouts(pool)
    _drain(cyclone_server)
    for port, calls in _checkouts(pool).items():
        assert calls > used.get(port, 0), f"nothing was sent to the node on {port}"


def _checkouts(pool: Any) -> dict[int, int]:
    """Connections each node's pool handed out so far, by the node's port."""
    return {_node_port(p): p.checkouts for p in pool.nodes.values()}


def test_a_stale_map_of_the_shards_costs_a_hop_not_an_answer(cyclone_server: Any) -> None:
    """A shard that moved since the map was read is reached through the node the call
    went to (any node runs a call for any shard): the map is only ever an optimisation."""
    pool = cyclone_server.server.db.pool
    nodes = sorted({id(p): p for p in pool.nodes.values()}.values(), key=_node_port)
    assert len(nodes) == 2
    wrong = {shard: nodes[1] if p is nodes[0] else nodes[0] for shard, p in pool.nodes.items()}
    pool.nodes = wrong
    _drain(cyclone_server)


def test_with_routing_off_every_call_goes_through_the_servers_node(
    database_url: str,
) -> None:
    server = RunningServer(database_url, replace(TEST_SETTINGS, citus_route="off")).start()
    try:
        pool = server.server.db.pool
        assert pool.nodes == {}
        _drain(server)
        assert pool.nodes == {} and pool.node_pools() == []
    finally:
        server.stop()


def test_a_claim_reads_each_nodes_shards_and_hands_out_in_claim_order(
    cyclone_server: Any,
) -> None:
    """The claim's first read asks each node for its own shards' ready steps and merges
    them: highest priority first, then oldest, whichever node holds the run."""

    def submitted(priority: int) -> str:
        request = wf_pb.SubmitRequest(workflow=workflow("w", node("a")), priority=priority)
        return str(cyclone_server.workflows.Submit(request).run_id)

    low = [submitted(0) for _ in range(6)]
    high = [submitted(5) for _ in range(6)]
    pool = cyclone_server.server.db.pool
    holders = pool.shard_holders()
    used = [p.checkouts for p in holders]
    first = claim(cyclone_server, n=6)
    assert sorted(s.run_id for s in first) == sorted(high)
    assert all(p.checkouts > n for p, n in zip(holders, used, strict=True))
    rest = claim(cyclone_server, n=20)
    assert sorted(s.run_id for s in rest) == sorted(low)
    shards = {pool.shard_of[r] for r in high + low}
    assert len({id(pool.nodes[s]) for s in shards}) == 2, "the runs are on both nodes"


def test_a_nodes_statements_are_planned_once_per_session(cyclone_server: Any) -> None:
    """On a worker node, the statements a delegated call EXECUTEs over its shard's
    tables are prepared at the session's first call and reused by the next (_prepared),
    with one generic plan: the session's prepared statements do not grow with its
    calls, and the answers are the same."""
    ids = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(8)]
    pool = cyclone_server.server.db.pool
    ports = sorted({_node_port(p) for p in pool.nodes.values()})
    assert len(ports) == 2
    url = cyclone_server.database_url
    for port in ports:
        with psycopg.connect(psycopg.conninfo.make_conninfo(url, port=port)) as conn:
            conn.autocommit = True

            def prepared() -> list[str]:
                rows = conn.execute(
                    "SELECT name FROM pg_prepared_statements WHERE name LIKE 'cyclone\\_%'"
                ).fetchall()
                return sorted(r[0] for r in rows)

            def read() -> list[str]:
                rows = conn.execute(
                    "SELECT run_id FROM cyclone.step_candidates_local("
                    "ARRAY['work'], 100, '{}', '{}', '{}')"
                ).fetchall()
                return sorted(str(r[0]) for r in rows)

            assert prepared() == []
            first = read()
            assert first and set(first) <= set(ids)
            once = prepared()
            assert len(once) == 1
            assert read() == first
            assert prepared() == once
            # Planned once for the session: a generic plan, never one for each call.
            assert conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s",
                once,
            ).fetchall() == [(2, 0)]
    steps = claim(cyclone_server, n=16)
    assert sorted(s.run_id for s in steps) == sorted(ids)
    for step in steps:
        complete(cyclone_server, step, step.run_id)
    assert {run_status(get_run(cyclone_server, r)) for r in ids} == {"completed"}


def test_a_node_takes_and_completes_its_shards_steps_in_one_call(cyclone_server: Any) -> None:
    """A claim's part of the shards one node holds is one call to that node
    (step_claim_node), and so are a batch's outcomes of those shards
    (step_complete_node): besides the claim's read, one connection per node for the
    claim and one for the batch, whatever the number of the runs' shards on each."""
    pool = cyclone_server.server.db.pool
    ids = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(40)]
    shards = {
        r: int(s)
        for r, s in cyclone_server.sql(
            "SELECT run_id::text, get_shard_id_for_distribution_column('cyclone.runs', run_id)"
            " FROM cyclone.runs"
        )
    }
    by_node: dict[int, set[int]] = {}
    for shard in set(shards.values()):
        by_node.setdefault(id(pool.nodes[shard]), set()).add(shard)
    assert len(by_node) == 2 and all(len(s) > 1 for s in by_node.values())
    holders = pool.shard_holders()
    before = [p.checkouts for p in holders]
    steps = claim(cyclone_server, n=40)
    assert sorted(s.run_id for s in steps) == sorted(ids)
    # One read of each node's candidates, one call taking its steps.
    assert [p.checkouts - n for p, n in zip(holders, before, strict=True)] == [2, 2]
    before = [p.checkouts for p in holders]
    request = worker_pb.CompleteManyRequest(
        completions=[
            worker_pb.CompleteRequest(
                run_id=s.run_id, node=s.node, lease_token=s.lease_token, output=value(s.node)
            )
            for s in steps
        ]
    )
    reply = cyclone_server.workers.CompleteMany(request)
    assert [r.WhichOneof("result") for r in reply.results] == ["response"] * len(steps)
    assert [p.checkouts - n for p, n in zip(holders, before, strict=True)] == [1, 1]
    assert {run_status(get_run(cyclone_server, r)) for r in ids} == {"completed"}
    # Sent again, each outcome is a duplicate, answered as such by its shard; one with
    # a token that was never handed out is refused alone, wherever it sits in the call.
    stale = worker_pb.CompleteRequest(
        run_id=steps[5].run_id, node=steps[5].node, lease_token=str(uuid.uuid4()), output=value(1)
    )
    request.completions.insert(3, stale)
    again = cyclone_server.workers.CompleteMany(request)
    kinds = [r.WhichOneof("result") for r in again.results]
    assert kinds == ["response"] * 3 + ["error"] + ["response"] * (len(steps) - 3)
    assert all(r.response.duplicate for r in again.results if r.HasField("response"))


def test_the_server_knows_a_runs_shard_from_its_id_and_submits_it_there(
    cyclone_server: Any,
) -> None:
    """A run's shard is computed from its id as Citus places it (uuid_hash and the
    shards' ranges), so a Submit goes straight to the node that holds the new run."""
    pool = cyclone_server.server.db.pool
    ids = [str(uuid.uuid4()) for _ in range(1000)]
    rows = cyclone_server.sql(
        "SELECT u::text, get_shard_id_for_distribution_column('cyclone.runs', u)"
        " FROM unnest(%s::uuid[]) u",
        ids,
    )
    assert {r: pool.shard_for(r) for r in ids} == {r: int(s) for r, s in rows}
    sent: list[tuple[int, str]] = []  # (node port, run id) of each run_submit sent
    nodes = {id(p): p for p in pool.nodes.values()}.values()
    for p in nodes:
        original = p._all

        async def recording(name: str, row: Any, _p: Any = p, _all: Any = original, **kw: Any):
            if name == "run_submit":
                sent.append((_node_port(_p), kw["run_id"]))
            return await _all(name, row, **kw)

        p._all = recording  # type: ignore[method-assign]
    try:
        submitted = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(12)]
    finally:
        for p in nodes:
            del p._all
    placed = cyclone_server.sql(
        "SELECT u::text, n.nodeport FROM unnest(%s::uuid[]) u"
        " JOIN pg_dist_placement p"
        "   ON p.shardid = get_shard_id_for_distribution_column('cyclone.runs', u)"
        " JOIN pg_dist_node n ON n.groupid = p.groupid",
        submitted,
    )
    assert sorted(sent) == sorted((port, run_id) for run_id, port in placed)
    steps = claim(cyclone_server, n=24)
    assert sorted(s.run_id for s in steps) == sorted(submitted)


def test_a_node_reads_its_own_copy_of_the_clock(cyclone_server: Any) -> None:
    """The functions that run on a node read the clock and the pauses from that node's
    copies (_here), by their shard's name, and see what cyclone.now() sees."""
    pool = cyclone_server.server.db.pool
    cyclone_server.advance_clock(3600)
    for port in sorted({_node_port(p) for p in pool.nodes.values()}):
        url = psycopg.conninfo.make_conninfo(cyclone_server.database_url, port=port)
        with psycopg.connect(url, autocommit=True) as conn:
            [([clock, pauses],)] = conn.execute("SELECT cyclone._here(ARRAY['clock', 'pauses'])")
            assert clock.startswith("cyclone.clock_") and pauses.startswith("cyclone.pauses_")
            [(here, now)] = conn.execute(
                f"SELECT statement_timestamp() + offset_by, cyclone.now() FROM {clock}"
            )
            assert here == now
            [(ahead,)] = conn.execute(f"SELECT offset_by >= interval '1 hour' FROM {clock}")
            assert ahead


def test_a_node_keeps_its_copies_names_for_the_session_and_finds_a_lost_one_again(
    cyclone_server: Any,
) -> None:
    """_here looks a copy's name up once per session (cyclone.here_<table>); a name that
    is no longer there (the schema made anew) is looked up again, and the prepared read
    of the clock (_now_here) sees what cyclone.now() sees."""
    pool = cyclone_server.server.db.pool
    for port in sorted({_node_port(p) for p in pool.nodes.values()}):
        url = psycopg.conninfo.make_conninfo(cyclone_server.database_url, port=port)
        with psycopg.connect(url, autocommit=True) as conn:
            [([clock],)] = conn.execute("SELECT cyclone._here(ARRAY['clock'])")
            [(kept,)] = conn.execute("SELECT current_setting('cyclone.here_clock')")
            assert kept == clock and clock.startswith("cyclone.clock_")
            conn.execute("SELECT set_config('cyclone.here_clock', 'cyclone.clock_1', false)")
            assert conn.execute("SELECT cyclone._here(ARRAY['clock'])").fetchall() == [([clock],)]
            [(kept,)] = conn.execute("SELECT current_setting('cyclone.here_clock')")
            assert kept == clock
            [(here, now)] = conn.execute("SELECT cyclone._now_here(), cyclone.now()")
            assert here == now


def test_a_nodes_claim_takes_each_shard_by_one_statement_and_a_moved_one_still_works(
    cyclone_server: Any,
) -> None:
    """step_claim_node takes each of its shards' runs with one prepared statement, on
    the node that holds them, without a call of step_claim_shard for each shard; sent to
    a node that does not hold them (a shard moved since the server's map was read),
    the same call still takes them, through step_claim_shard."""
    pool = cyclone_server.server.db.pool
    ids = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(40)]
    placed = _placements(cyclone_server)
    shard = {r: pool.shard_for(r) for r in ids}
    ports = sorted(set(placed.values()))
    assert len(ports) == 2
    for port in ports:
        here = [r for r in ids if placed[shard[r]] == port]
        assert len({shard[r] for r in here}) > 1, "the node's runs are on several shards"
        for target, path in ((port, "statement"), (next(p for p in ports if p != port), "shard")):
            taking = here[:3] if path == "statement" else here[3:6]
            url = psycopg.conninfo.make_conninfo(cyclone_server.database_url, port=target)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SET track_functions = 'all'")
                with conn.transaction():
                    rows = conn.execute(
                        "SELECT run_id::text FROM cyclone.step_claim_node("
                        "%s::uuid[], %s::text[], %s::bigint[], 'w1', '{}', '30s')",
                        (taking, ["a"] * len(taking), [shard[r] for r in taking]),
                    ).fetchall()
                    calls = dict(
                        conn.execute(
                            "SELECT funcname, calls FROM pg_stat_xact_user_functions"
                            " WHERE funcname IN ('step_claim_node', 'step_claim_shard')"
                        ).fetchall()
                    )
            assert sorted(r[0] for r in rows) == sorted(taking)  # shard by shard
            assert calls["step_claim_node"] == 1
            if path == "statement":
                assert "step_claim_shard" not in calls
            else:
                assert calls["step_claim_shard"] >= 1
    [(running,)] = cyclone_server.sql("SELECT count(*) FROM cyclone.steps WHERE status = 'running'")
    assert running == 12


def test_a_nodes_read_hands_a_worker_whose_lease_lapsed_nothing(cyclone_server: Any) -> None:
    """step_candidates_node checks the worker's health on the node's own copy of
    worker_health, by a prepared statement, before it reads: a worker marked there is
    handed nothing, the others their steps."""
    ids = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(8)]
    cyclone_server.sql(
        "INSERT INTO cyclone.worker_health (worker_id, unhealthy_since) VALUES ('lapsed', now())"
    )
    pool = cyclone_server.server.db.pool
    found: list[str] = []
    for port in sorted({_node_port(p) for p in pool.nodes.values()}):
        url = psycopg.conninfo.make_conninfo(cyclone_server.database_url, port=port)
        with psycopg.connect(url, autocommit=True) as conn:

            def read(worker: str) -> list[str]:
                rows = conn.execute(
                    "SELECT run_id::text FROM cyclone.step_candidates_node("
                    "%s, ARRAY['work'], 100, '{}', '{}', '{}')",
                    (worker,),
                ).fetchall()
                return [r[0] for r in rows]

            assert read("lapsed") == []
            found += read("well")
            assert read("lapsed") == []
    assert sorted(found) == sorted(ids)
    cyclone_server.sql("DELETE FROM cyclone.worker_health WHERE worker_id = 'lapsed'")
