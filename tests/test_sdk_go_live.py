"""The Go SDK against a real server: the Go tests named TestLive* (sdk/go/worker,
live_*_test.go) skip without a server; here they run on this test's server, with a
Go worker and the Go client talking to running work (output streams, queries and
updates, approvals); and a Go worker resumes a body a Python worker began, replaying
its approval and updates. They need Go: `make test` leaves them out (marker `polyglot`).
GO_TEST_FLAGS adds flags to `go test` (GO_TEST_FLAGS=-race)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client, Worker, wait_for_approval, wait_for_event
from tests.helpers import eventually, missing_tool
from tests.sdk.conftest import running

pytestmark = [pytest.mark.slow, pytest.mark.polyglot, pytest.mark.timeout(600)]

GO_SDK = Path(__file__).resolve().parent.parent / "sdk" / "go"

#: Every live test: each must have run and passed, not been skipped.
LIVE_TESTS = {
    "TestLiveAStreamIsReadAsItIsWrittenUntilTheRunEnds",
    "TestLiveRefusalsCarryTheirStatusAndNameTheCall",
    "TestLiveABodyWaitsForTwoApprovalsAndSendsEachOnce",
    "TestLiveUpdatesChangeAWaitingBodyAndQueriesReadIt",
}


def _go_test(server, run: str, **env: str) -> subprocess.CompletedProcess:
    go = shutil.which("go")
    if go is None:
        missing_tool("go is not installed: the polyglot tests need Go")
    return subprocess.run(
        [
            go,
            "test",
            *os.environ.get("GO_TEST_FLAGS", "").split(),
            "-count=1",
            "-v",
            "-run",
            run,
            "./worker/",
        ],
        cwd=GO_SDK,
        env={**os.environ, "CYCLONE_TEST_ADDRESS": server.address, **env},
        capture_output=True,
        text=True,
        timeout=540,
    )


def test_the_go_sdk_live_tests_pass_on_a_real_server(cyclone_server):
    out = _go_test(cyclone_server, "^TestLive")
    assert out.returncode == 0, out.stdout + out.stderr
    passed = set(re.findall(r"--- PASS: (TestLive\w+)", out.stdout))
    assert passed == LIVE_TESTS, out.stdout


def _python_cart_worker(address: str, sent: list[str]) -> Worker:
    worker = Worker(address, concurrency=2, lease=5.0, claim_wait=1.0, shutdown_grace=5.0)

    @worker.workflow("shared_cart")
    def shared_cart(ctx: Any, user: str) -> dict[str, Any]:
        items: list[str] = []

        @ctx.query("items")
        def _items() -> list[str]:
            return list(items)

        @ctx.update("add_item")
        def _add(item: str) -> int:
            items.append(item)
            return len(items)

        decision = wait_for_approval(lambda a: sent.append(a.approval_id), title="cart")
        wait_for_event("checkout")
        return {"user": user, "items": items, "approved": decision["approved"]}

    return worker


def test_a_go_worker_resumes_a_body_a_python_worker_began(cyclone_server):
    # The Python body creates its approval, applies an update at its wait, and waits.
    sent: list[str] = []
    with (
        running(_python_cart_worker(cyclone_server.address, sent)),
        Client(cyclone_server.address) as client,
    ):
        run_id = client.start("shared_cart", "ann")
        eventually(lambda: len(sent) == 1, "the Python body to send its approval")
        assert client.update(run_id, "shared_cart", "add_item", "tea").result == 1
    # The Go body (the same in Go: sdk/go/worker/live_shared_test.go) replays the
    # approval without sending it, and the update, then finishes the run.
    out = _go_test(cyclone_server, "^TestResumesACartBegunInPython$", CYCLONE_TEST_RUN_ID=run_id)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "--- PASS: TestResumesACartBegunInPython" in out.stdout, out.stdout
    with Client(cyclone_server.address) as client:
        run = client.get_run(run_id)
        assert run.status == "completed"
        journal = [(e.step_id, e.function) for e in run.step("shared_cart").journal]
        assert journal[:3] == [
            ("approval", "cyclone.approval"),
            ("approval.wait", "cyclone.event"),
            (journal[2][0], "cyclone.update"),
        ]
        assert [f for _, f in journal[3:]] == ["cyclone.update", "cyclone.event"]
        assert len(sent) == 1
