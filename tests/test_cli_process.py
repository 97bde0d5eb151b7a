"""The `cyclone` command as a shell runs it: an unreachable server is one line that
says what was tried, a reader that goes away (`| head`) ends it quietly, waiting for a
run says by its exit status whether the run completed, following a run shows its steps
as they change (live on a terminal, a line per change elsewhere), colour only on a
terminal and never with NO_COLOR, and `cyclone logs` prints what handlers logged."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cyclone.v1 import types_pb2, worker_service_pb2
from tests.helpers import (
    claim,
    complete,
    fail,
    get_run,
    node,
    run_status,
    submit,
    value,
    workflow,
)
from tests.test_flow import _claim, _complete, _keyed, _submit

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


def test_a_console_port_out_of_range_or_taken_is_one_line_naming_the_setting():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for listen in ("127.0.0.1:70000", f"127.0.0.1:{port}"):
            done = subprocess.run(
                [str(CYCLONE), "console", "--listen", listen, "--address", "127.0.0.1:1"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 1, done.stderr
            assert "Traceback" not in done.stderr
            [line] = done.stderr.splitlines()
            assert line.startswith("cyclone: error: cannot serve the console on ")
            assert listen in line and "--listen" in line


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
    # Quietly, with the status of a program that SIGPIPE ends (docs/python-sdk.md), or
    # 0 when the pipe took all the output before head closed it: never 1, a failure.
    assert done.returncode in (0, 141), done.stderr
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


def _cli(server, *argv: str, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [str(CYCLONE), *argv, "--address", server.address],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_run_wait_follow_prints_each_change_of_a_step_as_it_happens(cyclone_server):
    run_id = submit(cyclone_server, workflow("followed", node("a"), node("b", deps=["a"])))
    follow = subprocess.Popen(
        [
            *(str(CYCLONE), "run", "wait", run_id, "--follow", "--timeout", "60"),
            *("--address", cyclone_server.address),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    seen: list[str] = []

    def until(*words: str) -> None:
        # Bounded: the command itself gives up after its --timeout and ends the stream.
        for line in follow.stdout:
            seen.append(line)
            if all(w in line.split() for w in words):
                return
        raise AssertionError(f"no line with {words} in {seen}")

    try:
        until("a", "available")
        [step] = claim(cyclone_server)
        until("a", "running")
        complete(cyclone_server, step, "ok")
        until("a", "completed")
        [step] = claim(cyclone_server)
        fail(cyclone_server, step, "for good", non_retryable=True)
        until("b", "discarded")
        rest, errors = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 2, errors
    output = "".join(seen) + rest
    assert "FAILED" in rest and "errors of b:" in rest
    assert "\x1b[" not in output  # piped: plain text


def test_wait_exit_status_is_2_for_a_blocked_run_and_1_on_timeout(cyclone_server):
    blocked = submit(cyclone_server, workflow("order", node("charge", action="charge")))
    claim(cyclone_server, "charge", unsafe=("charge",), lease=5)
    cyclone_server.advance_clock(6)
    assert cyclone_server.sweep() == 1
    assert claim(cyclone_server, "charge", unsafe=("charge",)) == []
    shown = _cli(cyclone_server, "run", "wait", blocked, "--timeout", "30", "--follow")
    assert shown.returncode == 2, shown.stderr
    assert "BLOCKED" in shown.stdout
    # The advice once, and the time to the second with its zone.
    assert shown.stdout.count("cyclone resolve") == 1
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", shown.stdout)

    running = submit(cyclone_server, workflow("slow", node("a")))
    late = _cli(cyclone_server, "run", "wait", running, "--timeout", "0.5", "--follow")
    assert late.returncode == 1 and "still running after 0.5s" in late.stderr


def test_colour_only_on_a_terminal_or_when_forced_and_never_with_no_color(cyclone_server):
    run_id = submit(cyclone_server, workflow("coloured", node("a")))
    [step] = claim(cyclone_server)
    fail(cyclone_server, step, "for good", non_retryable=True)
    piped = _cli(cyclone_server, "run", "show", run_id)
    assert piped.returncode == 0 and "FAILED" in piped.stdout and "\x1b[" not in piped.stdout
    forced = _cli(cyclone_server, "run", "show", run_id, env={"FORCE_COLOR": "1"})
    assert "\x1b[1;31mFAILED" in forced.stdout
    plain = _cli(cyclone_server, "run", "show", run_id, env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert "FAILED" in plain.stdout and not re.search(r"\x1b\[[0-9;]*3\dm", plain.stdout)


def test_on_a_terminal_run_wait_follows_live_by_default(cyclone_server):
    run_id = submit(cyclone_server, workflow("live", node("a")))
    [step] = claim(cyclone_server)
    complete(cyclone_server, step, "ok")
    leader, follower = pty.openpty()
    with subprocess.Popen(
        [
            *(str(CYCLONE), "run", "wait", run_id, "--timeout", "30"),
            *("--address", cyclone_server.address),
        ],
        stdout=follower,
        stderr=subprocess.PIPE,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "160"},
    ) as shown:
        os.close(follower)
        output = b""
        with contextlib.suppress(OSError):  # EIO: the command ended and closed its side
            while chunk := os.read(leader, 65536):
                output += chunk
        assert shown.wait(timeout=60) == 0
    os.close(leader)
    text = output.decode()
    assert "\x1b[?25l" in text  # the live view hid the cursor while it redrew
    assert "COMPLETED" in text and "\x1b[32mcompleted" in text


def test_cyclone_logs_prints_a_nodes_lines_by_attempt(cyclone_server):
    run_id = submit(cyclone_server, workflow("logged", node("a")))
    [first] = claim(cyclone_server)
    cyclone_server.workers.Heartbeat(
        worker_service_pb2.HeartbeatRequest(
            run_id=first.run_id,
            node="a",
            lease_token=first.lease_token,
            logs=[types_pb2.LogLine(level="INFO", message="try one", logger="shop")],
        )
    )
    fail(cyclone_server, first, "boom")
    cyclone_server.advance_clock(3600)
    [second] = claim(cyclone_server)
    cyclone_server.workers.Complete(
        worker_service_pb2.CompleteRequest(
            run_id=second.run_id,
            node="a",
            lease_token=second.lease_token,
            output=value("ok"),
            logs=[types_pb2.LogLine(level="WARNING", message="try two\nsecond line")],
        )
    )
    every = _cli(cyclone_server, "logs", run_id, "a")
    assert every.returncode == 0, every.stderr
    lines = every.stdout.splitlines()
    assert lines[0].split()[1:] == ["attempt", "1", "INFO", "shop:", "try", "one"]
    assert lines[1].split()[1:] == ["attempt", "2", "WARNING", "try", "two"]
    assert lines[2].strip() == "second line"
    second_only = _cli(cyclone_server, "logs", run_id, "a", "--attempt", "2", "--json")
    assert [line["message"] for line in json.loads(second_only.stdout)["logs"]] == [
        "try two\nsecond line"
    ]
    shown = _cli(cyclone_server, "run", "show", run_id)
    assert "logs of a:" in shown.stdout and "try one" in shown.stdout
    waited = _cli(cyclone_server, "run", "wait", run_id, "--timeout", "30")
    assert waited.returncode == 0 and "logs of a:" in waited.stdout
    followed = _cli(cyclone_server, "logs", run_id, "a", "--follow")
    assert followed.returncode == 0 and "try two" in followed.stdout


def _workflow_file(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nnodes:\n  - name: a\n")
    return str(path)


def test_ctrl_c_while_submit_follows_names_the_run_and_exits_130(cyclone_server, tmp_path):
    argv = [str(CYCLONE), "submit", _workflow_file(tmp_path, "interrupted"), "--wait", "120"]
    with subprocess.Popen(
        [*argv, "--follow", "--address", cyclone_server.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as follow:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # piped: the run id first, then step changes
        match = re.fullmatch(r"following run (\S+) \(.*\)\n", first)
        assert match, first
        run_id = match.group(1)
        follow.send_signal(signal.SIGINT)
        _, errors = follow.communicate(timeout=60)
    assert follow.returncode == 130, errors
    assert "Traceback" not in errors and "KeyboardInterrupt" not in errors
    [line] = errors.splitlines()
    assert f"run {run_id} goes on" in line
    assert line.endswith(f"cyclone run wait {run_id} --follow")
    assert run_status(get_run(cyclone_server, run_id)) == "running"


def test_ctrl_c_on_the_live_view_of_run_wait_names_the_run_and_exits_130(cyclone_server):
    run_id = submit(cyclone_server, workflow("interrupted-live", node("a")))
    leader, follower = pty.openpty()
    with subprocess.Popen(
        [str(CYCLONE), "run", "wait", run_id, "--address", cyclone_server.address],
        stdout=follower,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "160"},
    ) as waiting:
        os.close(follower)
        shown = b""
        while b"\x1b[?25l" not in shown:  # the live view is drawn: it is polling
            shown += os.read(leader, 65536)
        # At once: Ctrl-C may land while the view is still starting.
        waiting.send_signal(signal.SIGINT)
        _, errors = waiting.communicate(timeout=60)
    shown += _drain(leader)
    os.close(leader)
    assert waiting.returncode == 130, errors
    assert "Traceback" not in errors
    assert f"interrupted; run {run_id} goes on. Follow it again: cyclone run wait {run_id}" in (
        errors
    )
    assert shown.rfind(b"\x1b[?25h") > shown.find(b"\x1b[?25l")  # the cursor is back


def _drain(leader: int) -> bytes:
    """What is left to read on a pty whose other end has closed."""
    rest = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the other end is gone and all was read
            return rest
        if not chunk:
            return rest
        rest += chunk


def test_a_reader_that_goes_away_from_submit_follow_is_141_not_the_timeout_status(
    cyclone_server, tmp_path
):
    """1 means a call failed or timed out: a gone reader has the status of a program
    that SIGPIPE ended, as `set -o pipefail` reports for `yes | head`."""
    argv = [str(CYCLONE), "submit", _workflow_file(tmp_path, "headed"), "--wait", "120"]
    with subprocess.Popen(
        [*argv, "--follow", "--address", cyclone_server.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as follow:
        assert follow.stdout is not None and follow.stderr is not None
        assert follow.stdout.readline().startswith("following run ")
        follow.stdout.close()  # as `| head -1` does after its line
        [step] = claim(cyclone_server, "a")
        complete(cyclone_server, step, "ok")  # a change to print, then the run
        assert follow.wait(timeout=60) == 141
        errors = follow.stderr.read()
    assert errors == ""


def test_submit_follow_piped_to_head_in_a_shell_is_not_exit_1(cyclone_server, tmp_path):
    script = (
        f"'{CYCLONE}' submit '{_workflow_file(tmp_path, 'shell')}' --wait 120 --follow "
        f"--address {cyclone_server.address} | head -1; exit ${{PIPESTATUS[0]}}"
    )
    with subprocess.Popen(
        script, shell=True, executable="/bin/bash", stdout=subprocess.PIPE, text=True
    ) as shell:
        assert shell.stdout is not None
        assert shell.stdout.readline().startswith("following run ")  # head's one line
        # A worker finishes the run: the command writes again, to a reader gone.
        [step] = claim(cyclone_server, "a")
        complete(cyclone_server, step, "ok")
        assert shell.wait(timeout=60) == 141


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "list", "--limit", "-5"],
        ["runs", "list", "--limit", "0"],
        ["runs", "list", "--limit", "many"],
        ["run", "wait", "r1", "--timeout", "-1"],
        ["run", "wait", "r1", "--timeout", "nan"],
        ["logs", "r1", "a", "--attempt", "0"],
        ["builds", "runs", "b1", "--limit", "-1"],
        ["journal", "export", "--limit", "-1"],
        ["schedule", "list", "--limit", "0"],
        ["schedule", "create", "n", "f.yaml", "--every", "0"],
        ["submit", "f.yaml", "--wait", "-1"],
        ["submit", "f.yaml", "--priority", "2000000"],
    ],
    ids=lambda argv: " ".join(argv),
)
def test_a_count_or_time_out_of_range_is_a_usage_error_exit_2(argv):
    # No server: the arguments are refused before any call.
    done = subprocess.run(
        [str(CYCLONE), *argv, "--address", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "no runs" not in done.stdout and "Traceback" not in done.stderr
    flag = next(a for a in argv if a.startswith("--"))
    assert f"argument {flag}" in done.stderr


def test_run_show_says_a_ready_node_waits_for_a_slot_of_its_full_concurrency_key(
    cyclone_server,
):
    keyed = workflow("w", _keyed("n", "customer:{run.c}", 1))
    runs = [_submit(cyclone_server, keyed, input={"c": 7}) for _ in range(2)]
    [held] = _claim(cyclone_server, "work", 10)  # the key's one slot
    [waiting] = [r for r in runs if r != held.run_id]

    shown = _cli(cyclone_server, "run", "show", waiting)
    assert shown.returncode == 0, shown.stderr
    [row] = [line for line in shown.stdout.splitlines() if line.startswith("n ")]
    assert row.split()[1] == "waiting", row
    assert "waiting for a free slot of concurrency key 'customer:7' (it is full)" in row
    # The JSON is GetRun's, untouched; the run that holds the slot does not wait.
    as_json = json.loads(_cli(cyclone_server, "run", "show", waiting, "--json").stdout)
    assert [s["status"] for s in as_json["steps"]] == ["available"]
    assert "waiting" not in _cli(cyclone_server, "run", "show", held.run_id).stdout

    _complete(cyclone_server, held)  # the slot is free: the node is simply ready
    again = _cli(cyclone_server, "run", "show", waiting).stdout
    [row] = [line for line in again.splitlines() if line.startswith("n ")]
    assert row.split()[1] == "available" and "concurrency" not in row, row
