"""examples/python runs as its README says, against a real server."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from pyclient import cli
from tests.helpers import PATIENCE, eventually

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_order_example_charges_once_per_order(cyclone_server, client, capsys):
    worker = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLES / "worker.py"),
            "--address",
            cyclone_server.address,
            "--database-url",
            cyclone_server.database_url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        submit = _load("submit")
        eventually(
            lambda: cyclone_server.sql("SELECT to_regclass('public.ledger') IS NOT NULL")[0][0],
            "the worker to create its tables",
        )
        assert submit.main(["--address", cyclone_server.address, "o-1"]) == "completed"
        assert submit.main(["--address", cyclone_server.address, "o-1"]) == "completed"
        out = capsys.readouterr().out
        assert out.count("submitted ") == 2 and "already submitted" in out
        assert "└─ audit" in out

        argv = ["--address", cyclone_server.address, "submit", str(EXAMPLES / "order.yaml")]
        assert cli.main([*argv, "--wait", str(PATIENCE)]) == 0
        assert "COMPLETED" in capsys.readouterr().out
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=PATIENCE)
    assert worker.returncode == 0, stderr
    ledger = cyclone_server.sql("SELECT node, amount FROM ledger ORDER BY amount")
    assert ledger == [("charge", 1500), ("charge", 4200)]
    assert cyclone_server.sql("SELECT count(*) FROM audit_log") == [(2,)]
    assert "mail to ada@example.com" in stderr


def test_refund_example_runs_its_durable_function_against_a_real_server(cyclone_server, capsys):
    """examples/python/refund.py: a worker process runs the body; start() prints the run
    with its journal, the flaky provider's failed tries and backoffs included."""
    address = cyclone_server.address
    worker = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "refund.py"), "worker", "--address", address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    failed = True
    try:
        refund = _load("refund")
        assert refund.main(["start", "o-1001", "--address", address]) == "completed"
        first = capsys.readouterr().out
        # Once per order: a second start is the same run, already done.
        assert refund.main(["start", "o-1001", "--address", address]) == "completed"
        again = capsys.readouterr().out
        failed = False
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=PATIENCE)
        if failed:  # printed with the failure
            print(f"the worker exited {worker.returncode}; its log:\n{stderr}")
    assert worker.returncode == 0, stderr
    run_id = first.split()[1]
    assert again.split()[1] == run_id
    assert "COMPLETED" in first
    journal = [line.split()[2:4] for line in first.splitlines() if line.lstrip().startswith("·")]
    assert journal == [
        ["list_items", "succeeded"],
        ["refund_item", "failed"],
        ["refund_item~2:backoff", "succeeded"],
        ["refund_item~2", "succeeded"],
        ["refund_item#2", "failed"],
        ["refund_item#2~2:backoff", "succeeded"],
        ["refund_item#2~2", "succeeded"],
        ["sleep", "succeeded"],
        ["notify", "succeeded"],
    ], first
    assert "mail: order o-1001 refunded 2000 in 2 refund(s)" in stderr
    assert stderr.count("refunded mug of o-1001") == 1


def test_agent_example_streams_its_draft_and_sends_it_once_approved_by_url(server_factory):
    """examples/python/agent.py: the draft's tokens reach the reader live, the approval
    URL the body hands out decides the run once, and the reply is sent once."""
    server = server_factory(http_listen="127.0.0.1:0")
    worker = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "agent.py"), "worker", "--address", server.address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    start = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "agent.py"), "start", "--address", server.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert start.stdout is not None
        lines = []
        for line in start.stdout:
            lines.append(line)
            if line.startswith("approve or reject: "):
                break
        url = lines[-1].removeprefix("approve or reject: ").strip()
        assert url.startswith(f"http://127.0.0.1:{server.server.http.port}/callbacks/"), lines
        body = json.dumps({"approved": True, "comment": "ok"}).encode()
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=PATIENCE) as answer:
            assert answer.status == 200
        out, _ = start.communicate(timeout=PATIENCE * 3)
    finally:
        if start.poll() is None:
            start.kill()
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=PATIENCE)
    assert start.returncode == 0, "".join(lines) + out
    printed = "".join(lines)
    assert "Thank you for asking about my broken order." in printed
    assert "run completed:" in out and '"sent": true' in out
    assert stderr.count("reply sent to") == 1, stderr
    run_id = lines[0].split()[1]
    [(stored, chunks)] = server.sql(
        "SELECT string_agg(data, '' ORDER BY pos), count(*) FROM cyclone.stream_chunks"
        " WHERE run_id = %s AND stream = 'tokens'",
        run_id,
    )
    assert chunks > 10 and printed.count(stored) == 1  # each token once, in order
