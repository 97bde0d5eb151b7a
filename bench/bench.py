"""`make bench`: Cyclone's throughput, pickup latency and history sensitivity, each
against a baseline measured in the same run on the same database.

Scenarios (fixed counts, every loop bounded in count and time):
  throughput  20,000 one-node runs drained through gRPC by 2 bare-stub worker processes,
              each on one Work stream (64 slots of credit)
  unary       throughput again, its workers on Claim and CompleteMany calls instead of a
              Work stream (as workers without stream support do; ratio to the baseline)
  flow        the same, each run with a priority (0-9) and half of them with a
              concurrency key (200 customers, 5 at once each); ratio to throughput
  sdk         the same, drained by 2 processes running the SDK's Worker (each on one Work
              stream)
  baseline    the same 20,000 jobs drained by a minimal psycopg loop, 8 threads
  languages   the same runs drained by each SDK's worker in turn (bench/languages.py:
              2 processes of 64 slots; Python, Go, TypeScript): steps/s and worker CPU
              per step, each as a ratio to the Python SDK's
  peer        the same 20,000 jobs drained by pgqueuer (bench/peer.py: 5 queue
              managers, batches of 50: 250 jobs in flight), then by bare stubs and by
              the SDK's Worker holding as many (2 processes of PEER_SLOTS = 128 slots);
              both reported as ratios to it (rate, and total CPU per job), and the SDK
              to the bare stubs
  dag         500 runs of a 20-node workflow (root, fan-out of 18, join)
  durable     one-node runs whose node is a durable function of 10 no-op step calls,
              safe, then unsafe_to_repeat; 12,000 drained by the SDK's Worker (1,024
              bodies in flight per process; safe calls in 3 interleaved pairs: with
              the window of one call, each call's function waiting for the last
              one's record, and with @step(record="async"), which does not wait;
              median of the pairs' ratios window / async, target >= 0.8), and 1,000
              by bare stubs speaking the journal protocol (EndStepCall, BeginStepCall);
              when the contract has CompleteMany.step_call_ends, also bare stubs that send
              the ends of safe calls there, with the node's completion
  pickup      200 single-node runs submitted one at a time to an idle worker
  waits       10,000 one-node runs whose durable function sleeps 1 second (the node
              gives up its slot), submitted while 2 SDK worker processes serve them:
              wake-to-resume latency, from each sleep's wake time to the claim that
              resumed it (p50, p99; target p50 within 50 ms)
  history     throughput again after 1,000,000 finished steps are in the tables
  fan         one run of a root, a 10,000-wide fan-out and a join, drained as throughput:
              steps/s (ratio to throughput), and how long after the last leaf's
              completion the join became available and was claimed. The server runs
              with its workflow limits raised for it (FAN_LIMITS)
  backlog     1,000,000 one-node runs put in ready (run_submit from SQL, in batches)
              before the workers start, drained as throughput: steps/s over the first
              100,000 completed (--backlog-measure; 0 drains all), ratio to throughput
  submit      runs submitted per second by 4 concurrent clients
  streams     throughput without live stream readers, with --stream-readers (1,000)
              ReadStream calls open on the server, and without again
              (bench/streams_bench.py): the rate with them over the mean without
              (target >= 0.9)
  big         health checks answered while one Submit at the default caps (2,000 nodes,
              ~100,000 edges) is validated and stored: their latency, and the Submit's own

Writes bench/results/latest.json (--out) and prints a table. Durability settings stay at
Postgres defaults (fsync, synchronous_commit on) throughout. The embedded Postgres is
measured unless --url (or CYCLONE_DATABASE_URL) names another, e.g. PostgreSQL 15:

    make bench BENCH_ARGS="--url postgresql://postgres@:5433/postgres?host=/tmp/pg15 --out x.json"

The throughput scenarios also report the WAL written per step (pg_current_wal_lsn
before and after the drain, so the cluster must not be busy with anything else).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import platform
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import languages
import peer
import psutil
import psycopg
import streams_bench

from cyclone.v1 import (
    types_pb2,
    worker_service_pb2,
    worker_service_pb2_grpc,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)

ROOT = Path(__file__).resolve().parent.parent
#: The contract lets a worker send the ends of safe step calls in CompleteMany.
BATCHED_ENDS = "step_call_ends" in worker_service_pb2.CompleteManyRequest.DESCRIPTOR.fields_by_name
RESULTS = ROOT / "bench" / "results"
DEADLINE_S = 600  # no scenario may run longer than this
#: The directory where each worker process writes the CPU seconds it spent starting
#: (interpreter, imports, setup) before its first claim (main() sets it for them).
STARTUP_DIR = "CYCLONE_BENCH_STARTUP_DIR"


# Setup ---------------------------------------------------------------------------


def admin_url(given: str | None) -> str:
    url = given or os.environ.get("CYCLONE_DATABASE_URL")
    if url:
        return url
    from service import embedded

    return embedded.start(ROOT / ".cyclone", database="postgres")


def fresh_database(base: str, name: str) -> str:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return re.sub(r"(postgres(?:ql)?://[^/]*/)([^?]*)", rf"\g<1>{name}", base, count=1)


class Server:
    def __init__(
        self, database_url: str, flags: tuple[str, ...] = (), prefix: tuple[str, ...] = ()
    ) -> None:
        """``prefix``: the command that runs the server's (valgrind ..., say)."""
        env = {**os.environ, "CYCLONE_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "service",
                "--listen",
                "127.0.0.1:0",
                "--log-level",
                "WARNING",
                "--pool-size",
                "16",
                *flags,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        #: Its Prometheus endpoint (the banner's metrics line), None when it has none.
        self.metrics_url: str | None = None
        for line in self.proc.stdout:
            m = re.search(r"Cyclone is serving on (\S+)\.", line)
            if m:
                self.address = m.group(1)
                break
        else:
            raise RuntimeError("server did not start")
        # The banner's next lines (gRPC, console, metrics): never past them.
        for line in itertools.islice(self.proc.stdout, 4):
            m = re.match(r"\s+metrics\s+(\S+)", line)
            if m:
                self.metrics_url = m.group(1) if m.group(1).startswith("http") else None
                break
        threading.Thread(target=lambda: self.proc.stdout.read(), daemon=True).start()

    def stop(self, wait: float = 30) -> None:
        self.proc.terminate()
        self.proc.wait(wait)


def worker_ready() -> None:
    """Called by a worker process just before its first claim: it records the CPU it
    spent starting (CpuMeter counts that apart from the CPU per step, since a worker
    starts once and serves for as long as it runs)."""
    where = os.environ.get(STARTUP_DIR)
    if where:
        me = resource.getrusage(resource.RUSAGE_SELF)
        Path(where, str(os.getpid())).write_text(repr(me.ru_utime + me.ru_stime))


class CpuMeter:
    """CPU seconds spent over a span by the server, by worker processes that finished
    in it, by this process (the baseline's threads) and by the embedded Postgres.

    The workers' figure leaves out what each spent starting, up to its first claim
    (worker_ready()): that is ``startup_s`` over ``startup_processes`` processes.

    Postgres is measured only when its processes are on this machine (the embedded one,
    or a local cluster given by URL whose data directory this process can read);
    backends that exit during the span are not counted, which is why every scenario
    keeps its connections open until it ends.
    """

    #: The postmaster's pid file, found by main().
    pid_file: Path | None = None
    #: On Citus, each node's postmaster pid file by the node's name ("coordinator",
    #: "worker 1", ...), found by main(): their CPU is measured apart (nodes_s).
    node_pid_files: dict[str, Path] = {}

    def __init__(self, server: Server | None) -> None:
        self.server = psutil.Process(server.proc.pid) if server else None
        files = self.node_pid_files or ({"postgres": self.pid_file} if self.pid_file else {})
        self.postmasters = {
            name: psutil.Process(int(f.read_text().split()[0]))
            for name, f in files.items()
            if f.exists()
        }
        self.postmaster = next(iter(self.postmasters.values()), None)
        self.nodes_s: dict[str, float] = {}
        self.postgres_end: dict[int, float] | None = None

    def _postgres(self) -> dict[int, float]:
        """CPU seconds by process of every node's postmaster and its children."""
        seconds = {}
        for postmaster in self.postmasters.values():
            for p in [postmaster, *postmaster.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                seconds[p.pid] = t.user + t.system
        return seconds

    def _by_node(self) -> dict[int, str]:
        """The node each postgres process belongs to."""
        node = {}
        for name, postmaster in self.postmasters.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                for p in [postmaster, *postmaster.children(recursive=True)]:
                    node[p.pid] = name
        return node

    def _snapshot(self) -> tuple[float, float, float, dict[int, float]]:
        server = sum(self.server.cpu_times()[:2]) if self.server else 0.0
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        me = resource.getrusage(resource.RUSAGE_SELF)
        return (
            server,
            children.ru_utime + children.ru_stime,
            me.ru_utime + me.ru_stime,
            self._postgres(),
        )

    @staticmethod
    def _startups() -> list[Path]:
        where = os.environ.get(STARTUP_DIR)
        return list(Path(where).iterdir()) if where else []

    def __enter__(self) -> CpuMeter:
        for path in self._startups():
            path.unlink()
        self.start = self._snapshot()
        return self

    def postgres_now(self) -> None:
        """End the span for Postgres here, not at exit: for clients whose backends
        exit with them (the peer's queue managers), before they exit."""
        self.postgres_end = self._postgres()

    def __exit__(self, *exc: object) -> None:
        end = self._snapshot()
        if self.postgres_end is not None:
            end = (*end[:3], self.postgres_end)
        self.server_s, self.workers_s, self.client_s = (
            b - a for a, b in zip(self.start[:3], end[:3], strict=True)
        )
        before = self.start[3]
        self.postgres_s = (
            sum(t - before.get(pid, 0.0) for pid, t in end[3].items()) if self.postmaster else None
        )
        if len(self.postmasters) > 1:
            nodes = self._by_node()
            self.nodes_s = dict.fromkeys(self.postmasters, 0.0)
            for pid, t in end[3].items():
                if pid in nodes:
                    self.nodes_s[nodes[pid]] += t - before.get(pid, 0.0)
        startups = [float(path.read_text()) for path in self._startups()]
        self.startup_s, self.startup_processes = sum(startups), len(startups)
        self.workers_s -= self.startup_s

    def per_step(self, steps: int, *parts: str) -> dict:
        """Milliseconds of CPU per step for each named part ("server", "workers", ...),
        and their ``total``."""
        out = {}
        for part in parts:
            seconds = getattr(self, f"{part}_s")
            out[part] = None if seconds is None else round(seconds * 1000 / steps, 3)
        if None not in out.values():
            out["total"] = round(sum(out.values()), 3)
        return out

    def per_node(self, steps: int) -> dict:
        """On Citus: milliseconds of CPU per step of each node's Postgres (empty else)."""
        return {name: round(t * 1000 / steps, 3) for name, t in self.nodes_s.items()}

    def startup_ms(self) -> float | None:
        """CPU milliseconds each worker process spent starting, on average."""
        if not self.startup_processes:
            return None
        return round(self.startup_s * 1000 / self.startup_processes, 1)


class StreamPhases:
    """The server's Work streams over a span: the share of their time spent applying
    reports, claiming and waiting on their workers (cyclone_work_stream_seconds_total;
    the idle phase, credit left and nothing ready, is left out)."""

    PHASES = ("report", "claim", "worker")

    def __init__(self, server: Server) -> None:
        self.url = server.metrics_url
        self.shares: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        if self.url is None:
            return {}
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url, timeout=10) as reply:
            text = reply.read().decode()
        return {
            sample.labels["phase"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "cyclone_work_stream_seconds"
            for sample in family.samples
            if sample.name.endswith("_total")
        }

    def __enter__(self) -> StreamPhases:
        self.before = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        after = self._read()
        spent = {p: after.get(p, 0.0) - self.before.get(p, 0.0) for p in self.PHASES}
        total = sum(spent.values())
        if total > 0:
            self.shares = {p: round(t / total, 2) for p, t in spent.items()}


class DbMeter:
    """Commits in the bench database, and WAL records and full-page images written by
    the cluster, over a span (pg_stat_database.xact_commit, pg_stat_wal).

    A backend publishes its counts when it goes idle, but at most once a second: what
    it could not publish then waits for its idle timer, 10 s. So each end of the span
    is read once 11 s have passed with the bench idle (outside any CpuMeter), from the
    admin database so that the readings count in neither. Like the WAL position,
    pg_stat_wal is the cluster's: the bench must have it to itself.
    """

    #: The admin URL (main() sets it).
    admin_url: str | None = None
    #: Postgres' PGSTAT_IDLE_INTERVAL (10 s), and a margin.
    SETTLE_S = 11.0

    def __init__(self, database_url: str) -> None:
        self.dbname = psycopg.conninfo.conninfo_to_dict(database_url)["dbname"]

    def _settled(self) -> tuple[int, int, int]:
        assert self.admin_url is not None
        time.sleep(self.SETTLE_S)
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT d.xact_commit, w.wal_records, w.wal_fpi"
                "  FROM pg_stat_database d CROSS JOIN pg_stat_wal w WHERE d.datname = %s",
                (self.dbname,),
            ).fetchone()
        return row

    def __enter__(self) -> DbMeter:
        self.start = self._settled()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._settled()
        self.commits, self.wal_records, self.wal_fpi = (
            b - a for a, b in zip(self.start, end, strict=True)
        )

    def per_step(self, steps: int) -> dict:
        return {
            "commits_per_step": round(self.commits / steps, 3),
            "wal_records_per_step": round(self.wal_records / steps, 2),
            "wal_fpi_per_step": round(self.wal_fpi / steps, 3),
        }


def one_node(name: str, action: str) -> types_pb2.Workflow:
    return types_pb2.Workflow(name=name, nodes=[types_pb2.Node(name="only", action=action)])


def fan_workflow(action: str, width: int = 18, name: str = "fan") -> types_pb2.Workflow:
    nodes = [types_pb2.Node(name="root", action=action)]
    nodes += [
        types_pb2.Node(name=f"leaf{i}", action=action, depends_on=["root"]) for i in range(width)
    ]
    nodes.append(
        types_pb2.Node(name="join", action=action, depends_on=[f"leaf{i}" for i in range(width)])
    )
    return types_pb2.Workflow(name=name, nodes=nodes)


def submit_many(
    address: str,
    workflows: list[types_pb2.Workflow] | list[workflow_service_pb2.SubmitRequest],
    clients: int = 4,
    once: bool = False,
) -> float:
    """Submit every workflow (or whole SubmitRequest); returns runs per second."""
    chunks = [workflows[i::clients] for i in range(clients)]

    def client(chunk: list) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = workflow_service_pb2_grpc.WorkflowServiceStub(channel)
            for wf in chunk:
                if isinstance(wf, workflow_service_pb2.SubmitRequest):
                    stub.Submit(wf)
                elif once:
                    stub.SubmitOnce(
                        workflow_service_pb2.SubmitOnceRequest(workflow=wf, key=uuid.uuid4().hex)
                    )
                else:
                    stub.Submit(workflow_service_pb2.SubmitRequest(workflow=wf))

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, chunks))
    return len(workflows) / (time.perf_counter() - start)


# Workers ---------------------------------------------------------------------------


def worker_process(
    address: str,
    action: str,
    concurrency: int,
    stop_after_idle: float,
    pickup_file: str | None,
    calls: int = 0,
    unsafe: bool = False,
    batched: bool = False,
    quota: tuple | None = None,
) -> None:
    """A Python worker process: long-poll claims batched to free slots, no-op handler.
    With ``calls``, the handler is a durable function of that many no-op step calls,
    made with the journal RPCs themselves (BeginStepCall first when ``unsafe``); with
    ``batched``, the ends of safe calls are held and sent in CompleteMany's step_call_ends
    with the node's completion instead of one EndStepCall each. With ``quota`` (a shared
    counter, an event and a count), the workers count their completions together and
    stop claiming once they reached the count (they finish what they hold)."""
    import asyncio

    async def noop(step: worker_service_pb2.ClaimedStep) -> None:
        return None  # the handler

    async def main() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
            spec = [worker_service_pb2.ActionSpec(name=action)]
            null = struct_null()
            worker_ready()
            idle_since = time.monotonic()
            started = time.monotonic()
            pickups = []

            # A step holds its slot from its claim until its CompleteMany is answered.
            held = 0
            freed = asyncio.Event()
            pending: list[worker_service_pb2.CompleteRequest] = []
            ends: list = []  # ends of safe step calls not sent yet (batched)
            flusher: asyncio.Task | None = None
            running: set[asyncio.Task] = set()

            async def flush() -> None:
                # One CompleteMany carries every completion that finished meanwhile,
                # after the step call ends held for it.
                nonlocal held
                while pending:
                    request = worker_service_pb2.CompleteManyRequest(completions=pending)
                    if ends:
                        request.step_call_ends.extend(ends)
                        del ends[:]
                    sent = len(pending)
                    del pending[:]
                    await stub.CompleteMany(request)
                    held -= sent
                    freed.set()
                    if quota is not None:
                        counter, reached, count = quota
                        with counter.get_lock():
                            counter.value += sent
                            if counter.value >= count:
                                reached.set()

            async def handle(step: worker_service_pb2.ClaimedStep) -> None:
                nonlocal flusher
                if pickup_file:
                    pickups.append((step.run_id, time.time()))
                for seq in range(1, calls + 1):
                    call = dict(
                        run_id=step.run_id,
                        node=step.node,
                        lease_token=step.lease_token,
                        step_id=f"noop#{seq}",
                        seq=seq,
                        function="bench.noop",
                        unsafe_to_repeat=unsafe,
                    )
                    if unsafe:
                        await stub.BeginStepCall(worker_service_pb2.BeginStepCallRequest(**call))
                    end = worker_service_pb2.EndStepCallRequest(**call, output=null)
                    if batched and not unsafe:
                        ends.append(end)
                    else:
                        await stub.EndStepCall(end)
                await noop(step)
                done = worker_service_pb2.CompleteRequest(
                    run_id=step.run_id, node=step.node, lease_token=step.lease_token, output=null
                )
                pending.append(done)
                if flusher is None or flusher.done():
                    flusher = asyncio.create_task(flush())

            while time.monotonic() - started < DEADLINE_S:
                if quota is not None and quota[1].is_set():
                    break
                free = concurrency - held
                if free <= 0:
                    freed.clear()
                    await freed.wait()
                    continue
                request = worker_service_pb2.ClaimRequest(
                    worker_id=f"bench-{os.getpid()}", actions=spec, max_steps=free
                )
                request.wait.FromMilliseconds(500)
                reply = await stub.Claim(request)
                if not reply.steps:
                    if not held and time.monotonic() - idle_since > stop_after_idle:
                        break
                    continue
                idle_since = time.monotonic()
                held += len(reply.steps)
                for step in reply.steps:
                    task = asyncio.create_task(handle(step))
                    running.add(task)
                    task.add_done_callback(running.discard)
            while held:  # what was claimed is reported
                freed.clear()
                await freed.wait()
            if pickup_file:
                Path(pickup_file).write_text(json.dumps(pickups))

    asyncio.run(main())


def stream_worker_process(
    address: str,
    action: str,
    concurrency: int,
    stop_after_idle: float,
    pickup_file: str | None,
    quota: tuple | None = None,
) -> None:
    """worker_process on one Work stream (WorkerService.Work) instead of Claim and
    CompleteMany calls: the stream opens with the worker's slots as credit, the server
    hands out steps as they are ready, and each report of the completions that finished
    while the previous one was on its way grants the credit of the slots it frees; its
    answer comes back with the next steps. Each handler is still a task of its own."""
    import asyncio

    async def noop(step: worker_service_pb2.ClaimedStep) -> None:
        return None  # the handler

    async def main() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
            null = struct_null()
            worker_ready()
            call = stub.Work()
            opened = worker_service_pb2.WorkOpen(
                worker_id=f"bench-{os.getpid()}",
                actions=[worker_service_pb2.ActionSpec(name=action)],
            )
            await call.write(worker_service_pb2.WorkRequest(open=opened, credit=concurrency))
            last_step = time.monotonic()
            pickups = []
            # A step holds its slot from its hand-out until its report is answered.
            held = 0
            pending: list[tuple[str, str, str]] = []
            sent: list[int] = []  # the sizes of the reports on their way, oldest first
            stopping = False
            running: set[asyncio.Task] = set()

            reporter: asyncio.Task | None = None

            async def report() -> None:
                # One report in flight at a time: the completions that finish meanwhile
                # go together in the next. Sent from a task of its own, which runs after
                # the handlers that finish in the same turn of the loop: they go too.
                if not pending:
                    return
                request = worker_service_pb2.WorkRequest(credit=0 if stopping else len(pending))
                completions = request.report.completions
                for run_id, node, token in pending:
                    completions.add(run_id=run_id, node=node, lease_token=token, output=null)
                sent.append(len(pending))
                del pending[:]
                await call.write(request)

            async def handle(step: worker_service_pb2.ClaimedStep) -> None:
                if pickup_file:
                    pickups.append((step.run_id, time.time()))
                nonlocal reporter
                await noop(step)
                pending.append((step.run_id, step.node, step.lease_token))
                if not sent and (reporter is None or reporter.done()):
                    reporter = asyncio.create_task(report())

            async def watch() -> None:
                # Close the stream once idle with nothing held (or the quota reached).
                nonlocal stopping
                while True:
                    await asyncio.sleep(0.05)
                    if quota is not None and quota[1].is_set():
                        stopping = True
                    idle = time.monotonic() - last_step > stop_after_idle
                    if (
                        (stopping or idle or time.monotonic() - started > DEADLINE_S)
                        and not held
                        and not sent
                    ):
                        await call.done_writing()
                        return

            started = time.monotonic()
            watcher = asyncio.create_task(watch())
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    break
                if response.HasField("report"):
                    answered = sent.pop(0)
                    held -= answered
                    if quota is not None:
                        counter, reached, count = quota
                        with counter.get_lock():
                            counter.value += answered
                            if counter.value >= count:
                                reached.set()
                    if pending and (reporter is None or reporter.done()):
                        reporter = asyncio.create_task(report())
                if response.steps:
                    last_step = time.monotonic()
                    held += len(response.steps)
                    for step in response.steps:
                        task = asyncio.create_task(handle(step))
                        running.add(task)
                        task.add_done_callback(running.discard)
            await watcher
            if pickup_file:
                Path(pickup_file).write_text(json.dumps(pickups))

    asyncio.run(main())


def sdk_worker_process(address: str, action: str, concurrency: int, finished) -> None:
    """A worker built with the SDK (pyclient.Worker), async no-op handler; it stops
    when the bench says every step is done."""
    from pyclient import Worker

    worker = Worker(address, concurrency=concurrency, claim_wait=0.5)

    @worker.action(action)
    async def noop(ctx):
        return None

    serve_until(worker, finished)


def sdk_durable_worker_process(
    address: str,
    action: str,
    concurrency: int,
    finished,
    calls: int,
    unsafe: bool,
    record: str = "window",
) -> None:
    """A worker built with the SDK serving a durable function of ``calls`` no-op step
    calls (unsafe_to_repeat when ``unsafe``; ``record``: when their records must be
    durable, see @step); it stops when the bench says so."""
    from pyclient import Worker, step

    worker = Worker(address, concurrency=concurrency, claim_wait=0.5)

    @step(unsafe_to_repeat=unsafe, record=record)
    async def noop() -> None:
        return None

    @worker.workflow(action)
    async def body(ctx):
        for _ in range(calls):
            await noop()

    serve_until(worker, finished)


def sdk_sleeper_process(
    address: str, action: str, concurrency: int, finished, seconds: float
) -> None:
    """A worker built with the SDK serving a durable function that sleeps ``seconds``
    durably, then returns; it stops when the bench says so."""
    from pyclient import Worker, sleep

    worker = Worker(address, concurrency=concurrency, claim_wait=5.0)

    @worker.workflow(action)
    async def body(ctx):
        await sleep(seconds)

    serve_until(worker, finished)


def serve_until(worker, finished) -> None:
    """Run an SDK worker until the bench sets ``finished``."""
    import asyncio

    async def main() -> None:
        worker_ready()
        serving = asyncio.ensure_future(worker.run_async())
        while not finished.is_set() and not serving.done():
            await asyncio.sleep(0.1)
        worker.stop()
        await serving

    asyncio.run(main())


def struct_null():
    from google.protobuf import struct_pb2

    return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)


def start_workers(
    address: str,
    action: str,
    processes: int = 2,
    concurrency: int = 64,
    stop_after_idle: float = 2.0,
    pickup_file: str | None = None,
    calls: int = 0,
    unsafe: bool = False,
    batched: bool = False,
    quota: tuple | None = None,
    stream: bool = True,
):
    """Start bare-stub worker processes: on a Work stream (stream_worker_process), or
    with Claim and CompleteMany calls (worker_process: always so for durable bodies,
    whose step calls are made with their own RPCs); with a ``quota`` (quota()), they
    stop claiming once they completed its count of steps together."""
    ctx = multiprocessing.get_context("spawn")
    if stream and not calls:
        target: Any = stream_worker_process
        args: tuple = (address, action, concurrency, stop_after_idle, pickup_file, quota)
    else:
        target = worker_process
        args = (
            address,
            action,
            concurrency,
            stop_after_idle,
            pickup_file,
            calls,
            unsafe,
            batched,
            quota,
        )
    procs = [ctx.Process(target=target, args=args) for _ in range(processes)]
    for p in procs:
        p.start()
    return procs


def quota(count: int) -> tuple:
    """A count of completions for start_workers' processes to share; the caller keeps
    it until they end (a process started by spawn reads it after start() returns)."""
    ctx = multiprocessing.get_context("spawn")
    return (ctx.Value("q", 0), ctx.Event(), count)


def join(procs) -> None:
    for p in procs:
        p.join(DEADLINE_S)
        if p.is_alive():
            p.kill()
            raise RuntimeError("worker did not finish in time")


def steps_per_second(database_url: str, action: str) -> tuple[int, float]:
    with psycopg.connect(database_url) as conn:
        n, first, last = conn.execute(
            "SELECT count(*), min(started_at), max(finished_at) FROM cyclone.steps "
            "WHERE action = %s AND status = 'completed'",
            (action,),
        ).fetchone()
    return n, n / (last - first).total_seconds()


# Scenarios -----------------------------------------------------------------------


def wal_lsn(database_url: str) -> int:
    """The WAL position in bytes (shared by every database of the cluster: the bench
    must have the cluster to itself for the difference to be its own)."""
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
        ).fetchone()[0]


def vacuumed(database_url: str) -> None:
    """VACUUM ANALYZE the whole database before a measured drain, outside the measure:
    each scenario then starts without the dead rows the ones before it left (the
    `throughput` drain and the psycopg loop leave tens of thousands), instead of
    sharing the two cores with autovacuum cleaning up after them."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")


def scenario_throughput(
    server: Server, database_url: str, runs: int, action: str, **drain: Any
) -> dict:
    """``runs`` one-node runs submitted, then drained (``drain``: measured_drain's
    stream and concurrency)."""
    submit_many(server.address, [one_node("one", action)] * runs)
    return measured_drain(server, database_url, runs, action, **drain)


def measured_drain(
    server: Server,
    database_url: str,
    runs: int,
    action: str,
    stream: bool = True,
    concurrency: int = 64,
) -> dict:
    """The submitted runs of ``action`` drained by the bare-stub workers, measured: steps
    per second, CPU per step by part, WAL and commits per step. Every scenario compared
    with `throughput` drains through this, so that each starts from the same state: the
    database vacuumed, then idle for DbMeter's settle time (background work done)."""
    vacuumed(database_url)
    with DbMeter(database_url) as db:
        wal_before = wal_lsn(database_url)
        with CpuMeter(server) as cpu, StreamPhases(server) as phases:
            join(start_workers(server.address, action, concurrency=concurrency, stream=stream))
        wal_bytes = wal_lsn(database_url) - wal_before
    n, rate = steps_per_second(database_url, action)
    assert n == runs, f"{n} of {runs} steps completed"
    return {
        "steps": n,
        "steps_per_s": round(rate, 1),
        "cpu_ms_per_step": cpu.per_step(n, "server", "workers", "postgres"),
        **({"work_stream_shares": phases.shares} if phases.shares else {}),
        **({"postgres_cpu_ms_per_step_by_node": cpu.per_node(n)} if cpu.nodes_s else {}),
        "worker_startup_cpu_ms": cpu.startup_ms(),
        "wal_bytes_per_step": round(wal_bytes / n),
        **db.per_step(n),
    }


def scenario_sdk(
    server: Server,
    database_url: str,
    runs: int,
    action: str,
    processes: int = 2,
    concurrency: int = 64,
) -> dict:
    """The throughput scenario drained by the SDK's Worker instead of bare stubs, from
    the same state as measured_drain's (the database vacuumed, then settled)."""
    submit_many(server.address, [one_node("one", action)] * runs)
    vacuumed(database_url)
    with DbMeter(database_url) as db:
        wal_before = wal_lsn(database_url)
        with (
            CpuMeter(server) as cpu,
            StreamPhases(server) as phases,
            psycopg.connect(database_url, autocommit=True) as conn,
        ):
            drain_with_sdk(
                conn,
                action,
                runs,
                processes,
                sdk_worker_process,
                server.address,
                action,
                concurrency,
            )
        wal_bytes = wal_lsn(database_url) - wal_before
    n, rate = steps_per_second(database_url, action)
    assert n == runs, f"{n} of {runs} steps completed"
    return {
        "steps": n,
        "steps_per_s": round(rate, 1),
        "cpu_ms_per_step": cpu.per_step(n, "server", "workers", "postgres"),
        **({"work_stream_shares": phases.shares} if phases.shares else {}),
        "worker_startup_cpu_ms": cpu.startup_ms(),
        "wal_bytes_per_step": round(wal_bytes / n),
        **db.per_step(n),
    }


def compare_sdk(sdk: dict, bare: dict) -> None:
    """The SDK's Worker against bare stubs in the same run: its rate, and its worker
    processes' CPU per step."""
    sdk["vs_bare"] = round(sdk["steps_per_s"] / bare["steps_per_s"], 2)
    sdk["workers_cpu_vs_bare"] = round(
        sdk["cpu_ms_per_step"]["workers"] / bare["cpu_ms_per_step"]["workers"], 2
    )


#: Slots of each of the 2 worker processes of the drains compared with the peer: 256
#: steps in flight, as many as pgqueuer's 5 queue managers take at a time (5 x 50).
#: The other scenarios keep --slots (64): their ratios are to `throughput` at 64.
PEER_SLOTS = 128


def scenario_peer(server: Server, database_url: str, runs: int) -> dict:
    """pgqueuer draining ``runs`` no-op jobs, then bare stubs and the SDK's Worker
    draining as many one-node runs with as many jobs in flight (PEER_SLOTS), one after
    the other on the same database: each Cyclone drain as ratios to pgqueuer's (rate,
    total CPU per step over its per job), and the SDK's to the bare stubs'."""
    peer.install(database_url)
    p = peer.scenario_pgqueuer(database_url, runs, CpuMeter)
    print("peer pgqueuer", p, flush=True)
    p["slots"] = PEER_SLOTS
    p["bare"] = scenario_throughput(server, database_url, runs, "peer-noop", concurrency=PEER_SLOTS)
    p["sdk"] = scenario_sdk(server, database_url, runs, "peer-sdk-noop", concurrency=PEER_SLOTS)
    for name in ("bare", "sdk"):
        r = p[name]
        p[f"{name}_rate_ratio"] = round(r["steps_per_s"] / p["jobs_per_s"], 2)
        p[f"{name}_cpu_ratio"] = round(
            r["cpu_ms_per_step"]["total"] / p["cpu_ms_per_job"]["total"], 2
        )
    compare_sdk(p["sdk"], p["bare"])
    return p


def drain_with_sdk(
    conn: psycopg.Connection, action: str, runs: int, processes: int, target, *args, **kwargs
) -> None:
    """Start ``processes`` SDK worker processes (``target(*args, finished, **kwargs)``)
    and stop them once ``runs`` steps of ``action`` completed (or at the deadline)."""
    ctx = multiprocessing.get_context("spawn")
    finished = ctx.Event()
    procs = [
        ctx.Process(target=target, args=(*args, finished), kwargs=kwargs) for _ in range(processes)
    ]
    for p in procs:
        p.start()
    wait_drained(conn, action, runs)
    finished.set()
    join(procs)


def wait_drained(conn: psycopg.Connection, action: str, runs: int, gave_up=lambda: False) -> None:
    """Until ``runs`` steps of ``action`` completed, ``gave_up()`` or the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        time.sleep(0.2)
        done = conn.execute(
            "SELECT count(*) FROM cyclone.steps WHERE action = %s AND status = 'completed'",
            (action,),
        ).fetchone()[0]
        if done == runs or gave_up():
            return


def scenario_baseline(database_url: str, jobs: int, threads: int = 8) -> dict:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_jobs")
        conn.execute(
            "CREATE TABLE bench_jobs (id bigserial PRIMARY KEY, status text NOT NULL,"
            " payload jsonb, locked_at timestamptz, done_at timestamptz)"
        )
        conn.execute("CREATE INDEX ON bench_jobs (id) WHERE status = 'ready'")
        conn.execute(
            "INSERT INTO bench_jobs (status, payload) SELECT 'ready', '{}' "
            "FROM generate_series(1, %s)",
            (jobs,),
        )
    vacuumed(database_url)
    done = [0] * threads
    # Opened before and closed after the measured span, so their CPU is all counted.
    conns = [psycopg.connect(database_url) for _ in range(threads)]

    def loop(i: int) -> None:
        conn = conns[i]
        while True:
            row = conn.execute(
                "UPDATE bench_jobs SET status = 'running', locked_at = now() WHERE id = ("
                " SELECT id FROM bench_jobs WHERE status = 'ready' ORDER BY id"
                " LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
            ).fetchone()
            conn.commit()
            if row is None:
                return
            conn.execute(
                "UPDATE bench_jobs SET status = 'done', done_at = now() WHERE id = %s", row
            )
            conn.commit()
            done[i] += 1

    try:
        start = time.perf_counter()
        with CpuMeter(None) as cpu, ThreadPoolExecutor(threads) as pool:
            list(pool.map(loop, range(threads)))
        elapsed = time.perf_counter() - start
    finally:
        for conn in conns:
            conn.close()
    assert sum(done) == jobs
    return {
        "jobs": jobs,
        "jobs_per_s": round(jobs / elapsed, 1),
        "cpu_ms_per_job": cpu.per_step(jobs, "client", "postgres"),
    }


def scenario_dag(address: str, database_url: str, runs: int, action: str) -> dict:
    submit_many(address, [fan_workflow(action)] * runs)
    join(start_workers(address, action))
    n, rate = steps_per_second(database_url, action)
    with psycopg.connect(database_url) as conn:
        latencies = [
            float(r[0]) * 1000
            for r in conn.execute(
                "SELECT extract(epoch FROM finished_at - created_at) FROM cyclone.runs "
                "WHERE workflow = 'fan' AND status = 'completed'"
            )
        ]
    assert n == runs * 20
    return {"steps": n, "steps_per_s": round(rate, 1), "run_latency_ms": percentiles(latencies)}


#: Bodies in flight per SDK worker process in the durable scenarios. Each safe call
#: with the window of one call, and each unsafe call, waits a round trip and a durable
#: commit before the body's next call runs its function, so a process's rate is its
#: bodies in flight over that round trip until the machine's CPU is busy, and then the
#: records of more bodies share each batch and commit. window / async (median of 3
#: interleaved pairs, 12,000 runs): 0.67 at 128, 0.76 at 256, 0.82 at 512, 0.91 at
#: 1,024; record="async" runs at the same rate with any of them. See
#: docs/performance.md, "Durable functions".
SDK_DURABLE_BODIES = 1024

#: Interleaved pairs of window and record="async" runs: their rate ratio is the median
#: of the pairs' ratios (this machine's speed changes from minute to minute).
WINDOW_PAIRS = 3


def scenario_durable(
    server: Server,
    database_url: str,
    runs: int,
    calls: int,
    action: str,
    unsafe: bool,
    sdk: bool,
    batched: bool = False,
    processes: int = 2,
    concurrency: int | None = None,
    record: str = "window",
) -> dict:
    """``runs`` one-node runs whose node calls ``calls`` no-op steps; step calls per
    second from the first claim to the last completion, and CPU per step call.

    With the SDK, SDK_DURABLE_BODIES bodies in flight per process (``concurrency``; the
    bare-stub variants and the throughput scenario's workers hold 64)."""
    if concurrency is None:
        concurrency = SDK_DURABLE_BODIES if sdk else 64
    submit_many(server.address, [one_node("durable", action)] * runs)
    with CpuMeter(server) as cpu, psycopg.connect(database_url, autocommit=True) as conn:
        if sdk:
            drain_with_sdk(
                conn,
                action,
                runs,
                processes,
                sdk_durable_worker_process,
                server.address,
                action,
                concurrency,
                calls=calls,
                unsafe=unsafe,
                record=record,
            )
        else:
            join(
                start_workers(
                    server.address,
                    action,
                    processes,
                    concurrency,
                    calls=calls,
                    unsafe=unsafe,
                    batched=batched,
                )
            )
        recorded = conn.execute(
            "SELECT count(*) FROM cyclone.step_calls c JOIN cyclone.steps s USING (run_id, node)"
            " WHERE s.action = %s AND c.status = 'succeeded'",
            (action,),
        ).fetchone()[0]
    n, rate = steps_per_second(database_url, action)
    assert n == runs, f"{n} of {runs} nodes completed"
    assert recorded == runs * calls, f"{recorded} of {runs * calls} step calls recorded"
    return {
        "runs": n,
        "step_calls": recorded,
        "step_calls_per_s": round(rate * calls, 1),
        "cpu_ms_per_step_call": cpu.per_step(recorded, "server", "workers", "postgres"),
    }


def durable_scenarios(server: Server, database_url: str, args, dag_rate: float | None) -> dict:
    """The durable scenarios: safe and unsafe calls with the SDK's Worker and with bare
    stubs; WINDOW_PAIRS interleaved pairs of SDK safe calls with the window of one call
    and with record="async" (the window's cost, as the median of the pairs' ratios); and
    bare stubs sending the ends in CompleteMany."""
    durable: dict = {}

    def run(label: str, runs: int, unsafe: bool, sdk: bool, **kwargs) -> dict:
        calls = args.durable_calls
        out = scenario_durable(
            server, database_url, runs, calls, f"durable-{label}", unsafe, sdk, **kwargs
        )
        print("durable", label, out, flush=True)
        return out

    pairs = []
    for i in range(WINDOW_PAIRS):
        window = run(f"sdk_safe_{i}", args.durable_sdk_runs, False, True)
        unwaited = run(f"sdk_safe_async_{i}", args.durable_sdk_runs, False, True, record="async")
        pairs.append((window, unwaited))
    ratios = [w["step_calls_per_s"] / a["step_calls_per_s"] for w, a in pairs]
    # The pair whose ratio is the median stands for both rates and their CPU.
    middle = sorted(range(len(pairs)), key=ratios.__getitem__)[len(pairs) // 2]
    durable["sdk_safe"], durable["sdk_safe_async"] = pairs[middle]
    durable["sdk_window_vs_async"] = round(ratios[middle], 2)
    durable["sdk_window_vs_async_pairs"] = [round(r, 2) for r in ratios]
    durable["sdk_unsafe"] = run("sdk_unsafe", args.durable_sdk_runs, True, True)
    for unsafe in (False, True):
        label = "stubs" + ("_unsafe" if unsafe else "_safe")
        durable[label] = run(label, args.durable_runs, unsafe, False)
    if BATCHED_ENDS:
        durable["stubs_batched_safe"] = run(
            "stubs_batched_safe", args.durable_runs, False, False, batched=True
        )
        if dag_rate:
            durable["stubs_batched_vs_dag"] = round(
                durable["stubs_batched_safe"]["step_calls_per_s"] / dag_rate, 2
            )
    for kind in ("sdk", "stubs"):
        safe, unsafe = durable[f"{kind}_safe"], durable[f"{kind}_unsafe"]
        durable[f"{kind}_unsafe_cost"] = round(
            safe["step_calls_per_s"] / unsafe["step_calls_per_s"], 2
        )
        if dag_rate:
            durable[f"{kind}_vs_dag"] = round(safe["step_calls_per_s"] / dag_rate, 2)
    return durable


def scenario_pickup(address: str, runs: int, action: str, tmp: Path) -> dict:
    pickup_file = str(tmp / "pickups.json")
    procs = start_workers(
        address, action, processes=1, concurrency=1, stop_after_idle=3, pickup_file=pickup_file
    )
    submitted = {}
    with grpc.insecure_channel(address) as channel:
        stub = workflow_service_pb2_grpc.WorkflowServiceStub(channel)
        time.sleep(2)  # let the worker start and begin waiting
        for _ in range(runs):
            reply = stub.Submit(workflow_service_pb2.SubmitRequest(workflow=one_node("p", action)))
            submitted[reply.run_id] = time.time()
            time.sleep(0.05)  # an idle system: one run at a time
    join(procs)
    pickups = dict(json.loads(Path(pickup_file).read_text()))
    latencies = [(pickups[r] - t) * 1000 for r, t in submitted.items()]
    return percentiles(latencies)


def scenario_waits(database_url: str, address: str, runs: int, action: str) -> dict:
    """``runs`` durable sleeps of 1s, submitted while the workers run: how late each
    sleeper was claimed again after its wake time (the claim's start_at minus the
    journal's wake_at, both on the server's host clock)."""
    submitted: list[float] = []

    def submit() -> None:
        time.sleep(2)  # the workers start and begin waiting
        submitted.append(submit_many(address, [one_node("nap", action)] * runs))

    thread = threading.Thread(target=submit)
    thread.start()
    with psycopg.connect(database_url, autocommit=True) as conn:
        drain_with_sdk(conn, action, runs, 2, sdk_sleeper_process, address, action, 64, seconds=1.0)
        thread.join()
        rows = conn.execute(
            "SELECT extract(epoch FROM s.started_at - c.wake_at) * 1000, s.resumes"
            "  FROM cyclone.steps s JOIN cyclone.step_calls c USING (run_id, node)"
            " WHERE s.action = %s AND s.status = 'completed' AND c.function = 'cyclone.sleep'",
            (action,),
        ).fetchall()
    assert len(rows) == runs, f"{len(rows)} of {runs} sleepers completed"
    late = [float(ms) for ms, _ in rows]
    return {
        "runs": runs,
        "submitted_per_s": round(submitted[0], 1) if submitted else None,
        "resumes": sum(r for _, r in rows),
        "wake_to_resume_ms": {**percentiles(late), "max": round(max(late), 1)},
    }


def scenario_big(address: str) -> dict:
    """Health-check latency on one connection while another submits a large workflow."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    fan_in = 50
    nodes = [
        types_pb2.Node(
            name=f"n{i}", action="big", depends_on=[f"n{j}" for j in range(max(0, i - fan_in), i)]
        )
        for i in range(2000)
    ]
    request = workflow_service_pb2.SubmitRequest(
        workflow=types_pb2.Workflow(name="big", nodes=nodes)
    )
    done = threading.Event()
    took: list[float] = []

    def big() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = workflow_service_pb2_grpc.WorkflowServiceStub(channel)
            for _ in range(3):
                start = time.perf_counter()
                stub.Submit(request, timeout=120)
                took.append((time.perf_counter() - start) * 1000)
        done.set()

    latencies = []
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        thread = threading.Thread(target=big)
        thread.start()
        while not done.is_set():
            start = time.perf_counter()
            health.Check(health_pb2.HealthCheckRequest(), timeout=60)
            latencies.append((time.perf_counter() - start) * 1000)
            time.sleep(0.005)
        thread.join()
    edges = sum(len(n.depends_on) for n in nodes)
    return {
        "edges": edges,
        "bytes": request.ByteSize(),
        "submit_ms": round(statistics.median(took), 1),
        "health_ms": {**percentiles(latencies), "max": round(max(latencies), 2)},
    }


def scenario_history(database_url: str, finished: int) -> None:
    """Load finished runs and steps straight into the tables, in batches."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        batch = 100_000
        for start in range(0, finished, batch):
            conn.execute(
                """
                WITH r AS (
                    INSERT INTO cyclone.runs (run_id, workflow, status, steps_total, steps_open,
                                              created_at, updated_at, finished_at)
                    SELECT gen_random_uuid(), 'old', 'completed', 1, 0,
                           now() - interval '1 day', now(), now()
                      FROM generate_series(1, %s)
                    RETURNING run_id)
                INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule,
                    depends_on, dependents, deps_open, attempt, max_attempts, attempt_budget,
                    initial_backoff, max_backoff, backoff_multiplier, timeout, output,
                    started_at, finished_at)
                SELECT run_id, 'only', 0, 'old', 'completed', 'all_success', '{}', '{}', 0, 1,
                       3, 3, '1s', '5m', 2, '5m', 'null', now(), now() FROM r
            """,
                (min(batch, finished - start),),
            )
        conn.execute("VACUUM ANALYZE cyclone.runs")
        conn.execute("VACUUM ANALYZE cyclone.steps")


#: The server's workflow limits for the fan scenario (a root, FAN_WIDTH leaves and a
#: join): raised by flags for the bench's server only; the defaults (cyclone.dag)
#: stay as they are.
FAN_WIDTH = 10_000


def fan_flags(width: int) -> tuple[str, ...]:
    return (
        "--max-nodes",
        str(max(dag_default("MAX_NODES"), width + 2)),
        "--max-dependencies",
        str(max(dag_default("MAX_DEPENDENCIES"), width)),
        "--max-dependents",
        str(max(dag_default("MAX_DEPENDENTS"), width)),
    )


def dag_default(name: str) -> int:
    from cyclone import dag

    return int(getattr(dag, name))


def scenario_fan(server: Server, database_url: str, width: int, action: str) -> dict:
    """One run: a root, ``width`` leaves depending on it, a join depending on every
    leaf; drained by the throughput scenario's workers. Steps per second from the
    root's claim to the join's completion, and how the join followed its last leaf."""
    started = time.perf_counter()
    submit_many(server.address, [fan_workflow(action, width, name="wide")], clients=1)
    submit_ms = (time.perf_counter() - started) * 1000
    drained = measured_drain(server, database_url, width + 2, action)
    with psycopg.connect(database_url) as conn:
        release, pickup, upstream, run_status = conn.execute(
            """
            SELECT extract(epoch FROM j.available_at - l.last) * 1000,
                   extract(epoch FROM j.started_at - l.last) * 1000,
                   (SELECT count(*) FROM cyclone.steps u
                     WHERE u.run_id = j.run_id AND u.node = ANY (j.depends_on)
                       AND u.status = 'completed' AND u.finished_at <= j.available_at),
                   r.status
              FROM cyclone.steps j
              JOIN cyclone.runs r USING (run_id)
             CROSS JOIN LATERAL (SELECT max(f.finished_at) AS last FROM cyclone.steps f
                                  WHERE f.run_id = j.run_id AND f.node LIKE 'leaf%%') l
             WHERE j.action = %s AND j.node = 'join'
            """,
            (action,),
        ).fetchone()
    assert upstream == width and run_status == "completed", (upstream, run_status)
    return {
        "width": width,
        **drained,
        "submit_ms": round(submit_ms, 1),
        "join_released_after_last_leaf_ms": round(float(release), 2),
        "join_claimed_after_last_leaf_ms": round(float(pickup), 2),
    }


def backlog_load(database_url: str, runs: int, action: str, batch: int = 50_000) -> float:
    """Put ``runs`` one-node runs of ``action`` in the tables, ready to claim, as Submit
    would make them: cyclone.run_submit called from SQL for a batch of UUIDv7 run ids
    at a time (one transaction per batch), with the node JSON the server would pass.
    Then VACUUM ANALYZE, as autovacuum would soon after such an insert. Returns the
    runs loaded per second."""
    from uuid6 import uuid7

    from cyclone import dag
    from service.db.runs import nodes_json

    nodes = nodes_json(dag.validate_workflow("backlog", [dag.NodeSpec("only", action)]))
    start = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as conn:
        for done in range(0, runs, batch):
            ids = [uuid7() for _ in range(min(batch, runs - done))]
            conn.execute(
                "SELECT count(s.created) FROM unnest(%s::uuid[]) AS r(id)"
                " CROSS JOIN LATERAL cyclone.run_submit(r.id, 'backlog', NULL, NULL,"
                " %s::jsonb) s",
                (ids, nodes),
            )
        conn.execute("VACUUM ANALYZE cyclone.runs")
        conn.execute("VACUUM ANALYZE cyclone.steps")
    return runs / (time.perf_counter() - start)


def scenario_backlog(
    server: Server, database_url: str, runs: int, measure: int, action: str
) -> dict:
    """``runs`` one-node runs ready before the workers start (backlog_load), drained by
    the throughput scenario's workers: all of them (``measure`` = 0), or until
    ``measure`` completed, the rest still ready. Steps per second from the first claim
    to the ``measure``-th completion (or the last)."""
    loaded_per_s = backlog_load(database_url, runs, action)
    measure = min(measure, runs) if measure else runs
    shared = quota(measure) if measure < runs else None
    # As measured_drain: idle for DbMeter's settle time before the workers start.
    with DbMeter(database_url) as db:
        wal_before = wal_lsn(database_url)
        with CpuMeter(server) as cpu:
            join(start_workers(server.address, action, quota=shared))
        wal_bytes = wal_lsn(database_url) - wal_before
    with psycopg.connect(database_url) as conn:
        n, first = conn.execute(
            "SELECT count(*), min(started_at) FROM cyclone.steps"
            " WHERE action = %s AND status = 'completed'",
            (action,),
        ).fetchone()
        nth = conn.execute(
            "SELECT finished_at FROM cyclone.steps WHERE action = %s AND status = 'completed'"
            " ORDER BY finished_at OFFSET %s LIMIT 1",
            (action, measure - 1),
        ).fetchone()[0]
    assert n >= measure, f"{n} of {measure} steps completed"
    return {
        "runs": runs,
        "loaded_per_s": round(loaded_per_s, 1),
        "measured_steps": measure,
        "steps_completed": n,
        "steps_per_s": round(measure / (nth - first).total_seconds(), 1),
        "cpu_ms_per_step": cpu.per_step(n, "server", "workers", "postgres"),
        "wal_bytes_per_step": round(wal_bytes / n),
        **db.per_step(n),
    }


def percentiles(values: list[float]) -> dict:
    values = sorted(values)
    q = statistics.quantiles(values, n=100)
    return {"p50": round(q[49], 2), "p99": round(q[98], 2), "n": len(values)}


def flow_requests(runs: int, action: str, seed: int = 16) -> list:
    """One-node runs with flow control in use: each run a priority from 0 to 9; half of
    them keyed by one of 200 customers, at most 5 running per customer."""
    rnd = random.Random(seed)
    keyed = types_pb2.Node(
        name="only",
        action=action,
        concurrency=types_pb2.ConcurrencyLimit(key="customer:{run.customer}", limit=5),
    )
    plain = types_pb2.Node(name="only", action=action)
    requests = []
    for i in range(runs):
        node = keyed if i % 2 else plain
        request = workflow_service_pb2.SubmitRequest(
            workflow=types_pb2.Workflow(name="flow", nodes=[node]), priority=rnd.randrange(10)
        )
        request.input.struct_value.fields["customer"].number_value = rnd.randrange(200)
        requests.append(request)
    return requests


def scenario_flow(server: Server, database_url: str, runs: int, action: str) -> dict:
    """throughput, with priorities and concurrency keys in use (flow_requests)."""
    submit_many(server.address, flow_requests(runs, action))
    return measured_drain(server, database_url, runs, action)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument(
        "--slots",
        type=int,
        default=64,
        help="handler slots of each worker process of `throughput` and `sdk` (default 64)",
    )
    parser.add_argument("--dag-runs", type=int, default=500)
    parser.add_argument("--pickups", type=int, default=200)
    parser.add_argument(
        "--durable-runs", type=int, default=1000, help="durable runs drained by bare stubs"
    )
    parser.add_argument(
        "--durable-sdk-runs",
        type=int,
        default=12_000,
        help="durable runs drained by the SDK's Worker (several waves of its bodies in flight)",
    )
    parser.add_argument(
        "--waits-runs", type=int, default=10_000, help="durable 1s sleeps (default 10,000)"
    )
    parser.add_argument(
        "--durable-calls", type=int, default=10, help="step calls per durable body (default 10)"
    )
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument(
        "--backlog-runs",
        type=int,
        default=1_000_000,
        help="one-node runs ready before the backlog's workers start (default 1,000,000)",
    )
    parser.add_argument(
        "--backlog-measure",
        type=int,
        default=100_000,
        help="completions the backlog's rate is measured over, the rest left ready "
        "(default 100,000; 0 drains the whole backlog)",
    )
    parser.add_argument(
        "--fan-width", type=int, default=FAN_WIDTH, help="leaves of the fan scenario's run"
    )
    parser.add_argument(
        "--stream-readers",
        type=int,
        default=1000,
        help="live ReadStream calls open during the streams scenario (default 1,000)",
    )
    parser.add_argument("--only", default="", help="comma-separated scenarios to run")
    parser.add_argument(
        "--database",
        default="cyclone_bench",
        help="database to (re)create for the run (default cyclone_bench)",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="a superuser URL of the Postgres to measure, e.g. a PostgreSQL 15 "
        "cluster (default: CYCLONE_DATABASE_URL, else the embedded one)",
    )
    parser.add_argument(
        "--citus",
        default=None,
        metavar="URL",
        help="measure on a Citus cluster: URL is a superuser URL of its coordinator's "
        "database (workers added, e.g. one of tests/citus/cluster.sh); its cyclone schema "
        "is dropped and made again, distributed (docs/scaling.md)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "latest.json",
        help="where to write the results (default bench/results/latest.json)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the selected scenarios N times, each on a fresh database, and report "
        "the median of every figure (all runs are kept in the results; default 1)",
    )
    parser.add_argument(
        "--citus-shards",
        type=int,
        default=0,
        help="with --citus: the runs' shards (cyclone-server --citus-shards; default 0, "
        "Citus's citus.shard_count)",
    )
    parser.add_argument(
        "--citus-only",
        action="store_true",
        help="with --citus: measure the cluster alone, not single Postgres beside it",
    )
    args = parser.parse_args()
    if args.repeat > 1:
        repeat(args)
        return
    if args.citus and not args.citus_only:
        compare_citus(args)
        return
    only = set(filter(None, args.only.split(",")))

    def wanted(name: str) -> bool:
        return not only or name in only

    from service.migrate import migrate

    if args.citus:
        # A Citus database cannot simply be created afresh (every node needs it): the
        # schema is dropped (on every node) and migrated again, which distributes it.
        database_url = args.citus
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS cyclone CASCADE")
        migrate(database_url, citus="on", citus_shards=args.citus_shards)
        base = database_url
    else:
        base = admin_url(args.url)
        database_url = fresh_database(base, args.database)
        migrate(database_url)
    with psycopg.connect(database_url) as conn:
        pg_version = conn.execute("SHOW server_version").fetchone()[0]
        data_directory = conn.execute("SHOW data_directory").fetchone()[0]
    CpuMeter.pid_file = Path(data_directory) / "postmaster.pid"
    if args.citus:
        CpuMeter.node_pid_files = citus_nodes(database_url)
    DbMeter.admin_url = base
    # The fan scenario's workflow is past the default limits: raised for this server.
    flags = fan_flags(args.fan_width) if wanted("fan") else ()
    server = Server(database_url, flags)
    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "postgres": pg_version,
        "server_flags": " ".join(flags),
        "citus": bool(args.citus),
    }
    tmp = RESULTS / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    startup_dir = tmp / f"startup-{os.getpid()}"
    startup_dir.mkdir(exist_ok=True)
    os.environ[STARTUP_DIR] = str(startup_dir)  # inherited by the worker processes
    try:
        if wanted("submit"):
            results["submit"] = {
                "runs_per_s": round(
                    submit_many(server.address, [one_node("s", "submit-only")] * 2000), 1
                ),
                "once_runs_per_s": round(
                    submit_many(server.address, [one_node("s1", "submit-only")] * 2000, once=True),
                    1,
                ),
            }
            print("submit", results["submit"], flush=True)
        if wanted("big"):
            results["big"] = scenario_big(server.address)
            print("big", results["big"], flush=True)
        if wanted("throughput"):
            results["throughput"] = scenario_throughput(
                server, database_url, args.runs, "noop", concurrency=args.slots
            )
            base_result = scenario_baseline(database_url, args.runs)
            results["throughput"]["baseline_jobs_per_s"] = base_result["jobs_per_s"]
            results["throughput"]["baseline_cpu_ms_per_job"] = base_result["cpu_ms_per_job"]
            results["throughput"]["ratio"] = round(
                results["throughput"]["steps_per_s"] / base_result["jobs_per_s"], 2
            )
            print("throughput", results["throughput"], flush=True)
        if wanted("peer") and not args.citus:
            results["peer"] = scenario_peer(server, database_url, args.runs)
            print("peer", results["peer"], flush=True)
        if wanted("unary"):
            results["unary"] = scenario_throughput(
                server, database_url, args.runs, "unaryop", stream=False
            )
            if "throughput" in results:
                results["unary"]["ratio"] = round(
                    results["unary"]["steps_per_s"] / results["throughput"]["baseline_jobs_per_s"],
                    2,
                )
            print("unary", results["unary"], flush=True)
        if wanted("flow"):
            results["flow"] = scenario_flow(server, database_url, args.runs, "flowop")
            if "throughput" in results:
                results["flow"]["ratio"] = round(
                    results["flow"]["steps_per_s"] / results["throughput"]["steps_per_s"], 2
                )
            print("flow", results["flow"], flush=True)
        if wanted("sdk"):
            results["sdk"] = scenario_sdk(
                server, database_url, args.runs, "sdk-noop", concurrency=args.slots
            )
            if "throughput" in results:
                results["sdk"]["ratio"] = round(
                    results["sdk"]["steps_per_s"] / results["throughput"]["baseline_jobs_per_s"], 2
                )
            if "throughput" in results:
                compare_sdk(results["sdk"], results["throughput"])
            print("sdk", results["sdk"], flush=True)
        if wanted("languages") and not args.citus:
            this = sys.modules[__name__]
            results["languages"] = languages.scenario(this, server, database_url, args.runs)
        if wanted("dag"):
            results["dag"] = scenario_dag(server.address, database_url, args.dag_runs, "dagop")
            print("dag", results["dag"], flush=True)
        if wanted("durable"):
            dag_rate = results["dag"]["steps_per_s"] if "dag" in results else None
            durable = durable_scenarios(server, database_url, args, dag_rate)
            results["durable"] = durable
        if wanted("waits"):
            results["waits"] = scenario_waits(
                database_url, server.address, args.waits_runs, "sleeper"
            )
            print("waits", results["waits"], flush=True)
        if wanted("pickup"):
            results["pickup_ms"] = scenario_pickup(server.address, args.pickups, "pick", tmp)
            print("pickup_ms", results["pickup_ms"], flush=True)
        if wanted("fan"):
            results["fan"] = scenario_fan(server, database_url, args.fan_width, "fanop")
            if "throughput" in results:
                results["fan"]["ratio"] = round(
                    results["fan"]["steps_per_s"] / results["throughput"]["steps_per_s"], 2
                )
            print("fan", results["fan"], flush=True)
        if wanted("history") and "throughput" in results:
            scenario_history(database_url, args.history)
            again = scenario_throughput(server, database_url, args.runs, "noop2")
            results["history"] = {
                "finished_steps_loaded": args.history,
                "steps_per_s": again["steps_per_s"],
                "cpu_ms_per_step": again["cpu_ms_per_step"],
                "wal_bytes_per_step": again["wal_bytes_per_step"],
                "ratio": round(again["steps_per_s"] / results["throughput"]["steps_per_s"], 2),
            }
            print("history", results["history"], flush=True)
        if wanted("streams"):
            this = sys.modules[__name__]
            results["streams"] = streams_bench.scenario(
                this, server, database_url, args.runs, args.stream_readers
            )
            print("streams", results["streams"], flush=True)
        if wanted("backlog"):
            # Last: the rest of the backlog stays in the tables, ready.
            results["backlog"] = scenario_backlog(
                server, database_url, args.backlog_runs, args.backlog_measure, "backlogop"
            )
            if "throughput" in results:
                results["backlog"]["ratio"] = round(
                    results["backlog"]["steps_per_s"] / results["throughput"]["steps_per_s"], 2
                )
            print("backlog", results["backlog"], flush=True)
    finally:
        server.stop()
        shutil.rmtree(startup_dir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results, args.out)


def citus_nodes(coordinator_url: str) -> dict[str, Path]:
    """The postmaster pid file of each node of a local Citus cluster, by name: the
    coordinator, then "worker 1", "worker 2"... (nodes on other machines are left out)."""
    with psycopg.connect(coordinator_url, autocommit=True) as conn:
        nodes = conn.execute(
            "SELECT groupid, nodename, nodeport FROM pg_dist_node ORDER BY groupid"
        ).fetchall()
    found = {}
    for group, host, port in nodes:
        url = psycopg.conninfo.make_conninfo(coordinator_url, host=host, port=port)
        with psycopg.connect(url, autocommit=True) as conn:
            data = conn.execute("SHOW data_directory").fetchone()[0]
        pid_file = Path(data) / "postmaster.pid"
        if pid_file.exists():
            found["coordinator" if group == 0 else f"worker {group}"] = pid_file
    return found


def compare_citus(args: argparse.Namespace) -> None:
    """``--citus URL``: the selected scenarios on single Postgres (a plain database on
    the coordinator's instance), then on the cluster, each in a process of its own, one
    after the other on the same machine; the results hold both and a table sets them
    side by side (docs/scaling.md)."""
    argv = sys.argv[1:]
    drop = ("--citus", "--out", "--url", "--database")
    while at := [i for i, a in enumerate(argv) if a.split("=")[0] in drop]:
        del argv[at[0] : at[0] + (1 if "=" in argv[at[0]] else 2)]
    single_url = re.sub(r"(postgres(?:ql)?://[^/]*/)([^?]*)", r"\g<1>postgres", args.citus, count=1)
    outs = {
        "single": args.out.with_name(f"{args.out.stem}.single.json"),
        "citus": args.out.with_name(f"{args.out.stem}.citus.json"),
    }
    print("--- single Postgres (the coordinator's instance, a plain database) ---", flush=True)
    subprocess.run(
        [sys.executable, __file__, *argv, "--url", single_url, "--out", str(outs["single"])],
        check=True,
    )
    print("--- Citus: the coordinator and its workers ---", flush=True)
    subprocess.run(
        [
            sys.executable,
            __file__,
            *argv,
            "--citus",
            args.citus,
            "--citus-only",
            "--out",
            str(outs["citus"]),
        ],
        check=True,
    )
    results = {k: json.loads(v.read_text()) for k, v in outs.items()}
    results["ratios"] = citus_ratios(results["single"], results["citus"])
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_citus_table(results, args.out)


#: docs/scaling.md's targets for the cluster against single Postgres in the same run.
CITUS_TARGETS = {
    "postgres_cpu_per_step": ("Postgres CPU per step, all nodes", "<= 3"),
    "server_cpu_per_step": ("server CPU per step", "<= 1.5"),
    "coordinator_share": ("coordinator's share of the cluster's Postgres CPU", "<= 0.2"),
    "pickup_p50": ("pickup p50", "<= 3"),
    "throughput": ("throughput", ""),
}


def citus_ratios(one: dict, cluster: dict) -> dict:
    """The cluster's figures as ratios to single Postgres's of the same run (with
    --repeat, the medians of these are the medians of the pairwise ratios)."""
    ratios: dict[str, float] = {}
    if "throughput" in one and "throughput" in cluster:
        a, b = one["throughput"], cluster["throughput"]
        for part in ("postgres", "server"):
            if a["cpu_ms_per_step"][part]:
                ratios[f"{part}_cpu_per_step"] = round(
                    b["cpu_ms_per_step"][part] / a["cpu_ms_per_step"][part], 2
                )
        nodes = b.get("postgres_cpu_ms_per_step_by_node", {})
        if nodes and sum(nodes.values()):
            ratios["coordinator_share"] = round(nodes["coordinator"] / sum(nodes.values()), 2)
        if a["steps_per_s"]:
            ratios["throughput"] = round(b["steps_per_s"] / a["steps_per_s"], 2)
    if "pickup_ms" in one and "pickup_ms" in cluster and one["pickup_ms"]["p50"]:
        ratios["pickup_p50"] = round(cluster["pickup_ms"]["p50"] / one["pickup_ms"]["p50"], 2)
    return ratios


def print_citus_table(r: dict, out: Path) -> None:
    """Single Postgres beside Citus: throughput, pickup and CPU per step on each node,
    then the cluster's figures as ratios to single Postgres's, against their targets."""
    rows: list[tuple[str, object, object]] = []
    one, cluster = r["single"], r["citus"]
    if "throughput" in one and "throughput" in cluster:
        a, b = one["throughput"], cluster["throughput"]
        rows.append(("throughput steps/s", a["steps_per_s"], b["steps_per_s"]))
        for part in ("server", "workers", "postgres"):
            rows.append(
                (f"CPU ms per step: {part}", a["cpu_ms_per_step"][part], b["cpu_ms_per_step"][part])
            )
        for node, ms in b.get("postgres_cpu_ms_per_step_by_node", {}).items():
            rows.append((f"  of which Postgres on {node}", "", ms))
        rows.append(
            ("commits per step (coordinator)", a["commits_per_step"], b["commits_per_step"])
        )
    if "pickup_ms" in one and "pickup_ms" in cluster:
        a, b = one["pickup_ms"], cluster["pickup_ms"]
        rows.append(("pickup p50 / p99 ms", f"{a['p50']} / {a['p99']}", f"{b['p50']} / {b['p99']}"))
    width = max(len(label) for label, _, _ in rows) + 2
    print(f"\n  {'':{width}}{'single Postgres':>20}{'Citus 1+2':>20}")
    for label, a, b in rows:
        print(f"  {label:{width}}{a!s:>20}{b!s:>20}")
    ratios = r.get("ratios") or citus_ratios(one, cluster)
    if ratios:
        print("\n  Citus ÷ single Postgres")
        for key, (label, target) in CITUS_TARGETS.items():
            if key in ratios:
                goal = f"  (target {target})" if target else ""
                print(f"    {label:{width + 10}}{ratios[key]!s:>10}{goal}")
    print(f"\n  Postgres {one['postgres']}, {one['machine']['cpus']} CPUs; {out} written")


def repeat(args: argparse.Namespace) -> None:
    """``--repeat N``: this bench N times over, one after the other, each in a process
    of its own on a fresh database; the results hold each run and, under the usual
    keys, the median of every number the runs share (`make bench` takes medians of 3)."""
    argv = sys.argv[1:]
    while at := [i for i, a in enumerate(argv) if a.startswith("--repeat")]:
        del argv[at[0] : at[0] + (1 if "=" in argv[at[0]] else 2)]
    runs = []
    for i in range(args.repeat):
        out = args.out.with_name(f"{args.out.stem}.run{i + 1}.json")
        print(f"--- run {i + 1} of {args.repeat} ---", flush=True)
        subprocess.run([sys.executable, __file__, *argv, "--out", str(out)], check=True)
        runs.append(json.loads(out.read_text()))
    results = _medians(runs)
    results["runs"] = runs
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nmedians of {args.repeat} runs:")
    if args.citus and not args.citus_only:
        print_citus_table(results, args.out)
        return
    print_table(results, args.out)


def _medians(runs: list) -> object:
    """The median of each number found at the same place in every run (the first
    run's value for anything else)."""
    first = runs[0]
    if isinstance(first, dict):
        return {
            k: _medians([r[k] for r in runs])
            if all(isinstance(r, dict) and k in r for r in runs)
            else v
            for k, v in first.items()
        }
    if all(isinstance(r, int) and not isinstance(r, bool) for r in runs):
        return statistics.median_low(runs)  # counts stay whole
    if all(isinstance(r, int | float) and not isinstance(r, bool) for r in runs):
        return round(statistics.median(runs), 3)
    return first


def cpu_split(cpu: dict) -> str:
    """ "server / workers / Postgres = total" (or the parts given, and their total)."""
    parts = " / ".join(str(v) for k, v in cpu.items() if k != "total")
    return f"{parts} = {cpu['total']}" if "total" in cpu else parts


def drain_rows(d: dict, indent: str, target: float) -> list[tuple[str, object]]:
    """The CPU split (and its target), commits and WAL per step, and the workers'
    start-up, of a throughput, flow or sdk drain."""
    return [
        (
            f"{indent}CPU ms per step: server / workers / Postgres = total (target <= {target})",
            cpu_split(d["cpu_ms_per_step"]),
        ),
        (
            "  commits, WAL bytes, WAL records, full-page images per step",
            f"{d.get('commits_per_step')}, {d.get('wal_bytes_per_step')},"
            f" {d.get('wal_records_per_step')}, {d.get('wal_fpi_per_step')}",
        ),
        ("  worker start-up CPU ms per process (not in the above)", d["worker_startup_cpu_ms"]),
        *phase_rows(d, "  "),
    ]


def phase_rows(d: dict, indent: str) -> list[tuple[str, object]]:
    """The Work streams' time by phase in a drain, when the server reported it."""
    shares = d.get("work_stream_shares")
    if not shares:
        return []
    return [
        (
            f"{indent}Work streams' time: reports / claims / waiting on workers",
            " / ".join(str(shares.get(p, "")) for p in StreamPhases.PHASES),
        )
    ]


def window_ratios(r: dict) -> str:
    """The durable window / async ratio and what it is the median of: one run's pairs,
    or (with --repeat) each run's own median."""
    d = r["durable"]
    if "runs" in r:
        each = [run["durable"]["sdk_window_vs_async"] for run in r["runs"]]
        return f"{d['sdk_window_vs_async']} (runs: {', '.join(map(str, each))})"
    pairs = d.get("sdk_window_vs_async_pairs", [])
    return f"{d['sdk_window_vs_async']} (pairs: {', '.join(map(str, pairs))})"


def print_table(r: dict, out: Path) -> None:
    rows = []
    if "throughput" in r:
        t = r["throughput"]
        rows += [
            ("throughput steps/s", t["steps_per_s"]),
            ("baseline jobs/s (psycopg loop)", t["baseline_jobs_per_s"]),
            ("throughput ratio (target >= 4.0)", t["ratio"]),
            *drain_rows(t, "", 0.13),
            (
                "CPU ms per baseline job: client / Postgres = total",
                cpu_split(t["baseline_cpu_ms_per_job"]),
            ),
        ]
    if "unary" in r:
        u = r["unary"]
        rows += [
            ("throughput over Claim and CompleteMany calls, steps/s", u["steps_per_s"]),
            *drain_rows(u, "  ", 0.13),
        ]
        if "ratio" in u:
            rows.append(("  its ratio: steps/s / baseline jobs/s", u["ratio"]))
    if "flow" in r:
        f = r["flow"]
        rows += [
            ("flow (priorities, concurrency keys) steps/s", f["steps_per_s"]),
            *drain_rows(f, "  ", 0.13),
        ]
        if "ratio" in f:
            rows.append(("  flow / throughput (target >= 0.8)", f["ratio"]))
    if "sdk" in r:
        d = r["sdk"]
        rows += [
            ("throughput with the SDK's Worker, steps/s", d["steps_per_s"]),
            *drain_rows(d, "  ", 0.18),
        ]
        if "ratio" in d:
            rows.append(("  SDK ratio: steps/s / baseline jobs/s (target >= 3.2)", d["ratio"]))
        if "vs_bare" in d:
            rows += [
                ("  SDK / bare stubs, steps/s (target >= 0.9)", d["vs_bare"]),
                (
                    "  SDK / bare stubs, worker CPU per step (target <= 1.5)",
                    d["workers_cpu_vs_bare"],
                ),
            ]
    if "peer" in r:
        p = r["peer"]
        rows += [
            (
                f"peer: pgqueuer, {p['managers']} queue managers, batches of {p['batch']}, jobs/s",
                p["jobs_per_s"],
            ),
            ("  CPU ms per job: queue managers / Postgres = total", cpu_split(p["cpu_ms_per_job"])),
        ]
        slots = p.get("slots", PEER_SLOTS)
        for name, title, target in (("bare", "bare stubs", 1.0), ("sdk", "SDK", 0.8)):
            if f"{name}_rate_ratio" in p:
                rows += [
                    (f"  {title}, 2 x {slots} slots, steps/s", p[name]["steps_per_s"]),
                    (
                        f"  {title} / pgqueuer, steps/s (target >= {target})",
                        p[f"{name}_rate_ratio"],
                    ),
                    (f"  {title} / pgqueuer, total CPU per step", p[f"{name}_cpu_ratio"]),
                    *phase_rows(p[name], "    "),
                ]
        if "vs_bare" in p.get("sdk", {}):
            rows += [
                (f"  SDK / bare stubs at {slots} slots, steps/s", p["sdk"]["vs_bare"]),
                (
                    f"  SDK / bare stubs at {slots} slots, worker CPU per step",
                    p["sdk"]["workers_cpu_vs_bare"],
                ),
            ]
    for name, d in r.get("languages", {}).items():
        rows += [
            (
                f"{name} SDK worker: steps/s; / Python's",
                f"{d['steps_per_s']}; {d['rate_vs_python']}",
            ),
            (
                "  CPU ms per step: server / workers / Postgres = total; workers / Python's",
                f"{cpu_split(d['cpu_ms_per_step'])}; {d['workers_cpu_vs_python']}",
            ),
        ]
    if "dag" in r:
        rows += [
            ("dag steps/s", r["dag"]["steps_per_s"]),
            (
                "dag run latency p50 / p99 ms",
                f"{r['dag']['run_latency_ms']['p50']} / {r['dag']['run_latency_ms']['p99']}",
            ),
        ]
    if "durable" in r:
        d = r["durable"]
        for kind, title in (("sdk", "SDK Worker"), ("stubs", "bare stubs")):
            safe, unsafe = d[f"{kind}_safe"], d[f"{kind}_unsafe"]
            rows += [
                (
                    f"durable step calls/s, {title}: safe / unsafe",
                    f"{safe['step_calls_per_s']} / {unsafe['step_calls_per_s']}",
                ),
                (
                    "  CPU ms per safe call: server / workers / Postgres = total",
                    cpu_split(safe["cpu_ms_per_step_call"]),
                ),
                (
                    "  CPU ms per unsafe call: server / workers / Postgres = total",
                    cpu_split(unsafe["cpu_ms_per_step_call"]),
                ),
                ("  unsafe cost, x safe (target <= 2)", d[f"{kind}_unsafe_cost"]),
            ]
            if f"{kind}_vs_dag" in d:
                rows.append(
                    ("  safe step calls/s / dag steps/s (target >= 1)", d[f"{kind}_vs_dag"])
                )
            if kind == "sdk" and "sdk_safe_async" in d:
                rows += [
                    (
                        '  safe calls/s with record="async" (no window)',
                        d["sdk_safe_async"]["step_calls_per_s"],
                    ),
                    (
                        '  CPU ms per record="async" call: server / workers / Postgres = total',
                        cpu_split(d["sdk_safe_async"]["cpu_ms_per_step_call"]),
                    ),
                    (
                        "  window / async, safe calls/s, median of pairs (target >= 0.8)",
                        window_ratios(r),
                    ),
                ]
        if "stubs_batched_safe" in d:
            b = d["stubs_batched_safe"]
            rows += [
                (
                    "durable safe step calls/s, bare stubs, ends in CompleteMany",
                    b["step_calls_per_s"],
                ),
                (
                    "  CPU ms per call: server / workers / Postgres = total",
                    cpu_split(b["cpu_ms_per_step_call"]),
                ),
            ]
            if "stubs_batched_vs_dag" in d:
                rows.append(
                    ("  safe step calls/s / dag steps/s (target >= 1)", d["stubs_batched_vs_dag"])
                )
    if "waits" in r:
        w = r["waits"]["wake_to_resume_ms"]
        rows.append(
            (
                f"waits: {r['waits']['runs']:,} 1s sleeps, wake to resume p50 / p99 ms"
                " (target p50 <= 50)",
                f"{w['p50']} / {w['p99']} (max {w['max']})",
            )
        )
    if "pickup_ms" in r:
        rows.append(
            (
                "pickup p50 / p99 ms (target <= 2.0 / 10)",
                f"{r['pickup_ms']['p50']} / {r['pickup_ms']['p99']}",
            )
        )
    if "history" in r:
        rows.append(("history ratio (target >= 0.9)", r["history"]["ratio"]))
        rows.append(
            (
                "  after history: steps/s, WAL bytes per step",
                f"{r['history']['steps_per_s']}, {r['history']['wal_bytes_per_step']}",
            )
        )
    if "fan" in r:
        f = r["fan"]
        rows += [
            (f"fan: one run of {f['width']:,} leaves and a join, steps/s", f["steps_per_s"]),
            (
                "  CPU ms per step: server / workers / Postgres = total",
                cpu_split(f["cpu_ms_per_step"]),
            ),
            (
                "  join available / claimed after the last leaf, ms (target <= 1000)",
                f"{f['join_released_after_last_leaf_ms']} / {f['join_claimed_after_last_leaf_ms']}",
            ),
        ]
        if "ratio" in f:
            rows.append(("  fan / throughput (target >= 0.8)", f["ratio"]))
    if "backlog" in r:
        b = r["backlog"]
        rows += [
            (
                f"backlog: {b['runs']:,} ready, steps/s over the first {b['measured_steps']:,}",
                b["steps_per_s"],
            ),
            (
                "  CPU ms per step: server / workers / Postgres = total",
                cpu_split(b["cpu_ms_per_step"]),
            ),
            ("  loaded (run_submit from SQL), runs/s", b["loaded_per_s"]),
        ]
        if "ratio" in b:
            rows.append(("  backlog / throughput (target >= 0.9)", b["ratio"]))
    if "streams" in r:
        s = r["streams"]
        rows += [
            (
                f"throughput with {s['readers']:,} live stream readers, steps/s (without)",
                f"{s['steps_per_s_with']} ({s['steps_per_s_without']})",
            ),
            (
                "  with readers / without (target >= 0.9)",
                f"{s['ratio']} (rounds: {', '.join(map(str, s.get('round_ratios', [])))})",
            ),
            ("  server CPU per step, with readers / without", s["server_cpu_ratio"]),
            (
                "  server CPU with only the readers open, % of a CPU",
                s["server_idle_cpu_pct_with_readers"],
            ),
        ]
    if "big" in r:
        b = r["big"]
        rows.append(
            (
                f"health check p50 / p99 / max ms during a {b['edges']:,}-edge Submit",
                f"{b['health_ms']['p50']} / {b['health_ms']['p99']} / {b['health_ms']['max']}"
                f" (Submit {b['submit_ms']} ms)",
            )
        )
    if "submit" in r:
        rows.append(
            (
                "submit runs/s (Submit / SubmitOnce)",
                f"{r['submit']['runs_per_s']} / {r['submit']['once_runs_per_s']}",
            )
        )
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(f"\n  Postgres {r['postgres']}, {r['machine']['cpus']} CPUs; {out} written")


if __name__ == "__main__":
    main()
