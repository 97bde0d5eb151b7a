"""The Go SDK against a real server: the Go tests named TestLive* (sdk/go/worker,
live_*_test.go) skip without a server; here they run on this test's server, with a
Go worker and the Go client talking to running work (output streams, queries and
updates, approvals). They need Go: `make test` leaves them out (marker `polyglot`).
GO_TEST_FLAGS adds flags to `go test` (GO_TEST_FLAGS=-race)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import missing_tool

pytestmark = [pytest.mark.slow, pytest.mark.polyglot, pytest.mark.timeout(600)]

GO_SDK = Path(__file__).resolve().parent.parent / "sdk" / "go"

#: Every live test: each must have run and passed, not been skipped.
LIVE_TESTS = {
    "TestLiveAStreamIsReadAsItIsWrittenUntilTheRunEnds",
    "TestLiveRefusalsCarryTheirStatusAndNameTheCall",
    "TestLiveABodyWaitsForTwoApprovalsAndSendsEachOnce",
    "TestLiveUpdatesChangeAWaitingBodyAndQueriesReadIt",
}


def test_the_go_sdk_live_tests_pass_on_a_real_server(cyclone_server):
    go = shutil.which("go")
    if go is None:
        missing_tool("go is not installed: the polyglot tests need Go")
    out = subprocess.run(
        [
            go,
            "test",
            *os.environ.get("GO_TEST_FLAGS", "").split(),
            "-count=1",
            "-v",
            "-run",
            "^TestLive",
            "./worker/",
        ],
        cwd=GO_SDK,
        env={**os.environ, "CYCLONE_TEST_ADDRESS": cyclone_server.address},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    passed = set(re.findall(r"--- PASS: (TestLive\w+)", out.stdout))
    assert passed == LIVE_TESTS, out.stdout
