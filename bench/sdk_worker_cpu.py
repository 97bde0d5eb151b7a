"""The SDK Worker's own CPU per step, apart from the server's and Postgres's.

One worker process (this one; the runs are submitted by another) drains RUNS
one-node runs of an async no-op handler (concurrency CONC, 64 by default) from a
local server, and prints CPU ms per step of this process (all its threads, and by
thread), counted from the worker's start to the last step completed.
``--profile FILE`` writes a cProfile of the worker's loop thread (in thread CPU
time); COUNT_CALLS=1 prints how many steps each Claim and CompleteMany carried, and
each report and each response handing out steps on the Work stream.

    .venv/bin/python bench/sdk_worker_cpu.py --runs 8000 --repeat 3

Under callgrind (instructions, not shared-machine CPU time), the difference of two
sizes cancels the start-up:

    POLL=1 valgrind --tool=callgrind --trace-children=no \
        .venv/bin/python bench/sdk_worker_cpu.py --runs 300 --repeat 1   # then 1500

The server's instructions per step, serving this worker: ``SERVER_CALLGRIND=FILE``
runs the worker's server under callgrind (its periodic loops stopped, so that they
do not count the drain's length; the runs submitted through a second server), writing
FILE when it stops, and the worker as usual:

    SERVER_CALLGRIND=/tmp/server-300.out .venv/bin/python bench/sdk_worker_cpu.py \
        --runs 300 --repeat 1   # then 1500; callgrind_annotate FILE | head: the total
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench

TICK = os.sysconf("SC_CLK_TCK")

#: How often the drain looks whether every step completed (raise it under valgrind).
POLL = float(os.environ.get("POLL", "0.05"))


def threads_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by thread name."""
    out: dict[str, float] = {}
    names = {t.native_id: t.name for t in threading.enumerate()}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(task.name), "other (gRPC core, ...)")
        if name.startswith("cyclone-") and name != "cyclone-async-handlers":
            name = "cyclone-handler threads"
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def drain(
    address: str, database_url: str, runs: int, action: str, profile, submit_to: str = ""
) -> float:
    from pyclient import Worker

    # Submitted by another process: its CPU is not the worker's (callgrind counts
    # this process only).
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, 'bench'); import bench;"
            f"bench.submit_many({submit_to or address!r},"
            f" [bench.one_node('one', {action!r})] * {runs})",
        ],
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    worker = Worker(address, concurrency=int(os.environ.get("CONC", "64")), claim_wait=0.5)

    @worker.action(action)
    async def noop(ctx):
        return None

    async def main() -> float:
        # Counted from before the worker starts (the runs are all submitted): its
        # start-up (channel, threads; the imports are done) is a few ms in all.
        cpu0 = time.process_time()
        by_thread0 = threads_cpu()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        if profile:
            profile.enable()
        serving = asyncio.ensure_future(worker.run_async())
        with psycopg.connect(database_url, autocommit=True) as conn:
            while True:
                await asyncio.sleep(POLL)
                done = conn.execute(
                    "SELECT count(*) FROM cyclone.steps WHERE action = %s AND status = 'completed'",
                    (action,),
                ).fetchone()[0]
                if done == runs:
                    break
        if profile:
            profile.disable()
        cpu = time.process_time() - cpu0
        by_thread = threads_cpu()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(
            f"  user {(ru.ru_utime - ru0.ru_utime) * 1000 / runs:.4f} sys"
            f" {(ru.ru_stime - ru0.ru_stime) * 1000 / runs:.4f} ms per step;"
            f" context switches per step: voluntary {(ru.ru_nvcsw - ru0.ru_nvcsw) / runs:.2f},"
            f" involuntary {(ru.ru_nivcsw - ru0.ru_nivcsw) / runs:.2f}"
        )
        print(
            "  by thread, ms per step:",
            ", ".join(
                f"{k} {(v - by_thread0.get(k, 0.0)) * 1000 / runs:.4f}"
                for k, v in sorted(by_thread.items())
            ),
        )
        worker.stop()
        await serving
        return cpu

    import pyclient.worker as worker_package

    # Calls (or Work messages) and the steps they carried: claimed, or reported.
    calls = {
        "Claim": [0, 0],
        "CompleteMany": [0, 0],
        "Work reports": [0, 0],
        "Work credit only": [0, 0],
        "Work steps": [0, 0],
    }
    serve = worker_package._Run.serve

    async def counting_serve(rt):  # counts the calls and what each carried
        real_stub = None

        class Stub:
            def __getattr__(self, name):
                fn = getattr(real_stub, name)
                if name == "Work":
                    return lambda **kw: _WorkCall(fn(**kw))
                if name not in calls:
                    return fn

                async def counted(request, **kw):
                    reply = await fn(request, **kw)
                    calls[name][0] += 1
                    calls[name][1] += len(reply.steps if name == "Claim" else request.completions)
                    return reply

                def wrapped(request, **kw):
                    return (
                        counted(request, **kw)
                        if name == "CompleteMany"
                        else _claim(fn, request, **kw)
                    )

                return wrapped

        class _ClaimCall:
            def __init__(self, call):
                self.call = call

            def __await__(self):
                reply = yield from self.call.__await__()
                calls["Claim"][0] += 1
                calls["Claim"][1] += len(reply.steps)
                return reply

            def cancel(self):
                return self.call.cancel()

        class _WorkCall:
            """A Work stream, counting its reports and the responses that hand out steps."""

            def __init__(self, call):
                self.call = call

            async def write(self, request):
                if request.HasField("report"):
                    calls["Work reports"][0] += 1
                    calls["Work reports"][1] += len(request.report.completions)
                elif not request.HasField("open"):
                    calls["Work credit only"][0] += 1
                    calls["Work credit only"][1] += request.credit
                await self.call.write(request)

            async def read(self):
                response = await self.call.read()
                if response is not grpc.aio.EOF and response.steps:
                    calls["Work steps"][0] += 1
                    calls["Work steps"][1] += len(response.steps)
                return response

            def __getattr__(self, name):
                return getattr(self.call, name)

        def _claim(fn, request, **kw):
            return _ClaimCall(fn(request, **kw))

        r = worker_package  # where the run opens its channel and makes its stub

        real_grpc = r.pb_grpc.WorkerServiceStub

        def make(channel):
            nonlocal real_stub
            real_stub = real_grpc(channel)
            return Stub()

        r.pb_grpc.WorkerServiceStub = make
        try:
            await serve(rt)
        finally:
            r.pb_grpc.WorkerServiceStub = real_grpc

    counting_serve.__wrapped__ = serve
    if os.environ.get("COUNT_CALLS"):
        worker_package._Run.serve = lambda rt: counting_serve(rt)
    try:
        return asyncio.run(main())
    finally:
        worker_package._Run.serve = serve
        if os.environ.get("COUNT_CALLS"):
            print(
                "  calls, steps per call:",
                {k: (n, round(s / max(n, 1), 1)) for k, (n, s) in calls.items()},
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile")
    args = parser.parse_args()
    from service.migrate import migrate

    base = bench.admin_url(None)
    database_url = bench.fresh_database(base, "cyclone_sdk_cpu")
    migrate(database_url)
    traced = os.environ.get("SERVER_CALLGRIND")
    server = bench.Server(
        database_url,
        ("--sweep-interval", "3600", "--schedule-interval", "3600", "--retention-interval", "3600")
        if traced
        else (),
        ("valgrind", "--tool=callgrind", f"--callgrind-out-file={traced}") if traced else (),
    )
    # Traced, the server only serves the worker: the runs are submitted through another.
    submitter = bench.Server(database_url) if traced else None
    try:
        figures = []
        for i in range(args.repeat):
            profile = cProfile.Profile(time.thread_time) if args.profile else None
            cpu = drain(
                server.address,
                database_url,
                args.runs,
                f"noop{i}",
                profile,
                submitter.address if submitter else "",
            )
            figures.append(cpu * 1000 / args.runs)
            print(f"run {i}: worker CPU ms per step {figures[-1]:.4f}", flush=True)
            if profile:
                profile.dump_stats(args.profile)
        print("median", sorted(figures)[len(figures) // 2])
    finally:
        server.stop(300 if traced else 30)
        if submitter:
            submitter.stop()


if __name__ == "__main__":
    main()
