"""Worker processes: graceful shutdown on SIGTERM, and reconnecting to a restarted server."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pyclient import Client, Workflow
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running

pytestmark = pytest.mark.slow

WORKER_SCRIPT = Path(__file__).with_name("worker_process.py")


def _one_node(seconds: float) -> Workflow:
    wf = Workflow("job")
    wf.node("work", input=seconds)
    return wf


def test_sigterm_mid_batch_finishes_the_batch_and_loses_no_run(
    cyclone_server, client, make_worker, tmp_path
):
    run_ids = [client.submit(_one_node(0.5)) for _ in range(8)]
    log = tmp_path / "calls.log"
    log.touch()
    proc = subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT), cyclone_server.address, str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        eventually(lambda: log.read_text().count("start") == 4, "a full batch of 4 handlers")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=PATIENCE)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    lines = log.read_text().splitlines()
    started = {line.split()[1] for line in lines if line.startswith("start")}
    ended = {line.split()[1] for line in lines if line.startswith("end")}
    assert len(started) == 4
    assert ended == started  # every handler in flight was allowed to finish
    for run_id in run_ids:
        step = client.get_run(run_id).step("work")
        if run_id in started:
            assert (step.status, step.attempt) == ("completed", 1)
        else:  # never claimed: still there for the next worker
            assert (step.status, step.attempt) == ("available", 0)

    worker = make_worker(concurrency=4)
    worker.register("work", lambda ctx: "ok")
    with running(worker):
        runs = [client.wait(run_id, timeout=PATIENCE) for run_id in run_ids]
    assert [r.status for r in runs] == ["completed"] * 8
    assert {r.step("work").attempt for r in runs} == {1}  # nothing was claimed and dropped


def test_worker_reconnects_after_the_server_restarts(cyclone_server, server_process, make_worker):
    first = server_process("--grace", "0")
    address = first.address
    calls: list[str] = []
    worker = make_worker(claim_wait=1.0)
    worker.address = address
    worker.register("work", lambda ctx: calls.append(ctx.run_id) or "ok")
    with running(worker), Client(cyclone_server.address) as client:
        before = client.submit(_one_node(0))
        assert client.wait(before, timeout=PATIENCE).status == "completed"

        first.stop()
        during = client.submit(_one_node(0))  # through the other server, same database
        eventually(
            lambda: client.get_run(during).step("work").status == "available",
            "the run to wait while the worker's server is down",
        )
        server_process("--grace", "0", "--listen", address)
        assert client.wait(during, timeout=PATIENCE).status == "completed"
    assert calls == [before, during]
