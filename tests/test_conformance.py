"""The conformance suite (tests/conformance/README.md): every scenario of
tests/conformance/scenarios.yaml on a worker process of each language of
tests/conformance/languages.py, on a real server; and each scenario in which a second
worker finishes what a first one started, with the two in every pair of languages.

A scenario is data: a workflow, a script of what the test does, and what must hold
at the end. This file only interprets it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from itertools import pairwise, permutations
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyclient import Client, Workflow
from tests.conformance.languages import LANGUAGES, ROOT
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(300)

SCENARIOS: list[dict[str, Any]] = yaml.safe_load(
    (ROOT / "tests" / "conformance" / "scenarios.yaml").read_text()
)
CYCLONE_CLI = Path(sys.executable).with_name("cyclone")
#: Upper bound of any wait; reached only when something is broken.
PATIENCE = 30.0
#: The workers' lease (seconds); `expire` moves the server's clock well past it.
LEASE = 5.0
#: The exit status of a worker's planned crash.
CRASHED = 3
LEDGER_TABLE = "CREATE TABLE conformance_ledger (run_id uuid, node text, entry text, attempt int)"


def _takes_over(scenario: dict[str, Any]) -> bool:
    return {"worker": "second"} in scenario["script"]


def _cases() -> Iterator[Any]:
    """Each scenario in each language and, for a takeover, each pair. A case with a
    worker in another language than Python is marked polyglot: `make test-all` runs
    those in its main suite only, which builds the Go and TypeScript workers once, and
    not also in the suites it runs beside it (two builds of one checkout at a time
    would rewrite the TypeScript worker under each other's running processes)."""
    for scenario in SCENARIOS:
        for name in LANGUAGES:
            yield pytest.param(
                scenario, name, name, id=f"{scenario['name']}-{name}", marks=_marks(name)
            )
        if _takes_over(scenario):
            for first, second in permutations(LANGUAGES, 2):
                yield pytest.param(
                    scenario,
                    first,
                    second,
                    id=f"{scenario['name']}-{first}-then-{second}",
                    marks=_marks(first, second),
                )


def _marks(*languages: str) -> list[Any]:
    return [] if set(languages) == {"python"} else [pytest.mark.polyglot]


@pytest.fixture(scope="session")
def worker_commands() -> Iterator[dict[str, list[str]]]:
    """Each language's worker command, built the first time a test asks for it."""
    built: dict[str, list[str]] = {}

    class Lazy(dict):
        def __missing__(self, name: str) -> list[str]:
            built[name] = LANGUAGES[name].build()
            return built[name]

    yield Lazy()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Scenario:
    """One scenario's run: its server (restartable on the same port), its workers,
    its effects file, the run it submitted."""

    def __init__(self, spec: dict[str, Any], languages: dict[str, str], env: Any):
        self.spec = spec
        self.languages = languages  # slot ("first", "second") -> language
        self.server_factory, self.commands, tmp_path = env
        self.port = _free_port()
        self.server = self.server_factory(listen=f"127.0.0.1:{self.port}")
        self.server.sql(LEDGER_TABLE)
        self.effects = tmp_path / "effects.jsonl"
        self.effects.touch()
        self.logs = tmp_path
        self.workers: dict[str, subprocess.Popen] = {}
        self.run_id = ""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def lines(self, phase: str | None = None) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.effects.read_text().splitlines() if line]
        return [line for line in lines if phase is None or line["phase"] == phase]

    def log(self, slot: str) -> str:
        return (self.logs / f"{slot}.log").read_text()

    def logs_text(self) -> str:
        return "\n".join(f"--- {slot}\n{self.log(slot)}" for slot in self.workers)

    # The script's actions ------------------------------------------------------------

    def worker(self, slot: str, concurrency: int = 4) -> None:
        command = self.commands[self.languages[slot]]
        with (self.logs / f"{slot}.log").open("w") as log:
            self.workers[slot] = subprocess.Popen(
                [
                    *command,
                    "--address",
                    self.address,
                    "--database-url",
                    self.server.database_url,
                    "--effects",
                    str(self.effects),
                    "--lease",
                    str(LEASE),
                    "--concurrency",
                    str(concurrency),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def submit(self, _: Any = None) -> None:
        workflow = Workflow.from_dict(self.spec["workflow"])
        with Client(self.address) as client:
            self.run_id = client.submit(workflow, self.spec.get("input"))

    def crashed(self, slot: str) -> None:
        process = self.workers[slot]
        try:
            process.wait(PATIENCE)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the {slot} worker did not crash as planned:\n{self.logs_text()}")
        assert process.returncode == CRASHED, self.logs_text()
        assert self.lines("crash"), "a planned crash writes its line first"

    def expire(self, _: Any = None) -> None:
        """The leases held run out (the server's clock moves on) and are reclaimed."""
        self.server.advance_clock(LEASE * 4)
        assert self.server.sweep() >= 1

    def _run(self) -> Any:
        with Client(self.address) as client:
            return client.get_run(self.run_id)

    def status(self, status: str) -> None:
        eventually(
            lambda: self._run().status == status,
            f"run status {status} (now {self._run().status}):\n{self.logs_text()}",
            PATIENCE,
        )

    def node(self, statuses: dict[str, str]) -> None:
        for node, status in statuses.items():
            eventually(
                lambda node=node, status=status: self._run().step(node).status == status,
                f"node {node} to be {status}:\n{self.logs_text()}",
                PATIENCE,
            )

    def waiting(self, node: str) -> None:
        def waits() -> bool:
            journal = self._run().step(node).journal
            return bool(journal) and str(journal[-1].status) == "waiting"

        eventually(waits, f"the body of {node} to wait:\n{self.logs_text()}", PATIENCE)

    def line(self, want: dict[str, Any]) -> None:
        def seen() -> bool:
            return any(want.items() <= line.items() for line in self.lines())

        eventually(seen, f"an effect line {want}:\n{self.logs_text()}", PATIENCE)

    def restart_server(self, _: Any = None) -> None:
        self.server.stop()
        self.server = self.server_factory(listen=self.address)

    def event(self, event: dict[str, Any]) -> None:
        with Client(self.address) as client:
            client.send_event(self.run_id, event["name"], event.get("payload"))

    def resolve(self, argv: list[str]) -> None:
        out = subprocess.run(
            [str(CYCLONE_CLI), "--address", self.address, "resolve", self.run_id, *argv],
            capture_output=True,
            text=True,
            timeout=PATIENCE,
        )
        assert out.returncode == 0, out.stderr

    def stop(self, slot: str) -> None:
        """SIGTERM, as a deployment would: the worker finishes and exits 0."""
        process = self.workers[slot]
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(PATIENCE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                pytest.fail(f"the {slot} worker did not stop on SIGTERM:\n{self.logs_text()}")
        assert process.returncode == 0, self.logs_text()

    def kill_all(self) -> None:
        for process in self.workers.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def _play(scenario: Scenario) -> None:
    for item in scenario.spec["script"]:
        action, argument = (item, None) if isinstance(item, str) else next(iter(item.items()))
        getattr(scenario, action)(argument)
    for slot, process in scenario.workers.items():
        if process.poll() is None:
            scenario.stop(slot)


def _check(scenario: Scenario) -> None:
    expect = scenario.spec["expect"]
    run = scenario._run()
    context = scenario.logs_text()
    assert run.status == expect["status"], context
    for node, status in expect.get("nodes", {}).items():
        assert run.step(node).status == status, (node, context)
    for node, output in expect.get("outputs", {}).items():
        assert run.step(node).output == output, (node, context)
    for node, types in expect.get("errors", {}).items():
        assert [error.type for error in run.step(node).errors] == types, (node, context)
    for node, journal in expect.get("journal", {}).items():
        got = [[call.step_id, str(call.status)] for call in run.step(node).journal]
        assert got == journal, (node, context)
    counts = Counter(line["name"] for line in scenario.lines("effect"))
    for name, allowed in expect.get("effects", {}).items():
        allowed = allowed if isinstance(allowed, list) else [allowed]
        assert counts[name] in allowed, (name, counts, context)
    assert set(counts) <= set(expect.get("effects", {})), (counts, context)
    if "ledger" in expect:
        rows = scenario.server.sql("SELECT node, entry, attempt FROM conformance_ledger")
        assert sorted(map(list, rows)) == sorted(expect["ledger"]), context
    for name, gaps in expect.get("gaps", {}).items():
        times = [line["time"] for line in scenario.lines("effect") if line["name"] == name]
        assert len(times) == len(gaps) + 1, (name, times)
        for (before, after), least in zip(pairwise(times), gaps, strict=True):
            assert after - before >= least, (name, times, gaps)
    langs = {line["lang"] for line in scenario.lines()}
    assert langs <= set(scenario.languages.values()), langs


@pytest.mark.parametrize(("scenario", "first", "second"), list(_cases()))
def test_conformance(
    scenario: dict[str, Any],
    first: str,
    second: str,
    server_factory: Any,
    worker_commands: dict[str, list[str]],
    tmp_path: Path,
) -> None:
    env = (server_factory, worker_commands, tmp_path)
    playing = Scenario(scenario, {"first": first, "second": second}, env)
    try:
        _play(playing)
        _check(playing)
    finally:
        playing.kill_all()
