"""The `cyclone` command as a shell runs it: an unreachable server is one line that
says what was tried, and a reader that goes away (`| head`) ends it quietly."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import node, submit, workflow

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
