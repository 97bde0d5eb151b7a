"""One workflow, three languages: the checkout of examples/ submitted from TypeScript,
its `price` node handled by the Python worker, its `charge` node by the Go worker
(a ledger row committed with the step's completion), and an operator inspecting and
retrying it with grpcurl. Then a durable function in Go (examples/go's order-worker):
its journaled step calls are not repeated after a SIGKILL, and its unsafe call killed
mid-call blocks the run until the operator resolves it with the `cyclone` command.
The examples are built as their READMEs say, once per session. They need Go and
Node.js: `make test` leaves them out (marker `polyglot`), `make test-all` runs them, and
there a missing go, node or npm fails them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyclient import Client, RetryPolicy, Run, Workflow
from tests.helpers import eventually, missing_tool

# The first test also builds the examples: on a machine with cold Go caches, compiling
# grpc-go and pgx takes minutes. Every wait inside a test is bounded far below this.
pytestmark = [pytest.mark.slow, pytest.mark.polyglot, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
GO_EXAMPLE = ROOT / "examples" / "go"
GO_SDK = ROOT / "sdk" / "go"
#: The Go SDK's module path, as its README and go.mod give it.
GO_MODULE = "github.com/cyclone-workflows/cyclone/sdk/go"
TS_EXAMPLE = ROOT / "examples" / "ts"
TS_SDK = ROOT / "sdk" / "ts"
PRICE_WORKER = ROOT / "examples" / "polyglot" / "price_worker.py"
#: Upper bound of any wait here; reached only when something is broken.
PATIENCE = 30.0
#: The default order of `cyclone-ts submit`: tea 2 x 450 + scone 3 x 300 cents.
DEFAULT_TOTAL = 1800
#: The Go worker's output for that order, when its ledger row was inserted.
CHARGED = {"charged": DEFAULT_TOTAL, "currency": "EUR", "booked": True}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing_tool(f"{name} is not installed: the polyglot tests need Go and Node.js")
    return path


def _build(*cmd: str, cwd: Path) -> None:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}"


@pytest.fixture(scope="session")
def go_binaries() -> Path:
    """examples/go's commands (checkout-worker, order-worker), built with the command
    of its README; the folder that holds them."""
    _build(_tool("go"), "build", "-o", "bin/", "./cmd/...", cwd=GO_EXAMPLE)
    return GO_EXAMPLE / "bin"


def _npm_ci(npm: str, folder: Path) -> None:
    """`npm ci` in folder, unless its node_modules hold exactly its lock file already
    (`make tools` installs sdk/ts's)."""
    installed = folder / "node_modules" / ".package-lock.json"
    lock = folder / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        _build(npm, "ci", "--no-audit", "--no-fund", cwd=folder)


@pytest.fixture(scope="session")
def ts_sdk() -> Path:
    """sdk/ts, installed and compiled (dist/) with the commands of its README."""
    npm = _tool("npm")
    _tool("node")
    _npm_ci(npm, TS_SDK)
    _build(npm, "run", "build", cwd=TS_SDK)
    return TS_SDK


@pytest.fixture(scope="session")
def ts_example(ts_sdk) -> Path:
    """examples/ts (its CLI and worker), installed and compiled on the built SDK."""
    npm = _tool("npm")
    _npm_ci(npm, TS_EXAMPLE)
    _build(npm, "run", "build", cwd=TS_EXAMPLE)
    return TS_EXAMPLE / "dist" / "src"


@pytest.fixture(scope="session")
def ts_cli(ts_example) -> list[str]:
    """examples/ts's CLI, `cyclone-ts`."""
    return [_tool("node"), str(ts_example / "main.js")]


@dataclass
class Process:
    """A worker process whose output goes to a file (so it never blocks on a pipe)."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        """SIGTERM, as a deployment would; the worker must finish cleanly."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(PATIENCE)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
                pytest.fail(f"{self.name} did not stop on SIGTERM:\n{self.log}")
        assert self.popen.returncode == 0, (
            f"{self.name} exited {self.popen.returncode}:\n{self.log}"
        )


@pytest.fixture
def start_process(tmp_path: Path) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(name: str, *cmd: str | Path) -> Process:
        log_path = tmp_path / f"{name}-{len(started)}.log"
        with log_path.open("w") as log:
            popen = subprocess.Popen(
                [str(c) for c in cmd],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                cwd=ROOT,
            )
        process = Process(name, popen, log_path)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.popen.poll() is None:
            process.popen.kill()
            process.popen.wait()


@pytest.fixture
def python_worker(cyclone_server, start_process) -> Process:
    return start_process(
        "price-worker", sys.executable, PRICE_WORKER, "--address", cyclone_server.address
    )


def _go_command(name: str, cyclone_server, start_process, go_binaries) -> Callable[..., Process]:
    """Starts the Go command `name` on the test's server and database, with extra flags."""

    def start(*flags: str) -> Process:
        return start_process(
            name,
            go_binaries / name,
            "-address",
            cyclone_server.address,
            "-database-url",
            cyclone_server.database_url,
            *flags,
        )

    return start


@pytest.fixture
def go_worker(cyclone_server, start_process, go_binaries) -> Callable[..., Process]:
    """Start examples/go's checkout-worker, with extra flags."""
    return _go_command("checkout-worker", cyclone_server, start_process, go_binaries)


@pytest.fixture
def order_worker(cyclone_server, start_process, go_binaries) -> Callable[..., Process]:
    """Start examples/go's order-worker (a durable function), with extra flags."""
    return _go_command("order-worker", cyclone_server, start_process, go_binaries)


@pytest.fixture
def ts(cyclone_server, ts_cli) -> Callable[..., subprocess.CompletedProcess]:
    """Run `cyclone-ts ARGS... --address SERVER`."""

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*ts_cli, *args, "--address", cyclone_server.address],
            capture_output=True,
            text=True,
            timeout=PATIENCE + 30,
        )

    return run


@pytest.fixture
def grpcurl_call(grpcurl, cyclone_server) -> Callable[..., dict]:
    """An operator's grpcurl call: grpcurl_call("cyclone.v1.WorkflowService/GetRun", {...})."""

    def call(method: str, body: dict) -> dict:
        out = subprocess.run(
            [grpcurl, "-plaintext", "-d", json.dumps(body), cyclone_server.address, method],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    return call


def _steps(run: dict) -> dict[str, dict]:
    return {step["node"]: step for step in run["steps"]}


def _ledger(server) -> list[tuple[str, str, int]]:
    return [
        (str(run_id), node, amount)
        for run_id, node, amount in server.sql("SELECT run_id, node, amount FROM ledger")
    ]


def test_a_checkout_submitted_from_typescript_is_priced_in_python_and_charged_in_go(
    cyclone_server, python_worker, go_worker, ts, grpcurl_call
):
    go = go_worker()
    submitted = ts("submit", "--customer", "ada", "--wait", "--json")
    assert submitted.returncode == 0, submitted.stderr + go.log + python_worker.log
    first, waited = submitted.stdout.splitlines()
    run_id = json.loads(first)["runId"]
    assert json.loads(waited)["status"] == "RUN_STATUS_COMPLETED"

    run = grpcurl_call("cyclone.v1.WorkflowService/GetRun", {"run_id": run_id})["run"]
    assert run["status"] == "RUN_STATUS_COMPLETED"
    assert run["input"]["customer"] == "ada"
    steps = _steps(run)
    assert [s["node"] for s in run["steps"]] == ["price", "charge"]
    assert steps["price"]["status"] == "STEP_STATUS_COMPLETED"
    assert steps["price"]["attempt"] == 1
    assert steps["price"]["output"] == {"amount": DEFAULT_TOTAL, "currency": "EUR", "items": 2}
    assert steps["charge"]["status"] == "STEP_STATUS_COMPLETED"
    assert steps["charge"]["attempt"] == 1
    assert steps["charge"]["output"] == CHARGED
    assert "errors" not in steps["price"] and "errors" not in steps["charge"]
    assert _ledger(cyclone_server) == [(run_id, "charge", DEFAULT_TOTAL)]
    assert "step completed in its transaction" in go.log

    listed = ts("list", "--workflow", "checkout", "--status", "completed", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["runId"] for r in json.loads(listed.stdout)] == [run_id]
    go.stop()
    python_worker.stop()


def test_a_declined_charge_is_inspected_and_retried_with_grpcurl_and_booked_once(
    cyclone_server, python_worker, go_worker, ts, grpcurl_call
):
    declining = go_worker("-limit", "1000")  # the order is 1800 cents
    submitted = ts("submit", "--customer", "bob", "--json")
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["runId"]
    waited = ts("wait", run_id, "--json")
    assert waited.returncode == 1, waited.stderr  # settled, but not completed
    assert json.loads(waited.stdout)["status"] == "RUN_STATUS_FAILED"

    # The operator looks: the charge was declined for good, nothing was booked.
    run = grpcurl_call("cyclone.v1.WorkflowService/GetRun", {"run_id": run_id})["run"]
    assert run["status"] == "RUN_STATUS_FAILED"
    assert run["error"]["kind"] == "StepDiscarded"
    assert run["error"]["node"] == "charge"
    steps = _steps(run)
    assert steps["price"]["status"] == "STEP_STATUS_COMPLETED"
    assert steps["charge"]["status"] == "STEP_STATUS_DISCARDED"
    [error] = steps["charge"]["errors"]
    assert error["type"] == "CardDeclined"
    assert error["message"] == "1800 cents is over the card's limit of 1000"
    assert error["kind"] == "handler" and "retryable" not in error  # false is omitted
    assert _ledger(cyclone_server) == []
    declining.stop()

    # The limit is raised (a new worker is deployed), then the node is retried in place.
    go = go_worker()
    retried = grpcurl_call(
        "cyclone.v1.AdminService/Retry",
        {"run_id": run_id, "node": "charge", "reason": "card limit raised"},
    )
    assert retried["run"]["status"] == "RUN_STATUS_RUNNING"
    waited = ts("wait", run_id, "--json")
    assert waited.returncode == 0, waited.stderr + go.log

    run = grpcurl_call("cyclone.v1.WorkflowService/GetRun", {"run_id": run_id})["run"]
    assert run["status"] == "RUN_STATUS_COMPLETED"
    assert "error" not in run
    steps = _steps(run)
    assert (steps["price"]["status"], steps["price"]["attempt"]) == ("STEP_STATUS_COMPLETED", 1)
    assert (steps["charge"]["status"], steps["charge"]["attempt"]) == ("STEP_STATUS_COMPLETED", 2)
    assert steps["charge"]["output"] == CHARGED
    assert [e["type"] for e in steps["charge"]["errors"]] == ["CardDeclined"]
    [audit] = run["audit"]
    assert (audit["action"], audit["node"], audit["reason"]) == (
        "retry",
        "charge",
        "card limit raised",
    )
    assert _ledger(cyclone_server) == [(run_id, "charge", DEFAULT_TOTAL)]
    go.stop()
    python_worker.stop()


def test_a_charge_that_loses_its_lease_before_commit_rolls_back_and_is_booked_once(
    cyclone_server, python_worker, go_worker, ts, grpcurl_call
):
    go = go_worker("-gateway-delay", "1.5s")
    submitted = ts("submit", "--customer", "cy", "--json")
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["runId"]

    # While the gateway answers, the ledger row is written but not committed: the
    # lease ends under the handler (the clock jumps past it) and the sweep reclaims it.
    eventually(
        lambda: cyclone_server.sql(
            "SELECT 1 FROM cyclone.steps WHERE run_id = %s AND node = 'charge'"
            " AND status = 'running'",
            run_id,
        ),
        "the Go worker to claim the charge",
        timeout=PATIENCE,
    )
    cyclone_server.advance_clock(120)
    assert cyclone_server.sweep() == 1
    eventually(lambda: "lease lost" in go.log, "the Go worker to lose its lease", PATIENCE)

    waited = ts("wait", run_id, "--json")
    assert waited.returncode == 0, waited.stderr + go.log
    run = grpcurl_call("cyclone.v1.WorkflowService/GetRun", {"run_id": run_id})["run"]
    steps = _steps(run)
    assert (steps["charge"]["status"], steps["charge"]["attempt"]) == ("STEP_STATUS_COMPLETED", 2)
    assert [e["kind"] for e in steps["charge"]["errors"]] == ["lease_expired"]
    assert steps["charge"]["output"]["booked"] is True  # the first row was rolled back
    assert _ledger(cyclone_server) == [(run_id, "charge", DEFAULT_TOTAL)]
    go.stop()
    python_worker.stop()


def _go_in_sdk(*args: str, tool: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool or _tool("go"), *args], cwd=GO_SDK, capture_output=True, text=True, timeout=300
    )


def test_the_go_sdk_unit_tests_pass(go_binaries):
    # The SDK's own tests: the journal's replay rules against a fake server, the
    # worker's loop, the client, and the testing package's crash-injection replay.
    out = _go_in_sdk("test", "./...")
    assert out.returncode == 0, out.stdout + out.stderr
    for package in ("worker", "client", "cyclonetest"):
        assert f"ok  \t{GO_MODULE}/{package}" in out.stdout, out.stdout


def test_the_go_sdk_is_vet_and_staticcheck_clean(go_binaries):
    vet = _go_in_sdk("vet", "./...")
    assert vet.returncode == 0, vet.stdout + vet.stderr
    # make tools installs staticcheck into .tools/bin; one on PATH does as well.
    staticcheck = ROOT / ".tools" / "bin" / "staticcheck"
    if not staticcheck.exists():
        found = shutil.which("staticcheck")
        if found is None:
            missing_tool("staticcheck is not installed: make tools installs it")
        staticcheck = Path(found)
    checked = _go_in_sdk("./...", tool=str(staticcheck))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_typescript_client_unit_tests_pass(ts_cli):
    out = subprocess.run(
        [_tool("npm"), "test"], cwd=TS_EXAMPLE, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "# fail 0" in out.stdout


# -- a durable function in Go ---------------------------------------------------------

#: The installed `cyclone` command, as an operator runs it.
CYCLONE_CLI = Path(sys.executable).with_name("cyclone")
ORDER = {"order_id": "o-7", "amount": 1800}


def _order_workflow() -> Workflow:
    wf = Workflow("order")
    wf.node("fulfil", action="order.fulfil", retry=RetryPolicy(max_attempts=5))
    return wf


def _calls(server, run_id: str) -> list[str]:
    """The step functions of the Go body that really ran, in order (its order_log)."""
    if server.sql("SELECT to_regclass('order_log')") == [(None,)]:
        return []  # the worker has not created it yet
    rows = server.sql("SELECT call FROM order_log WHERE run_id = %s ORDER BY at, call", run_id)
    return [call for (call,) in rows]


def _cyclone(server, *argv: str) -> subprocess.CompletedProcess:
    assert CYCLONE_CLI.exists(), f"the cyclone command is not installed next to {sys.executable}"
    return subprocess.run(
        [str(CYCLONE_CLI), "--address", server.address, "--actor", "dora", *argv],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )


def _journal(run: Run) -> list[tuple[str, str, int, bool]]:
    return [
        (c.step_id, str(c.status), c.attempt, c.unsafe_to_repeat)
        for c in run.step("fulfil").journal
    ]


@pytest.fixture
def operator(cyclone_server) -> Iterator[Client]:
    with Client(cyclone_server.address, actor="dora") as client:
        yield client


def test_a_go_durable_function_replays_its_journal_after_a_kill(
    cyclone_server, order_worker, operator
):
    # The first worker dies while the gateway answers the unsafe charge: price_order is
    # recorded, reserve_stock too (with its row, in one transaction), charge_card is
    # STARTED.
    first = order_worker("-gateway-delay", "10m")
    run_id = operator.submit(_order_workflow(), ORDER)
    eventually(
        lambda: _calls(cyclone_server, run_id) == ["price_order", "reserve_stock", "charge_card"],
        "the Go body to reach the charge",
        PATIENCE,
    )
    run = operator.get_run(run_id)
    assert _journal(run) == [
        ("price_order", "succeeded", 1, False),
        ("reserve_stock", "succeeded", 1, False),
        ("charge_card", "started", 1, True),
    ]
    first.popen.kill()
    first.popen.wait()

    # Its lease runs out; the next attempt replays the body: price_order and
    # reserve_stock come from the journal, and the STARTED charge blocks the run
    # instead of charging again.
    cyclone_server.advance_clock(120)
    assert cyclone_server.sweep() == 1
    second = order_worker()
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "blocked", second.log
    assert run.error is not None
    assert (run.error.kind, run.error.node, run.error.step_id) == (
        "EffectUncertain",
        "fulfil",
        "charge_card",
    )
    assert "fulfil" in run.error.message and "charge_card" in run.error.message
    assert run.step("fulfil").status == "uncertain"
    assert _journal(run) == [
        ("price_order", "succeeded", 1, False),
        ("reserve_stock", "succeeded", 1, False),
        ("charge_card", "started", 1, True),
    ]
    assert _calls(cyclone_server, run_id) == ["price_order", "reserve_stock", "charge_card"]
    eventually(lambda: "effect uncertain" in second.log, "the Go worker to drop the node", PATIENCE)

    shown = _cyclone(cyclone_server, "run", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "step call charge_card" in shown.stdout
    assert f"cyclone resolve {run_id} charge_card" in shown.stdout
    # The journal, one row per call: · seq, step id, status, attempt, times, mark.
    [price_line, reserve_line, charge_line] = [
        line.split("· ", 1)[1] for line in shown.stdout.splitlines() if "· " in line
    ]
    assert price_line.split()[:3] == ["1", "price_order", "succeeded"]
    assert price_line.endswith("-> 2290")
    assert reserve_line.split()[:3] == ["2", "reserve_stock", "succeeded"]
    assert reserve_line.endswith('-> "r-o-7"')
    assert charge_line.split()[:3] == ["3", "charge_card", "started"]
    assert "unsafe" in charge_line and "UTC" in charge_line and "no outcome" in charge_line

    # The operator finds the charge at the gateway: the seed's command, as written.
    resolved = _cyclone(
        cyclone_server, "resolve", run_id, "charge_card", "--result", '{"charge_id": "ch_found"}'
    )
    assert resolved.returncode == 0, resolved.stderr
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", second.log
    assert run.step("fulfil").output == {
        "status": "fulfilled",
        "reservation": "r-o-7",
        "charge_id": "ch_found",
        "charged": 2290,
    }
    assert _calls(cyclone_server, run_id) == [
        "price_order",
        "reserve_stock",
        "charge_card",
        "send_receipt",
    ]
    assert [s for (_, s, _, _) in _journal(run)] == ["succeeded"] * 4
    assert cyclone_server.sql("SELECT order_id, released FROM reservations") == [("o-7", False)]
    [audit] = run.audit
    assert (audit.action, audit.node, audit.actor) == ("resolve_result", "fulfil", "dora")
    second.stop()


#: How an operator resolves the charge of a blocked order, the step functions that
#: ran in the end, and the body's output (the Go and TypeScript bodies alike).
RESOLUTIONS = pytest.mark.parametrize(
    ("resolution", "calls", "output"),
    [
        (
            ["--error", "card declined"],
            ["price_order", "reserve_stock", "charge_card", "release_stock"],
            {"status": "cancelled", "reason": "EffectFailed: card declined"},
        ),
        (
            ["--discard", "--node", "fulfil", "--reason", "no charge at the gateway"],
            ["price_order", "reserve_stock", "charge_card", "charge_card", "send_receipt"],
            {"status": "fulfilled", "reservation": "r-o-7", "charge_id": "ch_o-7", "charged": 2290},
        ),
    ],
    ids=["error-runs-the-cleanup", "discard-runs-the-call-again"],
)


@RESOLUTIONS
def test_a_blocked_go_durable_function_resumes_as_resolved(
    cyclone_server, order_worker, operator, resolution, calls, output
):
    first = order_worker("-gateway-delay", "10m")
    run_id = operator.submit(_order_workflow(), ORDER)
    eventually(
        lambda: "charge_card" in _calls(cyclone_server, run_id), "the charge to begin", PATIENCE
    )
    first.popen.kill()
    first.popen.wait()
    cyclone_server.advance_clock(120)
    assert cyclone_server.sweep() == 1
    second = order_worker()
    assert operator.wait(run_id, timeout=PATIENCE).status == "blocked", second.log

    resolved = _cyclone(cyclone_server, "resolve", run_id, "charge_card", *resolution)
    assert resolved.returncode == 0, resolved.stderr
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", second.log
    assert run.step("fulfil").output == output
    assert _calls(cyclone_server, run_id) == calls
    second.stop()


def _kill_and_block(server, operator, worker: Process, run_id: str, restarted) -> Process:
    """Kill ``worker`` (in the unsafe charge of ``run_id``), let its lease run out and
    start ``restarted()``: the replay blocks the run on the charge."""
    worker.popen.kill()
    worker.popen.wait()
    server.advance_clock(120)
    assert server.sweep() == 1
    replaying = restarted()
    assert operator.wait(run_id, timeout=PATIENCE).status == "blocked", replaying.log
    resolved = _cyclone(
        server, "resolve", run_id, "charge_card", "--result", '{"charge_id": "ch_found"}'
    )
    assert resolved.returncode == 0, resolved.stderr
    return replaying


def test_a_go_run_in_flight_on_old_code_takes_the_old_path_of_a_patch_after_a_restart(
    cyclone_server, order_worker, operator
):
    # The code before the patch prices, reserves, and dies in the charge.
    old = order_worker("-gateway-delay", "10m")
    in_flight = operator.submit(_order_workflow(), ORDER)
    eventually(
        lambda: (
            _calls(cyclone_server, in_flight) == ["price_order", "reserve_stock", "charge_card"]
        ),
        "the old body to reach the charge",
        PATIENCE,
    )
    # The new code (free shipping behind the marker "free-shipping") replays it.
    new = _kill_and_block(
        cyclone_server,
        operator,
        old,
        in_flight,
        lambda: order_worker("-free-shipping", "-gateway-delay", "10m"),
    )
    run = operator.wait(in_flight, timeout=PATIENCE)
    assert run.status == "completed", new.log
    # The journal had reserve_stock where the marker would be: the old path, no waiver.
    assert [c.step_id for c in run.step("fulfil").journal] == [
        "price_order",
        "reserve_stock",
        "charge_card",
        "send_receipt",
    ]
    assert run.step("fulfil").output["charged"] == 2290
    assert _calls(cyclone_server, in_flight) == [
        "price_order",
        "reserve_stock",
        "charge_card",
        "send_receipt",
    ]

    # A run that starts on the new code records the marker and takes the new path...
    fresh = operator.submit(_order_workflow(), {"order_id": "o-8", "amount": 1800})
    eventually(
        lambda: "charge_card" in _calls(cyclone_server, fresh), "the new body's charge", PATIENCE
    )
    journal = operator.get_run(fresh).step("fulfil").journal
    assert [(c.step_id, c.function, str(c.status), c.output) for c in journal[:3]] == [
        ("price_order", "price_order", "succeeded", 2290),
        ("patch:free-shipping", "cyclone.patch", "succeeded", True),
        ("waive_shipping", "waive_shipping", "succeeded", 1800),
    ]
    assert not journal[1].unsafe_to_repeat
    # ... and keeps it when it replays after a restart: the marker is consumed.
    last = _kill_and_block(
        cyclone_server, operator, new, fresh, lambda: order_worker("-free-shipping")
    )
    run = operator.wait(fresh, timeout=PATIENCE)
    assert run.status == "completed", last.log
    assert run.step("fulfil").output["charged"] == 1800
    assert [c.seq for c in run.step("fulfil").journal] == [1, 2, 3, 4, 5, 6]
    assert _calls(cyclone_server, fresh) == [
        "price_order",
        "waive_shipping",
        "reserve_stock",
        "charge_card",
        "send_receipt",
    ]
    last.stop()


def test_a_go_step_result_over_the_payload_limit_is_its_recorded_failure(
    cyclone_server, order_worker, operator
):
    # An invoice of 30,000 lines is over 1 MiB: render_invoice fails with
    # StepResultTooLarge, and the body stores the invoice instead.
    first = order_worker("-gateway-delay", "10m")
    run_id = operator.submit(_order_workflow(), {**ORDER, "invoice_lines": 30_000})
    expected = ["price_order", "reserve_stock", "render_invoice", "store_invoice", "charge_card"]
    eventually(
        lambda: _calls(cyclone_server, run_id) == expected, "the body to reach the charge", PATIENCE
    )
    journal = {c.step_id: c for c in operator.get_run(run_id).step("fulfil").journal}
    rendered = journal["render_invoice"]
    assert str(rendered.status) == "failed" and rendered.error is not None
    assert (rendered.error.type, rendered.error.module) == (
        "StepResultTooLarge",
        f"{GO_MODULE}/worker",
    )
    assert "the limit of a step result is 1048576 bytes" in rendered.error.message
    assert rendered.error.attributes["limit"] == 1048576
    assert rendered.error.attributes["size"] > 1048576
    assert journal["store_invoice"].output == f"invoices/{run_id}"

    # After a restart the replay gets the same typed failure from the journal and
    # takes the same path, without rendering or storing again.
    second = _kill_and_block(cyclone_server, operator, first, run_id, order_worker)
    run = operator.wait(run_id, timeout=PATIENCE)
    assert run.status == "completed", second.log
    assert run.step("fulfil").output["invoice"] == f"invoices/{run_id}"
    assert _calls(cyclone_server, run_id) == [*expected, "send_receipt"]
    [(size,)] = cyclone_server.sql("SELECT length(body) FROM invoices WHERE run_id = %s", run_id)
    assert size > 1048576
    second.stop()


def test_the_typescript_cli_says_what_the_server_answered_and_has_help(ts):
    helped = ts("--help")
    assert helped.returncode == 0 and "cyclone-ts wait RUN_ID" in helped.stdout
    unknown = ts("wait", "01234567-89ab-7def-8123-456789abcdef")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("cyclone-ts: NotFound: ") and "Error" not in unknown.stderr
    malformed = ts("wait", "not-a-run-id")
    assert malformed.returncode == 2 and "InvalidArgument" in malformed.stderr
