"""The grpcurl pages run as written against a live server: docs/grpcurl.md and the
README's first example.

Every ```sh block is cut into commands. The commands run in order in one bash
process, as in a reader's terminal, so variables and functions carry over from one
command to the next. The address the pages use becomes the test server's. A command
under a comment that says "fails with <Code>" must be refused with that gRPC code;
every other command must succeed. Where the page sleeps (a reader waits for a lease or
a backoff to run out), the test moves the server's clock forward and runs the recovery
sweep (and a schedule firing pass) instead, so it never sleeps and does not depend on
the sweep's timing.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from cyclone.v1 import (
    admin_service_pb2,
    schedule_service_pb2,
    worker_service_pb2,
    workflow_service_pb2,
)
from tests.conftest import ROOT

DOC_ADDRESS = "127.0.0.1:50051"
FENCE = re.compile(r"^```sh\n(.*?)^```", re.M | re.S)
EXPECT = re.compile(r"#.*\bfails with (\w+)")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1")
SLEEP = re.compile(r"sleep (\d+(?:\.\d+)?)")
CAPTURE = re.compile(r"([A-Za-z_]\w*)=\$\(")


@dataclass(frozen=True)
class Command:
    text: str
    line: int  # where the command starts in its page
    expect: str | None  # the gRPC code the page says it fails with


def _complete(text: str) -> bool:
    if text.endswith("\\"):
        return False
    check = subprocess.run(["bash", "-n"], input=text + "\n", capture_output=True, text=True)
    return check.returncode == 0


def commands(markdown: str) -> list[Command]:
    """The commands of every ```sh block, with the comments written above each."""
    found = []
    for block in FENCE.finditer(markdown):
        first_line = markdown.count("\n", 0, block.start(1)) + 1
        notes: list[str] = []
        lines: list[str] = []
        start = first_line
        delimiter = None
        for offset, line in enumerate(block.group(1).splitlines()):
            if not lines:
                if not line.strip():
                    continue
                if line.lstrip().startswith("#"):
                    notes.append(line)
                    continue
                start = first_line + offset
            lines.append(line)
            if delimiter:
                if line.strip() != delimiter:
                    continue
                delimiter = None
            elif here := HEREDOC.findall(line):
                delimiter = here[-1][1]
                continue
            text = "\n".join(lines)
            if _complete(text):
                expect = next((m.group(1) for n in notes if (m := EXPECT.search(n))), None)
                found.append(Command(text, start, expect))
                notes, lines = [], []
        assert not lines, f"unfinished command at line {start}: {lines}"
    return found


def section(markdown: str, heading: str) -> str:
    """The text under a '## ' heading, up to the next one."""
    _, found, rest = markdown.partition(f"\n## {heading}\n")
    assert found, f"no section {heading!r}"
    return rest.split("\n## ", 1)[0]


class Shell:
    """One bash process that is fed one command after another, like a terminal."""

    def __init__(self, env: dict[str, str], scratch: Path) -> None:
        self.out = scratch / "stdout"
        self.err = scratch / "stderr"
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
        self.run("set -o pipefail")

    def run(self, text: str, timeout: float = 60) -> tuple[int, str, str]:
        """Run one command; its exit status, stdout and stderr."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        marker = f"__docs_rc_{uuid.uuid4().hex}__"
        script = f'{{\n{text}\n}} >"{self.out}" 2>"{self.err}"\necho "{marker}$?"\n'
        self.proc.stdin.write(script.encode())
        self.proc.stdin.flush()
        fd = self.proc.stdout.fileno()
        seen = b""
        deadline = time.monotonic() + timeout
        while not (done := re.search(marker.encode() + rb"(\d+)\n", seen)):
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no answer from bash after {timeout}s: {text}"
            chunk = os.read(fd, 65536)
            assert chunk, f"bash exited: {seen.decode(errors='replace')}"
            seen += chunk
        noise = seen[: done.start()].decode(errors="replace")
        return int(done.group(1)), self.out.read_text(), noise + self.err.read_text()

    def value(self, name: str) -> str:
        status, out, _ = self.run(f'printf %s "${name}"')
        assert status == 0
        return out

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()


# Stands in for jq where it is not installed: `jq [-r] PATH`, PATH made of .name and [n].
JQ_STAND_IN = """\
import json, re, sys

args = sys.argv[1:]
raw = "-r" in args
filters = [a for a in args if not a.startswith("-")] or ["."]
if len(filters) != 1 or not re.fullmatch(r"\\.|(\\.[A-Za-z_]\\w*|\\[\\d+\\])+", filters[0]):
    sys.exit(f"jq stand-in: only paths like .a.b[0].c are supported, not {filters}")
value = json.load(sys.stdin)
for name, index in re.findall(r"\\.([A-Za-z_]\\w*)|\\[(\\d+)\\]", filters[0]):
    if name:
        value = value.get(name) if isinstance(value, dict) else None
    else:
        value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
print(value if raw and isinstance(value, str) else json.dumps(value, indent=2))
"""


def jq_stand_in(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "jq"
    path.write_text(f"#!{sys.executable}\n{JQ_STAND_IN}")
    path.chmod(0o755)
    return path


def shell_env(grpcurl: str, scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BASH_ENV", "ENV", "CDPATH")}
    path = [str(Path(grpcurl).parent), env.get("PATH", "")]
    if shutil.which("jq") is None:
        path.append(str(jq_stand_in(scratch / "bin").parent))  # last: a real jq wins
    env["PATH"] = os.pathsep.join(path)
    return env


def run_page(name: str, text: str, server, shell: Shell) -> list[Command]:
    """Run every command of a page in order, checking each outcome."""
    found = commands(text)
    assert found, f"{name} has no commands"
    for command in found:
        where = f"{name}:{command.line}: {command.text}"
        if sleep := SLEEP.fullmatch(command.text.strip()):
            # Second by second, firing due schedules as a server's loop would on time.
            left = float(sleep.group(1))
            while left > 0:
                server.advance_clock(min(1.0, left))
                server.fire_schedules()
                left -= 1.0
            server.sweep()
            continue
        status, out, err = shell.run(command.text.replace(DOC_ADDRESS, server.address))
        if command.expect:
            assert status != 0, f"{where}\nshould fail with {command.expect}, but:\n{out}"
            assert f"Code: {command.expect}" in err, f"{where}\n{err}"
            continue
        assert status == 0, f"{where}\nexit status {status}:\n{err}{out}"
        if capture := CAPTURE.match(command.text):
            kept = shell.value(capture.group(1))
            assert kept and kept != "null", f"{where}\nleft {capture.group(1)} = {kept!r}"
    return found


def step_states(server, run_id: str) -> dict[str, tuple[str, int]]:
    rows = server.sql("SELECT node, status, attempt FROM cyclone.steps WHERE run_id = %s", run_id)
    return {node: (status, attempt) for node, status, attempt in rows}


def run_status(server, run_id: str) -> str:
    return server.sql("SELECT status FROM cyclone.runs WHERE run_id = %s", run_id)[0][0]


def audit(server, run_id: str) -> list[tuple[str, str]]:
    rows = server.sql(
        "SELECT action, actor FROM cyclone.audit WHERE run_id = %s ORDER BY id", run_id
    )
    return [(action, actor) for action, actor in rows]


def test_every_command_of_the_grpcurl_page_works_as_written(cyclone_server, grpcurl, tmp_path):
    page = (ROOT / "docs" / "grpcurl.md").read_text()
    shell = Shell(shell_env(grpcurl, tmp_path), tmp_path)
    try:
        ran = run_page("docs/grpcurl.md", page, cyclone_server, shell)
        names = ("RUN", "RUN_A", "RUN_B", "RUN_C", "RUN_D", "RUN_E", "RUN_F", "RUN_W")
        ids = {name: shell.value(name) for name in names}
    finally:
        shell.close()

    # Every RPC of the four services appears, and every operator action names its actor.
    text = "\n".join(c.text for c in ran)
    modules = (workflow_service_pb2, worker_service_pb2, admin_service_pb2, schedule_service_pb2)
    for module in modules:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                assert f"{service.full_name}/{method.name}" in text, method.full_name
    for command in ran:
        if "AdminService/" in command.text or "CancelRun" in command.text:
            assert "-H 'cyclone-actor: " in command.text, command.text
    assert any(" list" in c.text for c in ran) and any(" describe " in c.text for c in ran)
    assert {c.expect for c in ran} >= {"Aborted", "FailedPrecondition"}

    # The story ends as the page says.
    assert run_status(cyclone_server, ids["RUN"]) == "completed"
    # The step a Work stream took, completed by the report of a second stream.
    assert run_status(cyclone_server, ids["RUN_W"]) == "completed"
    assert step_states(cyclone_server, ids["RUN_W"]) == {"only": ("completed", 1)}
    assert step_states(cyclone_server, ids["RUN"]) == {
        "charge": ("completed", 1),
        "receipt": ("completed", 3),
        "ship": ("completed", 2),
        "refund": ("skipped", 0),
        "audit": ("completed", 1),
    }
    assert audit(cyclone_server, ids["RUN"]) == [("retry", "alice"), ("retry_all", "alice")]
    for key in ("RUN_A", "RUN_B"):
        assert run_status(cyclone_server, ids[key]) == "running"
    assert {n: s for n, (s, _) in step_states(cyclone_server, ids["RUN_A"]).items()} == {
        "charge": "completed",
        "receipt": "available",
        "refund": "skipped",
    }
    [(output,)] = cyclone_server.sql(
        "SELECT output FROM cyclone.steps WHERE run_id = %s AND node = 'charge'", ids["RUN_A"]
    )
    assert output == {"charge_id": "ch_2001"}
    assert {n: s for n, (s, _) in step_states(cyclone_server, ids["RUN_B"]).items()} == {
        "charge": "discarded",
        "receipt": "skipped",
        "refund": "available",
    }
    assert run_status(cyclone_server, ids["RUN_C"]) == "cancelled"
    assert audit(cyclone_server, ids["RUN_C"]) == [("resolve_discard", "bob"), ("cancel", "carol")]
    # The durable function's journal: the resolved charge and the first receipt stand.
    assert run_status(cyclone_server, ids["RUN_D"]) == "completed"
    assert step_states(cyclone_server, ids["RUN_D"]) == {"fulfil": ("completed", 3)}
    journal = cyclone_server.sql(
        "SELECT step_id, status, unsafe, output, attempt FROM cyclone.step_calls"
        " WHERE run_id = %s ORDER BY seq",
        ids["RUN_D"],
    )
    assert journal == [
        ("reserve", "succeeded", False, {"reservation": "r-3001"}, 1),
        ("charge", "succeeded", True, {"charge_id": "ch_3001"}, 1),
        ("receipt", "succeeded", False, "sent", 3),
    ]
    assert audit(cyclone_server, ids["RUN_D"]) == [("resolve_result", "bob")]
    # The schedule fired once after its minute, and is gone; its run stays.
    runs = cyclone_server.sql("SELECT submit_key, input FROM cyclone.runs WHERE workflow = 'stock'")
    assert [(k.startswith("schedule:stock-check:20"), i) for k, i in runs] == [
        (True, {"warehouse": "north"})
    ]
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.schedules") == [(0,)]
    # The waits: a sleep and an event, two resumes.
    assert run_status(cyclone_server, ids["RUN_E"]) == "completed"
    assert step_states(cyclone_server, ids["RUN_E"]) == {"remind": ("completed", 3)}
    assert cyclone_server.sql(
        "SELECT step_id, status, output FROM cyclone.step_calls WHERE run_id = %s ORDER BY seq",
        ids["RUN_E"],
    ) == [("sleep", "succeeded", None), ("event:confirmed", "succeeded", {"by": "dave"})]
    assert audit(cyclone_server, ids["RUN_E"]) == [("send_event", "dave")]
    # The approval: decided once, by alice; the body got the decision.
    assert run_status(cyclone_server, ids["RUN_F"]) == "completed"
    assert audit(cyclone_server, ids["RUN_F"]) == [
        ("send_event", "alice"),
        ("decide_approval", "alice"),
    ]
    [(decision,)] = cyclone_server.sql("SELECT decision FROM cyclone.approvals")
    assert decision == {"approved": True, "comment": "fine", "decided_by": "alice"}
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.webhooks") == [(0,)]


def test_the_readme_example_works_as_written(cyclone_server, grpcurl, tmp_path):
    readme = (ROOT / "README.md").read_text()
    shell = Shell(shell_env(grpcurl, tmp_path), tmp_path)
    try:
        run_page(
            "README.md", section(readme, "A first workflow with grpcurl"), cyclone_server, shell
        )
        run_id = shell.value("RUN")
    finally:
        shell.close()
    assert run_status(cyclone_server, run_id) == "completed"


def test_the_jq_stand_in_reads_paths_like_jq(tmp_path):
    jq = jq_stand_in(tmp_path)
    reply = '{"steps": [{"leaseToken": "t-1", "n": 2}], "runId": "r-1"}'

    def run(*args: str) -> str:
        return subprocess.run(
            [str(jq), *args], input=reply, capture_output=True, text=True, check=True
        ).stdout

    assert run("-r", ".runId") == "r-1\n"
    assert run("-r", ".steps[0].leaseToken") == "t-1\n"
    assert run(".steps[0].n") == "2\n"
    assert run("-r", ".missing") == "null\n"
    assert run("-r", ".steps[3].leaseToken") == "null\n"
    refused = subprocess.run(
        [str(jq), ".steps[] | .n"], input=reply, capture_output=True, text=True
    )
    assert refused.returncode != 0
