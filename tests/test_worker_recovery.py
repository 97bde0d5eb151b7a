"""Lost and frozen workers, with real worker processes (tests/lost_worker_process.py).

A worker killed with SIGKILL, or stopped with SIGSTOP, while it runs a durable body
leaves a lease that lapses with no outcome. That is not a failure of the body: the
attempt counts against the server's recovery budget (--max-recoveries), never against
the node's retry policy, and the worker whose lease lapsed is handed nothing more
until it reports again. Leases run out on the fake clock (advance_clock, then a sweep);
nothing here sleeps or times anything.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cyclone.v1 import workflow_service_pb2
from pyclient import Client, RetryPolicy, Workflow
from tests.helpers import eventually
from tests.process_lab import PAST_THE_LEASE, ProcessLab

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("lost_worker_process.py")


@dataclass
class Lab(ProcessLab):
    effects_file: Path
    release_file: Path

    def start_worker(self, worker_id: str, *flags: str) -> subprocess.Popen:
        argv = [str(WORKER), self.server.address, str(self.effects_file)]
        return self.spawn([*argv, "--worker-id", worker_id, *flags])

    def lines(self) -> list[dict[str, Any]]:
        text = self.effects_file.read_text()
        return [json.loads(line) for line in text.splitlines(keepends=True) if line[-1] == "\n"]

    def paused(self, worker_id: str) -> bool:
        return any(
            line["phase"] == "paused" and line["worker"] == worker_id for line in self.lines()
        )

    def submit(self, n: int = 1) -> str:
        """A run of ``hold`` whose node may fail 3 times (the retry budget)."""
        wf = Workflow("hold")
        wf.node("hold", retry=RetryPolicy(max_attempts=3, initial_backoff=0.1, max_backoff=0.1))
        return self.client.submit(wf, {"n": n})

    def lose(self, worker_id: str, sweep: Any) -> None:
        """Start worker ``worker_id``, let it reach the pause in the body, kill it and let
        its lease lapse; ``sweep``: a sweep, returning how many leases it reclaimed."""
        proc = self.start_worker(worker_id, "--hang")
        eventually(lambda: self.paused(worker_id), f"{worker_id} to reach the pause")
        # A safe call's end is sent without waiting: kill once it is recorded.
        recorded = "SELECT count(*) FROM cyclone.step_calls WHERE status = 'succeeded'"
        eventually(lambda: self.server.sql(recorded) == [(1,)], "first's end to be recorded")
        self.kill(proc)
        self.lapse(sweep)

    def lapse(self, sweep: Any) -> None:
        """Move the clock past the lease (not the step's deadline) and sweep."""
        for _ in range(3):  # a heartbeat sent just before the kill may extend it once
            self.server.advance_clock(PAST_THE_LEASE)
            if sweep() == 1:
                return
        pytest.fail("the sweep did not reclaim the lost worker's lease")

    def unhealthy(self) -> dict[str, bool]:
        """ListWorkers: each listed worker and whether it is marked unhealthy."""
        listed = self.server.workflows.ListWorkers(workflow_service_pb2.ListWorkersRequest())
        for w in listed.workers:
            assert w.HasField("unhealthy_since") == w.unhealthy, w
        return {w.worker_id: w.unhealthy for w in listed.workers}


def _lab(server: Any, tmp_path: Path) -> Iterator[Lab]:
    effects_file = tmp_path / "effects.jsonl"
    effects_file.touch()
    with Client(server.address, actor="sdk-operator") as client:
        lab = Lab(server, client, tmp_path, effects_file, tmp_path / "release")
        try:
            yield lab
        finally:
            if lab.workers:
                for proc in lab.workers:  # a stopped process must run to die
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGCONT)
            lab.kill_all()


@pytest.fixture
def lab(server_factory, tmp_path) -> Iterator[Lab]:
    yield from _lab(server_factory(), tmp_path)


@pytest.fixture
def lab_budget_2(server_factory, tmp_path) -> Iterator[Lab]:
    yield from _lab(server_factory(max_recoveries=2), tmp_path)


def test_a_body_whose_worker_is_killed_three_times_still_completes(lab):
    run_id = lab.submit()
    for i in range(3):
        lab.lose(f"doomed-{i}", lab.server.sweep)
    lab.start_worker("survivor")
    run = lab.wait(run_id)
    assert run.status == "completed", run
    assert run.steps[0].output == {"a": 2, "worker": "survivor"}
    [step] = run.steps
    # Four claims, three of them lost their worker: the retry budget is untouched.
    assert (step.attempt, step.recoveries, step.max_attempts) == (4, 3, 3)
    assert [(e.attempt, e.kind, e.type, e.retryable) for e in step.errors] == [
        (i, "lease_expired", "WorkerLost", True) for i in (1, 2, 3)
    ]
    for i, e in enumerate(step.errors):
        assert e.worker_lost
        assert f"worker doomed-{i} lost" in e.message
        assert f"recovery {i + 1} of 10" in e.message
    # The step function before the pause ran once: the later attempts replayed it.
    assert [line["worker"] for line in lab.lines() if line["step"] == "first"] == ["doomed-0"]

    shown = lab.cli("run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "attempt 4 (try 1 of 3, 3 of 10 worker lost)" in shown.stdout
    error_lines = [line for line in shown.stdout.splitlines() if "WorkerLost" in line]
    assert len(error_lines) == 3
    assert all("worker lost" in line for line in error_lines)
    assert "doomed-2" in error_lines[2]


def test_a_step_that_loses_its_worker_past_the_recovery_budget_is_discarded(lab_budget_2):
    lab = lab_budget_2
    run_id = lab.submit()

    def server_sweep() -> int:
        # The server's own sweep, which passes its --max-recoveries (2 here).
        return int(lab.server.call(lab.server.server.sweep))

    for i in range(3):
        lab.lose(f"doomed-{i}", server_sweep)
    run = lab.wait(run_id)
    assert run.status == "failed", run
    [step] = run.steps
    assert step.status == "discarded"
    # Three attempts, all lost: none counted against the retry policy (3 attempts).
    assert (step.attempt, step.recoveries, step.max_attempts, step.max_recoveries) == (3, 3, 3, 2)
    assert [(e.type, e.retryable) for e in step.errors] == [
        ("WorkerLost", True),
        ("WorkerLost", True),
        ("WorkerLost", False),
    ]
    last = step.errors[-1].message
    assert "worker doomed-2 lost" in last
    assert "past the recovery budget of 2" in last
    assert "--max-recoveries" in last
    assert run.error is not None and run.error.node == "hold"


def test_a_frozen_worker_is_handed_nothing_until_it_reports_again(lab):
    frozen = lab.start_worker(
        "frozen", "--hang", "--concurrency", "4", "--release-file", str(lab.release_file)
    )
    first = lab.submit()
    eventually(lambda: lab.paused("frozen"), "the frozen worker to hold the body")
    # Stopped with its Work stream open and 3 slots of credit unused.
    frozen.send_signal(signal.SIGSTOP)
    # A message the worker wrote just before it stopped is read by the server first, as
    # it would be long before a real lease lapses (here it lapses at once, by the test
    # clock); read after the lapse, it would rightly count as a sign of life.
    time.sleep(1.0)
    lab.lapse(lab.server.sweep)
    # Ready steps, and no healthy worker yet: the frozen one's open stream and credit
    # must not take them.
    later = [lab.submit(n) for n in (2, 3, 4)]
    lab.start_worker("healthy-1", "--concurrency", "2")
    lab.start_worker("healthy-2", "--concurrency", "2")
    for run_id in [first, *later]:
        run = lab.wait(run_id)
        assert run.status == "completed", run
        assert run.steps[0].output["worker"] in ("healthy-1", "healthy-2")
    held = lab.server.sql(
        "SELECT run_id::text, attempt, worker_id FROM cyclone.steps WHERE worker_id = 'frozen'"
    )
    assert held == []
    # Only its one claim: the first attempt of the first run, lost without a failure.
    ran = {(line["run_id"], line["attempt"]) for line in lab.lines() if line["worker"] == "frozen"}
    assert ran == {(first, 1)}
    [step] = lab.client.get_run(first).steps
    assert (step.attempt, step.recoveries) == (2, 1)
    assert [(e.attempt, e.type) for e in step.errors] == [(1, "WorkerLost")]
    assert "worker frozen lost" in step.errors[0].message
    # Listed as marked; the healthy workers may be listed too (seen asking for work), unmarked.
    assert {w for w, marked in lab.unhealthy().items() if marked} == {"frozen"}

    # It wakes up, its body ends and it reports (the lease is gone: refused), which
    # shows it is alive: the mark is cleared and it may be handed steps again.
    frozen.send_signal(signal.SIGCONT)
    lab.release_file.touch()
    eventually(lambda: not lab.unhealthy().get("frozen", False), "the mark to be cleared")
    assert lab.server.sql("SELECT count(*) FROM cyclone.worker_health") == [(0,)]
    assert frozen.poll() is None
