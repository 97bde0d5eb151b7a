"""Unsafe-to-repeat actions with real worker processes killed with SIGKILL.

The worker (tests/unsafe_worker_process.py) appends a line to a calls file, synced to
disk, for each call of its handlers: an effect that no Cyclone transaction can roll
back. A first worker is killed mid-handler; its lease runs out on the fake clock
(advance_clock + sweep, no sleeping); a second worker claims, and the run is blocked
until an operator resolves it through the SDK or the CLI.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from pyclient import Client, FailedPrecondition, NotFound, Workflow
from tests.helpers import PATIENCE, eventually
from tests.process_lab import ProcessLab

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("unsafe_worker_process.py")
# The installed console script, so the test runs what an operator runs.
CLI = Path(sys.executable).with_name("cyclone")


def order_workflow() -> Workflow:
    wf = Workflow("order")
    charge = wf.node("charge", timeout=60)
    wf.node("receipt", depends_on=charge)
    wf.node("refund", depends_on=charge, trigger_rule="one_failed")
    return wf


def idle_workflow() -> Workflow:
    """A workflow whose action no worker here serves: its run stays running."""
    wf = Workflow("other")
    wf.node("nobody_serves_this")
    return wf


@dataclass
class Lab(ProcessLab):
    calls_file: Path

    def start_worker(
        self, mode: str = "effect", *, safe: bool = False, gated: bool = False
    ) -> subprocess.Popen:
        flags = (["--safe"] if safe else []) + (["--gated"] if gated else [])
        argv = [str(WORKER), self.server.address, str(self.calls_file), mode]
        return self.spawn([*argv, *flags], gated=gated)

    def call_lines(self) -> list[dict[str, Any]]:
        """Every call the handlers made, in order."""
        text = self.calls_file.read_text()
        return [json.loads(line) for line in text.splitlines(keepends=True) if line[-1] == "\n"]

    def calls(self, node: str = "charge", phase: str | None = None) -> list[tuple]:
        """(attempt, phase, detail) of each call of ``node``'s handler, in order."""
        return [
            (c["attempt"], c["phase"], c["detail"])
            for c in self.call_lines()
            if c["node"] == node and phase in (None, c["phase"])
        ]

    def crash(self, mode: str, *, safe_next: bool = False) -> tuple[str, subprocess.Popen]:
        """Submit an order; a worker runs charge to ``mode``'s hang and is SIGKILLed; its
        lease expires. Returns the run id and the next worker (gated, not yet claiming;
        ``safe_next``: its code no longer marks charge unsafe)."""
        run_id = self.client.submit(order_workflow(), {"order_id": "o-1"})
        proc = self.start_worker(mode)
        following = self.start_worker("effect", safe=safe_next, gated=True)
        phase = "effect" if mode == "hang-after" else "entered"
        eventually(lambda: self.calls("charge", phase), f"charge to reach {phase!r}")
        self.kill(proc)
        self.expire_leases()
        step = self.client.get_run(run_id).step("charge")
        # The sweep alone decides nothing: the step waits for the next claim.
        assert (step.status, step.effect_uncertain) == ("available", True)
        return run_id, following

    def blocked(self, mode: str = "hang-after") -> str:
        """A run whose charge crashed in ``mode`` and was then blocked at the claim of
        the next worker (which keeps running)."""
        run_id, following = self.crash(mode)
        self.release(following)
        assert self.wait(run_id).status == "blocked"
        return run_id

    def snapshot(self) -> dict[str, list[tuple]]:
        """Every row Cyclone keeps, and every call the handlers made."""
        tables = {
            "runs": "cyclone.runs ORDER BY run_id",
            "steps": "cyclone.steps ORDER BY run_id, node",
            "step_errors": "cyclone.step_errors ORDER BY run_id, node, at, attempt",
            "audit": "cyclone.audit ORDER BY id",
        }
        rows = {name: self.server.sql(f"SELECT * FROM {query}") for name, query in tables.items()}
        return {**rows, "calls": self.call_lines()}


@pytest.fixture
def lab(cyclone_server, tmp_path) -> Iterator[Lab]:
    calls_file = tmp_path / "calls.jsonl"
    calls_file.touch()
    assert CLI.exists(), f"the cyclone command is not installed next to {sys.executable}"
    with Client(cyclone_server.address, actor="sdk-operator") as client:
        lab = Lab(cyclone_server, client, tmp_path, calls_file)
        try:
            yield lab
        finally:
            lab.kill_all()


def test_a_worker_killed_mid_handler_leaves_its_run_blocked_with_effect_uncertain(
    lab, cyclone_server, caplog
):
    idle = lab.client.submit(idle_workflow())
    with caplog.at_level(logging.INFO, logger="cyclone"):
        run_id, following = lab.crash("hang-after")
        started_at = lab.client.get_run(run_id).step("charge").started_at
        lab.release(following)
        run = lab.wait(run_id)
        # Logged just after the claim commits, so possibly after wait() saw the block.
        eventually(
            lambda: [r for r in caplog.records if "blocked" in r.getMessage()],
            "the blocked warning",
        )

    assert run.status == "blocked"
    assert (run.error.kind, run.error.node, run.error.attempt) == ("EffectUncertain", "charge", 1)
    assert run.error.started_at == started_at
    assert "node charge" in run.error.message and "attempt 1" in run.error.message
    assert [(s.node, s.status) for s in run.steps] == [
        ("charge", "uncertain"),
        ("receipt", "pending"),
        ("refund", "pending"),
    ]
    # started_at is the claim's time, before the handler's first line ran.
    [entered] = [c for c in lab.call_lines() if c["phase"] == "entered"]
    assert started_at.timestamp() <= entered["at"]
    assert lab.calls() == [(1, "entered", None), (1, "effect", None)]

    # A holding state, not a failure: one warning naming the run, node and attempt.
    blocked = [r for r in caplog.records if "blocked" in r.getMessage()]
    assert [r.levelno for r in blocked] == [logging.WARNING]
    assert (blocked[0].run_id, blocked[0].node, blocked[0].attempt) == (run_id, "charge", 1)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    # Nothing moves it: not the sweep, however late, nor the worker that is waiting.
    cyclone_server.advance_clock(3600)
    assert cyclone_server.sweep() == 0
    assert lab.client.get_run(run_id).status == "blocked"

    listed = lab.cli("runs", "list", "--status", "blocked", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in json.loads(listed.stdout)] == [run_id]
    everything = lab.cli("runs", "list", "--json")
    assert {r["run_id"] for r in json.loads(everything.stdout)} == {run_id, idle}


def test_resolve_result_records_the_value_and_runs_downstream(lab):
    run_id = lab.blocked()
    value = {"charge_id": "ch-from-the-psp"}
    lab.client.resolve(run_id, "charge", result=value, reason="charge found at the PSP")
    run = lab.wait(run_id)

    assert run.status == "completed"
    assert run.step("charge").output == value
    assert lab.calls() == [(1, "entered", None), (1, "effect", None)]  # called once
    assert lab.calls("receipt") == [(1, "effect", {"charge": value})]
    assert run.step("refund").status == "skipped"
    [entry] = run.audit
    assert (entry.action, entry.node, entry.actor, entry.reason) == (
        "resolve_result",
        "charge",
        "sdk-operator",
        "charge found at the PSP",
    )
    assert entry.details == {"attempt": 1, "value": value}
    assert entry.at is not None


def test_resolve_error_from_the_cli_fails_the_step_and_runs_the_failure_rule(lab):
    run_id = lab.blocked()
    done = lab.cli(
        "resolve", run_id, "charge", "--error", "card declined", "--reason", "PSP says declined"
    )
    assert done.returncode == 0, done.stderr
    run = lab.wait(run_id)

    assert run.status == "failed"
    assert (run.error.kind, run.error.node) == ("StepDiscarded", "charge")
    charge = run.step("charge")
    assert charge.status == "discarded"
    assert (charge.last_error.kind, charge.last_error.message) == ("resolved", "card declined")
    assert lab.calls() == [(1, "entered", None), (1, "effect", None)]  # called once
    assert [p for _, p, _ in lab.calls("refund")] == ["effect"]
    assert run.step("receipt").status == "skipped" and lab.calls("receipt") == []
    [entry] = run.audit
    assert (entry.action, entry.actor, entry.reason) == (
        "resolve_error",
        "carol",
        "PSP says declined",
    )

    # `cyclone run show` shows the resolution: when, which, on what, by whom, why.
    shown = lab.cli("run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    [line] = [ln.strip() for ln in shown.stdout.splitlines() if "resolve_error" in ln]
    at = entry.at.astimezone()  # shown in the local zone, named
    assert line == (
        f"{at:%Y-%m-%d %H:%M:%S} {at.tzname()}  resolve_error charge by carol: PSP says declined"
    )


def test_resolve_discard_from_the_cli_runs_the_handler_again(lab):
    run_id = lab.blocked()
    done = lab.cli("resolve", run_id, "charge", "--discard", "--reason", "no charge at the PSP")
    assert done.returncode == 0, done.stderr
    assert "RUNNING" in done.stdout.splitlines()[0]  # it prints the run, back in play
    run = lab.wait(run_id)

    assert run.status == "completed"
    assert (run.step("charge").attempt, run.step("charge").output) == (2, {"charge_id": "ch-2"})
    # Called twice: the effect of the first call happened, and now once more.
    assert [(a, p) for a, p, _ in lab.calls()] == [
        (1, "entered"),
        (1, "effect"),
        (2, "entered"),
        (2, "effect"),
    ]
    assert lab.calls("receipt") == [(1, "effect", {"charge": {"charge_id": "ch-2"}})]
    assert [(a.action, a.actor) for a in run.audit] == [("resolve_discard", "carol")]


def test_a_false_alarm_resolved_with_discard_runs_the_effect_exactly_once(lab):
    # Killed after the claim, before the effect: the run is blocked all the same.
    run_id = lab.blocked("hang-before")
    assert lab.calls() == [(1, "entered", None)]
    lab.client.resolve(run_id, "charge", discard=True, reason="nothing at the PSP")
    run = lab.wait(run_id)

    assert run.status == "completed"
    assert [(a, p) for a, p, _ in lab.calls()] == [(1, "entered"), (2, "entered"), (2, "effect")]
    assert len(lab.calls("charge", "effect")) == 1


def test_removing_the_unsafe_mark_re_executes_the_step(lab):
    # The next worker registers the same action without the mark.
    run_id, following = lab.crash("hang-after", safe_next=True)
    lab.release(following)
    run = lab.wait(run_id)

    assert run.status == "completed"
    charge = run.step("charge")
    assert (charge.attempt, charge.output) == (2, {"charge_id": "ch-2"})
    assert [e.kind for e in charge.errors] == ["lease_expired"]
    assert len(lab.calls("charge", "effect")) == 2  # at least once again
    assert run.audit == ()


def test_resolving_what_is_not_blocked_or_not_uncertain_is_refused_and_changes_nothing(lab):
    running = lab.client.submit(idle_workflow())
    run_id = lab.blocked()
    before = lab.snapshot()

    with pytest.raises(FailedPrecondition, match="not uncertain") as refused:
        lab.client.resolve(run_id, "receipt", result=1, reason="wrong node")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(FailedPrecondition, match="not blocked"):
        lab.client.resolve(running, "nobody_serves_this", discard=True, reason="not blocked")
    with pytest.raises(NotFound):
        lab.client.resolve(run_id, "no_such_node", discard=True, reason="typo")
    by_cli = lab.cli("resolve", run_id, "refund", "--discard", "--reason", "wrong node")
    assert by_cli.returncode == 1
    assert "refund is pending, not uncertain" in by_cli.stderr
    assert lab.snapshot() == before

    # Once resolved, the run is no longer blocked: a second resolution is refused.
    lab.client.resolve(run_id, "charge", result={"charge_id": "x"}, reason="found it")
    assert lab.wait(run_id).status == "completed"
    after = lab.snapshot()
    again = lab.cli("resolve", run_id, "charge", "--discard", "--reason", "once more")
    assert again.returncode == 1
    assert "is completed, not blocked" in again.stderr
    assert lab.snapshot() == after


def test_two_operators_resolving_at_once_one_wins_the_other_is_refused(lab):
    run_id = lab.blocked()
    for proc in lab.workers:  # nothing else may move the run while they race
        if proc.poll() is None:
            lab.kill(proc)
    argv = {
        "alice": ["--result", '{"charge_id": "ch-alice"}', "--reason", "alice checked"],
        "bob": ["--discard", "--reason", "bob checked"],
    }
    command = [str(CLI), "--address", lab.server.address, "resolve", run_id, "charge"]
    procs = {
        actor: subprocess.Popen(
            [*command, "--actor", actor, *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for actor, flags in argv.items()
    }
    outcomes = {}
    for actor, proc in procs.items():
        _, err = proc.communicate(timeout=PATIENCE)
        outcomes[actor] = (proc.returncode, err)

    winners = [actor for actor, (code, _) in outcomes.items() if code == 0]
    assert len(winners) == 1, outcomes
    [loser] = set(argv) - set(winners)
    assert outcomes[loser][0] == 1
    assert "not blocked" in outcomes[loser][1]
    run = lab.client.get_run(run_id)
    [entry] = run.audit
    assert entry.actor == winners[0]
    charge = run.step("charge")
    if winners == ["alice"]:
        assert (charge.status, charge.output) == ("completed", {"charge_id": "ch-alice"})
    else:
        assert (charge.status, charge.effect_uncertain) == ("available", False)
