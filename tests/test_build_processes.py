"""A deploy with real worker processes of two builds side by side (tests/lab.py):
a durable body started on the old build waits for an event while the old workers stop
and the new ones start; it is not handed to the new build until an operator declares
it compatible, or moves the retired build's leftovers to it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cyclone.v1 import types_pb2
from tests.build_lab import BuildLab, build_lab_on
from tests.helpers import eventually

pytestmark = pytest.mark.slow

AVAILABLE = types_pb2.STEP_STATUS_AVAILABLE


@pytest.fixture
def lab(server_factory: Any, tmp_path: Path) -> Iterator[BuildLab]:
    with build_lab_on(server_factory(), tmp_path) as lab:
        yield lab


def started_on_old_build(lab: BuildLab) -> str:
    """A deploy run whose body build A began, now waiting for its event, with A's
    workers stopped: the state a deploy leaves a long body in."""
    old = lab.start("A")
    run_id = lab.client.start("deploy")
    eventually(lambda: lab.step(run_id, "deploy").waiting_for == "event go", "the body to wait")
    lab.stop(old)
    assert lab.step(run_id, "deploy").build_id == "A"
    return run_id


def listed(lab: BuildLab) -> dict[str, Any]:
    """cyclone builds list: each build known, by its id."""
    return {b["build_id"]: b for b in json.loads(lab.cli("builds", "list", "--json").stdout)}


def seen(lab: BuildLab, build: str) -> None:
    """Wait until a worker of ``build`` has claimed once: a build is known from then."""
    eventually(lambda: build in listed(lab), f"a worker of build {build} to claim")


def passed_over(lab: BuildLab, run_id: str) -> None:
    """The node is ready (its event came) and a probe submitted after that completed
    on the workers running now: they claimed after the node was ready, in claim order
    (oldest first), and still left it."""
    lab.client.send_event(run_id, "go")
    probe = lab.wait(lab.client.start("probe"))
    assert probe.status == "completed", probe
    step = lab.step(run_id, "deploy")
    assert (step.status, step.attempt, step.build_id) == (AVAILABLE, 1, "A")


def test_a_body_begun_on_one_build_waits_for_it_until_the_new_build_is_declared_compatible(
    lab: BuildLab,
) -> None:
    run_id = started_on_old_build(lab)
    lab.start("B")
    lab.start(None)  # a worker without a build leaves pinned nodes alone too
    seen(lab, "B")
    passed_over(lab, run_id)

    declared = lab.cli("builds", "compatible", "B", "--with", "A", "--reason", "same steps")
    assert declared.returncode == 0, declared.stderr
    run = lab.wait(run_id)
    assert run.status == "completed", run
    assert run.step("deploy").output == {"began": "A", "finished": "B"}

    retired = lab.cli("builds", "retire", "A")
    assert retired.returncode == 0, retired.stderr
    builds = listed(lab)
    assert builds["A"]["retired"] and builds["A"]["pinned_nodes"] == 0
    assert builds["B"]["compatible"] == ["A", "B"]


def test_a_retired_builds_leftover_is_listed_and_moved_to_the_new_build(
    lab: BuildLab,
) -> None:
    run_id = started_on_old_build(lab)
    lab.start("B")
    seen(lab, "B")
    passed_over(lab, run_id)

    assert lab.cli("builds", "retire", "A").returncode == 0
    runs = lab.cli("builds", "runs", "A")
    assert runs.returncode == 0 and run_id in runs.stdout, runs
    moved = lab.cli("builds", "move", "A", "B", "--json")
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout) == {"nodes_moved": 1, "runs_moved": 1}
    run = lab.wait(run_id)
    assert run.status == "completed", run
    assert run.step("deploy").output == {"began": "A", "finished": "B"}
    assert lab.step(run_id, "deploy").build_id == "B"


def test_a_deploy_of_a_patched_body_completes_every_run_and_only_new_runs_take_the_patch(
    lab: BuildLab,
) -> None:
    """Runs in flight on build A, waiting past the point of a patch; build B, whose
    body adds a step there behind patched(), starts and is declared compatible; A's
    workers stop. Every run completes: those A began replay on B down the old path,
    those B begins take the new one."""
    old = lab.start("A")
    in_flight = [lab.client.start("checkout") for _ in range(3)]
    for run_id in in_flight:
        eventually(lambda r=run_id: lab.step(r, "checkout").waiting_for == "event go", "a wait")

    lab.start("B", patched=True)
    seen(lab, "B")
    declared = lab.cli("builds", "compatible", "B", "--with", "A", "--reason", "patched")
    assert declared.returncode == 0, declared.stderr
    lab.stop(old)

    fresh = [lab.client.start("checkout") for _ in range(2)]
    for run_id in in_flight + fresh:
        lab.client.send_event(run_id, "go")
    for run_id in in_flight:
        run = lab.wait(run_id)
        assert run.status == "completed", run
        assert run.step("checkout").output == {"reserve": "A", "settle": "B"}
        assert lab.step(run_id, "checkout").build_id == "A"
    for run_id in fresh:
        run = lab.wait(run_id)
        assert run.status == "completed", run
        assert run.step("checkout").output == {"reserve": "B", "add_tax": "B", "settle": "B"}
        journal = [c.step_id for c in lab.step(run_id, "checkout").journal]
        assert "patch:add-tax" in journal, journal
