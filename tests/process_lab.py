"""What the tests with real worker processes share: start, release, kill them, expire
the lease a killed one held on the fake clock, wait for a run, run the command line."""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client, Run, cli
from tests.helpers import PATIENCE

ROOT = Path(__file__).resolve().parent.parent
# Past any lease a killed worker held (2 s, extended by heartbeats to now + 2 s).
PAST_THE_LEASE = 10


@dataclass
class ProcessLab:
    server: Any
    client: Client
    logs: Path
    workers: list[subprocess.Popen] = field(default_factory=list, init=False)

    def spawn(self, argv: list[str], *, gated: bool = False) -> subprocess.Popen:
        """Start a worker script (``argv`` after the interpreter), its output in a log
        file; ``gated``: with a pipe on stdin, for :meth:`release`."""
        out = (self.logs / f"worker-{len(self.workers)}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, *argv],
            stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        out.close()
        self.workers.append(proc)
        return proc

    def release(self, proc: subprocess.Popen) -> None:
        """Let a gated worker start claiming."""
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.close()

    def kill(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(PATIENCE) == -signal.SIGKILL
        if proc.stdin and not proc.stdin.closed:
            proc.stdin.close()

    def kill_all(self) -> None:
        """Kill the workers still running and print their logs (shown when a test fails)."""
        for proc in self.workers:
            if proc.poll() is None:
                self.kill(proc)
        for log in sorted(self.logs.glob("worker-*.log")):
            print(f"--- {log.name}\n{log.read_text()}")

    def wait(self, run_id: str) -> Run:
        """The run once it is finished or blocked (polling often: these runs are quick)."""
        return self.client.wait(run_id, timeout=PATIENCE, poll_cap=0.05)

    def expire_leases(self) -> None:
        """Move the clock past the killed worker's lease; the sweep reclaims its step."""
        # A heartbeat the worker sent just before it died can still land after a move
        # and extend the lease from the new time: then move on once more.
        for _ in range(3):
            self.server.advance_clock(PAST_THE_LEASE)
            if self.server.sweep() == 1:
                return
        pytest.fail("the sweep did not reclaim the killed worker's step")

    def cli(self, *argv: str, actor: str = "carol") -> subprocess.CompletedProcess:
        """Run the ``cyclone`` command line's main() on the server; its exit status and
        output."""
        out, err = io.StringIO(), io.StringIO()
        full = ["--address", self.server.address, "--actor", actor, *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(full)
            except SystemExit as exc:  # argparse: --help, usage errors
                code = exc.code
        return subprocess.CompletedProcess(full, code, out.getvalue(), err.getvalue())
