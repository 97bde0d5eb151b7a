"""Worker processes of several builds side by side, as a deploy runs them: start one
per build (its build id in CYCLONE_BUILD_ID, as a deployment sets it), stop one as a
deploy stops the old workers (SIGTERM: it finishes what it holds), and read a node's
pin. :func:`build_lab_on` gives one on a server, for a test module's fixture:

    @pytest.fixture
    def lab(server_factory, tmp_path):
        with build_lab_on(server_factory(), tmp_path) as lab:
            yield lab

    def test_deploy(lab):
        old = lab.start("v1")
        ...
        lab.stop(old)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyclient import Client
from tests.helpers import PATIENCE, get_run
from tests.process_lab import ROOT, ProcessLab

WORKER = Path(__file__).with_name("build_worker_process.py")


@dataclass
class BuildLab(ProcessLab):
    def start(self, build: str | None, *, patched: bool = False) -> subprocess.Popen:
        """A worker process of ``build`` (None: a worker that declares none) serving the
        actions of tests/build_worker_process.py; ``patched``: its code has the patch
        of the ``checkout`` body."""
        env = {k: v for k, v in os.environ.items() if k != "CYCLONE_BUILD_ID"}
        env["CYCLONE_TEST_PATCHED"] = "1" if patched else "0"
        if build is not None:
            env["CYCLONE_BUILD_ID"] = build
        out = (self.logs / f"worker-{len(self.workers)}-{build}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), self.server.address],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
        )
        out.close()
        self.workers.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen) -> None:
        """Stop a worker as a deploy does (SIGTERM); it exits once its slots are free."""
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(PATIENCE) == 0

    def step(self, run_id: str, node: str) -> Any:
        """The node as GetRun shows it (status, attempt, waiting_for, build_id)."""
        [found] = [s for s in get_run(self.server, run_id).steps if s.node == node]
        return found


@contextlib.contextmanager
def build_lab_on(server: Any, logs: Path) -> Iterator[BuildLab]:
    """A lab on ``server``, its workers' logs under ``logs``; the workers still running
    at the end are killed and their logs printed (shown when the test fails)."""
    with Client(server.address, actor="deployer") as client:
        lab = BuildLab(server, client, logs)
        try:
            yield lab
        finally:
            lab.kill_all()
