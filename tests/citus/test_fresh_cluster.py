"""What a new user does with a cluster of their own: `make bench BENCH_ARGS="--citus URL"`
(docs/scaling.md) on a coordinator and a worker started afresh. The bench measures a
plain database on the coordinator's instance first, which creates Cyclone's role there
outside Citus, then migrates the Citus database, whose grants reach the worker: the
role must exist there too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests.citus.conftest import CLUSTER, ROOT, start_cluster

pytestmark = pytest.mark.slow


def test_the_documented_bench_command_runs_on_a_fresh_cluster() -> None:
    work = Path(tempfile.mkdtemp(prefix="cyclone-fresh-citus."))
    try:
        url, port = start_cluster(work, workers=1)
        out = work / "bench.json"
        command = ["bench/bench.py", "--citus", url, "--only", "throughput", "--runs", "300"]
        bench = subprocess.run(
            [sys.executable, *command, "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        results = json.loads(out.read_text())
        assert results["single"]["throughput"]["steps"] == 300
        assert results["citus"]["throughput"]["steps"] == 300
        worker = url.replace(str(port), str(port + 1))
        with psycopg.connect(worker) as conn:
            role = conn.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = 'cyclone_worker'"
            ).fetchall()
        assert role == [("cyclone_worker",)]
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)
