"""Child runs with real worker processes killed with SIGKILL: a parent body killed just
after StartChild answered replays on another worker and gets the same child back,
never a second one (counted in the database, not from worker logs)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client
from tests.helpers import eventually
from tests.process_lab import ProcessLab

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("child_worker_process.py")


@dataclass
class Lab(ProcessLab):
    effects_file: Path

    def start_worker(self, *flags: str, gated: bool = False) -> subprocess.Popen:
        argv = [str(WORKER), self.server.address, str(self.effects_file), *flags]
        return self.spawn([*argv, *(["--gated"] if gated else [])], gated=gated)

    def lines(self, phase: str) -> list[dict[str, Any]]:
        text = self.effects_file.read_text()
        found = [json.loads(line) for line in text.splitlines(keepends=True) if line[-1] == "\n"]
        return [line for line in found if line["phase"] == phase]

    def children(self, run_id: str) -> list[str]:
        rows = self.server.sql(
            "SELECT run_id::text FROM cyclone.runs WHERE parent_run_id = %s::uuid", run_id
        )
        return [r[0] for r in rows]


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


def test_a_parent_killed_right_after_start_child_does_not_start_a_second(lab: Lab) -> None:
    run_id = lab.client.start("parent", {"n": 21})
    proc = lab.start_worker("--hang", "after-start")
    following = lab.start_worker(gated=True)
    [paused] = eventually(lambda: lab.lines("paused"), "the body to pass StartChild")
    lab.kill(proc)
    [child_id] = lab.children(run_id)
    assert paused["detail"] == child_id
    lab.expire_leases()

    lab.release(following)
    run = lab.wait(run_id)
    assert run.status == "completed", run
    # The replay started nothing: one child, the one the killed attempt started.
    assert lab.children(run_id) == [child_id]
    assert [line["detail"] for line in lab.lines("started")] == [child_id, child_id]
    assert len(lab.lines("effect")) == 2  # the body ran twice, the start happened once
    assert run.step("parent").output == {"child": child_id, "result": {"double": 42}}
    assert lab.client.get_run(child_id).parent_run_id == run_id
