"""A step's retries with a real worker process killed with SIGKILL during a backoff:
the next worker resumes the durable wait and goes on counting the tries, so the step
runs no more tries than its policy allows."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client
from tests.helpers import eventually, get_run
from tests.process_lab import ProcessLab
from tests.test_durable_processes import STATUS

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("policy_worker_process.py")
#: Past the backoffs of the step (an hour, then two), on the fake clock.
HOUR = 3600


@dataclass
class Lab(ProcessLab):
    effects_file: Path

    def start_worker(self, *, gated: bool = False) -> subprocess.Popen:
        argv = [str(WORKER), self.server.address, str(self.effects_file)]
        return self.spawn([*argv, *(["--gated"] if gated else [])], gated=gated)

    def tries(self) -> list[dict[str, Any]]:
        text = self.effects_file.read_text()
        return [json.loads(line) for line in text.splitlines(keepends=True) if line[-1] == "\n"]

    def journal(self, run_id: str) -> list[tuple[str, str]]:
        [found] = get_run(self.server, run_id).steps
        return [(c.step_id, STATUS[c.status]) for c in found.journal]


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


def test_a_worker_killed_during_a_backoff_leaves_the_next_one_to_go_on_counting(lab):
    run_id = lab.client.start("flaky_order", "o-1")
    first = lab.start_worker()
    following = lab.start_worker(gated=True)
    # The first try failed and the body sleeps its backoff: the node gave up its lease.
    eventually(
        lambda: lab.journal(run_id) == [("charge", "failed"), ("charge~2:backoff", "waiting")],
        "the first backoff",
    )
    lab.kill(first)
    lab.release(following)

    # The hour passes (on the fake clock): the next worker replays the failed try and
    # the finished wait, runs the second try, and sleeps the second backoff.
    lab.server.advance_clock(HOUR + 60)
    eventually(
        lambda: lab.journal(run_id)[-1] == ("charge~3:backoff", "waiting"), "the second backoff"
    )
    lab.server.advance_clock(2 * HOUR + 60)
    run = lab.wait(run_id)

    assert run.status == "completed" and run.step("flaky_order").output == "charged o-1"
    assert lab.journal(run_id) == [
        ("charge", "failed"),
        ("charge~2:backoff", "succeeded"),
        ("charge~2", "failed"),
        ("charge~3:backoff", "succeeded"),
        ("charge~3", "succeeded"),
    ]
    tries = lab.tries()
    # Three tries in all, the policy's count, each once: none ran again after the kill.
    assert [t["step_id"] for t in tries] == ["charge", "charge~2", "charge~3"]
    assert tries[0]["pid"] == first.pid
    assert {t["pid"] for t in tries[1:]} == {following.pid}
