"""The `cyclone` command as a shell runs it: an unreachable server is one line that
says what was tried, a reader that goes away (`| head`) ends it quietly, and waiting
for a run says by its exit status whether the run completed."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import claim, complete, fail, node, submit, workflow

CYCLONE = Path(sys.executable).with_name("cyclone")


def test_an_unreachable_server_is_named_with_what_to_check():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    done = subprocess.run(
        [str(CYCLONE), "runs", "list", "--address", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert f"cannot reach a Cyclone server at 127.0.0.1:{port}" in done.stderr
    assert "CYCLONE_ADDRESS" in done.stderr and "Traceback" not in done.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(cyclone_server):
    for _ in range(300):
        submit(cyclone_server, workflow("piped", node("a")))
    done = subprocess.run(
        f"'{CYCLONE}' runs list --limit 300 --address {cyclone_server.address} | head -1;"
        " exit ${PIPESTATUS[0]}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and len(done.stdout.splitlines()) == 1


def _wait(server, run_id: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CYCLONE), "run", "wait", run_id, "--timeout", "30", "--address", server.address],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_wait_exits_0_for_a_completed_run_and_2_for_a_failed_one(cyclone_server):
    done = submit(cyclone_server, workflow("settles", node("a")))
    [step] = claim(cyclone_server)
    complete(cyclone_server, step, "ok")
    failed = submit(cyclone_server, workflow("settles", node("a")))
    [step] = claim(cyclone_server)
    fail(cyclone_server, step, "for good", non_retryable=True)

    completed = _wait(cyclone_server, done)
    assert completed.returncode == 0, completed.stderr
    assert "COMPLETED" in completed.stdout
    refused = _wait(cyclone_server, failed)
    assert refused.returncode == 2, refused.stderr
    assert "FAILED" in refused.stdout
