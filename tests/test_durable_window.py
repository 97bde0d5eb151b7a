"""The window of one call, with real worker processes killed with SIGKILL: a safe step
call's record is durable before the body's next step call runs its function, so a
crash runs again at most the call the body was in, never one it moved past.

The worker (tests/window_worker_process.py) appends a line, synced to disk, for each
call of a step function, and holds each batch of step call ends a while before sending
it (--slow-ends), as a slow network or a busy server would: the records are on their
way when the body goes on. The body ``s1(); s2(); hold()`` is killed inside ``hold``;
a second worker replays it.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client
from tests.helpers import eventually
from tests.process_lab import ProcessLab

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("window_worker_process.py")


@dataclass
class Lab(ProcessLab):
    effects_file: Path

    def start_worker(self, *flags: str, gated: bool = False) -> subprocess.Popen:
        argv = [str(WORKER), self.server.address, str(self.effects_file), *flags]
        return self.spawn([*argv, *(["--gated"] if gated else [])], gated=gated)

    def lines(self) -> list[dict[str, Any]]:
        text = self.effects_file.read_text()
        return [json.loads(line) for line in text.splitlines(keepends=True) if line[-1] == "\n"]

    def effects(self) -> Counter[str]:
        return Counter(line["step"] for line in self.lines() if line["phase"] == "effect")

    def killed_in_hold(self, action: str, *flags: str) -> str:
        """A run of ``action`` whose first worker is SIGKILLed inside ``hold``, replayed
        to its end by a second worker; its run id."""
        first = self.start_worker("--hold", *flags)
        following = self.start_worker(gated=True)
        run_id = self.client.start(action)
        eventually(lambda: any(line["phase"] == "paused" for line in self.lines()), "hold")
        self.kill(first)
        self.expire_leases()
        self.release(following)
        run = self.wait(run_id)
        assert run.status == "completed", run
        assert run.step(action).output == 3
        return run_id


@pytest.fixture
def lab(server_factory, tmp_path) -> Iterator[Lab]:
    server = server_factory()
    effects_file = tmp_path / "effects.jsonl"
    effects_file.touch()
    with Client(server.address, actor="sdk-operator") as client:
        lab = Lab(server, client, tmp_path, effects_file)
        try:
            yield lab
        finally:
            lab.kill_all()


@pytest.mark.parametrize("action", ["two_then_hold", "two_then_hold_async"])
def test_a_crash_never_runs_again_a_safe_call_the_body_moved_past(lab, action):
    lab.killed_in_hold(action, "--slow-ends", "1")

    # s1 and s2 were recorded before hold ran: the replay returned their values. Only
    # the call the body was in when the worker died ran again.
    assert lab.effects() == {"s1": 1, "s2": 1, "hold": 2}


@pytest.mark.parametrize("action", ["two_then_hold", "two_then_hold_async"])
def test_record_async_steps_may_run_again_after_the_body_moved_past_them(lab, action):
    # Their records never reach the server before the kill (held for longer than the
    # test lasts), and the body did not wait for them: both calls run again.
    lab.killed_in_hold(action, "--record", "async", "--slow-ends", "3600")

    assert lab.effects() == {"s1": 2, "s2": 2, "hold": 2}
