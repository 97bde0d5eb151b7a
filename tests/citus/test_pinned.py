"""A worker pinned to a node (ClaimRequest.shard_node, Worker(shard_node=...)): its
claims read and take the runs of that node's shards only, asking no other node; a
node that holds no shard, or a server that does not route, refuses it, saying why
(docs/scaling.md, "A worker pinned to a node")."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import grpc

from cyclone.v1 import worker_service_pb2 as worker_pb
from pyclient import Worker
from tests.conftest import TEST_SETTINGS, RunningServer
from tests.helpers import PATIENCE, eventually, node, rpc_error, submit, workflow


def _claim(server: Any, shard_node: str, n: int = 50) -> list[worker_pb.ClaimedStep]:
    request = worker_pb.ClaimRequest(
        worker_id=f"pinned-{shard_node}",
        actions=[worker_pb.ActionSpec(name="work")],
        max_steps=n,
        shard_node=shard_node,
    )
    return list(server.workers.Claim(request, timeout=30).steps)


def _nodes(server: Any) -> dict[str, set[int]]:
    """The nodes that hold shards of the runs, "host:port", and the shards of each."""
    rows = server.sql(
        "SELECT n.nodename || ':' || n.nodeport, s.shardid FROM pg_dist_shard s"
        " JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid)"
        " WHERE s.logicalrelid = 'cyclone.runs'::regclass AND n.noderole = 'primary'"
    )
    nodes: dict[str, set[int]] = {}
    for name, shard in rows:
        nodes.setdefault(name, set()).add(shard)
    return nodes


def _shards_of(server: Any, runs: list[str]) -> dict[str, int]:
    """Each run's shard, as Citus places it."""
    rows = server.sql(
        "SELECT r::text, get_shard_id_for_distribution_column('cyclone.runs', r)"
        " FROM unnest(%s::uuid[]) r",
        runs,
    )
    return dict(rows)


def test_a_pinned_claim_takes_only_its_nodes_runs_and_asks_no_other_node(
    cyclone_server: Any,
) -> None:
    runs = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(24)]
    shard = _shards_of(cyclone_server, runs)
    nodes = _nodes(cyclone_server)
    assert len(nodes) == 2
    pool = cyclone_server.server.db.pool
    taken: list[str] = []
    for name, shards in sorted(nodes.items()):
        mine = sorted(r for r in runs if shard[r] in shards)
        assert mine, f"no run on {name}: the test needs runs on both nodes"
        others = [p for p in pool.shard_holders() if p is not pool.named[name]]
        asked = [p.checkouts for p in others]
        steps = _claim(cyclone_server, name)
        assert sorted(s.run_id for s in steps) == mine
        assert [p.checkouts for p in others] == asked, f"a claim pinned to {name} asked another"
        taken += [s.run_id for s in steps]
    assert sorted(taken) == sorted(runs)


def test_a_pinned_claim_that_meets_a_keyed_step_keeps_to_its_node(cyclone_server: Any) -> None:
    """Steps with a concurrency key are read across shards (the key's limit holds
    across them), and a pinned claim keeps only its node's."""
    keyed = workflow("w", node("a"))
    keyed.nodes[0].concurrency.key = "tenant"
    keyed.nodes[0].concurrency.limit = 100
    runs = [submit(cyclone_server, keyed) for _ in range(16)]
    shard = _shards_of(cyclone_server, runs)
    for name, shards in sorted(_nodes(cyclone_server).items()):
        steps = _claim(cyclone_server, name)
        assert sorted(s.run_id for s in steps) == sorted(r for r in runs if shard[r] in shards)


def test_a_pinned_worker_drains_its_nodes_runs_and_leaves_the_others(
    cyclone_server: Any,
) -> None:
    runs = [submit(cyclone_server, workflow("w", node("a"))) for _ in range(24)]
    shard = _shards_of(cyclone_server, runs)
    name, shards = sorted(_nodes(cyclone_server).items())[0]
    mine = {r for r in runs if shard[r] in shards}
    worker = Worker(
        cyclone_server.address, shard_node=name, concurrency=4, lease=5.0, claim_wait=1.0
    )
    ran: list[str] = []
    worker.register("work", lambda ctx: ran.append(ctx.run_id))
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()
    try:
        eventually(lambda: set(ran) == mine, f"the runs of {name}'s shards done")
    finally:
        worker.stop()
        thread.join(PATIENCE)
    assert set(ran) == mine
    [(ready,)] = cyclone_server.sql(
        "SELECT count(*) FROM cyclone.steps"
        " WHERE status = 'available' AND run_id = ANY(%s::uuid[])",
        sorted(set(runs) - mine),
    )
    assert ready == len(runs) - len(mine), "the other node's runs were left ready"


def test_a_node_that_holds_no_shard_is_refused_naming_those_that_do(
    cyclone_server: Any,
) -> None:
    error = rpc_error(_claim, cyclone_server, "elsewhere:5432")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'elsewhere:5432'" in error.details()
    for name in _nodes(cyclone_server):
        assert name in error.details()


def test_a_server_that_does_not_route_refuses_a_pinned_claim(database_url: str) -> None:
    server = RunningServer(database_url, replace(TEST_SETTINGS, citus_route="off")).start()
    try:
        name = sorted(_nodes(server))[0]
        error = rpc_error(_claim, server, name)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "--citus-route" in error.details()
    finally:
        server.stop()
