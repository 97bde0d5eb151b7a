"""A worker node of the cluster down: calls for runs on its shards fail fast with
UNAVAILABLE and name nothing of the cluster, the runs on the other node go on, and when
it is back nothing was lost and nothing ran twice (docs/scaling.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import grpc
import psycopg
import pytest

from cyclone.v1 import worker_service_pb2, workflow_service_pb2
from service.migrate import migrate
from tests.citus.conftest import CLUSTER, start_cluster
from tests.conftest import TEST_SETTINGS, RunningServer
from tests.helpers import claim, node, rpc_error, submit, value, workflow

pytestmark = pytest.mark.slow

PG_CTL = Path(os.environ.get("PG15_BIN", "/usr/lib/postgresql/15/bin")) / "pg_ctl"


def _pg_ctl(*args: str) -> None:
    as_owner = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
    subprocess.run([*as_owner, str(PG_CTL), *args], check=True, cwd="/", capture_output=True)


def _complete_all(server: RunningServer, steps: list) -> list:
    reply = server.workers.CompleteMany(
        worker_service_pb2.CompleteManyRequest(
            completions=[
                worker_service_pb2.CompleteRequest(
                    run_id=s.run_id, node=s.node, lease_token=s.lease_token, output=value(1)
                )
                for s in steps
            ]
        )
    )
    return [r.WhichOneof("result") for r in reply.results]


def test_runs_on_the_nodes_that_are_up_go_on_and_the_rest_resume_once() -> None:
    work = Path(tempfile.mkdtemp(prefix="cyclone-node-down."))
    server = None
    try:
        url, port = start_cluster(work, workers=2)
        migrate(url, citus="on", citus_shards=4)
        server = RunningServer(url, TEST_SETTINGS).start()
        runs = [submit(server, workflow("w", node("a"))) for _ in range(24)]
        with psycopg.connect(url) as conn:
            placed = dict(
                conn.execute(
                    "SELECT r.run_id::text, n.nodeport FROM cyclone.runs r"
                    "  JOIN pg_dist_placement p ON p.shardid ="
                    "       get_shard_id_for_distribution_column('cyclone.runs', r.run_id)"
                    "  JOIN pg_dist_node n ON n.groupid = p.groupid"
                ).fetchall()
            )
        up = {r for r in runs if placed[r] == port + 1}
        down = {r for r in runs if placed[r] == port + 2}
        assert up and down and up | down == set(runs)

        _pg_ctl("-D", str(work / f"node{port + 2}"), "-m", "immediate", "-w", "stop")
        steps = claim(server, n=100)
        assert {s.run_id for s in steps} == up
        assert set(_complete_all(server, steps)) == {"response"}

        # A call for a run on the node that is down: UNAVAILABLE, naming nothing of it.
        gone = sorted(down)[0]
        err = rpc_error(server.workflows.GetRun, workflow_service_pb2.GetRunRequest(run_id=gone))
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        for internal in (str(port + 2), "127.0.0.1", "remote node", "connection"):
            assert internal not in err.details(), err.details()
        # A waiting claim is not held up either: it answers when its wait is over.
        assert claim(server, n=100, wait=1) == []

        _pg_ctl("-D", str(work / f"node{port + 2}"), "-l", str(work / "back.log"), "-w", "start")
        steps = claim(server, n=100)
        assert {s.run_id for s in steps} == down
        assert set(_complete_all(server, steps)) == {"response"}
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT r.status, s.attempt, count(*) FROM cyclone.runs r"
                " JOIN cyclone.steps s USING (run_id) GROUP BY 1, 2"
            ).fetchall()
        assert rows == [("completed", 1, len(runs))], "each ran once"
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["bash", str(CLUSTER), "stop", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)
